package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/cockroachdb/pebble/v2"
	dto "github.com/prometheus/client_model/go"
	bolt "go.etcd.io/bbolt"
)

// errNotFound is what every adapter returns for a missing key, so the workload code can
// tell a miss (a correctness failure in this benchmark: every read key was loaded) from
// an I/O error.
var errNotFound = errors.New("key not found")

// Engine is the common surface the workloads drive. Every adapter gives the same
// durability for Put: when Put returns, the write is on stable storage (fsync), and
// concurrent Puts share fsyncs through the engine's own group commit.
type Engine interface {
	// Put writes key=val durably. Safe for concurrent use.
	Put(key, val []byte) error
	// Load bulk-writes sorted keys with larger batches and syncs once at the end;
	// it prepares read workloads and is not what the put figures measure.
	Load(keys, vals [][]byte) error
	// Get appends key's value to dst[:0] and returns it, or errNotFound.
	Get(key, dst []byte) ([]byte, error)
	// Scan reads up to n consecutive keys starting at start (inclusive) and returns how
	// many it read, touching every value byte so lazily-read values are really read.
	Scan(start []byte, n int) (int, error)
	// Prepare runs before a measured phase that reopens or closes: Kefir writes its hint
	// files here, the others do nothing.
	Prepare() error
	Close() error
}

// Config is what the benchmark tells every engine alike.
type Config struct {
	// CacheBytes sizes the engine's own cache (Kefir's value cache, Pebble's block
	// cache). bbolt has none: it reads through its mmap, i.e. the OS page cache.
	CacheBytes int64
	// Writers is the number of concurrent Put callers in the phase; bbolt uses it as its
	// batch size (see openBolt).
	Writers int
}

// fsyncCounter is implemented by engines that can say how many log fsyncs they have
// issued, so the report can show group-commit sizes (puts per fsync).
type fsyncCounter interface{ fsyncs() int64 }

// engineOpener opens (creating if needed) an engine in dir.
type engineOpener func(dir string, cfg Config) (Engine, error)

// openers lists the engines, in report order. kefir.go adds Kefir's engine.
var openers = map[string]engineOpener{
	"pebble": openPebble,
	"bbolt":  openBolt,
}

// engineOrder is the column order of the report; the first is the one ratios are taken
// against.
var engineOrder = []string{"kefir", "pebble", "bbolt"}

// ---- Pebble ----

type pebbleEngine struct {
	db    *pebble.DB
	cache interface{ Unref() }
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...interface{})  {}
func (quietLogger) Errorf(string, ...interface{}) {}
func (quietLogger) Fatalf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "pebble fatal: "+format+"\n", args...)
	os.Exit(2)
}

// openPebble opens Pebble with its defaults except the block cache size (set equal to
// Kefir's value cache) and a quiet logger. Put is Set(k, v, pebble.Sync): Pebble's commit
// pipeline group-commits concurrent synced writes into one WAL write and one fsync.
func openPebble(dir string, cfg Config) (Engine, error) {
	c := pebble.NewCache(cfg.CacheBytes)
	db, err := pebble.Open(dir, &pebble.Options{Cache: c, Logger: quietLogger{}})
	if err != nil {
		c.Unref()
		return nil, fmt.Errorf("pebble open %s: %w", dir, err)
	}
	return &pebbleEngine{db: db, cache: c}, nil
}

func (e *pebbleEngine) Put(key, val []byte) error { return e.db.Set(key, val, pebble.Sync) }

func (e *pebbleEngine) Load(keys, vals [][]byte) error {
	b := e.db.NewBatch()
	for i := range keys {
		if err := b.Set(keys[i], vals[i], nil); err != nil {
			return err
		}
		if b.Len() >= 4<<20 || i == len(keys)-1 {
			opt := pebble.NoSync
			if i == len(keys)-1 {
				opt = pebble.Sync
			}
			if err := b.Commit(opt); err != nil {
				return fmt.Errorf("pebble load commit: %w", err)
			}
			b = e.db.NewBatch()
		}
	}
	return b.Close()
}

func (e *pebbleEngine) Get(key, dst []byte) ([]byte, error) {
	v, closer, err := e.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, errNotFound
	}
	if err != nil {
		return nil, err
	}
	dst = append(dst[:0], v...)
	return dst, closer.Close()
}

func (e *pebbleEngine) Scan(start []byte, n int) (int, error) {
	it, err := e.db.NewIter(nil)
	if err != nil {
		return 0, err
	}
	got := 0
	for ok := it.SeekGE(start); ok && got < n; ok = it.Next() {
		touch(it.Value())
		got++
	}
	if err := it.Close(); err != nil {
		return got, err
	}
	return got, nil
}

func (e *pebbleEngine) Prepare() error { return nil }

// fsyncs counts WAL fsyncs through Pebble's fsync-latency histogram.
func (e *pebbleEngine) fsyncs() int64 {
	h := e.db.Metrics().LogWriter.FsyncLatency
	if h == nil {
		return 0
	}
	var m dto.Metric
	if err := h.Write(&m); err != nil || m.Histogram == nil {
		return 0
	}
	return int64(m.Histogram.GetSampleCount())
}

func (e *pebbleEngine) Close() error {
	err := e.db.Close()
	e.cache.Unref()
	return err
}

// ---- bbolt ----

type boltEngine struct{ db *bolt.DB }

var boltBucket = []byte("kv")

// openBolt opens bbolt with its defaults (NoSync false: every commit fdatasyncs the
// data pages and then the meta page — two syncs per commit). Put goes through
// DB.Batch, which coalesces concurrent callers into one read-write transaction and so
// one commit. MaxBatchSize is set to the phase's writer count so a batch commits as soon
// as every writer has joined instead of waiting out MaxBatchDelay (10 ms by default,
// which would cap one writer at ~100 puts/s and misrepresent bbolt).
func openBolt(dir string, cfg Config) (Engine, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	db, err := bolt.Open(filepath.Join(dir, "bolt.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("bbolt open %s: %w", dir, err)
	}
	if cfg.Writers > 0 {
		db.MaxBatchSize = cfg.Writers
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("bbolt bucket: %w", err)
	}
	return &boltEngine{db: db}, nil
}

func (e *boltEngine) Put(key, val []byte) error {
	return e.db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(boltBucket).Put(key, val) })
}

func (e *boltEngine) Load(keys, vals [][]byte) error {
	const per = 50_000
	for lo := 0; lo < len(keys); lo += per {
		hi := min(lo+per, len(keys))
		err := e.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(boltBucket)
			b.FillPercent = 0.9 // keys arrive sorted: pack pages as a bulk load would
			for i := lo; i < hi; i++ {
				if err := b.Put(keys[i], vals[i]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("bbolt load: %w", err)
		}
	}
	return nil
}

func (e *boltEngine) Get(key, dst []byte) ([]byte, error) {
	err := e.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(boltBucket).Get(key)
		if v == nil {
			return errNotFound
		}
		dst = append(dst[:0], v...)
		return nil
	})
	return dst, err
}

func (e *boltEngine) Scan(start []byte, n int) (int, error) {
	got := 0
	err := e.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(boltBucket).Cursor()
		for k, v := c.Seek(start); k != nil && got < n; k, v = c.Next() {
			touch(v)
			got++
		}
		return nil
	})
	return got, err
}

func (e *boltEngine) Prepare() error { return nil }
func (e *boltEngine) Close() error   { return e.db.Close() }

// touchSink keeps touch's reads from being optimised away.
//
//lint:ignore U1000 written, never read: that is its purpose
var touchSink byte

// touch reads the first and last byte of v: an engine that returns values lazily (mmap)
// must fault the value's pages in inside the measured operation, as a real caller would,
// without the benchmark adding a per-byte loop that would dwarf the engines' own costs.
func touch(v []byte) {
	if len(v) > 0 {
		touchSink ^= v[0] ^ v[len(v)-1]
	}
}

// sortedPairs sorts keys (and vals alongside) so Load gets keys in order.
func sortedPairs(keys, vals [][]byte) {
	sort.Sort(pairSorter{keys, vals})
}

type pairSorter struct{ k, v [][]byte }

func (p pairSorter) Len() int           { return len(p.k) }
func (p pairSorter) Less(i, j int) bool { return string(p.k[i]) < string(p.k[j]) }
func (p pairSorter) Swap(i, j int) {
	p.k[i], p.k[j] = p.k[j], p.k[i]
	p.v[i], p.v[j] = p.v[j], p.v[i]
}

var _ io.Closer = (*pebbleEngine)(nil)

// Settle flushes the memtable and waits (up to a minute) for background compactions, so
// the read cells measure a quiet LSM rather than one still compacting the load.
func (e *pebbleEngine) Settle() error {
	if err := e.db.Flush(); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		m := e.db.Metrics()
		if m.Compact.NumInProgress == 0 && m.Flush.NumInProgress == 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
