package client

import (
	"time"

	"github.com/kefirdb/kefir/internal/level"
)

// Consistency is a read's consistency level (ARCHITECTURE §2). The zero value means
// the connection's default, which starts at the server's (linearizable).
type Consistency = level.Consistency

// Durability is a write's durability level. The zero value means the default.
type Durability = level.Durability

// Consistency levels.
var (
	// Linearizable reads see every update that completed before they began.
	Linearizable = level.ConsLinearizable
	// CrossClientMonotonic reads never return state older than what any earlier read
	// (any client, across failures) returned.
	CrossClientMonotonic = level.ConsCrossClient
	// SessionConsistency reads give read-my-writes, monotonic reads and monotonic
	// writes within one Session.
	SessionConsistency = level.ConsSession
	// Eventual reads may return any recent version.
	Eventual = level.ConsEventual
)

// BoundedVersions returns the level "one of the latest n+1 versions of the key".
func BoundedVersions(n uint64) Consistency { return level.BoundedVersionsLevel(n) }

// BoundedTime returns the level "a version that was current within the last t".
func BoundedTime(t time.Duration) Consistency { return level.BoundedTimeLevel(t) }

// Durability levels.
const (
	// Sync acknowledges a write once it is persisted (fsync) on a majority.
	Sync = level.Sync
	// CAD acknowledges once replicated in memory; a read never observes data a crash
	// could take back.
	CAD = level.CAD
	// Async acknowledges like CAD without the durability check on reads (unsafe
	// baseline for experiments).
	Async = level.Async
)

// ParseConsistency parses a level name such as "linearizable" or "bounded(250ms)".
func ParseConsistency(s string) (Consistency, error) { return level.ParseConsistency(s) }

// ParseDurability parses "sync", "cad" or "async".
func ParseDurability(s string) (Durability, error) { return level.ParseDurability(s) }
