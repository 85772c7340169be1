package vrshard

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainmaster"
	"github.com/kefirdb/kefir/internal/chainwire"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/transport"
)

// ChainMeta is r — a replica of the metadata group — as a hosted chain
// master's metadata group (chainmaster.Config.Meta).
func (r *Replica) ChainMeta() chainmaster.Meta { return chainMeta{r} }

type chainMeta struct{ r *Replica }

// leaseProbe is the key the leadership read reads: any key would do (it is
// absent); a linearizable read succeeds only at the leader under its lease.
var leaseProbe = []byte("kefir-chain-master-lease")

// Read is a linearizable read (leader, lease, and everything committed
// before it applied), then the record from the engine, which has applied at
// least as much: reserved records are not readable by ops.
func (m chainMeta) Read(ctx context.Context, group uint64) (*kv.ChainConfig, error) {
	if _, err := m.r.Read(ctx, kv.Op{Kind: kv.KindGet, Key: leaseProbe}, level.ConsLinearizable, shard.Session{}); err != nil {
		return nil, err
	}
	return readChainRecord(m.r.Engine(), group)
}

// readChainRecord is chain group's configuration as db has applied it (nil:
// none recorded), read from the engine directly: reserved records are not
// readable by ops.
func readChainRecord(db *storage.DB, group uint64) (*kv.ChainConfig, error) {
	v, err := db.Get(kv.ChainConfigKey(group))
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("chain %d's configuration: %w", group, err)
	}
	c, err := kv.DecodeChainConfig(v.Data)
	if err != nil {
		return nil, fmt.Errorf("chain %d's configuration at version %d: %w", group, v.Version, err)
	}
	return c, nil
}

// Wants is chain group's wanted change as the cluster map records it
// (kv.MapGroup's Joining and Leaving, KindMapChainWant), the places its
// failures left (Dropped) and the map's nodes, read from the engine as the record is, right
// after a leadership read (the master reads it then): none, not Mapped,
// when the metadata group holds no map (a lone chain's) or the map has no
// such chain.
func (m chainMeta) Wants(group uint64) (chainmaster.Want, error) {
	v, err := m.r.Engine().Get(kv.ClusterMapKey)
	if errors.Is(err, storage.ErrNotFound) {
		return chainmaster.Want{}, nil
	}
	if err != nil {
		return chainmaster.Want{}, fmt.Errorf("the cluster map: %w", err)
	}
	cm, err := kv.DecodeClusterMap(v.Data)
	if err != nil {
		return chainmaster.Want{}, fmt.Errorf("the cluster map at version %d: %w", v.Version, err)
	}
	g, ok := cm.Group(group)
	if !ok || !g.IsChain() {
		return chainmaster.Want{}, nil
	}
	return chainmaster.Want{Joining: g.Joining, Leaving: g.Leaving, Dropped: g.Dropped, Nodes: cm.NodeIDs(), Mapped: true}, nil
}

var _ chainmaster.MetaWants = chainMeta{}

// Commit writes op (sync: on a majority's disks) at r, which must lead.
func (m chainMeta) Commit(ctx context.Context, op kv.Op) (kv.Result, error) {
	if op.Kind != kv.KindMapChainInit && op.Kind != kv.KindMapChainSet {
		return kv.Result{}, fmt.Errorf("chain master: %s is not a chain configuration op", op.Kind)
	}
	return m.r.Write(ctx, op, level.Sync, shard.ReqID{})
}

// ChainMasterID is the id a chain's members know their hosted master by
// (ChainOptions.Master with Masters): outside any chain, on no transport.
const ChainMasterID uint64 = 1 << 62

// metaGroupID is the metadata group's group id on a node's transport.
const metaGroupID = uint64(kcluster.MetaGroupID)

// ChainNode is how a chain node hosts its master: the metadata group's
// members (Meta, ids), its replica's options there (MetaOptions: Dir, VR
// timing; Transport, Group, members and Chain are set here) and the
// master's (Master: timing and logger; the rest is set here).
type ChainNode struct {
	Meta        []uint64
	MetaOptions Options
	Master      chainmaster.Config
}

// OpenChainNode opens a chain member (opts, opts.Chain set, on
// opts.Transport) whose master is hosted by the metadata group n.Meta:
// on a node of that group it also opens the node's replica of it (group
// kcluster.MetaGroupID on the same transport) and a hosted master, which the
// member's Close stops first. The master speaks through the member's
// endpoint, since the node's chain group is the member's.
func OpenChainNode(opts Options, n ChainNode) (*Replica, error) {
	if opts.Chain == nil || opts.Transport == nil {
		return nil, fmt.Errorf("chain node %d: need chain options and a transport", opts.VR.Self)
	}
	self := opts.VR.Self
	hosts := slices.Contains(n.Meta, self)
	var master atomic.Pointer[chainmaster.Master]
	co := *opts.Chain
	co.Master, co.Masters = ChainMasterID, slices.Clone(n.Meta)
	if hosts {
		co.LocalMaster = func(msgs []chain.Msg) {
			if m := master.Load(); m != nil {
				m.Deliver(msgs)
			}
		}
	}
	opts.Chain = &co
	r, err := Open(opts)
	if err != nil || !hosts {
		return r, err
	}
	mo := n.MetaOptions
	mo.Transport, mo.Group, mo.Chain = opts.Transport, metaGroupID, nil
	mo.VR.Members, mo.VR.Self, mo.VR.Cluster = slices.Clone(n.Meta), self, opts.VR.Cluster
	meta, err := Open(mo)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("chain node %d: the metadata group's replica: %w", self, err)
	}
	mc := n.Master
	mc.Self, mc.As, mc.Members, mc.Group, mc.Meta = self, ChainMasterID, slices.Clone(opts.VR.Members), opts.Group, meta.ChainMeta()
	mc.Send = r.sendFromMaster
	mc.Mode = co.Mode // the chain's, as every member's flag says (the master refuses one that differs)
	// The takeover waits out the members' leases: never less than theirs
	// (a shorter Master.Lease would let a new master act while an old
	// master's grant still runs).
	memberLease := co.Lease
	if memberLease <= 0 {
		memberLease = chainmaster.DefaultLease // the member's default (chainHost)
	}
	mc.Lease = max(mc.Lease, memberLease)
	m, err := chainmaster.Start(mc)
	if err != nil {
		meta.Close()
		r.Close()
		return nil, fmt.Errorf("chain node %d: the hosted master: %w", self, err)
	}
	master.Store(m)
	r.hostedMeta, r.hostedMaster = meta, m
	r.beforeClose = append(r.beforeClose, m.Close, func() { meta.Close() })
	return r, nil
}

// sendFromMaster sends a message of this node's hosted master on the
// chain's endpoint; one for this node's own member is handed to its driver.
// The master holds its lock meanwhile, so the hand-over must end when the
// driver does: stopped (Close) or failed (a disk error: fail, which closes
// r.done but not r.stop) — the message is then dropped, as a link to a
// dead member drops it.
//
// The master goes on after its own member failed: it hears the members on
// the transport's reader (chainHost.Decode), not through the driver, so
// its own member falls silent and is failed like any other, and the
// metadata group keeps its three replicas.
func (r *Replica) sendFromMaster(to uint64, m *chain.Msg) {
	if to == r.cfg.Self {
		c := *m
		c.Members, c.Path = slices.Clone(m.Members), slices.Clone(m.Path)
		r.queueInbound(inbound{from: to, batch: &chainBatch{[]chain.Msg{c}}})
		return
	}
	if err := r.ep.Send(to, chainwire.Payload(m)); err != nil && !errors.Is(err, transport.ErrClosed) {
		r.log.Warn("chain master: send", "to", to, "type", m.Type.String(), "err", err)
	}
}

// OpenHostedChainNode is the kcluster.Opener of a chain member whose
// master the metadata group hosts (--engine chain without --chain-master):
// the metadata group is the first kcluster.MetaReplicas nodes by id
// (kcluster.MetaMembers), each hosting a replica of it in DIR/chain-meta
// beside the member's DIR/vr, and a master (OpenChainNode). failAfter is
// the masters' failure timeout (0: chainmaster's default). One group per
// node, as OpenHostedChain.
func OpenHostedChainNode(failAfter time.Duration, st ChainStoreOptions) kcluster.Opener {
	return func(spec kcluster.ReplicaSpec) (kcluster.Hosted, error) {
		if err := chainSpecOK(spec); err != nil {
			return kcluster.Hosted{}, err
		}
		opts := hostedOptions(spec)
		opts.Chain = &ChainOptions{Store: st.Store, Flush: st.Flush, NoLogMember: st.NoLogMember, PrecopyRate: st.PrecopyRate, Mode: st.Mode}
		tr, err := transport.New(transport.Config{Self: spec.Self, Peers: opts.Peers, ClusterSecret: spec.ClusterSecret,
			Cluster: spec.Cluster, Logger: opts.Logger})
		if err != nil {
			return kcluster.Hosted{}, fmt.Errorf("peer transport of node %d: %w", spec.Self, err)
		}
		opts.Transport = tr
		mo := hostedOptions(spec)
		// Not group-65535/: a node's directory with group-* in it is a
		// multi-group node's (the server refuses it without --groups).
		mo.Dir = filepath.Join(filepath.Dir(spec.Dir), "chain-meta")
		mo.Logger = opts.Logger.With("group", metaGroupID)
		mo.CheckpointOps = 0
		meta := kcluster.MetaMembers(opts.VR.Members)
		if len(meta) < kcluster.MetaReplicas {
			opts.Logger.Warn("chain: fewer than three members: the metadata group hosting the master is one node, whose loss stops the chain (use --chain-master to survive it)",
				"metadata group", meta, "members", opts.VR.Members)
		}
		r, err := OpenChainNode(opts, ChainNode{Meta: meta, MetaOptions: mo,
			Master: chainmaster.Config{FailAfter: failAfter, Logger: opts.Logger.With("component", "chain-master")}})
		if err != nil {
			tr.Close()
			return kcluster.Hosted{}, fmt.Errorf("open chain member %d of cluster %d: %w", spec.Self, spec.Cluster, err)
		}
		return kcluster.Hosted{Replica: r, Group: r.Hosted(), Engine: r.Engine(), Transport: tr}, nil
	}
}

// RestartChainWithout asks this node's hosted master to restart a chain
// that is down without the members ids (chainmaster.Master.RestartWithout):
// the operator's way out when a member whose disk is gone for good keeps
// the whole-chain restart waiting. Only the acting master (the metadata
// leader's) does it: kcluster.ErrNotActing elsewhere, a node hosting none
// (not of the chain's metadata group) included.
func (g hostedGroup) RestartChainWithout(ids []uint64) (string, error) {
	if g.r.hostedMaster == nil {
		return "", fmt.Errorf("%w (this node hosts no chain master: not of the chain's metadata group)", kcluster.ErrNotActing)
	}
	return restartWithout(g.r.hostedMaster, ids)
}

// restartWithout is m.RestartWithout with chainmaster's "not acting" as
// kcluster.ErrNotActing, which the admin port answers 503 (ask another).
func restartWithout(m *chainmaster.Master, ids []uint64) (string, error) {
	msg, err := m.RestartWithout(ids)
	if errors.Is(err, chainmaster.ErrNotActing) {
		err = fmt.Errorf("%w: %w", kcluster.ErrNotActing, err)
	}
	return msg, err
}

var _ kcluster.ChainRestarter = hostedGroup{}
