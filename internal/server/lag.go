package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kefirdb/kefir/internal/cluster"
)

// Replication lag in /status and /metrics (issue 28: "the HTTP admin shows
// the map, each group's leader, lag and slot counts"). Two figures, both in
// ops of the group's log: a replica's own apply lag (its commit point less
// what it applied), and, at a VR leader, each follower's lag (the leader's
// commit point less what the follower last reported applied), from the
// leader's view as of its last tick (vrshard Replica.Peers).

// FollowerLag is one follower as its group's leader sees it.
type FollowerLag struct {
	ID        uint64 `json:"id"`
	Persisted uint64 `json:"persisted_op"`
	Applied   uint64 `json:"applied_op"`
	Lag       uint64 `json:"lag_ops"`
}

// opsBehind is how far at is behind commit (0 if not).
func opsBehind(commit, at uint64) uint64 {
	if at >= commit {
		return 0
	}
	return commit - at
}

// followerLags is st's followers' lag (nil unless st is a VR leader's).
func followerLags(st cluster.State) []FollowerLag {
	if len(st.Followers) == 0 {
		return nil
	}
	out := make([]FollowerLag, len(st.Followers))
	for i, f := range st.Followers {
		out[i] = FollowerLag{ID: f.ID, Persisted: f.Persisted, Applied: f.Applied, Lag: opsBehind(st.Commit, f.Applied)}
	}
	return out
}

// groupsCollector exports each hosted group's replication state at a node
// of several groups, labelled by group (the node-wide kefir_vr_* gauges
// report its first group only).
type groupsCollector struct{ s *Server }

var (
	groupCommitDesc      = prometheus.NewDesc("kefir_group_commit_op", "The commit point this node's replica of the group knows.", []string{"group"}, nil)
	groupAppliedDesc     = prometheus.NewDesc("kefir_group_applied_op", "The op this node's replica of the group has applied.", []string{"group"}, nil)
	groupLagDesc         = prometheus.NewDesc("kefir_group_lag_ops", "Ops this node's replica of the group has not applied yet of those it knows committed.", []string{"group"}, nil)
	groupLeaderDesc      = prometheus.NewDesc("kefir_group_is_leader", "1 if this node's replica leads the group.", []string{"group"}, nil)
	groupSlotsDesc       = prometheus.NewDesc("kefir_group_slots", "Slots the group owns in the cluster map this node follows.", []string{"group"}, nil)
	groupFollowerLagDesc = prometheus.NewDesc("kefir_group_follower_lag_ops", "At the group's leader: ops a follower has not reported applied of those the leader knows committed.", []string{"group", "follower"}, nil)
)

func (groupsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{groupCommitDesc, groupAppliedDesc, groupLagDesc, groupLeaderDesc, groupSlotsDesc, groupFollowerLagDesc} {
		ch <- d
	}
}

func (c groupsCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.s.multi
	if m == nil {
		return
	}
	for _, g := range m.Slots().Groups {
		id := strconv.FormatUint(uint64(g.ID), 10)
		slots := 0
		for _, r := range g.Slots {
			slots += int(r.End) - int(r.Start) + 1
		}
		ch <- prometheus.MustNewConstMetric(groupSlotsDesc, prometheus.GaugeValue, float64(slots), id)
		st, ok := m.GroupState(g.ID)
		if !ok {
			continue // not hosted here
		}
		leader := 0.0
		if st.IsLeader {
			leader = 1
		}
		ch <- prometheus.MustNewConstMetric(groupCommitDesc, prometheus.GaugeValue, float64(st.Commit), id)
		ch <- prometheus.MustNewConstMetric(groupAppliedDesc, prometheus.GaugeValue, float64(st.Applied), id)
		ch <- prometheus.MustNewConstMetric(groupLagDesc, prometheus.GaugeValue, float64(opsBehind(st.Commit, st.Applied)), id)
		ch <- prometheus.MustNewConstMetric(groupLeaderDesc, prometheus.GaugeValue, leader, id)
		for _, f := range followerLags(st) {
			ch <- prometheus.MustNewConstMetric(groupFollowerLagDesc, prometheus.GaugeValue, float64(f.Lag), id, strconv.FormatUint(f.ID, 10))
		}
	}
}
