package vrshard

import (
	"errors"
	"fmt"

	kcluster "github.com/kefirdb/kefir/internal/cluster"

	"github.com/kefirdb/kefir/internal/shard"
)

// Errors callers branch on. Each wraps the shard error the RESP front door
// already maps (docs/design/resp-extensions.md), so an unmodified front door
// degrades to -UNAVAILABLE / -ERR instead of lying.
var (
	// ErrNotLeader: the operation must go to the leader. Returned as
	// *NotLeaderError, which names it when known (kcluster.ErrNotLeader).
	ErrNotLeader = kcluster.ErrNotLeader
	// ErrOutcomeUnknown: a write was proposed but this replica stopped
	// leading (or stopped) before it learned the write's fate. Retry with the
	// same request id at the new leader: the client table answers a write that
	// did execute instead of executing it twice.
	ErrOutcomeUnknown = fmt.Errorf("write outcome unknown (leader changed): %w", shard.ErrUnavailable)
	// ErrNotDurable: a write asking for durability (sync) on a chain was
	// committed, but no log member had it on its disk within the request
	// timeout — a chain repaired down to memory members answers a sync write
	// only once a log member joins and persists it (docs/design/chain.md,
	// "A sync answer needs a disk"). Its outcome is unknown: the members'
	// memory holds it, a crash of all of them loses it. A retry with the same
	// request id waits for the disk again.
	ErrNotDurable = fmt.Errorf("write outcome unknown: committed, but on no log member's disk within the request timeout (a chain with no log member left answers sync writes once one joins): %w", shard.ErrUnavailable)
	// ErrCannotServe: this replica cannot prove the read's consistency level
	// from its state right now and no leader is known to redirect to.
	ErrCannotServe = fmt.Errorf("replica cannot serve this consistency level now: %w", shard.ErrUnavailable)
	// ErrBusy: too many writes in flight at the leader.
	ErrBusy = fmt.Errorf("too many writes in flight: %w", shard.ErrUnavailable)
	// ErrFailed: the replica stopped after a disk error (a failed write or
	// fsync of its log, or of its engine). The rest of the group carries on.
	ErrFailed = fmt.Errorf("replica failed: %w", shard.ErrUnavailable)
	// ErrNotOfferedUnderAU: a linearizable (or cross-client-monotonic) read
	// on a chain in AU mode, where the head answers a write before any other
	// member holds it, so a crash of the head can take back what a read
	// returned (docs/design/chain.md, "Kefir's levels on a chain"). Not
	// ErrUnavailable: no member, now or later, serves it; the client must
	// ask for a weaker level.
	ErrNotOfferedUnderAU = errors.New("not offered by a chain in AU mode (asynchronous updates: an answered write may be lost with the head); read at bounded, session or eventual, or run the chain in SU or AUSI")
)

// NotLeaderError says that a write or a strong read must go elsewhere
// (kcluster.NotLeaderError: the front door routes by it without knowing the
// engine).
type NotLeaderError = kcluster.NotLeaderError

// LeaderOf returns the leader named by err, if err is a *NotLeaderError.
func LeaderOf(err error) (id uint64, addr string, ok bool) { return kcluster.LeaderOf(err) }
