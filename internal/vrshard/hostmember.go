package vrshard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/vr"
)

// A hosted replica's part of a node's membership wiring (the front door's
// membership.go, docs/design/cluster.md §7 "The node wiring"): the
// reconfiguration as internal/cluster's contract names it, and the
// addresses of members the node learned after the replica opened (the
// group's address record, kv.GroupAddrsKey), which Options.Peers and
// Options.ClientAddrs, fixed at open, cannot name.

// memberAddrs are the addresses the node taught the replica (SetAddrs):
// they take precedence over the Options' (a later word).
type memberAddrs struct {
	peers, clients map[uint64]string
}

// addrBook holds the taught addresses (nil: none yet). Published: the
// driver (admitMembers) and request goroutines (notLeader) read it.
type addrBook struct{ p atomic.Pointer[memberAddrs] }

func (b *addrBook) peer(r *Replica, id uint64) (string, bool) {
	if m := b.p.Load(); m != nil {
		if a, ok := m.peers[id]; ok {
			return a, true
		}
	}
	a, ok := r.opts.Peers[id]
	return a, ok
}

func (b *addrBook) client(r *Replica, id uint64) string {
	if m := b.p.Load(); m != nil {
		if a, ok := m.clients[id]; ok {
			return a
		}
	}
	return r.opts.ClientAddrs[id]
}

// SetAddrs records members' addresses: their client addresses name the
// leader in this replica's redirects from now on, and a peer address its
// transport does not know yet is added to it (a new member of the group;
// one the transport knows keeps its address: a peer that moved is
// redialed at its new address only after a restart).
func (r *Replica) SetAddrs(ms []kcluster.Member) error {
	next := &memberAddrs{peers: map[uint64]string{}, clients: map[uint64]string{}}
	if cur := r.addrs.p.Load(); cur != nil {
		next.peers, next.clients = maps.Clone(cur.peers), maps.Clone(cur.clients)
	}
	for _, m := range ms {
		if m.PeerAddr != "" {
			next.peers[m.ID] = m.PeerAddr
		}
		if m.ClientAddr != "" {
			next.clients[m.ID] = m.ClientAddr
		}
	}
	r.addrs.p.Store(next)
	if r.ep == nil {
		return nil // on Options.Network: the caller delivers
	}
	tr := r.ep.Transport()
	var errs []error
	for _, m := range ms {
		if m.ID == r.cfg.Self || m.PeerAddr == "" || tr.HasPeer(m.ID) {
			continue
		}
		if err := tr.AddPeer(m.ID, m.PeerAddr); err != nil {
			errs = append(errs, fmt.Errorf("vrshard: replica %d: add peer %d at %s: %w", r.cfg.Self, m.ID, m.PeerAddr, err))
		}
	}
	return errors.Join(errs...)
}

var _ kcluster.Reconfigurable = hostedGroup{}

// The cluster's AnyEpoch is VR's (a compile error if they part).
var _ [0]struct{} = [kcluster.AnyEpoch - vr.AnyEpoch]struct{}{}

// Reconfigure is Replica.Reconfigure in the cluster's words (epoch
// kcluster.AnyEpoch is vr.AnyEpoch).
func (g hostedGroup) Reconfigure(ctx context.Context, epoch uint64, members []uint64) (kcluster.Membership, error) {
	m, err := g.r.Reconfigure(ctx, epoch, members)
	var moved *vr.EpochMovedError
	if errors.As(err, &moved) {
		return kcluster.Membership{}, &kcluster.EpochMovedError{Expected: moved.Expected, Epoch: moved.Epoch, Members: moved.Members, Pending: moved.Pending}
	}
	if err != nil {
		return kcluster.Membership{}, err
	}
	return clusterMembership(m), nil
}

// Membership is the replica's durable configuration: the last
// reconfiguration's, or the one it opened with.
func (g hostedGroup) Membership() kcluster.Membership {
	if m, ok := g.r.Membership(); ok {
		return clusterMembership(m)
	}
	c := g.r.opts.VR
	return kcluster.Membership{Epoch: c.Epoch, Members: slices.Clone(c.Members), Start: c.EpochStart, Previous: slices.Clone(c.Previous)}
}

// SetAddrs is Replica.SetAddrs.
func (g hostedGroup) SetAddrs(ms []kcluster.Member) error { return g.r.SetAddrs(ms) }

func clusterMembership(m vr.Membership) kcluster.Membership {
	return kcluster.Membership{Epoch: m.Epoch, Members: slices.Clone(m.Members), Start: m.Start, Previous: slices.Clone(m.Previous)}
}

// vrMembership is the cluster's Membership as VR's (a new member's
// configuration, ReplicaSpec.Membership).
func vrMembership(m kcluster.Membership) vr.Membership {
	return vr.Membership{Epoch: m.Epoch, Members: slices.Clone(m.Members), Start: m.Start, Previous: slices.Clone(m.Previous)}
}
