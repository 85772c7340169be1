package vrshard

import (
	"fmt"
	"slices"

	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/transport"
	"github.com/kefirdb/kefir/internal/vr"
)

// The replica's wiring to the node's peer transport: the transport moves
// group-addressed frames and knows nothing of VR; this replica registers its
// group with VR's codec (internal/wire) as the handler, and sends through
// the group's endpoint (snapshot.go send, nilext.go).

// GroupConfig returns the VR configuration a replica opened with o runs
// (defaults filled in, validated): a node passes its Hash to the transport
// it creates, so the handshake admits only peers of the same group
// configuration.
func GroupConfig(o Options) (vr.Config, error) {
	if err := o.fill(); err != nil {
		return vr.Config{}, err
	}
	return o.VR, nil
}

// openEndpoint registers the replica's group on opts.Transport, or on a
// transport of its own when the node gave none.
func (r *Replica) openEndpoint() error {
	opts := &r.opts
	if opts.Network != nil {
		r.net = opts.Network
		return nil
	}
	tr := opts.Transport
	if tr == nil {
		var err error
		tr, err = transport.New(transport.Config{
			Self: r.cfg.Self, Peers: opts.Peers, ClusterSecret: opts.ClusterSecret,
			Cluster: r.cfg.Cluster, ConfigHash: r.cfg.Hash, TLS: opts.TLS,
			Logger: opts.Logger, MaxFrame: opts.PeerMaxFrame, // the transport adds "replica" itself
		})
		if err != nil {
			return fmt.Errorf("vrshard: transport: %w", err)
		}
		r.ownTr = tr
	}
	// Before Register: deliver may run as soon as it returns, before r.ep
	// is set below, and reads peerTr (whether the links carry this group
	// alone).
	r.peerTr = tr
	ep, err := tr.Register(opts.Group, r.eng.Engine(), r.deliver, r.progress)
	if err != nil {
		if r.ownTr != nil {
			r.ownTr.Close()
		}
		return fmt.Errorf("vrshard: replica %d of group %d on the peer transport: %w", r.cfg.Self, opts.Group, err)
	}
	r.ep, r.net = ep, ep
	if r.ownTr != nil || opts.ownsHandshake {
		tr.AdmitConfigs(r.rc.admitsConfig)
	}
	if r.ownTr != nil && opts.Listener != nil {
		go func() {
			if err := tr.Serve(opts.Listener); err != nil {
				r.log.Error("peer listener stopped", "err", err)
			}
		}()
	}
	return nil
}

// closeEndpoint leaves the transport: the group's endpoint is unregistered,
// and a transport the replica started is closed.
func (r *Replica) closeEndpoint() {
	if r.ep == nil {
		return // on Options.Network
	}
	r.ep.Close()
	if r.ownTr != nil {
		r.ownTr.Close()
	}
}

// deliver decodes one batch of the group's messages from peer `from` (on
// the connection's reader goroutine, as before groups) with the engine's
// codec (peerEngine.Decode) and hands it to the driver, or steps it here
// when the driver is idle (stepInline). A message that does not
// decode, or does not come from `from` to this replica, fails the batch and
// the transport closes the connection.
func (r *Replica) deliver(from uint64, in []frame.Message) error {
	b, err := r.eng.Decode(from, r.cfg.Self, in)
	if err != nil {
		return err
	}
	ib := inbound{from: from, batch: b, at: traceNow()}
	// An idle driver's round runs here (inline.go) only where the link
	// carries this group alone (transport.Alone): while it runs this reader reads nothing
	// else, and any round can take long (a log write held by the kernel's
	// dirty-page limit, a recovering member's sync, applying a large
	// committed batch), so on a node of several groups the others' messages
	// on the link would wait for it (TestSlowRoundOfOneGroupDoesNotStallAnotherOnTheLink:
	// 2.9 s). Nor a large batch's (a snapshot, a page of one, a log of
	// large values), which writes and syncs the state for up to seconds
	// (TestLargeBatchRoundDoesNotStallAnotherOnTheLink): the hand-off saved
	// is nothing against that round.
	if r.peerTr == nil || !r.peerTr.Alone() || batchBytes(in) >= largeMessage || !r.stepInline(ib) {
		r.queueInbound(ib)
	}
	return nil
}

// batchBytes is the size of a batch's message bodies.
func batchBytes(in []frame.Message) int {
	n := 0
	for i := range in {
		n += len(in[i].Body)
	}
	return n
}

// progress passes the transport's "a large message of this group from
// `from` is arriving" to the core (vr.Heard) as an inbound batch without
// messages; when the driver is busy it is dropped, as the next one comes
// 10 ms later.
func (r *Replica) progress(from uint64) {
	select {
	case r.inbox <- inbound{from: from}:
	default:
	}
}

// admitMembers (driver) makes the members of a new configuration
// reachable: the handshake admits them (admitsConfig), and the transport
// learns the address of each one new to it (Options.Peers or the node's
// SetAddrs name it: the group's address record, written before the
// reconfiguration, hostmember.go).
func (r *Replica) admitMembers(m *vr.Membership) error {
	r.rc.admitFrom(r.rc.vrc.Config())
	if r.ep == nil {
		return nil // on Options.Network: the caller delivers
	}
	tr := r.ep.Transport()
	for _, id := range m.Members {
		if id == r.cfg.Self || tr.HasPeer(id) {
			continue
		}
		addr, ok := r.addrs.peer(r, id)
		if !ok {
			// Not an error of this replica's: the group goes on without
			// it (a majority of the new members may still be reachable)
			// until the node learns the address (SetAddrs: a node learns
			// it from the group's address record, which the leader
			// committed before the reconfiguration but this node may
			// read a poll after the epoch starts).
			r.log.Warn("new member's peer address not known yet: reached once the node learns it", "member", id, "epoch", m.Epoch)
			continue
		}
		if err := tr.AddPeer(id, addr); err != nil {
			return fmt.Errorf("vrshard: replica %d: address new member %d of epoch %d: %w", r.cfg.Self, id, m.Epoch, err)
		}
	}
	return nil
}

// admitFrom (driver) sets the peers whose handshake may carry another
// configuration hash than this replica's: once the group has been
// reconfigured (the configuration names previous members), its members and
// previous members, replicas of an adjacent epoch (transport.AdmitConfigs).
// In a group's first epoch none: a node with another member list or epoch
// is refused at the handshake, as before reconfiguration existed
// (TestStaleConfigurationIsRefused; the e2e TestWrongMemberListIsRefused).
// The price: a member that was away during the group's first
// reconfiguration and restarts in the first epoch refuses a peer that
// restarted in the new one (docs/design/cluster.md §7, Limits).
func (rc *reconfState) admitFrom(cfg vr.Config) {
	if len(cfg.Previous) == 0 {
		rc.admit.Store(nil)
		return
	}
	ids := append(slices.Clone(cfg.Members), cfg.Previous...)
	rc.admit.Store(&ids)
}

// admitsConfig is the handshake's rule (transport.AdmitConfigs): a peer of
// another configuration is let through if admitFrom names it; VR's core
// then judges each message (an older epoch is told the new configuration,
// a mismatch in the same epoch is refused). Any other node with another
// configuration is refused at the handshake.
func (rc *reconfState) admitsConfig(node, _ uint64) bool {
	ids := rc.admit.Load()
	return ids != nil && slices.Contains(*ids, node)
}
