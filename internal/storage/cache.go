package storage

import (
	"bytes"
	"sync"
	"sync/atomic"
)

// cache is a size-bounded value cache keyed by record position, with SIEVE eviction
// (Zhang et al., NSDI'24): a FIFO queue with one "visited" bit per entry and a hand that
// sweeps from the oldest entry, sparing and clearing visited ones. It matches or beats
// LRU on web/KV traces, and a hit only sets a bit, with no list reordering.
//
// Positions are never reused (the log only grows), so entries never go stale: a value
// at a position is immutable. Compacted-away positions simply age out.
type cache struct {
	shards [cacheShards]cacheShard
}

const cacheShards = 16

type cacheShard struct {
	mu         sync.RWMutex
	m          map[uint64]*centry
	head, tail *centry // head = newest
	hand       *centry
	size, max  int64
	// Counted per shard, next to the lock a probe writes anyway: one cache-wide counter
	// was one more cache line every get on every core wrote.
	hits, misses atomic.Int64
}

type centry struct {
	// visited and small come first, in the line a hit reads anyway: a value
	// of at most len(small) bytes (a counter, a flag, redis-benchmark's
	// "xxx") is kept there, not in an allocation of its own, which cost a GET
	// over many keys a cache miss more (docs/design/hashes.md, "Pipelined,
	// session 21").
	visited    atomic.Bool
	small      [20]byte
	data       []byte // small's bytes for a small value
	pos        uint64
	prev, next *centry // prev is towards head (newer)
}

const centryOverhead = 64 // map slot + entry struct, so tiny values still count

func newCache(maxBytes int64) *cache {
	c := &cache{}
	for i := range c.shards {
		c.shards[i].m = map[uint64]*centry{}
		c.shards[i].max = maxBytes / cacheShards
	}
	return c
}

func (c *cache) shard(pos uint64) *cacheShard {
	return &c.shards[(pos*0x9E3779B97F4A7C15)>>60]
}

// get returns the cached value at pos: a copy if clone, else the cached bytes themselves
// (immutable: nothing writes to an entry's data after put, so sharing them is safe as
// long as the caller does not write either). A hit takes the shard's lock shared: it only
// sets the atomic visited bit.
func (c *cache) get(pos uint64, clone bool) ([]byte, bool) {
	s := c.shard(pos)
	s.mu.RLock()
	e, ok := s.m[pos]
	var out []byte
	if ok {
		if !e.visited.Load() { // a hot entry is visited already: do not dirty its line
			e.visited.Store(true)
		}
		out = e.data
		if clone {
			out = bytes.Clone(out)
		}
		if out == nil {
			out = []byte{}
		}
	}
	s.mu.RUnlock()
	if ok {
		s.hits.Add(1)
	} else {
		s.misses.Add(1)
	}
	return out, ok
}

func (c *cache) has(pos uint64) bool {
	s := c.shard(pos)
	s.mu.RLock()
	_, ok := s.m[pos]
	s.mu.RUnlock()
	return ok
}

// put caches a copy of data at pos.
func (c *cache) put(pos uint64, data []byte) { c.insert(pos, data, true) }

// putOwned caches data itself at pos: the caller hands it over and, like every other
// reader of it from now on, never modifies it.
func (c *cache) putOwned(pos uint64, data []byte) { c.insert(pos, data, false) }

func (c *cache) insert(pos uint64, data []byte, clone bool) {
	s := c.shard(pos)
	cost := int64(len(data)) + centryOverhead
	if cost > s.max {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[pos]; ok {
		return
	}
	for s.size+cost > s.max && s.tail != nil {
		s.evict()
	}
	e := &centry{pos: pos, next: s.head}
	switch {
	case len(data) <= len(e.small):
		n := copy(e.small[:], data)
		data = e.small[:n:n]
	case clone:
		data = bytes.Clone(data)
	}
	e.data = data
	if s.head != nil {
		s.head.prev = e
	}
	s.head = e
	if s.tail == nil {
		s.tail = e
	}
	s.m[pos] = e
	s.size += cost
}

// evict removes one entry: the hand walks from where it stopped (or the tail) towards
// the head, clearing visited bits, and evicts the first unvisited entry.
func (s *cacheShard) evict() {
	h := s.hand
	if h == nil {
		h = s.tail
	}
	for h.visited.Load() {
		h.visited.Store(false)
		h = h.prev
		if h == nil {
			h = s.tail
		}
	}
	s.hand = h.prev
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		s.head = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	} else {
		s.tail = h.prev
	}
	delete(s.m, h.pos)
	s.size -= int64(len(h.data)) + centryOverhead
}

func (c *cache) stats() (hits, misses int64) {
	for i := range c.shards {
		hits += c.shards[i].hits.Load()
		misses += c.shards[i].misses.Load()
	}
	return hits, misses
}
