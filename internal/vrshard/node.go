package vrshard

import (
	"context"
	"errors"
	"fmt"
	"maps"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vr"
)

// This file is the replica as a node hosts it (internal/cluster's contract):
// OpenHosted is the kcluster.Opener the binary hands the front door, and
// hostedGroup reports the replica's VR state in the cluster's words. The
// front door knows neither this package nor internal/vr. (The import is
// named kcluster: this package's tests have a type named cluster.)

var _ kcluster.Opener = OpenHosted

// OpenHosted opens a node's VR replica of its group in spec.Dir, on a new
// node transport (the node hands it every accepted peer connection and
// closes it after the replica).
func OpenHosted(spec kcluster.ReplicaSpec) (kcluster.Hosted, error) {
	opts := hostedOptions(spec)
	// The node's peer transport: its handshake admits peers of the same
	// cluster and group configuration (members, epoch, lease timing), whose
	// hash is the one the replica runs with, defaults filled in.
	if spec.Transport != nil {
		// One of several groups on the node's transport (issue 28): the
		// node made it and serves its peer port; the replica registers
		// its group there.
		opts.Transport, opts.Group = spec.Transport, uint64(spec.Group)
		r, err := Open(opts)
		if err != nil {
			return kcluster.Hosted{}, fmt.Errorf("open VR replica %d of group %d (cluster %d): %w", spec.Self, spec.Group, spec.Cluster, err)
		}
		return kcluster.Hosted{Replica: r, Group: r.Hosted(), Engine: r.Engine(), Transport: spec.Transport}, nil
	}
	gcfg, err := GroupConfig(opts)
	if err != nil {
		return kcluster.Hosted{}, fmt.Errorf("VR replica %d of cluster %d: %w", spec.Self, spec.Cluster, err)
	}
	return openOnTransport(opts, transport.Config{
		Self: spec.Self, Peers: opts.Peers, ClusterSecret: spec.ClusterSecret,
		Cluster: gcfg.Cluster, ConfigHash: gcfg.Hash(),
		Logger: opts.Logger, // the transport adds "replica" itself
	}, fmt.Sprintf("VR replica %d of cluster %d", spec.Self, spec.Cluster))
}

// openOnTransport opens the replica on a new node transport made from tc
// (closed again if the replica does not open); what names the replica in
// errors.
func openOnTransport(opts Options, tc transport.Config, what string) (kcluster.Hosted, error) {
	tr, err := transport.New(tc)
	if err != nil {
		return kcluster.Hosted{}, fmt.Errorf("peer transport of node %d: %w", tc.Self, err)
	}
	opts.Transport, opts.ownsHandshake = tr, true
	r, err := Open(opts)
	if err != nil {
		tr.Close()
		return kcluster.Hosted{}, fmt.Errorf("open %s: %w", what, err)
	}
	return kcluster.Hosted{Replica: r, Group: r.Hosted(), Engine: r.Engine(), Transport: tr}, nil
}

// hostedOptions are the replica's Options for a node's spec.
func hostedOptions(spec kcluster.ReplicaSpec) Options {
	peers := map[uint64]string{}
	clients := map[uint64]string{}
	ids := make([]uint64, len(spec.Members))
	for i, m := range spec.Members {
		ids[i] = m.ID
		peers[m.ID] = m.PeerAddr
		clients[m.ID] = m.ClientAddr
	}
	o := Options{
		Dir: spec.Dir,
		FS:  spec.FS,
		VR: vr.Config{
			Cluster: spec.Cluster, Members: ids, Self: spec.Self,
			HeartbeatInterval: spec.HeartbeatInterval, ViewChangeTimeout: spec.ViewChangeTimeout,
			NilextBatch: spec.NilextBatch, NilextInterval: spec.NilextInterval,
		},
		NilextSyncDelay: spec.NilextSyncDelay,
		CadSyncDelay:    spec.CadSyncDelay,
		CheckpointOps:   spec.CheckpointOps,
		Bootstrap:       spec.Bootstrap,
		Nilext:          spec.Nilext,
		FollowerReads:   spec.FollowerReads,
		ClockSkew:       spec.ClockSkew,
		ActiveExpiry:    activeExpiry(spec.ActiveExpiry),
		Peers:           peers,
		ClientAddrs:     clients,
		ClusterSecret:   spec.ClusterSecret,
		Storage:         spec.Storage,
		OnLogSync:       spec.OnLogSync,
		Logger:          spec.Logger,
	}
	if ask := spec.AskTail; ask != nil {
		group := spec.Group
		o.AskTail = func(ctx context.Context, _ uint64, addr string, epoch uint64) (uint64, error) {
			if addr == "" {
				return 0, errors.New("the tail's client address is not known")
			}
			return ask(ctx, addr, group, epoch)
		}
	}
	if spec.Membership != nil {
		// A new member of a reconfigured group: the reported
		// configuration, an empty disk and no Bootstrap (it pulls the
		// state); its transport's handshake hash is this configuration's.
		o.VR = vrMembership(*spec.Membership).Apply(o.VR)
	}
	return o
}

// OpenHostedChain is the kcluster.Opener of a chain member (--engine
// chain): the node's group is a chain (spec.Members, head first) whose
// master, node master at masterAddr, runs elsewhere (kefir chain-master).
// The node's transport admits the members and the master: its handshake
// compares the cluster id and the sorted node ids (the transport's derived
// hash), which the master computes alike. One group per node: a chain in a
// multi-group cluster (--groups) is not built.
func OpenHostedChain(master uint64, masterAddr string, st ChainStoreOptions) kcluster.Opener {
	return func(spec kcluster.ReplicaSpec) (kcluster.Hosted, error) {
		if err := chainSpecOK(spec); err != nil {
			return kcluster.Hosted{}, err
		}
		opts := hostedOptions(spec)
		opts.Chain = &ChainOptions{Master: master, Store: st.Store, Flush: st.Flush, NoLogMember: st.NoLogMember, PrecopyRate: st.PrecopyRate, Mode: st.Mode}
		peers := maps.Clone(opts.Peers)
		peers[master] = masterAddr
		return openOnTransport(opts, transport.Config{
			Self: spec.Self, Peers: peers, ClusterSecret: spec.ClusterSecret, Cluster: spec.Cluster,
			Logger: opts.Logger,
		}, fmt.Sprintf("chain member %d of cluster %d", spec.Self, spec.Cluster))
	}
}

// chainSpecOK refuses what a chain member does not run: a group of a
// multi-group cluster (a shared transport) and VR's options.
func chainSpecOK(spec kcluster.ReplicaSpec) error {
	if spec.Transport != nil {
		return fmt.Errorf("chain member %d: a chain in a cluster of several groups is not built", spec.Self)
	}
	if spec.Nilext || spec.FollowerReads {
		return fmt.Errorf("chain member %d: --nilext and --follower-reads are VR's", spec.Self)
	}
	return nil
}

// Hosted returns r's replication side as a node's front door sees it.
func (r *Replica) Hosted() kcluster.Group { return hostedGroup{r} }

// ReadPaths: a replica answers reads that wait for durability at once with
// a held reply (ReadDeferred), and a leader under a running lease serves
// reads without waiting (TryRead). ReadKey is Read.
func (r *Replica) ReadPaths() shard.ReadPaths {
	return shard.ReadPaths{Deferred: true, Inline: true}
}

// ReadKey is Read of a GET of key (shard.Replica); the front door uses
// ReadDeferred here (ReadPaths).
func (r *Replica) ReadKey(key []byte, c level.Consistency, s shard.Session) ([]byte, uint64, bool, error) {
	res, err := r.Read(context.Background(), kv.Op{Kind: kv.KindGet, Key: key}, c, s)
	if err != nil {
		return nil, 0, false, err
	}
	return res.Bulk, res.Version, res.Kind == kv.ResBulk, nil
}

// hostedGroup is a Replica as kcluster.Group.
type hostedGroup struct{ r *Replica }

var _ kcluster.Group = hostedGroup{}

func (g hostedGroup) State() kcluster.State {
	in := g.r.Info()
	return kcluster.State{Self: in.Self, Role: role(in), Status: in.Status.String(), Normal: in.Status == vr.Normal,
		View: in.View, Leader: in.Leader, IsLeader: in.IsLeader, Commit: in.Commit, Applied: in.Applied,
		Failed: in.Failed, DLogLen: in.DLogLen, Readable: in.Readable,
		NilextCycles: in.NilextCycles, NilextStaleWaits: in.NilextStaleWaits, DLogStale: in.DLogStale,
		Epoch: in.Epoch, Joining: in.Joining, Leaving: in.Leaving, Retired: in.Retired,
		Followers: g.r.Peers()}
}

// role names what a replica does now.
func role(in Info) string {
	switch {
	case in.Failed != nil:
		return kcluster.RoleFailed
	case in.Status == vr.Recovering:
		return kcluster.RoleRecovering
	case in.Status == vr.ViewChange:
		return kcluster.RoleViewChange
	case in.IsLeader:
		return kcluster.RoleLeader
	}
	return kcluster.RoleFollower
}

func (g hostedGroup) Stats() kcluster.Stats            { return g.r.Stats() }
func (g hostedGroup) ViewEvents() []kcluster.ViewEvent { return g.r.ViewEvents() }
func (g hostedGroup) NilextOn() bool                   { return g.r.NilextOn() }
func (g hostedGroup) NilextEligible(op *kv.Op) bool    { return NilextEligible(op) }
func (g hostedGroup) NilextApply(ctx context.Context, reqs []shard.WriteReq) ([]int, error) {
	return g.r.NilextApply(ctx, reqs)
}

func (g hostedGroup) NilextTake(ctx context.Context, id shard.ReqID, op kv.Op, d level.Durability) (kcluster.NilextAck, error) {
	a, err := g.r.NilextTake(ctx, id, op, d)
	return nilextAck(a), nilextError(err)
}

func (g hostedGroup) NilextTakeBatch(ctx context.Context, ups []kcluster.NilextDirect) ([]kcluster.NilextAck, []error) {
	as, errs := g.r.NilextTakeBatch(ctx, ups)
	acks := make([]kcluster.NilextAck, len(as))
	for i, a := range as {
		acks[i] = nilextAck(a)
	}
	for i, err := range errs {
		errs[i] = nilextError(err)
	}
	return acks, errs
}

func nilextAck(a vr.NilextAck) kcluster.NilextAck {
	return kcluster.NilextAck{View: a.View, From: a.From, Leader: a.Leader}
}

// nilextError marks the refusals that are the client's mistake (an update
// the fast path may not take, an older request than one already taken, the
// fast path off) as kcluster.RequestError: the client must not send them
// again.
func nilextError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNilextInvalid), errors.Is(err, ErrNilextStale), errors.Is(err, vr.ErrNilextOff):
		return &kcluster.RequestError{Err: err}
	}
	return err
}
