package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// GroupID names a replica group of the cluster.
type GroupID uint64

// Router answers, for a node's front door, which group serves a key, where
// that group's leader is, and how a request this node cannot serve gets
// there: forwarded to the leader's client port (forward.go), or redirected
// with -MOVED when the client asked for redirects.
//
// Today a cluster is one group, and every key maps to it: the router is
// shaped for the slot map of issue 28 (key → Slot → group → leader). With
// several groups, GroupOf reads the slot map, the node serves keys of the
// groups it hosts through each group's replica, and a key of a group it does
// not host is answered "-MOVED <slot> <addr>" (Redis Cluster's redirect) from
// here, as a not-leader error is today.
type Router struct {
	group GroupID
	// members: the group's members as the node knows them now (SetMembers
	// after a reconfiguration or an address record; copy on write).
	members atomic.Pointer[[]Member]
	// local is this node's replica of the group (nil on a single node): it
	// names the leader it follows.
	local Group
	fwd   *forwarder
}

// RouterConfig configures a Router.
type RouterConfig struct {
	// Group is the one group of the cluster today; Members its replicas in
	// leader order (none on a single node).
	Group   GroupID
	Members []Member
	// Local is this node's replica of Group, nil on a single node.
	Local Group
	// Password authenticates forwarding connections (the members share
	// it); TLSCert and TLSKey, when set, are the group's client-port
	// certificate, the only one a forwarding connection trusts.
	Password, TLSCert, TLSKey string
	// Stopping reports that the node shuts down: forwarding stops
	// retrying (nil: never).
	Stopping func() bool
}

// NewRouter returns a router for cfg.
func NewRouter(cfg RouterConfig) *Router {
	f := newForwarder(cfg.Password, cfg.TLSCert, cfg.TLSKey)
	f.stopping = cfg.Stopping
	r := &Router{group: cfg.Group, local: cfg.Local, fwd: f}
	r.SetMembers(cfg.Members)
	return r
}

// SetMembers replaces the members the router resolves the leader's address
// among (a node's group was reconfigured, or learned an address).
func (r *Router) SetMembers(ms []Member) {
	ms = slices.Clone(ms)
	r.members.Store(&ms)
}

// GroupOf returns the group that serves key. One group today: every slot
// is its own.
func (r *Router) GroupOf(key []byte) GroupID {
	_ = key // issue 28: r.slots[Slot(key)]
	return r.group
}

// Leader returns the client address of the group's leader as this node's
// replica knows it in a normal view (its own when it leads: a request
// forwarded to itself runs as a client's), or false during a view change
// and on a single node.
func (r *Router) Leader() (string, bool) {
	if r.local == nil {
		return "", false
	}
	st := r.local.State()
	if !st.Normal || st.Leader == 0 {
		return "", false
	}
	for _, m := range *r.members.Load() {
		if m.ID == st.Leader && m.ClientAddr != "" {
			return m.ClientAddr, true
		}
	}
	return "", false
}

// LeaderFor returns where to forward a request that failed with err, or
// false when err is not a redirect (or no leader is known).
func (r *Router) LeaderFor(err error) (string, bool) {
	if !errors.Is(err, ErrNotLeader) {
		return "", false
	}
	_, addr, ok := LeaderOf(err)
	return addr, ok && addr != ""
}

// Redirect is the reply to a request that failed with err (a not-leader
// error) and asked for redirects, or cannot be forwarded: -MOVED <leader's
// client address>, or -UNAVAILABLE no leader.
func (r *Router) Redirect(err error) error { return Redirect(err) }

// Redirect is Router.Redirect for a front door without a router at hand
// (error texts).
func Redirect(err error) error {
	if _, addr, ok := LeaderOf(err); ok && addr != "" {
		return &ReplyError{"MOVED " + addr}
	}
	return ErrNoLeader
}

// Forward sends calls to addr (the leader as the error that refused them
// named it; "" when none is known) as one pipeline and fills in their
// outcomes, retrying what got no answer, with the same request ids, at the
// leader Leader names, until each call has the leader's answer or the retry
// bound passed (forward.go).
func (r *Router) Forward(addr string, calls []*Call) {
	r.fwd.forward(addr, calls, r.Leader)
}

// AskChainVersion asks the chain member at client address addr (its
// group's tail) for its version in epoch: KEFIR.CHAINVERSION group epoch,
// once, on a pooled forwarding connection, bounded by ctx. An error — the
// tail refused (not the tail, another epoch, no lease), an older node that
// knows no such command, no answer — tells the asker to send its read to
// the tail whole (vrshard chainVersionRead).
func (r *Router) AskChainVersion(ctx context.Context, addr string, group GroupID, epoch uint64) (uint64, error) {
	v, err := r.fwd.ask(ctx, addr, []byte("KEFIR.CHAINVERSION"),
		strconv.AppendUint(nil, uint64(group), 10), strconv.AppendUint(nil, epoch, 10))
	if err != nil {
		return 0, fmt.Errorf("version query to %s: %w", addr, err)
	}
	switch v.Kind {
	case resp.Int:
		if v.Int < 0 {
			return 0, fmt.Errorf("version query to %s: negative version %d", addr, v.Int)
		}
		return uint64(v.Int), nil
	case resp.Error:
		return 0, fmt.Errorf("version query to %s: %s", addr, v.Str)
	}
	return 0, fmt.Errorf("version query to %s: unexpected reply %v", addr, v.Kind)
}

// Forwarded counts the commands forwarded to a leader that answered them;
// Retries those sent again.
func (r *Router) Forwarded() uint64 { return r.fwd.forwarded.Load() }

// Retries counts forwarded commands sent again because the leader did not
// answer (it failed, moved, or none was known yet).
func (r *Router) Retries() uint64 { return r.fwd.retries.Load() }

// SetRetryFor bounds how long a forwarded write is retried (default 10 s);
// tests shorten it.
func (r *Router) SetRetryFor(d time.Duration) { r.fwd.retryFor = d }

// Close closes the pooled forwarding connections.
func (r *Router) Close() { r.fwd.close() }
