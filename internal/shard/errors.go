package shard

import (
	"errors"

	"github.com/kefirdb/kefir/internal/token"
)

// A replica's errors, beside the operations' own (kv.ErrWrongType and the
// rest, which internal/kv produces). The server maps them to RESP prefixes
// (docs/design/resp-extensions.md): ErrUnavailable → -UNAVAILABLE, the rest →
// -ERR. Their texts are the RESP message after the prefix.
var (
	ErrStaleRequest = errors.New("stale request")
	ErrBadSession   = token.ErrBad // a token that does not parse (internal/token)
	// ErrSessionAhead means the session has seen versions this replica does not have
	// (after a crash lost unsynced writes, or a replica that lags).
	ErrSessionAhead = errors.New("session token is ahead of this replica")
	// ErrSessionLost means the session saw a version that a crash took back
	// (an async or cad write acknowledged before it was durable), or, in a
	// replica group, whose op a view change dropped and gave to another write:
	// serving it would silently drop its own writes. The client must start a
	// new session.
	ErrSessionLost = errors.New("session token refers to writes lost in a crash")
	// ErrUnavailable is a replica's failure to read or write its store: not
	// an outcome of the operation, so never cached as one.
	ErrUnavailable = errors.New("shard unavailable")
	ErrClosed      = errors.New("shard closed")
)

// ReqID identifies a write for at-most-once execution: Client is a random non-zero
// id the client picks at start, Seq increases with each of its writes. The zero ReqID
// means "no id" (plain Redis clients).
type ReqID struct {
	Client uint64
	Seq    uint64
}

// IsZero reports whether the request carries no id.
func (r ReqID) IsZero() bool { return r.Client == 0 }
