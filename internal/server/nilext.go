package server

import (
	"context"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/prometheus/client_golang/prometheus"
)

// The nilext coordinator (Config.Nilext, experimental). A node that receives
// plain SETs and MSETs from a RESP client coordinates them on the Skyros fast
// path (cluster.Group.NilextApply): sent to every replica, complete on a
// supermajority of acks from one view including the leader's, ordered by the
// leader in the background. Writes that miss the supermajority fall back to
// the ordered path with the request id the fast path used (exactly-once via
// the client table): applied here if this node leads, else forwarded.
//
// A batch takes the fast path only when every write in it may: each is a
// nilext update (cluster.Group.NilextEligible: plain SET, MSET), carries no
// client request id (a client id may have several writes in flight, which
// the d-log's per-client cleanup must not see; such writes keep the ordered
// path), is no KEFIR.CALL SESSION call and the connection does not use
// session consistency (a fast write has no version to put in a token), and
// no two writes share a key (so a fallback of an earlier write cannot be
// ordered after a later one that completed). Anything else keeps the
// ordered path, which orders every pending d-log entry first.

// applyBatch applies the connection's batch: on the fast path when it
// qualifies, else (and for fast-path fallbacks) through the shard.
func (c *conn) applyBatch() (shard.Pending, error) {
	ctx := context.Background()
	if !c.nilextBatch() {
		return c.srv.shard.Apply(ctx, c.writes)
	}
	fb, err := c.srv.grp.NilextApply(ctx, c.writes)
	if err != nil {
		return shard.Pending{}, err
	}
	if len(fb) == 0 {
		return shard.Pending{}, nil
	}
	sub := make([]shard.WriteReq, len(fb))
	for j, i := range fb {
		sub[j] = c.writes[i]
	}
	p, err := c.srv.shard.Apply(ctx, sub)
	for j, i := range fb {
		c.writes[i].Result, c.writes[i].Err = sub[j].Result, sub[j].Err
	}
	return p, err
}

func (c *conn) nilextBatch() bool {
	if c.srv.grp == nil || !c.srv.grp.NilextOn() || c.cons.Kind == level.Session {
		return false
	}
	seen := make(map[string]struct{}, len(c.writes))
	for i := range c.writes {
		w := &c.writes[i]
		if !w.ID.IsZero() || c.meta[i].session || !c.srv.grp.NilextEligible(&w.Op) {
			return false
		}
		keys := [][]byte{w.Op.Key}
		if w.Op.Kind == kv.KindMSet {
			keys = keys[:0]
			for j := 0; j < len(w.Op.Keys); j += 2 {
				keys = append(keys, w.Op.Keys[j])
			}
		}
		for _, k := range keys {
			if _, dup := seen[string(k)]; dup {
				return false
			}
			seen[string(k)] = struct{}{}
		}
	}
	return true
}

// NilextInfo is the fast path's part of /status.
type NilextInfo struct {
	Fast      uint64 `json:"fast_writes"`
	Fallbacks uint64 `json:"fallback_writes"`
	SlowReads uint64 `json:"slow_reads"`
	DLogLen   int    `json:"dlog_len"`
	// DLogCycles counts view changes this replica led whose d-logs ordered
	// pending updates in a cycle; DLogStaleWaits those that waited for more
	// fresh d-logs; DLogStale: this replica restarted and its d-log does not
	// count in d-log recovery yet (docs/operations.md).
	DLogCycles     uint64 `json:"dlog_cycles"`
	DLogStaleWaits uint64 `json:"dlog_stale_waits"`
	DLogStale      bool   `json:"dlog_stale"`
}

func (s *Server) nilextInfo(in cluster.State) *NilextInfo {
	st := s.grp.Stats()
	return &NilextInfo{Fast: st.NilextFast, Fallbacks: st.NilextFallbacks, SlowReads: st.NilextSlowReads, DLogLen: in.DLogLen,
		DLogCycles: in.NilextCycles, DLogStaleWaits: in.NilextStaleWaits, DLogStale: in.DLogStale}
}

func (s *Server) nilextCollectors() []prometheus.Collector {
	counter := s.vrStatCounter
	return []prometheus.Collector{
		counter("kefir_nilext_fast_writes_total", "Nilext writes this node coordinated that completed on the fast path.",
			func(st cluster.Stats) uint64 { return st.NilextFast }),
		counter("kefir_nilext_fallback_writes_total", "Nilext writes this node coordinated that fell back to the ordered path.",
			func(st cluster.Stats) uint64 { return st.NilextFallbacks }),
		counter("kefir_nilext_slow_reads_total", "Linearizable reads at the leader that waited for pending nilext writes to be ordered.",
			func(st cluster.Stats) uint64 { return st.NilextSlowReads }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kefir_nilext_dlog_len", Help: "Nilext updates in this replica's durability log, not applied yet."},
			func() float64 { return float64(s.grp.State().DLogLen) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kefir_nilext_dlog_cycles_total",
			Help: "View changes this replica led whose durability logs ordered pending updates in a cycle (it waits for more logs; with every replica's it refuses the view)."},
			func() float64 { return float64(s.grp.State().NilextCycles) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kefir_nilext_dlog_stale_waits_total",
			Help: "View changes this replica led that waited for more durability logs from replicas that had not restarted."},
			func() float64 { return float64(s.grp.State().NilextStaleWaits) }),
	}
}

// vrStatCounter is a Prometheus counter reading one figure of the VR driver's
// Stats at scrape time (shared by the nilext and CAD collectors).
func (s *Server) vrStatCounter(name, help string, f func(cluster.Stats) uint64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
		func() float64 { return float64(f(s.grp.Stats())) })
}
