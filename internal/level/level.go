// Package level defines Kefir's consistency and durability levels: their names,
// their parsing and their ordering. Every layer (client, front doors, replication,
// checkers) speaks these types, so a level means the same thing everywhere.
//
// It must not import any other Kefir package.
package level

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrUnknownLevel is returned (wrapped) when a level name cannot be parsed.
var ErrUnknownLevel = errors.New("unknown level")

// ConsistencyKind names a family of read guarantees (ARCHITECTURE §2).
type ConsistencyKind uint8

const (
	// Linearizable reads see every update that completed before they began.
	Linearizable ConsistencyKind = iota + 1
	// CrossClientMonotonic reads never return state older than what any earlier
	// read (any client, across failures) returned.
	CrossClientMonotonic
	// Session reads give read-my-writes, monotonic reads and monotonic writes
	// within one session token.
	Session
	// BoundedVersions reads return one of the latest N+1 versions of the key.
	BoundedVersions
	// BoundedTime reads return a version that was current within the last T.
	BoundedTime
	// Eventual reads may return any version superseded at most the eventual
	// window before the read began (docs/consistency.md; a replica that
	// cannot prove its state is that recent refuses).
	Eventual
)

// Consistency is a read's consistency level. The zero value means "use the
// default" (the connection's, then the server's).
type Consistency struct {
	Kind ConsistencyKind
	// Versions is N for BoundedVersions.
	Versions uint64
	// Staleness is T for BoundedTime.
	Staleness time.Duration
}

// Common consistency levels.
var (
	ConsLinearizable = Consistency{Kind: Linearizable}
	ConsCrossClient  = Consistency{Kind: CrossClientMonotonic}
	ConsSession      = Consistency{Kind: Session}
	ConsEventual     = Consistency{Kind: Eventual}
)

// BoundedVersionsLevel returns bounded(n versions).
func BoundedVersionsLevel(n uint64) Consistency {
	return Consistency{Kind: BoundedVersions, Versions: n}
}

// BoundedTimeLevel returns bounded(t).
func BoundedTimeLevel(t time.Duration) Consistency {
	return Consistency{Kind: BoundedTime, Staleness: t}
}

// IsZero reports whether c is the unset ("default") level.
func (c Consistency) IsZero() bool { return c.Kind == 0 }

// String returns the canonical name, which ParseConsistency accepts.
func (c Consistency) String() string {
	switch c.Kind {
	case 0:
		return "default"
	case Linearizable:
		return "linearizable"
	case CrossClientMonotonic:
		return "cross-client-monotonic"
	case Session:
		return "session"
	case BoundedVersions:
		return "bounded(" + strconv.FormatUint(c.Versions, 10) + ")"
	case BoundedTime:
		return "bounded(" + c.Staleness.String() + ")"
	case Eventual:
		return "eventual"
	}
	return fmt.Sprintf("consistency(%d)", c.Kind)
}

// ParseConsistency parses a level name, case-insensitively:
// "linearizable", "cross-client-monotonic", "session", "eventual",
// "bounded(N)" (N versions) or "bounded(DURATION)" (Go duration, e.g. 250ms).
func ParseConsistency(s string) (Consistency, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	switch name {
	case "linearizable", "strong":
		return ConsLinearizable, nil
	case "cross-client-monotonic", "ccm":
		return ConsCrossClient, nil
	case "session":
		return ConsSession, nil
	case "eventual":
		return ConsEventual, nil
	}
	if strings.HasPrefix(name, "bounded(") && strings.HasSuffix(name, ")") {
		arg := name[len("bounded(") : len(name)-1]
		if n, err := strconv.ParseUint(arg, 10, 64); err == nil {
			return BoundedVersionsLevel(n), nil
		}
		if d, err := time.ParseDuration(arg); err == nil && d > 0 {
			return BoundedTimeLevel(d), nil
		}
		return Consistency{}, fmt.Errorf("%w: consistency %q: bounded() takes a version count or a positive duration", ErrUnknownLevel, s)
	}
	return Consistency{}, fmt.Errorf("%w: consistency %q (want linearizable, cross-client-monotonic, session, bounded(N), bounded(DURATION) or eventual)", ErrUnknownLevel, s)
}

// Durability is a write's durability level. The zero value means "use the default".
type Durability uint8

const (
	// Sync acknowledges a write once it is persisted (fsync) on a majority.
	Sync Durability = iota + 1
	// CAD acknowledges once replicated in memory; a read never observes data a
	// crash could take back (consistency-aware durability).
	CAD
	// Async acknowledges like CAD but without the durability check on reads.
	// Unsafe: exists as the weak baseline for experiments.
	Async
)

// IsZero reports whether d is the unset ("default") level.
func (d Durability) IsZero() bool { return d == 0 }

// String returns the canonical name, which ParseDurability accepts.
func (d Durability) String() string {
	switch d {
	case 0:
		return "default"
	case Sync:
		return "sync"
	case CAD:
		return "cad"
	case Async:
		return "async"
	}
	return fmt.Sprintf("durability(%d)", uint8(d))
}

// ParseDurability parses "sync", "cad" or "async", case-insensitively.
func ParseDurability(s string) (Durability, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "sync":
		return Sync, nil
	case "cad":
		return CAD, nil
	case "async":
		return Async, nil
	}
	return 0, fmt.Errorf("%w: durability %q (want sync, cad or async)", ErrUnknownLevel, s)
}
