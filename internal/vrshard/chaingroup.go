package vrshard

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainmaster"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
)

// A chain group inside a cluster of several groups (kefir cluster add-group
// --engine chain; docs/design/chain.md "A chain in a cluster of groups").
// The group's members open a chain member on the node's one peer transport
// (OpenChainGroup); the chain's configuration record lives in the cluster's
// metadata group, whose every node runs the group's hosted master
// (HostChainMaster on the node's metadata replica), acting at its leader —
// as OpenChainNode does for the single chain of kefir server --engine chain,
// except that the metadata group is the cluster's (the slot map's) and the
// master is started by the node when the map names a chain group, not with
// the member: a metadata node need not be a member of the chain.

// OpenChainGroup is the kcluster.Opener of a chain group's member in a
// cluster of several groups: spec.Transport is the node's transport, and
// spec.ChainMasters the metadata group's members, where the masters run.
func OpenChainGroup(st ChainStoreOptions) kcluster.Opener {
	return func(spec kcluster.ReplicaSpec) (kcluster.Hosted, error) {
		if spec.Transport == nil || len(spec.ChainMasters) == 0 {
			return kcluster.Hosted{}, fmt.Errorf("chain member %d of group %d: a chain group of a cluster needs the node's transport and the metadata group's members", spec.Self, spec.Group)
		}
		if spec.Nilext || spec.FollowerReads {
			return kcluster.Hosted{}, fmt.Errorf("chain member %d: --nilext and --follower-reads are VR's", spec.Self)
		}
		opts := hostedOptions(spec)
		opts.Transport, opts.Group = spec.Transport, uint64(spec.Group)
		co := &ChainOptions{Master: ChainMasterID, Masters: slices.Clone(spec.ChainMasters), MastersFollowMap: true,
			Store: st.Store, Flush: st.Flush, NoLogMember: st.NoLogMember, PrecopyRate: st.PrecopyRate}
		lm := new(atomic.Pointer[chainmaster.Master])
		// This node may host one of the masters — now or later, once the
		// map names it a metadata member (SetChainMasters): what the
		// member sends it, and what other members send it through this
		// group's endpoint, is handed to it once the node starts it, and
		// dropped before (as the master would drop it at a node that
		// does not lead the metadata group).
		co.LocalMaster = func(msgs []chain.Msg) {
			if m := lm.Load(); m != nil {
				m.Deliver(msgs)
			}
		}
		opts.Chain = co
		r, err := Open(opts)
		if err != nil {
			return kcluster.Hosted{}, fmt.Errorf("open chain member %d of group %d (cluster %d): %w", spec.Self, spec.Group, spec.Cluster, err)
		}
		r.groupMaster = lm
		return kcluster.Hosted{Replica: r, Group: r.Hosted(), Engine: r.Engine(), Transport: spec.Transport}, nil
	}
}

// SetChainMasters makes ids — the metadata group's members as the node's
// map names them now — the nodes r, a chain group's member in a cluster of
// several groups, sends its master's messages to and takes the master's
// from (ChainOptions.MastersFollowMap). The node calls it as its map
// changes (kcluster.ChainMastersFollower); on any other replica it does
// nothing.
func (r *Replica) SetChainMasters(ids []uint64) {
	if h, ok := r.core.(*chainHost); ok && h.followsMap && len(ids) > 0 {
		h.setMasters(ids)
	}
}

// ChainMasters is, for r a chain member whose master the metadata group
// hosts, the metadata nodes it sends its master's messages to now
// (SetChainMasters); nil on any other replica.
func (r *Replica) ChainMasters() []uint64 {
	if h, ok := r.core.(*chainHost); ok && h.viaMeta {
		return slices.Clone(h.mastersNow())
	}
	return nil
}

var _ kcluster.ChainMastersFollower = (*Replica)(nil)

// HostChainMaster starts this node's master of chain group s.Group, hosted
// by g — the node's replica of the cluster's metadata group. With s.Local
// (this node is a member of the chain) the master speaks through the
// member's endpoint, as OpenChainNode's does; without, it registers the
// group on s.Transport itself.
func (g hostedGroup) HostChainMaster(s kcluster.ChainMasterSpec) (kcluster.HostedChainMaster, error) {
	mc := chainmaster.Config{Self: g.r.cfg.Self, As: ChainMasterID, Members: slices.Clone(s.Members),
		Group: uint64(s.Group), Meta: g.r.ChainMeta(), Logger: s.Logger}
	var local *Replica
	if s.Local != nil {
		lr, ok := s.Local.(*Replica)
		if !ok || lr.groupMaster == nil {
			return nil, fmt.Errorf("chain group %d: this node's member is not a chain group's member", s.Group)
		}
		local = lr
		mc.Send = lr.sendFromMaster
	} else {
		mc.Transport = s.Transport
	}
	m, err := chainmaster.Start(mc)
	if err != nil {
		return nil, fmt.Errorf("chain group %d: the hosted master: %w", s.Group, err)
	}
	if local != nil {
		local.groupMaster.Store(m)
	}
	return &groupMaster{m: m, local: local}, nil
}

// groupMaster is a node's running master of a chain group of a cluster
// (HostChainMaster).
type groupMaster struct {
	m     *chainmaster.Master
	local *Replica // the node's member of the chain, if it is one
}

func (x *groupMaster) RestartChainWithout(ids []uint64) (string, error) {
	return restartWithout(x.m, ids)
}

func (x *groupMaster) Stop() {
	if x.local != nil {
		x.local.groupMaster.CompareAndSwap(x.m, nil)
	}
	x.m.Close()
}

var _ kcluster.ChainMasterHost = hostedGroup{}
