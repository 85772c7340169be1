// Package storage is Kefir's storage engine: a versioned, log-structured key-value store.
//
// Records (key, value, version, timestamp, tombstone) are appended to a segmented log with
// a CRC32C each; concurrent appends are group-committed into one write and one fsync is
// shared by every waiter (Append and Sync are separate so replication can choose "fsync
// before ack" or "persist in the background and tell me how far"). An in-memory ordered
// index maps each key to its versions, newest first, and serves point reads, reads at a
// version and range scans at a version (the StaleStore API of Yogurt: GetAt, VersionRange,
// Versions, Cost, snapshots). Old versions are kept by a retention policy; compaction copies
// live versions of sparse segments to the tail and frees the head (FAWN-DS, Gecko). The log
// is chained over one or more devices, each optionally carrying an emulated latency /
// bandwidth / queue model.
//
// Segments are zero-filled and synced ahead of need and written in place, so an fsync
// commits no file size (zero.go, docs/design/zero-filled-logs.md); records carry their
// own position and a synced mark (record.go).
//
// Recovery restores the synced prefix plus every complete, checksummed record after it; a
// checksum failure below what a later record says was synced is corruption and Open
// refuses it (unless Salvage).
// Index checkpoints (hint files) make reopening fast. After a failed fsync the engine stops
// accepting writes for good (the fsyncgate lesson).
//
// The contract callers code against is docs/design/storage-api.md.
//
// It must not import any Kefir package except internal/vfs.
package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kefirdb/kefir/internal/vfs"
)

// Errors callers branch on. Returned errors wrap them with context.
var (
	ErrNotFound      = errors.New("storage: not found")
	ErrEmptyKey      = errors.New("storage: empty key")
	ErrKeyTooLarge   = errors.New("storage: key too large")
	ErrValueTooLarge = errors.New("storage: value too large")
	// ErrDiskFull means a write could not be persisted because a device is full. The
	// engine stays consistent: nothing half-written is visible, and writes succeed
	// again once space is freed (e.g. by compaction).
	ErrDiskFull = errors.New("storage: disk full")
	// ErrFailed means an fsync (or a write whose outcome is unknown) failed. The engine
	// refuses every later write and sync; reads keep working. Reopen to recover.
	ErrFailed = errors.New("storage: engine failed")
	ErrClosed = errors.New("storage: closed")
	// ErrVersionOrder is returned when an appended version is not newer than the key's
	// newest version (versions are strictly increasing per key).
	ErrVersionOrder = errors.New("storage: version not newer than the key's newest")
	// ErrVersionGone is returned by GetAt/VersionRange when the version asked for was
	// older than every version the retention policy kept.
	ErrVersionGone = errors.New("storage: version no longer retained")
)

// CorruptionError reports a record whose checksum or framing is wrong somewhere other than
// the torn tail of the log, or a gap in the log.
type CorruptionError struct {
	File   string
	Offset int64
	Reason string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("storage: corruption in %s at offset %d: %s", e.File, e.Offset, e.Reason)
}

// Record is one write.
type Record struct {
	Key, Value []byte
	Version    uint64 // assigned by the caller (the shard log position); strictly increasing per key
	Timestamp  int64  // caller's wall clock, unix nanos
	Tombstone  bool
	// Meta is a short (<= MaxMetaSize bytes) opaque byte string stored with the value
	// and handed back with it (Value.Meta); the caller owns its meaning (internal/kv:
	// the value's type and expiry). Empty costs nothing on disk or in memory; a
	// tombstone has none.
	Meta []byte
	// Hint, if not zero, is what DB.Probe of Key on this DB returned (never
	// another key's or another DB's): Append starts its index update from
	// it when the leaf has not changed since, and walks the index otherwise.
	Hint Hint
}

// Pos is a position in the engine log: the byte offset just past a record in the logical
// log that the segments concatenate into. Totally ordered; 0 = nothing.
type Pos uint64

// Value is the result of a read. Data is a fresh copy, safe to keep and modify.
type Value struct {
	Data      []byte
	Meta      []byte // the record's Meta (nil if none); read-only, may alias Data's buffer
	Version   uint64
	Timestamp int64
	Pos       Pos
}

// VersionInfo describes one retained version of a key.
type VersionInfo struct {
	Version   uint64
	Timestamp int64
	Tombstone bool
	Pos       Pos
	Size      int // record size in the log
}

// Retention says which old versions to keep. A version that is not a key's newest is kept
// if it is among the key's last KeepVersions versions, or if it was superseded less than
// KeepFor ago, or if an open snapshot needs it. Everything else is garbage that compaction
// may reclaim (reads of garbage versions keep working until then). The zero value keeps
// only the newest version.
type Retention struct {
	KeepVersions int
	KeepFor      time.Duration
}

// Device is one data directory in the chain. Model, if set, emulates the medium.
type Device struct {
	Dir   string
	Model *DeviceModel
}

// DeviceModel emulates a storage medium on top of whatever the directory really is: each
// read waits Latency plus size/Bandwidth, with at most QueueDepth reads in service at once
// (later ones queue). Writes are not slowed (the model is for read-path cost studies).
type DeviceModel struct {
	Latency    time.Duration
	Bandwidth  int64 // bytes per second; 0 = unlimited
	QueueDepth int   // 0 = unlimited
}

// Options configures Open. The zero value of every field except Devices is usable.
type Options struct {
	Devices     []Device // chained data directories; appends go to the tail device
	FS          vfs.FS   // nil = the real OS file system
	SegmentSize int64    // default 64 MiB

	MaxKeySize, MaxValueSize int // defaults 64 KiB and 16 MiB

	SyncInterval time.Duration // background syncer: sync every interval (0 = off)
	SyncBytes    int64         // ... or every this many unsynced bytes (0 = off)

	Retention  Retention
	CacheBytes int64 // value cache size (0 = default 32 MiB, <0 = off)

	CompactionThreshold float64 // live fraction below which a segment is compacted (default 0.5)
	CompactionRate      int64   // bytes/s budget for compaction I/O (0 = unlimited)
	// CompactInterval runs Compact in the background this often (0 = only when called).
	CompactInterval time.Duration
	// CheckpointInterval writes a hint file in the background this often, if the log
	// has grown since the last one (0 = only when Checkpoint is called). Reopening
	// replays only the log after the newest hint.
	CheckpointInterval time.Duration

	// CountMeta says which records with meta Stats.MetaKeys counts (nil: every
	// one). The engine never interprets meta; the caller does (kv: a record
	// whose meta carries an expiry, not a hash's type byte alone). It must be
	// the same function every time a directory is opened: the index keeps its
	// verdict (verCounted) in hint files.
	CountMeta func(meta []byte) bool

	Salvage bool // open despite mid-log corruption, dropping what follows it (logged)
	Logger  *slog.Logger

	// Now is the clock used by the retention policy (nil = time.Now). The simulator
	// passes its virtual clock.
	Now func() time.Time
	// Inline runs every file operation on the calling goroutine: Sync fsyncs on the
	// caller's goroutine (the first waiter leads) instead of handing off to the syncer
	// goroutine, and a full segment is sealed (fsync, create the next) inside the Append
	// that fills it instead of in the background. The deterministic simulator sets it.
	// The optional periodic syncer (SyncInterval, SyncBytes) still runs a goroutine.
	Inline bool
	// WriteBufferSize is how many appended bytes are buffered in memory before they are
	// written to the segment file (default 256 KiB). Sync writes the buffer regardless.
	WriteBufferSize int
	// NoZeroFill appends to every segment instead of zero-filling the next one ahead
	// and writing it in place. Zero-filling makes each fsync commit no file size; it
	// pays for itself only when fsyncs are frequent and waited on. An engine synced
	// rarely (a VR replica's, whose writes its replication log makes durable, synced at
	// checkpoints) would write every byte twice and gain nothing.
	NoZeroFill bool
	// OnSync, if set, is told how long each fsync of a log segment took (the
	// node's fsync latency histogram). It runs on the goroutine that synced,
	// possibly under the engine's lock (sealing a segment), so it must be quick
	// and must not call back into the engine.
	OnSync func(time.Duration)

	mut mutations // deliberate bugs, for tests (zero.go)
}

// Stats is a snapshot of engine counters.
type Stats struct {
	Keys        int // keys in the index, deleted ones not yet compacted away included
	LiveKeys    int // keys whose newest version is not a deletion (what a read finds)
	MetaKeys    int // live keys whose newest version carries meta that Options.CountMeta counts (kv: keys with an expiry)
	Versions    int
	Segments    int
	DiskBytes   int64 // bytes in segment files
	LiveBytes   int64 // bytes of records the index still points at
	LastPos     Pos
	DurablePos  Pos
	Appends     int64 // records appended
	Writes      int64 // write syscalls
	Syncs       int64 // fsyncs of segment files
	CacheHits   int64
	CacheMisses int64
	Compactions int64 // segments compacted
	Compacted   int64 // bytes copied by compaction
	Snapshots   int   // open snapshots
	HintPos     Pos   // the checkpoint the last Open recovered from (0 = full replay)
	Failed      error // non-nil once the engine has failed
}

const (
	defaultSegmentSize  = 64 << 20
	defaultMaxKeySize   = 64 << 10
	defaultMaxValueSize = 16 << 20
	defaultCacheBytes   = 32 << 20
	defaultWriteBuffer  = 256 << 10
	defaultThreshold    = 0.5
)

func (o *Options) fill() error {
	if len(o.Devices) == 0 {
		return errors.New("storage: Options.Devices is empty")
	}
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.SegmentSize <= 0 {
		o.SegmentSize = defaultSegmentSize
	}
	if o.MaxKeySize <= 0 {
		o.MaxKeySize = defaultMaxKeySize
	}
	if o.MaxValueSize <= 0 {
		o.MaxValueSize = defaultMaxValueSize
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = defaultCacheBytes
	}
	if o.CompactionThreshold <= 0 {
		o.CompactionThreshold = defaultThreshold
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.WriteBufferSize <= 0 {
		o.WriteBufferSize = defaultWriteBuffer
	}
	return nil
}
