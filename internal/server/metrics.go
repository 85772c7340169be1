package server

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/storage"
)

// metrics holds the node's Prometheus instruments. Per-command instruments are
// resolved once, indexed by command ID, so the hot path does no label lookups.
type metrics struct {
	reg *prometheus.Registry

	calls   []prometheus.Counter
	errs    []prometheus.Counter
	latency []prometheus.Observer

	conns       prometheus.Gauge
	connsTotal  prometheus.Counter
	rejected    prometheus.Counter
	authFails   prometheus.Counter
	protoErrors prometheus.Counter
	tooLarge    prometheus.Counter
	syncLatency prometheus.Histogram

	// plain counters for INFO (reading Prometheus instruments back is awkward).
	commands  atomic.Uint64
	connected atomic.Int64
	total     atomic.Uint64
}

// newFsyncHistogram is kefir_fsync_duration_seconds: how long each fsync
// system call took, by log. The "storage" log is the engine's (a single node's
// only log, synced for sync writes; a replica's engine, synced at checkpoints),
// "replication" a replica's replication log (synced for every batch).
func newFsyncHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kefir_fsync_duration_seconds",
		Help:    "Duration of each fsync of a log file, by log (storage: the engine's log; replication: a replica's replication log).",
		Buckets: prometheus.ExponentialBuckets(2e-5, 2, 16),
	}, []string{"log"})
}

// fsyncObserver is the hook the engine and the replication log call after
// each fsync: it records the fsync's real duration. (An emulated slower disk,
// Config.FsyncExtraDelay, is the file system's: Config.diskFS.)
func (s *Server) fsyncObserver(log string) func(time.Duration) {
	h := s.fsyncs.WithLabelValues(log)
	return func(d time.Duration) { h.Observe(d.Seconds()) }
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	callsVec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kefir_commands_total", Help: "Commands processed, by command.",
	}, []string{"cmd"})
	errsVec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kefir_command_errors_total", Help: "Commands answered with an error, by command.",
	}, []string{"cmd"})
	latVec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kefir_command_duration_seconds",
		Help:    "Time from the arrival of a command's pipeline batch to the release of its replies (includes the fsync of sync writes).",
		Buckets: prometheus.ExponentialBuckets(5e-6, 2.5, 14),
	}, []string{"cmd"})
	for _, spec := range command.All() {
		name := strings.ToLower(spec.Name)
		if spec.Has(command.Unsupported) {
			// Some 200 Redis commands Kefir only refuses (docs/commands.md):
			// one series for them all, not a histogram each.
			name = "unsupported"
		}
		m.calls = append(m.calls, callsVec.WithLabelValues(name))
		m.errs = append(m.errs, errsVec.WithLabelValues(name))
		m.latency = append(m.latency, latVec.WithLabelValues(name))
	}
	m.conns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kefir_client_connections", Help: "Open client connections."})
	m.connsTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "kefir_client_connections_total", Help: "Client connections accepted."})
	m.rejected = prometheus.NewCounter(prometheus.CounterOpts{Name: "kefir_client_connections_rejected_total", Help: "Client connections refused (max clients)."})
	m.authFails = prometheus.NewCounter(prometheus.CounterOpts{Name: "kefir_auth_failures_total", Help: "Failed AUTH attempts."})
	m.protoErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "kefir_protocol_errors_total", Help: "Connections closed for malformed input."})
	m.tooLarge = prometheus.NewCounter(prometheus.CounterOpts{Name: "kefir_commands_too_large_total", Help: "Commands refused (read and discarded, connection kept) for an argument over --max-bulk or a size over --max-request."})
	m.syncLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kefir_fsync_wait_seconds",
		Help:    "Time a batch of sync writes waited for durability (one shared fsync).",
		Buckets: prometheus.ExponentialBuckets(2e-5, 2, 16),
	})
	storageBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kefir_storage_log_bytes", Help: "Engine log position (bytes appended).",
	}, func() float64 { return float64(s.shard.Status().LastPos) })
	durable := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kefir_storage_durable_bytes", Help: "Engine durable position.",
	}, func() float64 { return float64(s.shard.Status().DurablePos) })
	version := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kefir_last_version", Help: "Highest version applied.",
	}, func() float64 { return float64(s.shard.Status().LastVersion) })
	m.reg.MustRegister(callsVec, errsVec, latVec, m.conns, m.connsTotal, m.rejected, m.authFails,
		m.protoErrors, m.tooLarge, m.syncLatency, s.fsyncs, storageBytes, durable, storageCollector{s.db}, version,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if s.multi != nil {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kefir_tx_pushes_total",
			Help: "Prepared cross-group transactions this node pushed (asked their primary to decide abort, or learned its decision, and resolved): as a group's leader after they stayed prepared longer than the push age, or for a read or write that waited on their lock."},
			func() float64 { return float64(s.multi.TxPushes()) }),
			groupsCollector{s}) // lag.go
	}
	if s.grp != nil {
		gauge := func(name, help string, f func(cluster.State) float64) prometheus.Collector {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
				func() float64 { return f(s.grp.State()) })
		}
		b := func(v bool) float64 {
			if v {
				return 1
			}
			return 0
		}
		m.reg.MustRegister(
			gauge("kefir_vr_view", "Current VR view number.", func(in cluster.State) float64 { return float64(in.View) }),
			gauge("kefir_vr_leader", "Replica id of the leader this node knows (0: none).", func(in cluster.State) float64 { return float64(in.Leader) }),
			gauge("kefir_vr_is_leader", "1 if this node leads the group.", func(in cluster.State) float64 { return b(in.IsLeader) }),
			gauge("kefir_vr_recovering", "1 while this node runs VR recovery.", func(in cluster.State) float64 { return b(in.Role == cluster.RoleRecovering) }),
			gauge("kefir_vr_commit_op", "Highest op number known committed.", func(in cluster.State) float64 { return float64(in.Commit) }),
			gauge("kefir_vr_applied_op", "Highest op number applied to the engine.", func(in cluster.State) float64 { return float64(in.Applied) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kefir_vr_log_fsyncs_total", Help: "Fsyncs of the replication log."},
				func() float64 { return float64(s.grp.Stats().Fsyncs) }),
			s.vrStatCounter("kefir_vr_tx_early_aborts_total", "Transactions (EXEC, KEFIR.TX commits) this node answered as aborted as leader without a log entry: a key they check already has a newer committed record.",
				func(st cluster.Stats) uint64 { return st.TxEarlyAborts }),
			s.vrStatCounter("kefir_vr_tx_holds_total", "Transactions (EXEC, KEFIR.TX commits) this node as leader held, unproposed, until the commits it had in flight that write a key they check were applied.",
				func(st cluster.Stats) uint64 { return st.TxHolds }),
			s.vrStatCounter("kefir_vr_tx_held_aborts_total", "Held transactions this node as leader then answered as aborted without a log entry (among kefir_vr_tx_early_aborts_total).",
				func(st cluster.Stats) uint64 { return st.TxHeldAborts }),
			s.vrStatCounter("kefir_vr_tx_fresh_reads_total", "Transactions whose first read waited, at this node as leader, for the EXECs and KEFIR.TX commits in flight that write its keys, then took their start version again.",
				func(st cluster.Stats) uint64 { return st.TxFreshReads }),
			s.vrStatCounter("kefir_vr_lease_reads_total", "Reads that confirmed leadership under the leader's lease (no read-index round).",
				func(st cluster.Stats) uint64 { return st.LeaseReads }),
			s.vrStatCounter("kefir_vr_local_lease_reads_total", "Leader lease reads and follower reads confirmed by the lease the VR driver published, without a round trip to it.",
				func(st cluster.Stats) uint64 { return st.LocalReads }),
			s.vrStatCounter("kefir_vr_read_index_reads_total", "Linearizable reads that needed a read-index heartbeat round.",
				func(st cluster.Stats) uint64 { return st.IndexReads }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kefir_forwarded_total", Help: "Commands this node forwarded to the leader."},
				func() float64 { return float64(s.router.Forwarded()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kefir_forward_retries_total", Help: "Forwarded commands sent again because the leader did not answer (it failed, moved, or none was known yet)."},
				func() float64 { return float64(s.router.Retries()) }),
			s.vrStatCounter("kefir_vr_view_changes_total", "View changes this node started or joined.",
				func(st cluster.Stats) uint64 { return st.ViewChanges }),
			s.vrStatCounter("kefir_vr_leader_changes_total", "Normal views this node entered under a different leader than the last one it knew.",
				func(st cluster.Stats) uint64 { return st.LeaderChanges }),
			s.vrStatCounter("kefir_vr_depositions_total", "Times this node stopped leading (a view change, or a newer view led by another).",
				func(st cluster.Stats) uint64 { return st.Depositions }),
			s.vrStatCounter("kefir_vr_writes_refused_no_leader_total", "Writes this node refused (UNAVAILABLE no leader) because it knew no leader: a view change was running.",
				func(st cluster.Stats) uint64 { return st.WritesRefusedNoLeader }),
		)
		m.reg.MustRegister(s.cadCollectors()...)
		if s.grp.NilextOn() {
			m.reg.MustRegister(s.nilextCollectors()...)
		}
	}
	return m
}

// storageCollector exports the engine's file and index figures from one
// storage.DB.Stats per scrape (Stats takes the engine's lock and walks its
// segments; a gauge function each would take it once per figure).
type storageCollector struct{ db *storage.DB }

var storageDescs = [...]*prometheus.Desc{
	prometheus.NewDesc("kefir_storage_disk_bytes", "Bytes in the engine's log segment files (what compaction reclaims shrinks it).", nil, nil),
	prometheus.NewDesc("kefir_storage_live_bytes", "Bytes of records the engine's index still points at.", nil, nil),
	prometheus.NewDesc("kefir_storage_keys", "Keys in the engine's index: deleted keys not yet compacted away and the node's internal rows (client table, version reservations) included; DBSIZE counts live user keys.", nil, nil),
}

func (storageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range storageDescs {
		ch <- d
	}
}

func (c storageCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.db.Stats()
	for i, v := range [...]int64{st.DiskBytes, st.LiveBytes, int64(st.Keys)} {
		ch <- prometheus.MustNewConstMetric(storageDescs[i], prometheus.GaugeValue, float64(v))
	}
}
