package storage

import (
	"sync/atomic"
	"time"
)

// device is one data directory of the chain with its optional emulated medium.
type device struct {
	dir      string
	model    *DeviceModel
	slots    chan struct{} // QueueDepth service slots; nil = unlimited
	inflight atomic.Int64  // reads queued or in service: the live queue depth
}

func newDevice(d Device) *device {
	dev := &device{dir: d.Dir, model: d.Model}
	if d.Model != nil && d.Model.QueueDepth > 0 {
		dev.slots = make(chan struct{}, d.Model.QueueDepth)
	}
	return dev
}

// serviceTime is the emulated time to read n bytes once in service.
func (d *device) serviceTime(n int) time.Duration {
	if d.model == nil {
		return 0
	}
	t := d.model.Latency
	if d.model.Bandwidth > 0 {
		t += time.Duration(int64(n) * int64(time.Second) / d.model.Bandwidth)
	}
	return t
}

// begin enters a read of n bytes: it waits for a service slot and the emulated service
// time. The real read happens between begin and end.
func (d *device) begin(n int) bool {
	d.inflight.Add(1)
	if d.model == nil {
		return false
	}
	if d.slots != nil {
		d.slots <- struct{}{}
	}
	if t := d.serviceTime(n); t > 0 {
		time.Sleep(t)
	}
	return d.slots != nil
}

func (d *device) end(held bool) {
	if held {
		<-d.slots
	}
	d.inflight.Add(-1)
}

// Cost units: nanoseconds of expected read time. A cache hit costs cacheHitCost; an
// unmodelled device costs a nominal page-cache read; a modelled one its service time,
// multiplied by the reads ahead in the queue per slot.
const (
	cacheHitCost   = 100
	unmodelledCost = 2000
)

func (d *device) cost(n int) int64 {
	q := d.inflight.Load()
	if d.model == nil {
		return unmodelledCost * (1 + q)
	}
	t := int64(d.serviceTime(n))
	if qd := int64(d.model.QueueDepth); qd > 0 {
		return t * (1 + q/qd)
	}
	return t
}

// Cost returns the expected cost (nanoseconds, comparable across calls) of reading key at
// version v: cheap if the value is cached or still in the write buffer, otherwise the
// device's emulated service time scaled by its live queue depth. A missing version costs 0.
func (db *DB) Cost(key []byte, v uint64) int64 {
	db.mu.RLock()
	p := db.idx.get(keyString(key))
	if p == nil {
		db.mu.RUnlock()
		return 0
	}
	vs := db.idx.vers(p)
	i, _ := vs.pick(v)
	if i < 0 || vs.at(i).tombstone() {
		db.mu.RUnlock()
		return 0
	}
	ver := vs.at(i)
	if ver.pos >= uint64(db.writ) {
		db.mu.RUnlock()
		return cacheHitCost
	}
	seg := db.segFor(ver.pos)
	dev := db.devs[seg.dev]
	db.mu.RUnlock()
	if db.cache != nil && db.cache.has(ver.pos) {
		return cacheHitCost
	}
	return dev.cost(int(ver.size))
}
