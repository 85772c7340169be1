package vrshard

import (
	"errors"
	"fmt"

	"github.com/kefirdb/kefir/internal/shard"
)

// Errors callers branch on. Each wraps the shard error the RESP front door
// already maps (docs/design/resp-extensions.md), so an unmodified front door
// degrades to -UNAVAILABLE / -ERR instead of lying.
var (
	// ErrNotLeader: the operation must go to the leader. Returned as
	// *NotLeaderError, which names it when known.
	ErrNotLeader = fmt.Errorf("not the leader: %w", shard.ErrUnavailable)
	// ErrOutcomeUnknown: a write was proposed but this replica stopped
	// leading (or stopped) before it learned the write's fate. Retry with the
	// same request id at the new leader: the client table answers a write that
	// did execute instead of executing it twice.
	ErrOutcomeUnknown = fmt.Errorf("write outcome unknown (leader changed): %w", shard.ErrUnavailable)
	// ErrCannotServe: this replica cannot prove the read's consistency level
	// from its state right now and no leader is known to redirect to.
	ErrCannotServe = fmt.Errorf("replica cannot serve this consistency level now: %w", shard.ErrUnavailable)
	// ErrBusy: too many writes in flight at the leader.
	ErrBusy = fmt.Errorf("too many writes in flight: %w", shard.ErrUnavailable)
	// ErrFailed: the replica stopped after a disk error (a failed write or
	// fsync of its log, or of its engine). The rest of the group carries on.
	ErrFailed = fmt.Errorf("replica failed: %w", shard.ErrUnavailable)
)

// NotLeaderError says that a write or a strong read must go elsewhere: to
// Leader (a node id, 0 if unknown) whose client address is Addr (if the
// replica was given client addresses). The front door maps it to
// "-MOVED <Addr>" when Addr is set, else to "-UNAVAILABLE".
type NotLeaderError struct {
	Leader uint64
	Addr   string
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
