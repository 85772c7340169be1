package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kefirdb/kefir/internal/cluster"
)

// CAD and cross-client-monotonic reads (docs/design/cad.md) in /metrics,
// /status and INFO. The durability-wait counter is the paper's "fraction
// of reads that needed the durability check": divide it by the reads.

// CADInfo is the CAD part of /status.
type CADInfo struct {
	FollowerReads    bool   `json:"follower_reads"`
	Readable         uint64 `json:"readable_op"`
	DurabilityWaits  uint64 `json:"reads_durability_wait"`
	FollowerServed   uint64 `json:"follower_reads_served"`
	FollowerRedirect uint64 `json:"follower_reads_redirected"`
	EarlyAcks        uint64 `json:"writes_acked_before_commit"`
	OverlayReads     uint64 `json:"async_overlay_reads"`
	DeferredReads    uint64 `json:"reads_durability_deferred"`
}

func (s *Server) cadInfo(in cluster.State) *CADInfo {
	st := s.grp.Stats()
	return &CADInfo{FollowerReads: s.cfg.FollowerReads, Readable: in.Readable, DurabilityWaits: st.DurabilityWaits,
		FollowerServed: st.FollowerReads, FollowerRedirect: st.FollowerRedirects, EarlyAcks: st.EarlyAcks,
		OverlayReads: st.OverlayReads, DeferredReads: st.DeferredReads}
}

func (s *Server) cadCollectors() []prometheus.Collector {
	counter := s.vrStatCounter
	return []prometheus.Collector{
		counter("kefir_reads_durability_wait_total", "Reads at the leader whose key's latest update was not yet readable (durable and applied on every active-set member), so they waited for it (the CAD durability check).",
			func(st cluster.Stats) uint64 { return st.DurabilityWaits }),
		counter("kefir_reads_durability_deferred_total", "Of the reads counted in kefir_reads_durability_wait_total, those answered at once from the leader's log with the reply held until the value was readable (the connection's later commands did not wait).",
			func(st cluster.Stats) uint64 { return st.DeferredReads }),
		counter("kefir_follower_reads_total", "Cross-client-monotonic reads this follower served from its own engine under an active-set lease.",
			func(st cluster.Stats) uint64 { return st.FollowerReads }),
		counter("kefir_follower_reads_redirected_total", "Cross-client-monotonic reads this follower sent to the leader (no lease, or the data read was not yet readable).",
			func(st cluster.Stats) uint64 { return st.FollowerRedirects }),
		counter("kefir_writes_early_ack_total", "cad and async blind writes acknowledged before they were committed (once in memory on a majority).",
			func(st cluster.Stats) uint64 { return st.EarlyAcks }),
		counter("kefir_reads_async_overlay_total", "Reads at the leader served from pending async writes (no durability check; async is unsafe).",
			func(st cluster.Stats) uint64 { return st.OverlayReads }),
		counter("kefir_chain_reads_clean_total", "Strong reads this chain member served itself: no update to the keys read was in flight here (CRAQ, docs/design/chain.md).",
			func(st cluster.Stats) uint64 { return st.ChainClean }),
		counter("kefir_chain_reads_to_tail_total", "Strong reads this chain member sent to the tail: an update to a key read was in flight here.",
			func(st cluster.Stats) uint64 { return st.ChainToTail }),
		counter("kefir_chain_reads_waited_total", "Strong reads this chain member (the tail, or one that knows no tail) answered once the update in flight to a key read was committed.",
			func(st cluster.Stats) uint64 { return st.ChainWaits }),
		counter("kefir_chain_reads_durable_waits_total", "Waits of this chain member's strong reads under AUSI for an update they read to reach the durable point (every log member persisted it): a value a power cut could still take is not served.",
			func(st cluster.Stats) uint64 { return st.ChainDurableWaits }),
		counter("kefir_chain_reads_version_total", "Strong reads this chain member answered from its own engine at the tail's version (CRAQ's version query): an update to a key read was in flight here.",
			func(st cluster.Stats) uint64 { return st.ChainVersionReads }),
		counter("kefir_chain_reads_version_fallbacks_total", "Strong reads this chain member sent to the tail after all: the version query failed (an older tail, no answer) or its apply lagged the tail's version too long.",
			func(st cluster.Stats) uint64 { return st.ChainVersionFallbacks }),
		counter("kefir_chain_reads_held_total", "Of the version reads, those this chain member answered from an update it holds and has not applied yet: a blind write (SET, MSET, DEL) the tail's version covers (CRAQ).",
			func(st cluster.Stats) uint64 { return st.ChainHeldReads }),
		counter("kefir_chain_reads_version_waited_total", "Of the version reads, those this chain member answered after waiting for its apply to reach the tail's version (the acknowledgement on its way).",
			func(st cluster.Stats) uint64 { return st.ChainVersionWaited }),
		counter("kefir_chain_version_queries_sent_total", "Version queries (KEFIR.CHAINVERSION) this chain member sent to the tail; the dirty reads that arrive while one is in flight share the next.",
			func(st cluster.Stats) uint64 { return st.ChainVersionQueries }),
		counter("kefir_chain_version_queries_answered_total", "Version queries (KEFIR.CHAINVERSION) this chain member answered as the tail.",
			func(st cluster.Stats) uint64 { return st.ChainVersionAnswers }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kefir_vr_readable_op", Help: "The readable index R this node knows: ops up to it are durable and applied on every active-set member."},
			func() float64 { return float64(s.grp.State().Readable) }),
	}
}
