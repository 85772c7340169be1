package vrshard

import (
	"time"

	"github.com/kefirdb/kefir/internal/vr"
)

// group is the host's engine-neutral view of its replica group's
// configuration: who is in it, who this replica is, the identity its
// peers must share, and the few figures the host's own policy needs. An
// engine's own configuration (VR's vr.Config: epoch, lease timing, the
// nilext and follower-read switches) stays the engine's; Open derives the
// group from it (vrGroup for VR's core, neutralGroup before any core is
// open and for another core).
type group struct {
	// Cluster identifies the group on the node's peer transport.
	Cluster uint64
	// Self is this replica's id, one of Members.
	Self    uint64
	Members []uint64
	// Hash is the configuration identity a peer's handshake must match
	// (VR: vr.Config.Hash: members, epoch, lease timing).
	Hash uint64
	// ClientCap is how many clients the core's client table holds
	// (maybeForgetRows forgets the engine's rows beyond it).
	ClientCap int
	// ViewChangeTimeout is about how long the group takes to replace a
	// silent leader: snapshot holds (snapshot.go) and the view events'
	// reasons (viewlog.go) use it.
	ViewChangeTimeout time.Duration
	// leaderOf is the engine's rule for the leader of a view (VR: the
	// members in turn); nil: the core's Info names the current view's
	// (Replica.leaderOf).
	leaderOf func(view uint64) uint64
}

// neutralGroup is the group cfg describes, without an engine's leader
// rule: what a core other than VR's is opened with (Options.newCore).
func neutralGroup(cfg vr.Config) group {
	g := group{Cluster: cfg.Cluster, Self: cfg.Self, Members: cfg.Members, Hash: cfg.Hash(),
		ClientCap: cfg.ClientCap, ViewChangeTimeout: cfg.ViewChangeTimeout}
	if g.ClientCap <= 0 {
		g.ClientCap = vr.MaxClients // kv's client table under VR's count rule, which every core keeps
	}
	return g
}

// vrGroup is the group of VR's core, whose configuration is cfg (its
// defaults filled in), with VR's leader rule.
func vrGroup(cfg vr.Config) group {
	g := neutralGroup(cfg)
	g.leaderOf = cfg.LeaderOf
	return g
}

// leaderOf is the leader of view: the engine's rule, or, for a core
// without one, the leader its Info names if view is its current view (0:
// not known).
func (r *Replica) leaderOf(view uint64) uint64 {
	if r.cfg.leaderOf != nil {
		return r.cfg.leaderOf(view)
	}
	if i := r.core.Info(); i.View == view {
		return i.Leader
	}
	return 0
}
