// Package cluster is what a node's front door knows about the replica groups
// behind it: which group serves a key and where that group's leader is
// (Router), how a request a follower cannot serve reaches the leader
// (forwarding, forward.go) or is redirected (-MOVED), and the engine-neutral
// contract of a hosted replica (Group, Hosted, Opener).
//
// The front door (internal/server) depends on this package and on
// shard.Replica only, never on a replication engine: an engine (today
// internal/vrshard, VR) implements the contract and the binary (cmd/kefir)
// wires it in through an Opener. A second engine, or a node hosting
// replicas of many groups (issue 28's slot map), plugs in here without a
// change to the front door. A test (internal/purity) fails if the front
// door reaches a protocol core or an engine host through its imports.
package cluster

import (
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/shard"
)

// ErrNotLeader: the operation must go to the group's leader. Engines return
// it as *NotLeaderError, which names the leader when known. It wraps
// shard.ErrUnavailable, so a front door that does not route degrades to
// -UNAVAILABLE instead of lying.
var ErrNotLeader = fmt.Errorf("not the leader: %w", shard.ErrUnavailable)

// NotLeaderError says that a write or a strong read must go elsewhere: to
// Leader (a node id, 0 if unknown) whose client address is Addr (if the
// replica was given client addresses). The front door forwards the request
// there, or answers "-MOVED <Addr>" when the request asked for redirects,
// or "-UNAVAILABLE no leader" when none is known.
type NotLeaderError struct {
	Leader uint64
	Addr   string
	// Slot, if HasSlot, is the hash slot of the request's keys (a node of
	// several groups names it): a cluster-aware client is answered
	// "-MOVED <Slot> <Addr>", Redis Cluster's redirect.
	Slot    uint16
	HasSlot bool
	// ReadAt: a read that another member answers, not the leader — a
	// chain's tail, for a key with an update in flight at this member
	// (vrshard chainread.go). The front door forwards it even when the
	// request asked for redirects: a -MOVED names a leader, and a client
	// would send its writes there.
	ReadAt bool
}

func (e *NotLeaderError) Error() string {
	if e.Leader == 0 {
		return "not the leader; leader unknown (view change in progress)"
	}
	if e.Addr != "" {
		return fmt.Sprintf("not the leader; leader is node %d at %s", e.Leader, e.Addr)
	}
	return fmt.Sprintf("not the leader; leader is node %d", e.Leader)
}

// Unwrap makes errors.Is(err, ErrNotLeader) and errors.Is(err,
// shard.ErrUnavailable) hold.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// LeaderOf returns the leader named by err, if err is a *NotLeaderError.
func LeaderOf(err error) (id uint64, addr string, ok bool) {
	var nl *NotLeaderError
	if errors.As(err, &nl) {
		return nl.Leader, nl.Addr, nl.Leader != 0
	}
	return 0, "", false
}

// SlotRedirect is Redis Cluster's redirect for a request that failed with
// err: "-MOVED <slot> <leader's client address>", when err is a not-leader
// error that names the slot and a leader's address (false otherwise: no
// leader is known, and the request is forwarded, which waits for one).
func SlotRedirect(err error) (*ReplyError, bool) {
	var nl *NotLeaderError
	if !errors.As(err, &nl) || !nl.HasSlot || nl.Addr == "" || nl.ReadAt {
		return nil, false
	}
	return &ReplyError{fmt.Sprintf("MOVED %d %s", nl.Slot, nl.Addr)}, true
}

// ReadElsewhere reports whether err sends a read to a member that is not
// the leader (NotLeaderError.ReadAt): forwarded, never redirected.
func ReadElsewhere(err error) bool {
	var nl *NotLeaderError
	return errors.As(err, &nl) && nl.ReadAt
}

// ReplyError is an error whose RESP text, prefix included, is fixed: the
// front door sends Msg as it is (-MOVED, -UNAVAILABLE, -ERR ...).
type ReplyError struct{ Msg string }

func (e *ReplyError) Error() string { return e.Msg }

// RequestError marks an engine's refusal of a request the client got wrong
// (it must not send the same request again): the front door answers it with
// -ERR, not -UNAVAILABLE. Its text is Err's.
type RequestError struct{ Err error }

func (e *RequestError) Error() string { return e.Err.Error() }
func (e *RequestError) Unwrap() error { return e.Err }
