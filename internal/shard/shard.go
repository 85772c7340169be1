// Package shard is one shard replica on one node: it assigns versions, applies
// operations (evaluated by internal/kv, the state machine every engine runs) to the
// storage engine under a single writer, keeps the client table that makes retried
// writes execute at most once, and implements the durability levels (sync, cad,
// async) and read consistency levels as they apply on a single node.
//
// The front doors talk to the Replica interface; the replication engines implement
// the same interface (internal/vrshard: a VR replica applying the same kv.Apply), so
// the server does not change with the engine.
//
// It must not import the server, the RESP codec or any networking package.
package shard

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	// The Lua interpreter registers itself with kv (kv.RegisterScripting):
	// imported here, by the one package every engine that applies ops
	// imports (vrshard too), so no replica applies an EVAL without it.
	_ "github.com/kefirdb/kefir/internal/script"
	"github.com/kefirdb/kefir/internal/storage"
)

// WriteReq is one write in a batch. Apply fills Result and Err.
type WriteReq struct {
	Op         kv.Op
	Durability level.Durability // zero = the shard's default
	ID         ReqID
	// Session is the writer's session when it writes at the session level
	// (the connection's level, or KEFIR.CALL SESSION), else zero. A chain
	// member's head refuses the write with ErrSessionLost if the session
	// saw an update the chain no longer holds (vrshard, chainSessionCheck):
	// the write's token would otherwise rise past the loss and hide it from
	// the session's next read. A VR replica does not check it.
	Session Session
	Result  kv.Result
	Err     error

	deduped bool // answered from the client table
	reveals bool // the reply reports state the write read (see revealsState)
	// row is the encoded result of the client-table row staged for the
	// write (kv.ClientEntry.Result), rowVer the row's version.
	row    []byte
	rowVer uint64
}

// Pending is what a batch of applied writes still waits for before its replies may
// be released: the log position that must be durable (a single node), or the
// acknowledgement of writes a replication engine has ordered but not yet
// acknowledged (Acks). Pendings merge, so a front door can apply several batches and
// wait once.
type Pending struct {
	SyncPos storage.Pos
	// Acks are writes a replication engine's Apply returned once they were ordered
	// (their replies are known and later reads see them) but before they were
	// acknowledged. Only the Replica that returned them interprets them: its Wait
	// fails if any of them was not acknowledged (a leader change, a closed replica),
	// and then no reply of the batch may be released.
	Acks []Ack
}

// Ack is a replication engine's handle on ordered writes awaiting acknowledgement
// (see Pending.Acks).
type Ack interface {
	// Await blocks until the writes are acknowledged (nil) or will not be (their
	// outcome is unknown).
	Await(ctx context.Context) error
}

// Merge returns the pending that covers both.
func (p Pending) Merge(q Pending) Pending {
	m := Pending{SyncPos: max(p.SyncPos, q.SyncPos), Acks: p.Acks}
	switch {
	case len(q.Acks) == 0:
	case len(p.Acks) == 0:
		m.Acks = q.Acks
	default:
		// Never append into p's backing array: another Pending may share it.
		m.Acks = append(p.Acks[:len(p.Acks):len(p.Acks)], q.Acks...)
	}
	return m
}

// IsZero reports whether p waits for nothing.
func (p Pending) IsZero() bool { return p.SyncPos == 0 && len(p.Acks) == 0 }

// Replica is what a front door needs from a shard. The single-node Shard implements
// it, and so does every replication engine's replica (internal/vrshard), so the
// front door serves either through this one method set.
type Replica interface {
	// Apply applies writes in order (their effects are visible to reads on return)
	// and returns what must be awaited before any of their replies is released. A
	// write's own error is in its Err; the returned error is for the batch (closed).
	Apply(ctx context.Context, reqs []WriteReq) (Pending, error)
	// Wait blocks until p is satisfied. An error means the outcome of the writes is
	// unknown (an fsync failed, a replicated write was not acknowledged): no reply
	// of the batch may be released.
	Wait(ctx context.Context, p Pending) error
	// Write is Apply and Wait for one write.
	Write(ctx context.Context, op kv.Op, d level.Durability, id ReqID) (kv.Result, error)

	// Reads. Read serves a read at consistency c for session s; every replica
	// serves every read through it. The three others are faster paths for
	// some replicas, each correct on every replica; ReadPaths says which
	// ones are worth taking here, and the front door chooses once, not per
	// read.
	Read(ctx context.Context, op kv.Op, c level.Consistency, s Session) (kv.Result, error)
	ReadPaths() ReadPaths
	// ReadKey is Read of a GET of key that builds no kv.Op or kv.Result;
	// found is false for a missing key, value is read-only.
	ReadKey(key []byte, c level.Consistency, s Session) (value []byte, version uint64, found bool, err error)
	// ReadDeferred answers a read at once with a result whose release must
	// wait for p (a value a leader's log holds but has not made durable
	// yet): the front door writes the reply in its place and releases it
	// with the batch, after Wait(p) succeeds; if Wait fails, no reply of the
	// batch may be released.
	ReadDeferred(ctx context.Context, op kv.Op, c level.Consistency, s Session) (res kv.Result, p Pending, err error)
	// TryRead serves a read only if it need not wait for anything (ok false:
	// it did nothing), so an event loop may run it itself.
	TryRead(op kv.Op, c level.Consistency) (res kv.Result, ok bool)

	// CheckConsistency reports whether this replica can serve level c.
	CheckConsistency(c level.Consistency) error
	// CheckDurability reports whether this replica can provide level d.
	CheckDurability(d level.Durability) error
	Status() Status
	// Close stops the replica after making what it applied durable; it does not
	// close the engine.
	Close() error
}

// ReadPaths are the read paths a Replica gains from, besides Read.
type ReadPaths struct {
	// Key: ReadKey is cheaper than Read for a plain GET (a single node,
	// where GET is the hottest command).
	Key bool
	// Deferred: ReadDeferred can answer reads Read would wait for (a
	// leader's durability wait), so the connection's later commands do not
	// wait behind them.
	Deferred bool
	// Inline: TryRead serves some reads without waiting (a leader under a
	// running lease), so an event loop need not hand them off.
	Inline bool
}

// Engine is the part of the storage engine a Shard uses; *storage.DB implements it.
type Engine interface {
	Append(recs ...storage.Record) (storage.Pos, error)
	Sync(pos storage.Pos) (storage.Pos, error)
	DurablePos() storage.Pos
	LastPos() storage.Pos
	LastVersion() uint64
	Get(key []byte) (storage.Value, error)
	Versions(key []byte) ([]storage.VersionInfo, error)
	Scan(start, end []byte, at uint64, limit int, fn func(key []byte, v storage.Value) bool) error
	// Snapshot pins a consistent view (at 0: the last version); a read of
	// several keys uses one, so that writes applied between its keys' reads
	// cannot show in part.
	Snapshot(at uint64) *storage.Snapshot
}

var _ Engine = (*storage.DB)(nil)

// sharedGetter is an Engine that can also read without copying the value
// (storage.DB.GetShared). Optional, so that test engines wrapping a DB need not have it.
type sharedGetter interface {
	GetShared(key []byte) (storage.Value, error)
}

var _ sharedGetter = (*storage.DB)(nil)

// prober is an Engine that can tell whether a key holds a value without
// reading it (storage.DB.Has): the hash writes ask it of field rows.
// Optional, as sharedGetter is.
type prober interface {
	Has(key []byte) (bool, error)
}

var _ prober = (*storage.DB)(nil)

// changeCounter is an Engine that counts the appends that changed what reads
// find (storage.DB.Changes): hgetOne brackets its reads with it. Optional, as
// sharedGetter is (without it hgetOne rereads the metadata, as before).
type changeCounter interface {
	Changes() uint64
}

var _ changeCounter = (*storage.DB)(nil)

// hashMetaMemo is a hash's metadata record as hgetOne last read it from the
// engine, with the engine's change count (changeCounter) under which it was
// read: while the count has not moved, no append came since, so the record is
// still the key's. Immutable once published (Shard.hgetMemo).
type hashMetaMemo struct {
	key     string
	changes uint64
	v       storage.Value
}

// Options configure a Shard.
type Options struct {
	// Durability is the default for writes that do not name one (default sync).
	Durability level.Durability
	// NoReadDurabilityCheck turns off the read check (a read of a not yet durable
	// version written by a sync or cad write first syncs it; async values are never
	// checked). Tests use it to show what the check prevents: without it a read may
	// return a value a crash takes back.
	NoReadDurabilityCheck bool
	// NoBackgroundSync turns off the goroutine that syncs cad writes soon after
	// they are applied; they then become durable only on a read, a sync write or
	// the engine's own SyncInterval. Tests use it to observe the read check.
	NoBackgroundSync bool
	// ClientTTL is how long the client table remembers a client id after its last
	// write (default 1h; negative = forever). Clients draw fresh ids (one per
	// connection), so without expiry the table grows without bound; a retry older
	// than the TTL may execute again.
	ClientTTL time.Duration
	// MaxScan caps a scan's limit (default 100000).
	MaxScan int
	Logger  *slog.Logger
	// Now is the clock for record timestamps (default time.Now).
	Now func() time.Time
}

// Status is a snapshot of a shard's progress.
type Status struct {
	LastVersion uint64
	LastPos     uint64
	DurablePos  uint64
	Clients     int
	// Reserved counts the other reserved keys the engine counts among its
	// keys (a replicated shard's applied mark and view history); DBSIZE
	// subtracts them too.
	Reserved  int
	Writes    uint64
	Syncs     uint64
	ReadSyncs uint64
	Deduped   uint64
}

// chunk bounds how many records one Append carries, which also bounds the backward
// search for earlier writes of the same batch.
const chunk = 256

// DefaultMaxScan is the server cap on a scan's limit (docs/design/resp-extensions.md).
const DefaultMaxScan = 100000

// Shard is a single-node replica.
type Shard struct {
	db Engine
	// readGet is the engine's GetShared if it has one, else its Get: the read path's
	// point lookup (read results are read-only, so the value need not be copied).
	readGet func(key []byte) (storage.Value, error)
	// sdb is the engine when it is a storage.DB (every production shard):
	// get calls its GetShared directly, so the call inlines instead of
	// going through readGet's method value. A Value is 72 bytes, and each
	// level of calls copies it: two levels fewer saved a pipelined GET ~5 %
	// of its instructions (docs/design/one-house.md).
	sdb *storage.DB
	// engineHas is the engine's Has if it has one (nil: engineGet answers).
	engineHas func(key []byte) (bool, error)
	// changes is the engine's change count if it has one (changeCounter;
	// nil: hgetOne rereads the metadata and keeps no memo).
	changes func() uint64
	// hgetMemo is the metadata record hgetOne last read (nil: none). Readers
	// of every connection share it; each publishes a new one, never writes
	// one it loaded.
	hgetMemo atomic.Pointer[hashMetaMemo]
	// rowKeys holds *[]byte buffers for hgetField's row keys (a key passed
	// to the engine's read through a func value escapes, so a buffer on
	// the stack would be allocated on every read anyway).
	rowKeys sync.Pool
	// getFn, hasFn, stageFn are the closures getter, prober and stager
	// return (current, has, stage), made once: a method value or closure
	// made per write allocates, and these were three of an HSET's
	// allocations.
	getFn   kv.Getter
	hasFn   kv.Prober
	stageFn kv.Emit
	stageTS int64 // the timestamp stage gives records (under mu)
	// maxKey, maxVal: the engine's size limits (if it says), checked per write
	// (kv.Op.CheckSizes) so that one oversized write fails alone; 0: unknown.
	maxKey, maxVal int
	// Tests only: tornMultiReads (a mutation, read only under mutation.On)
	// reads MGET's keys one by one from the latest state; betweenKeys runs
	// between its first two keys. staleHashMeta (a mutation) makes hgetOne
	// trust its memo and skip the reread whatever the change count says.
	tornMultiReads bool
	staleHashMeta  bool
	// noHSetFast (tests only) sends every HSET through kv.ApplyHashTo, the
	// reference hsetFast is held to.
	noHSetFast  bool
	betweenKeys func()
	opts        Options
	log         *slog.Logger

	// mu is the single writer lock: versions are assigned and read-modify-writes
	// evaluated under it, so applies are serial in version order.
	mu   sync.Mutex
	next uint64 // next version to assign
	// reserved bounds the versions handed out (versions.go): every version
	// below it is covered by a durable reservation. holes are ranges lost in
	// crashes; set by Open, read-only afterwards.
	reserved   uint64
	reserveSeq uint64 // sequence number of the latest reservation record
	holes      []hole
	clients    *kv.ClientTable // under the idle rule (expireClients)
	legacy     []legacyRow     // rows in the pre-issue-26 format, for migrateClients
	recs       []storage.Record
	// stagedIdx indexes recs[:stagedN] by a 10-bit hash of their keys
	// (stagedHash), for stagedRec: slot h holds the newest record whose key
	// hashes to h, and stagedPrev[i] the record before i with the same hash
	// (-1: none), so a lookup compares only keys of its own hash. Slots are
	// stamped with the chunk's generation (stagedGen), so a new chunk starts
	// empty without clearing 8 KB. It replaced a linear search behind a
	// 256-bit filter (up to 32 records) and a Go map beyond: a pipelined
	// chunk holds up to 256 records, and the map's insert of every record and
	// its lookups were ~190 instructions of each pipelined HSET over random
	// fields (docs/design/hashes.md, "Pipelined, session 22").
	stagedIdx  [1 << stagedBits]stagedSlot
	stagedPrev []int32
	stagedGen  uint32
	stagedN    int
	// memo is engineGet's last read of the engine (memoSet: it holds one;
	// memoKey owns its key): an HSET of existing fields stages nothing
	// under its hash's key (kv.ApplyOptions.SparseHashMeta), so every HSET
	// of a pipelined batch would read the metadata record from the engine
	// again. Only the writer changes the engine, under mu, and truncate(0)
	// — at each Apply's start and after each append — drops the memo.
	memoKey []byte
	memo    storage.Value
	memoOK  bool
	memoSet bool
	// memoCur: the memo is also the key's current value — no record of its
	// key among recs[:memoN] (current found none when it read the engine,
	// and memoFresh has checked every record staged since). current then
	// answers from it before the staged index: every HSET of a pipelined
	// batch reads its hash's metadata, which the chunk rarely stages, and
	// the index's hash of that short key and its chain were ~80
	// instructions of each (docs/design/hashes.md, "Pipelined, session
	// 25"). A truncate below memoN clears it: records staged later at the
	// same positions were never checked.
	memoCur bool
	memoN   int
	// hm is the hash the last one-field HSET wrote (hsetFast), decoded
	// (hmOK: it is one, of key hmKey): its current metadata as of
	// recs[:hmN], and of the engine at its change count hmChanges.
	// hsetFast checks the records staged since (unstagedSince; Apply
	// checks the engine's count at its start), and then neither reads nor
	// decodes the record: the
	// getter's call, kv.ApplyHashTo's checks, the read and the decode
	// were ~300 instructions of a pipelined HSET (docs/design/hashes.md,
	// "Pipelined, session 32"). Unlike the memo it survives the chunk's
	// append (flush) and the next Apply while the engine's count says no
	// other append came: it holds values, not the arena's bytes.
	hm        kv.HashMeta
	hmKey     []byte
	hmOK      bool
	hmN       int
	hmChanges uint64
	// hmRows is a filter of the rows of hm's hash among recs[:hmN], by
	// rowBit (every bit set: any of them may be one, as hsetFast's load
	// assumes of the records staged before it): a row whose bit is clear
	// is not staged, and hsetFast asks
	// the engine alone whether it exists, without the staged index, which
	// a chunk of HSETs then never builds (its lookup and the indexing of
	// each record were ~90 instructions of a pipelined HSET).
	hmRows [1 << (rowBits - 6)]uint64
	// probeKey is the key has last asked the engine about (storage.DB.Probe)
	// and probeHint the hint it returned: stage gives the hint to the record
	// of that same key (the same bytes: an HSET probes its row's key, then
	// stages it), and the engine's insert starts from its item instead of
	// walking the index again (docs/design/hashes.md, "Pipelined, session
	// 26"). Reset by each apply: a later write's keys may take the same
	// bytes (the next batch's reuse the arena's), and a hint given to
	// another key would update that key's item.
	probeKey  []byte
	probeHint storage.Hint
	// scratch backs the row keys of the batch's hash writes
	// (kv.ApplyOptions.Scratch): like
	// recs, which point into it, it is reused once the batch is appended
	// (truncate(0)); a chunk that fills up is replaced, never grown in place.
	scratch []byte
	closed  bool
	stats   Status

	// sweepEvery is how many writes pass between client-table expiry sweeps.
	sweepEvery uint64
	lastSweep  uint64

	kick     chan struct{} // wakes the background syncer (cad writes)
	done     chan struct{}
	syncerWG sync.WaitGroup

	// syncs and readSyncs are bumped by waiters that do not hold mu, so they
	// live outside stats (Status copies stats under mu only).
	syncs, readSyncs atomic.Uint64

	// The read check applies to values written by sync and cad writes, not async
	// ones (async promises nothing). checkPos is the highest engine position of a
	// chunk that held a sync or cad write; checking is set while such a chunk is
	// being appended (its position is not known yet, but its values are already
	// visible). A value at a position <= checkPos may come from a checked write
	// and is made durable before it is returned; conservative, never unsafe.
	checkPos atomic.Uint64
	checking atomic.Bool
}

var _ Replica = (*Shard)(nil)

// Open starts a shard over db, continuing versions after db.LastVersion() and
// reloading the client table the engine holds.
func Open(db Engine, opts Options) (*Shard, error) {
	if opts.Durability == 0 {
		opts.Durability = level.Sync
	}
	if opts.ClientTTL == 0 {
		opts.ClientTTL = time.Hour
	}
	if opts.MaxScan <= 0 {
		opts.MaxScan = DefaultMaxScan
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Shard{
		db:         db,
		opts:       opts,
		log:        opts.Logger,
		next:       db.LastVersion() + 1,
		clients:    kv.NewClientTable(0),
		sweepEvery: 4096,
		kick:       make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
	s.readGet = db.Get
	if lim, ok := db.(interface {
		MaxKeySize() int
		MaxValueSize() int
	}); ok {
		s.maxKey, s.maxVal = lim.MaxKeySize(), lim.MaxValueSize()
	}
	if sg, ok := db.(sharedGetter); ok {
		s.readGet = sg.GetShared
	}
	s.sdb, _ = db.(*storage.DB)
	if p, ok := db.(prober); ok {
		s.engineHas = p.Has
	}
	if c, ok := db.(changeCounter); ok {
		s.changes = c.Changes
	}
	s.getFn, s.hasFn, s.stageFn = s.getter(), s.prober(), s.stager()
	if err := s.loadClients(); err != nil {
		return nil, fmt.Errorf("shard: load client table: %w", err)
	}
	if err := s.openVersions(); err != nil {
		return nil, fmt.Errorf("shard: %w", err)
	}
	if err := s.migrateClients(); err != nil {
		return nil, fmt.Errorf("shard: rewrite the client table's rows: %w", err)
	}
	if err := s.finishFlush(); err != nil {
		return nil, fmt.Errorf("shard: %w", err)
	}
	if !opts.NoBackgroundSync {
		s.syncerWG.Add(1)
		go s.syncer()
	}
	s.log.Info("shard open", "next_version", s.next, "clients", s.clients.Len(),
		"durable_pos", uint64(db.DurablePos()), "last_pos", uint64(db.LastPos()))
	return s, nil
}

// Close stops the background syncer and makes everything applied durable. It does
// not close the engine.
func (s *Shard) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	verr := s.closeVersions()
	s.mu.Unlock()
	if verr != nil {
		return fmt.Errorf("shard: close: %w", verr)
	}
	close(s.done)
	s.syncerWG.Wait()
	if _, err := s.db.Sync(s.db.LastPos()); err != nil {
		return fmt.Errorf("shard: final sync: %w", err)
	}
	return nil
}

// syncer makes cad writes durable in the background, coalescing kicks: each round
// syncs everything appended so far with one fsync.
func (s *Shard) syncer() {
	defer s.syncerWG.Done()
	for {
		select {
		case <-s.done:
			return
		case <-s.kick:
		}
		last := s.db.LastPos()
		if last <= s.db.DurablePos() {
			continue
		}
		if _, err := s.db.Sync(last); err != nil {
			s.log.Error("background sync failed", "err", err)
			return
		}
	}
}

// CheckConsistency: a single node holds the latest state, so it serves every level.
func (s *Shard) CheckConsistency(c level.Consistency) error {
	if c.Kind < level.Linearizable || c.Kind > level.Eventual {
		return fmt.Errorf("consistency %v: %w", c, level.ErrUnknownLevel)
	}
	return nil
}

// CheckDurability: a single node provides every level (majority = itself).
func (s *Shard) CheckDurability(d level.Durability) error {
	if d < level.Sync || d > level.Async {
		return fmt.Errorf("durability %v: %w", d, level.ErrUnknownLevel)
	}
	return nil
}

// Write applies one write and waits for its durability.
func (s *Shard) Write(ctx context.Context, op kv.Op, d level.Durability, id ReqID) (kv.Result, error) {
	reqs := [1]WriteReq{{Op: op, Durability: d, ID: id}}
	p, err := s.Apply(ctx, reqs[:])
	if err != nil {
		return kv.Result{}, err
	}
	if reqs[0].Err != nil {
		return kv.Result{}, reqs[0].Err
	}
	if err := s.Wait(ctx, p); err != nil {
		return kv.Result{}, err
	}
	return reqs[0].Result, nil
}

// Wait makes p.SyncPos durable; the engine shares one fsync among concurrent waiters.
func (s *Shard) Wait(ctx context.Context, p Pending) error {
	if p.SyncPos == 0 || p.SyncPos <= s.db.DurablePos() {
		return nil
	}
	if _, err := s.db.Sync(p.SyncPos); err != nil {
		return fmt.Errorf("%w: sync: %w", ErrUnavailable, err)
	}
	s.syncs.Add(1)
	return nil
}

// Apply applies reqs in order under the writer lock, appending their records in
// chunks. Within a chunk, a read-modify-write sees the earlier writes of the same
// chunk by searching the records not yet appended.
func (s *Shard) Apply(ctx context.Context, reqs []WriteReq) (Pending, error) {
	if err := ctx.Err(); err != nil {
		return Pending{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Pending{}, ErrClosed
	}
	var p Pending
	now := s.opts.Now()
	ts, nowMs := now.UnixNano(), now.UnixMilli()
	start := 0 // first request of the current chunk
	s.truncate(0)
	if s.hmOK && (s.changes == nil || s.changes() != s.hmChanges) {
		s.hmOK = false // another append came since (hm)
	}
	if s.opts.ClientTTL > 0 && s.stats.Writes-s.lastSweep >= s.sweepEvery {
		s.lastSweep = s.stats.Writes
		s.expireClients(ts)
	}
	for i := range reqs {
		r := &reqs[i]
		r.Result, r.Err, r.deduped, r.row = kv.Result{}, nil, false, nil
		if r.Op.Now == 0 {
			// The proposer's clock decides expiry (kv/expiry.go); a front
			// door that turned a relative TTL into ExpireAt set Now already.
			r.Op.Now = nowMs
		}
		if r.Durability == 0 {
			r.Durability = s.opts.Durability
		}
		if !r.ID.IsZero() {
			switch d, e := s.clients.Check(r.ID.Client, r.ID.Seq); d {
			case kv.Duplicate:
				// Only successful writes are cached here, so an op error in a row
				// cannot occur; one that does not decode is this node's fault.
				res, opErr, err := kv.DecodeResult(e.Result)
				if err != nil {
					opErr = fmt.Errorf("%w: client table entry of client %d: %w", ErrUnavailable, r.ID.Client, err)
				}
				r.Result, r.Err, r.deduped = res, opErr, true
				s.stats.Deduped++
				// The original may still be waiting for its fsync (a retry racing
				// it on another connection): the answer waits for durability too.
				if r.Durability == level.Sync {
					p.SyncPos = max(p.SyncPos, s.db.LastPos())
				}
				continue
			case kv.Stale:
				r.Err = ErrStaleRequest
				continue
			}
		}
		before := len(s.recs)
		r.Err = s.apply(&r.Op, ts, &r.Result)
		if r.Err != nil {
			r.Result = kv.Result{}
			s.truncate(before)
			continue
		}
		if revealsState(&r.Op) && !s.opts.NoReadDurabilityCheck {
			// A read-modify-write's reply is also a read (the old value, whether
			// the key existed, a count): like a read, it may only report state a
			// crash cannot take back. Earlier batches are covered here, this
			// batch's own records by flush.
			p.SyncPos = max(p.SyncPos, s.applyLimit())
			r.reveals = true
		}
		if !r.ID.IsZero() {
			// The table entry shares the write's version if the write staged records
			// (it assigned the newest version); a write that changed nothing (a failed
			// SET NX) still advances the client's seq, under a version of its own.
			v := s.next - 1
			if len(s.recs) == before {
				v = s.next
				s.next++
			}
			row, off := kv.AppendClientRow(make([]byte, 0, 32+len(r.Result.Bulk)), r.ID.Seq, r.Result, nil)
			s.recs = append(s.recs, storage.Record{Key: kv.ClientRowKey(r.ID.Client), Value: row, Version: v, Timestamp: ts})
			r.row, r.rowVer = row[off:], v
		}
		if len(s.recs) >= chunk {
			if err := s.flush(reqs[start:i+1], &p); err != nil {
				failRest(reqs[i+1:], err)
				return p, nil
			}
			start = i + 1
		}
	}
	_ = s.flush(reqs[start:], &p) // a failure is in the requests' Err
	return p, nil
}

// revealsState reports whether a write's reply carries state it read: the old
// value (GETSET, SET GET), whether the key existed or matched (SET NX/XX, CAS), a
// count (DEL) or a computed value (INCRBY, APPEND's length). Plain SET and MSET
// reply OK whatever was there: they are nil-externalizing.
func revealsState(op *kv.Op) bool {
	switch op.Kind {
	case kv.KindSet:
		return op.Cond != kv.Always || op.ReturnOld
	case kv.KindMSet:
		return false
	case kv.KindHSet: // (IsUpdate's comparisons, for the commonest hash write)
		return true
	}
	return op.Kind.IsUpdate()
}

func failRest(reqs []WriteReq, err error) {
	for i := range reqs {
		reqs[i].Result, reqs[i].Err = kv.Result{}, err
	}
}

// flush appends the pending records of reqs and, on success, records their client
// table entries and durability needs. On failure every write in reqs fails.
func (s *Shard) flush(reqs []WriteReq, p *Pending) error {
	if len(s.recs) == 0 {
		return nil
	}
	ts := s.recs[0].Timestamp
	needCheck := false
	for i := range reqs {
		if reqs[i].Err == nil && !reqs[i].deduped && reqs[i].Durability != level.Async {
			needCheck = true
			break
		}
	}
	if needCheck {
		s.checking.Store(true)
	}
	err := s.reserveFor()
	var pos storage.Pos
	if err == nil {
		pos, err = s.db.Append(s.recs...)
	}
	if needCheck {
		if err == nil && uint64(pos) > s.checkPos.Load() {
			s.checkPos.Store(uint64(pos)) // only the writer (under mu) stores
		}
		s.checking.Store(false)
	}
	keep := err == nil && s.changes != nil && s.hmFresh(s.hmKey)
	s.truncate(0)
	// hsetFast checks only the records staged since hm (hmN), and those
	// checked are gone now: hm is kept only if it was checked here. Not
	// kept: hmFresh found a record of its key, the append failed (the
	// engine may hold a part), or the engine counts no changes (truncate
	// does not drop an hm that was loaded with nothing staged, hmN 0).
	s.hmOK = keep
	if keep {
		// The chunk's records are the engine's now, and hm is still the
		// key's: no record of it came after hm's own.
		s.hmN, s.hmChanges = 0, s.changes()
		clear(s.hmRows[:]) // the engine's now
	}
	if err != nil {
		err = fmt.Errorf("%w: append: %w", ErrUnavailable, err)
		for i := range reqs {
			if reqs[i].Err == nil {
				reqs[i].Err = err
			}
		}
		return err
	}
	cad := false
	for i := range reqs {
		r := &reqs[i]
		if r.Err != nil || r.deduped {
			continue
		}
		s.stats.Writes++
		if !r.ID.IsZero() {
			// The entry's result is the row's encoding (a copy made when the row
			// was staged: the result may alias the caller's request buffers).
			s.clients.Put(kv.ClientEntry{Client: r.ID.Client, ReqNum: r.ID.Seq, Op: r.rowVer, Result: r.row, Touched: ts})
		}
		switch r.Durability {
		case level.Sync:
			p.SyncPos = max(p.SyncPos, pos)
		case level.CAD:
			cad = true
		}
		if r.reveals && needCheck {
			p.SyncPos = max(p.SyncPos, pos)
		}
	}
	if cad {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// getter returns the writer's kv.Getter (getFn), current: it returns the
// latest value of key as the writer sees it, the newest record of the
// chunk being built, else the engine's (ok false if missing or deleted).
// A closure, not a method value, as stager's: the method value's wrapper
// was ~19 instructions of each pipelined HSET's metadata read
// (docs/design/hashes.md, "Pipelined, session 28").
func (s *Shard) getter() kv.Getter {
	return func(key []byte) (data, meta []byte, version uint64, ok bool, err error) {
		if s.memoCur && s.memoFresh(key) {
			return s.memo.Data, s.memo.Meta, s.memo.Version, s.memoOK, nil
		}
		if r := s.stagedRec(key); r != nil {
			return r.Value, r.Meta, r.Version, !r.Tombstone, nil
		}
		data, meta, version, ok, err = s.engineGet(key)
		if err == nil {
			// No staged record of key (stagedRec): the engine's is current.
			s.memoCur, s.memoN = true, len(s.recs)
		}
		return data, meta, version, ok, err
	}
}

// memoFresh reports whether the memo (memoCur) is key's current value: it
// is key's read, and no record staged since the last check has key.
func (s *Shard) memoFresh(key []byte) bool {
	if len(key) != len(s.memoKey) || string(key) != string(s.memoKey) {
		return false
	}
	if !s.unstagedSince(key, &s.memoN) {
		s.memoCur = false // staged since: the staged index answers
		return false
	}
	return true
}

// unstagedSince reports whether no record of recs[*n:] has key, moving *n
// to the end of those it checked.
func (s *Shard) unstagedSince(key []byte, n *int) bool {
	for ; *n < len(s.recs); *n++ {
		if k := s.recs[*n].Key; len(k) == len(key) && string(k) == string(key) {
			return false
		}
	}
	return true
}

// hmFresh reports whether hm is key's current metadata: no record of key
// was staged since hmN. (The rows of hm's hash that other writes staged
// since need no bit in hmRows: a write that adds or deletes a field
// rewrites the metadata record, its count, which makes hm stale and the
// next load scans the chunk; one that only overwrites a field leaves it
// existing, as the engine says.)
func (s *Shard) hmFresh(key []byte) bool {
	if !s.hmOK || len(key) != len(s.hmKey) || string(key) != string(s.hmKey) {
		return false
	}
	if !s.unstagedSince(key, &s.hmN) {
		s.hmOK = false
		return false
	}
	return true
}

// rowBits is the width of hmRows's hash: 4,096 bits for the rows of a
// chunk of up to 256 records, so that few probes of rows not staged find
// their bit set.
const rowBits = 12

// rowBit is key's bit in hmRows: a hash of its length and its last eight
// bytes, where a hash's rows differ (a row key is at least 18 bytes).
func rowBit(key []byte) uint64 {
	tail := binary.LittleEndian.Uint64(key[len(key)-8:])
	return ((tail ^ uint64(len(key))) * 0x9e3779b97f4a7c15) >> (64 - rowBits)
}

// stagedBits is the width of stagedRec's hash: 1,024 slots for chunks of up
// to 256 records (an op's records may take a chunk past it), so most keys
// have a slot of their own.
const stagedBits = 10

// stagedSlot is a slot of Shard.stagedIdx: the newest record (i) of the
// chunk of generation gen whose key has the slot's hash.
type stagedSlot struct {
	gen uint32
	i   int32
}

// stagedRec returns the newest record of key in the chunk being built, nil
// if it has none.
func (s *Shard) stagedRec(key []byte) *storage.Record {
	if s.stagedN < len(s.recs) {
		s.indexStaged()
	}
	if s.stagedN == 0 {
		return nil
	}
	e := s.stagedIdx[stagedHash(key)]
	if e.gen != s.stagedGen {
		return nil
	}
	// Keys that share long prefixes (a hash's field rows: 30 bytes) differ
	// at their ends: the last byte rules out most before a comparison of
	// the whole key.
	n := len(key)
	for i := e.i; i >= 0; i = s.stagedPrev[i] {
		if k := s.recs[i].Key; len(k) == n && (n == 0 || k[n-1] == key[n-1]) && bytes.Equal(k, key) {
			return &s.recs[i]
		}
	}
	return nil
}

// indexStaged adds recs[stagedN:] to stagedRec's index, starting a new
// generation when the index is empty (a new chunk, or after a truncate).
func (s *Shard) indexStaged() {
	if s.stagedN == 0 {
		s.stagedGen++
		if s.stagedGen == 0 { // wrapped: slots of generation 1 may be four billion chunks old
			clear(s.stagedIdx[:])
			s.stagedGen = 1
		}
		s.stagedPrev = s.stagedPrev[:0]
	}
	for ; s.stagedN < len(s.recs); s.stagedN++ {
		h := stagedHash(s.recs[s.stagedN].Key)
		prev := int32(-1)
		if e := s.stagedIdx[h]; e.gen == s.stagedGen {
			prev = e.i
		}
		s.stagedIdx[h] = stagedSlot{gen: s.stagedGen, i: int32(s.stagedN)}
		s.stagedPrev = append(s.stagedPrev, prev)
	}
}

// stagedHash is key's slot in Shard.stagedIdx: a hash of its length and its
// last eight bytes, where keys of one batch differ (a hash's field rows share
// their first 30).
func stagedHash(key []byte) uint64 {
	var tail uint64
	if n := len(key); n >= 8 {
		tail = binary.LittleEndian.Uint64(key[n-8:])
	} else {
		for _, c := range key {
			tail = tail<<8 | uint64(c)
		}
	}
	return ((tail ^ uint64(len(key))) * 0x9e3779b97f4a7c15) >> (64 - stagedBits)
}

// truncate drops the staged records from n on (a failed write's, or a
// chunk appended) and forgets them in stagedRec's index: records staged
// later at the same positions hold other keys.
func (s *Shard) truncate(n int) {
	s.recs = s.recs[:n]
	if n < s.memoN {
		s.memoCur = false
	}
	if n < s.hmN {
		s.hmOK = false
	}
	if n == 0 {
		s.memoSet, s.memoCur = false, false
		if cap(s.scratch) > 1<<20 {
			s.scratch = nil // one huge batch must not pin its memory
		}
		s.scratch = s.scratch[:0]
	}
	if s.stagedN > n {
		s.stagedN = 0 // rebuilt from recs[:n], in a new generation, at the next search
	}
}

// prober returns the writer's kv.Prober (hasFn), has: current (getter)
// for a caller that needs only whether key holds a value, which the
// engine's index answers without reading the record. A closure, as
// getter's (its wrapper: ~15 instructions of a pipelined HSET's probe).
func (s *Shard) prober() kv.Prober {
	return func(key []byte) (bool, error) { return s.has(key) }
}

// has is prober's function, which hsetFast calls directly.
func (s *Shard) has(key []byte) (bool, error) {
	if r := s.stagedRec(key); r != nil {
		return !r.Tombstone, nil
	}
	return s.hasUnstaged(key)
}

// hasUnstaged is has of a key the chunk has not staged: the engine's answer.
func (s *Shard) hasUnstaged(key []byte) (bool, error) {
	var ok bool
	var err error
	switch {
	case s.sdb != nil:
		// A direct call, as get's: not through the method value.
		ok, s.probeHint, err = s.sdb.Probe(key)
		s.probeKey = key
	case s.engineHas == nil:
		_, _, _, ok, err := s.engineGet(key)
		return ok, err
	default:
		ok, err = s.engineHas(key)
	}
	if err != nil {
		return false, fmt.Errorf("%w: has: %w", ErrUnavailable, err)
	}
	return ok, nil
}

// engineGet is current's read of the engine (no staged record has key).
func (s *Shard) engineGet(key []byte) (data, meta []byte, version uint64, ok bool, err error) {
	if s.memoSet && bytes.Equal(s.memoKey, key) {
		return s.memo.Data, s.memo.Meta, s.memo.Version, s.memoOK, nil
	}
	v, err := s.db.Get(key)
	if errors.Is(err, storage.ErrNotFound) {
		s.setMemo(key, storage.Value{}, false)
		return nil, nil, 0, false, nil
	}
	if err != nil {
		return nil, nil, 0, false, fmt.Errorf("%w: get: %w", ErrUnavailable, err)
	}
	s.setMemo(key, v, true)
	return v.Data, v.Meta, v.Version, true, nil
}

// setMemo remembers an engine read for engineGet (v's bytes are the
// caller's copy, never changed: records are not modified in place).
func (s *Shard) setMemo(key []byte, v storage.Value, ok bool) {
	s.memoKey = append(s.memoKey[:0], key...)
	s.memo, s.memoOK, s.memoSet = v, ok, true
	s.memoCur = false // current says when it is (it has looked for staged records)
}

// apply evaluates one write against the current state (kv.Apply) and stages
// its records at the next version, which it consumes only if the write wrote
// something: every record of one write shares its version. Its result goes
// to *res (zero on entry; the caller zeroes it again on an error), the
// request's own: a Result returned through each call was copied at each
// (docs/design/hashes.md, "Pipelined, session 28").
func (s *Shard) apply(op *kv.Op, ts int64, res *kv.Result) error {
	if s.maxKey > 0 {
		if err := op.CheckSizes(s.maxKey, s.maxVal); err != nil {
			return err
		}
	}
	v := s.next
	get := s.getFn
	s.probeKey = nil // an earlier write's probe
	var list kv.Lister
	if op.Lists() {
		// Only then: the closures allocate. A flush reads each key once and
		// stages a tombstone for most: they must not be searched by the
		// reads of the next keys (current's linear search of the chunk
		// would make a flush of n keys cost n²; a COPY of a hash of n
		// fields alike).
		get, list = s.flushReaders(len(s.recs))
	}
	before := len(s.recs)
	s.stageTS = ts
	// One node tracks nothing by the version of a hash's user key, so an
	// HSET of existing fields writes only their rows (SparseHashMeta).
	var err error
	opts := kv.ApplyOptions{SparseHashMeta: true, Scratch: &s.scratch, NoTxLocks: true, OrderedList: true} // flushReaders' list
	switch op.Kind {
	case kv.KindSet:
		// ApplyWithOptions sends a SET to apply: directly, the commonest
		// write skips a call of nine arguments (~65 instructions of a
		// pipelined SET's ~3,200; docs/design/one-house.md). HSET, the
		// commonest hash write, alike (kv.ApplyHashTo). One node holds no
		// cross-group transaction's locks: ApplyLockFree and NoTxLocks
		// skip the lock rule's lookup.
		*res, err = kv.ApplyLockFree(get, v, op, s.maxVal, s.stageFn)
	case kv.KindHSet:
		if len(op.Keys) == 2 && !s.noHSetFast {
			var done bool
			if done, err = s.hsetFast(op, v, res); done {
				break
			}
		}
		err = kv.ApplyHashTo(get, s.hasFn, v, op, s.stageFn, opts, res)
	default:
		*res, err = kv.ApplyWithOptions(get, list, s.hasFn, v, op, s.maxVal, s.stageFn, opts)
	}
	if err != nil {
		return err // the caller drops what was staged, and the result
	}
	if len(s.recs) > before {
		s.next++
	}
	return nil
}

// hsetFast applies a one-field HSET, HMSET or HSETNX of a hash without an
// expiry as kv.ApplyHashTo would with SparseHashMeta, from the hash's
// decoded metadata (hm) rather than its record: the row's probe, then the
// row alone (an existing field) or the metadata record with the count one
// higher and the row (a new one). done false: it staged nothing and the
// caller takes kv's path — the key holds no such hash (missing, expired or
// with an expiry, of another type, reserved) or its read failed (kv's
// reports it). TestHSetFastAgreesWithKv holds the two to one another.
func (s *Shard) hsetFast(op *kv.Op, v uint64, res *kv.Result) (done bool, err error) {
	if !s.hmFresh(op.Key) {
		if kv.CheckKey(op.Key) != nil {
			return false, nil
		}
		data, meta, ver, ok, err := s.getFn(op.Key)
		if err != nil {
			return false, nil
		}
		if s.hm, ok = kv.LiveHashMeta(data, meta, ver, ok); !ok {
			s.hmOK = false
			return false, nil
		}
		s.hmKey = append(s.hmKey[:0], op.Key...)
		s.hmOK = true
		if s.changes != nil {
			s.hmChanges = s.changes()
		}
		// The value read is current; of the records staged before it,
		// any may be one of its rows: with none, an empty filter, else a
		// full one (the staged index answers every probe until the chunk's
		// append clears it). Not a scan of the chunk for its rows: over
		// many hashes hm is loaded at almost every HSET, and the scan made
		// a pipelined batch of them quadratic (~5x kv's path).
		if len(s.recs) == 0 {
			clear(s.hmRows[:])
		} else {
			for i := range s.hmRows {
				s.hmRows[i] = ^uint64(0)
			}
		}
		s.hmN = len(s.recs)
	}
	row := s.hm.RowKey(&s.scratch, op.Keys[0])
	var exists bool
	b := rowBit(row)
	switch {
	case s.hmRows[b>>6]&(1<<(b&63)) != 0:
		exists, err = s.has(row)
	case s.sdb != nil: // hasUnstaged's first case, without its call
		exists, s.probeHint, err = s.sdb.Probe(row)
		s.probeKey = row
		if err != nil {
			err = fmt.Errorf("%w: has: %w", ErrUnavailable, err)
		}
	default:
		exists, err = s.hasUnstaged(row)
	}
	if err != nil {
		return true, err
	}
	// *res is zero on entry (apply): only its fields are written.
	switch {
	case exists && op.Cond == kv.IfAbsent:
		res.Kind, res.Version = kv.ResInt, s.hm.Ver
		return true, nil
	case !exists:
		// The metadata first, as kv's emit: its crash order.
		res.Int = 1
		s.hm.N++
		s.hm.Ver = v
		value, meta := s.hm.Record(&s.scratch)
		s.stageFn(op.Key, value, meta, false)
	}
	value := op.Keys[1]
	if value == nil {
		value = []byte{} // nil stages a deletion's value (kv's put)
	}
	s.stageFn(row, value, nil, false)
	// Its own records are in hm, its row in hmRows.
	s.hmRows[b>>6] |= 1 << (b & 63)
	s.hmN = len(s.recs)
	res.Kind, res.Version = kv.ResInt, v
	if op.Delta == 1 {
		res.Kind, res.Int = kv.ResOK, 0
	}
	return true, nil
}

// stager returns apply's kv.Emit (stageFn): it stages a record of the
// write being applied, at version s.next (not consumed until the write
// returns) and timestamp s.stageTS, written in place, field by field: an
// appended composite literal was built on the stack, zeroed, filled and
// copied (~80 instructions of every write's record, a third of it the
// Hint's 24 bytes). A closure, not a method value: the method, too large
// to inline, would be a second call behind the method value's wrapper.
func (s *Shard) stager() kv.Emit {
	return func(key, value, meta []byte, tomb bool) {
		if len(s.recs) == cap(s.recs) {
			s.growRecs()
		}
		s.recs = s.recs[:len(s.recs)+1]
		r := &s.recs[len(s.recs)-1]
		r.Key, r.Value, r.Meta = key, value, meta
		r.Version, r.Timestamp, r.Tombstone = s.next, s.stageTS, tomb
		r.Hint = storage.Hint{}
		if len(key) == len(s.probeKey) && unsafe.SliceData(key) == unsafe.SliceData(s.probeKey) {
			r.Hint = s.probeHint // the bytes has probed: the same key
		}
	}
}

// growRecs makes room for one more staged record.
func (s *Shard) growRecs() { s.recs = slices.Grow(s.recs, 1) }

// Read serves a read. On one node the latest state satisfies every consistency
// level, so c only matters for validation; the session only needs this node to have
// the versions it saw. Unless disabled, a read that would return a version not yet
// durable first makes it durable (cad: no read observes what a crash can take back).
func (s *Shard) Read(ctx context.Context, op kv.Op, c level.Consistency, sess Session) (kv.Result, error) {
	if err := ctx.Err(); err != nil {
		return kv.Result{}, err
	}
	if err := s.readChecks(c, sess); err != nil {
		return kv.Result{}, err
	}
	if op.Kind == kv.KindGet || op.Kind == kv.KindStrlen {
		// The hot path (a pipelined GET): one key, read without kv.Read's
		// closures (they cost ~15 % of a cached GET's CPU); the clock is read
		// only for a key with meta (getLive).
		v, ok, err := s.getLive(op.Key, op.Now)
		if err != nil {
			return kv.Result{}, err
		}
		if err := s.readDurable(v.Pos); err != nil { // a miss carries its tombstone's position (see get)
			return kv.Result{}, err
		}
		if ok && kv.MetaType(v.Meta) != kv.TypeString {
			return kv.Result{}, kv.ErrWrongKind // a GET of a hash
		}
		return kv.PointResult(op.Kind, v.Data, v.Version, ok), nil
	}
	if op.Kind == kv.KindHGet && len(op.Keys) == 1 && !(mutation.On && s.tornMultiReads) {
		// HGET, HEXISTS, HSTRLEN: two keys read without a snapshot or
		// kv.Read's closures, unless a write moved the hash between them.
		if res, ok, err := s.hgetOne(&op); ok || err != nil {
			return res, err
		}
	}
	if op.Now == 0 {
		// One node: its clock is the leader's (docs/consistency.md, "Key expiry").
		op.Now = s.opts.Now().UnixMilli()
	}
	// maxPos is the highest log position the read observed: readDurable
	// makes it durable before the result is returned.
	var maxPos storage.Pos
	readGet := s.readGet
	var snap *storage.Snapshot
	if kv.MultiKey(&op) {
		// One version for every key: a write applied between two keys'
		// reads must not show in part (another client's x then k, seen
		// as k without x).
		snap = s.db.Snapshot(0)
		defer snap.Close()
		if !(mutation.On && s.tornMultiReads) {
			readGet = snap.Get
		}
	}
	n := 0
	get := func(k []byte) ([]byte, []byte, uint64, bool, error) {
		if n++; mutation.On && n == 2 && s.betweenKeys != nil {
			s.betweenKeys()
		}
		v, ok, err := s.getWith(readGet, k)
		maxPos = max(maxPos, v.Pos)
		return v.Data, v.Meta, v.Version, ok, err
	}
	var scan kv.Scanner
	if kv.IsHashRead(op.Kind) || op.Kind == kv.KindWatch || op.Kind == kv.KindExecRO {
		// A hash read (a WATCH of a hash: kv.Observe) reads its field
		// rows through the scanner (the getter hides reserved keys), in
		// the same snapshot as the key.
		scan = snapshotScan(snap, &maxPos, nil)
	}
	if op.Kind == kv.KindScan {
		// A scan also observes which keys are absent; a deletion it does not
		// show must not be one a crash can undo, so it waits for everything
		// appended so far to be durable (only when something is not).
		if !s.opts.NoReadDurabilityCheck {
			maxPos = s.checkLimit()
		}
		scan = snapshotScan(snap, &maxPos, op.ScanBuf) // the values into the caller's buffer, if it lends one
	}
	res, err := kv.Read(get, scan, &op, s.opts.MaxScan)
	if err != nil {
		return kv.Result{}, err
	}
	if err := s.readDurable(maxPos); err != nil {
		return kv.Result{}, err
	}
	return res, nil
}

// hgetOne serves an HGET of one field (HGET, HEXISTS, HSTRLEN) as kv.Read
// would, without its snapshot and closures (they cost an HGET as much as
// the engine's reads did: docs/design/hashes.md): hgetField's read as a
// kv.Result; ok false when the caller must read in a snapshot.
func (s *Shard) hgetOne(op *kv.Op) (res kv.Result, ok bool, err error) {
	v, version, ok, err := s.hgetField(op.Key, op.Keys[0], op.Now)
	if !ok || err != nil {
		return kv.Result{}, ok || err != nil, err
	}
	return kv.Result{Kind: kv.ResArray, Array: [][]byte{v}, Version: version}, true, nil
}

// ReadField is Read of an HGET of one field for a front door's hot path, as
// ReadKey is of a GET: it builds no Op and no Result. found is false for a
// missing field or hash; value is read-only.
func (s *Shard) ReadField(key, field []byte, c level.Consistency, sess Session) (value []byte, version uint64, found bool, err error) {
	if err := s.readChecks(c, sess); err != nil {
		return nil, 0, false, err
	}
	if !(mutation.On && s.tornMultiReads) {
		v, version, ok, err := s.hgetField(key, field, 0)
		if ok || err != nil {
			return v, version, v != nil, err
		}
	}
	// A write moved the hash between hgetField's reads: read in a snapshot.
	res, err := s.Read(context.Background(), kv.Op{Kind: kv.KindHGet, Key: key, Keys: [][]byte{field}}, c, sess)
	if err != nil {
		return nil, 0, false, err
	}
	return res.Array[0], res.Version, res.Array[0] != nil, nil
}

// hgetField reads field of the hash at key as of now (0: the shard's clock):
// its value (nil: absent, empty but not nil: empty) and the version of what
// it read; the hash's metadata record, then the field's row. The two must be
// one state: if the record did not change in between, the key held it the
// whole time, so when the row was read the hash was that generation and the
// field that value, a state the read may take effect at. The engine's change
// count (changeCounter) says so at the cost of two atomic loads: unmoved, no
// append came between the reads. Moved (or without a counter), the metadata
// record is read again, and if its version moved too (ok false) a write moved
// the hash in between — say RENAME h h2, HSET h2 f, which writes the very row
// this read found while h no longer holds it — and the caller reads in a
// snapshot. What it read is made durable before it returns (readDurable).
//
// The metadata record comes from the memo (hgetMemo) while the count has not
// moved since it was read: repeated HGETs of a hash between writes read one
// engine record each, as a GET does, not two or three. The row's key is built
// in a pooled buffer (rowKeys): with the memo, a one-field HGET allocates
// nothing here, as a GET does not.
func (s *Shard) hgetField(key, field []byte, now int64) (value []byte, version uint64, ok bool, err error) {
	if kv.IsReserved(key) {
		return nil, 0, true, kv.ErrReservedKey
	}
	var c0 uint64
	if s.changes != nil {
		c0 = s.changes()
	}
	m, live, err := s.hashMeta(key, c0)
	if err != nil {
		return nil, 0, true, err
	}
	m, live = s.liveAt(m, live, now)
	if !live {
		return nil, m.Version, true, s.readDurable(m.Pos) // one key: one state
	}
	buf, _ := s.rowKeys.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	defer s.rowKeys.Put(buf)
	row, err := kv.AppendHashFieldRow((*buf)[:0], m.Data, m.Meta, field)
	if err != nil {
		return nil, 0, true, err
	}
	*buf = row
	if mutation.On && s.betweenKeys != nil {
		s.betweenKeys()
	}
	version, pos := m.Version, m.Pos
	v, err := s.readGet(row)
	switch {
	case err == nil:
		value = v.Data
		if value == nil {
			value = []byte{}
		}
		version = max(version, v.Version)
		pos = max(pos, v.Pos)
	case !errors.Is(err, storage.ErrNotFound):
		return nil, 0, true, fmt.Errorf("%w: get: %w", ErrUnavailable, err)
	}
	if s.changes == nil || s.changes() != c0 && !(mutation.On && s.staleHashMeta) {
		if again, err := s.readGet(key); err != nil || again.Version != m.Version {
			return nil, 0, false, nil
		}
	}
	return value, version, true, s.readDurable(pos)
}

// hashMeta is hgetOne's read of key's metadata record with the engine's
// change count at c: the memo's if it was read at c (no append since), else
// the engine's, which becomes the memo if no append came during the read.
func (s *Shard) hashMeta(key []byte, c uint64) (storage.Value, bool, error) {
	if s.changes == nil {
		return s.get(key)
	}
	if mm := s.hgetMemo.Load(); mm != nil && (mm.changes == c || mutation.On && s.staleHashMeta) && mm.key == string(key) {
		return mm.v, true, nil
	}
	v, ok, err := s.get(key)
	if ok && err == nil && s.changes() == c {
		s.hgetMemo.Store(&hashMetaMemo{key: string(key), changes: c, v: v})
	}
	return v, ok, err
}

// readChecks validates a read's level and session before it is served.
func (s *Shard) readChecks(c level.Consistency, sess Session) error {
	if !c.IsZero() {
		if err := s.CheckConsistency(c); err != nil {
			return err
		}
	}
	if err := s.checkLost(sess); err != nil {
		return err
	}
	if need := sess.Need(); need > 0 && need > s.db.LastVersion() {
		return fmt.Errorf("%w: session needs version %d, replica has %d", ErrSessionAhead, need, s.db.LastVersion())
	}
	return nil
}

// readDurable makes what a read observed (up to log position maxPos) durable
// before it is returned, unless the check is off: no read reports a state a
// crash can take back.
func (s *Shard) readDurable(maxPos storage.Pos) error {
	if !s.opts.NoReadDurabilityCheck && maxPos > s.db.DurablePos() {
		maxPos = min(maxPos, s.checkLimit())
	}
	if !s.opts.NoReadDurabilityCheck && maxPos > s.db.DurablePos() {
		if _, err := s.db.Sync(maxPos); err != nil {
			return fmt.Errorf("%w: read durability sync: %w", ErrUnavailable, err)
		}
		s.readSyncs.Add(1)
	}
	return nil
}

// ReadPaths: a single node serves GET by ReadKey; its reads never hold a
// reply (Read waits for durability itself) and may wait for an fsync, so
// neither ReadDeferred nor TryRead gains anything.
func (s *Shard) ReadPaths() ReadPaths { return ReadPaths{Key: true} }

// ReadDeferred is Read: a single node's read holds no reply.
func (s *Shard) ReadDeferred(ctx context.Context, op kv.Op, c level.Consistency, sess Session) (kv.Result, Pending, error) {
	res, err := s.Read(ctx, op, c, sess)
	return res, Pending{}, err
}

// TryRead does nothing: whether a single node's read waits for an fsync is
// the front door's to know (it tracks its connections' unsynced writes).
func (s *Shard) TryRead(op kv.Op, c level.Consistency) (kv.Result, bool) { return kv.Result{}, false }

// ReadKey is Read of a GET of key for a front door's hot path: it builds no Op
// and no Result (copying those large structs was a measurable share of a
// pipelined GET's CPU). found is false for a missing key; value is read-only.
func (s *Shard) ReadKey(key []byte, c level.Consistency, sess Session) (value []byte, version uint64, found bool, err error) {
	if err := s.readChecks(c, sess); err != nil {
		return nil, 0, false, err
	}
	v, ok, err := s.get(key)
	if err != nil {
		return nil, 0, false, err
	}
	if ok && v.Meta != nil && kv.HasExpiry(v.Meta) {
		// getLive's verdict, inline: the call and its copies of the Value
		// were ~150 instructions of a pipelined GET's ~2,700.
		v, ok = s.liveAt(v, ok, 0)
	}
	if err := s.readDurable(v.Pos); err != nil {
		return nil, 0, false, err
	}
	if !ok {
		return nil, 0, false, nil
	}
	if kv.MetaType(v.Meta) != kv.TypeString {
		return nil, 0, false, kv.ErrWrongKind // a GET of a hash
	}
	return v.Data, v.Version, true, nil
}

// checkLimit is the highest position a read must make durable before returning
// what it saw there: values above it were written by async writes only.
func (s *Shard) checkLimit() storage.Pos {
	if s.checking.Load() {
		return s.db.LastPos()
	}
	return storage.Pos(s.checkPos.Load())
}

// applyLimit is checkLimit as Apply asks it, between flushes: checking is
// set only within flush's append, by the writer, which holds mu as Apply
// does, so Apply never finds it set and the limit is checkPos. A load, not
// checkLimit's call (~15 instructions of every revealing write of a
// pipelined batch of HSETs; docs/design/hashes.md, "Pipelined, session
// 32"), and no copy of it to forget after a flush.
func (s *Shard) applyLimit() storage.Pos { return storage.Pos(s.checkPos.Load()) }

// get reads k's latest value. For a key that is absent because of a deletion that
// is not durable yet, the returned Value carries the tombstone's Pos, so that the
// read check makes the deletion durable before the miss is reported: otherwise a
// crash could bring the value back after a read said it was gone.
func (s *Shard) get(k []byte) (storage.Value, bool, error) {
	// Shared: read results are only written to the client (Result's values are
	// read-only), so the engine's cached bytes need no copy.
	if s.sdb == nil || bytes.HasPrefix(k, kv.ReservedPrefix) {
		return s.getWith(s.readGet, k)
	}
	v, err := s.sdb.GetShared(k)
	if err != nil {
		return s.missed(k, err)
	}
	return v, true, nil
}

// getLive is get of a key as of now (unix ms; 0: the shard's clock, read
// only for a key that has meta, so a plain GET pays no clock): a key whose
// expiry is before now is absent (kv.Live), as kv.Read decides for every
// other read.
func (s *Shard) getLive(k []byte, now int64) (storage.Value, bool, error) {
	v, ok, err := s.get(k)
	if ok && v.Meta != nil && kv.HasExpiry(v.Meta) {
		v, ok = s.liveAt(v, ok, now)
	}
	return v, ok, err
}

// liveAt is getLive's verdict on v (found if ok) as of now. Meta without an
// expiry (a hash's type byte) needs no clock either.
func (s *Shard) liveAt(v storage.Value, ok bool, now int64) (storage.Value, bool) {
	if !ok || v.Meta == nil || !kv.HasExpiry(v.Meta) {
		return v, ok
	}
	if now == 0 {
		now = s.opts.Now().UnixMilli()
	}
	if !kv.Live(v.Meta, now) {
		ok = false
		v.Data, v.Meta = nil, nil
	}
	return v, ok
}

// getWith is get reading with readGet (the engine's latest, or a snapshot's).
func (s *Shard) getWith(readGet func([]byte) (storage.Value, error), k []byte) (storage.Value, bool, error) {
	if bytes.HasPrefix(k, kv.ReservedPrefix) {
		return storage.Value{}, false, nil
	}
	v, err := readGet(k)
	if err != nil {
		return s.missed(k, err)
	}
	return v, true, nil
}

// missed is get's answer when the engine's read of k failed with err: a
// miss (with a deletion's position, see get) or an unavailable engine.
func (s *Shard) missed(k []byte, err error) (storage.Value, bool, error) {
	if errors.Is(err, storage.ErrNotFound) {
		if !s.opts.NoReadDurabilityCheck && s.db.DurablePos() < s.checkLimit() {
			if vs, verr := s.db.Versions(k); verr == nil && len(vs) > 0 {
				return storage.Value{Pos: vs[0].Pos}, false, nil
			}
		}
		return storage.Value{}, false, nil
	}
	return storage.Value{}, false, fmt.Errorf("%w: get: %w", ErrUnavailable, err)
}

// Status reports the shard's progress.
func (s *Shard) Status() Status {
	s.mu.Lock()
	st := s.stats
	st.Clients = s.clients.Len()
	s.mu.Unlock()
	// Counted outside mu (waits run unlocked); stats' own copies stay zero.
	st.Syncs, st.ReadSyncs = s.syncs.Load(), s.readSyncs.Load()
	st.LastVersion = s.db.LastVersion()
	st.LastPos = uint64(s.db.LastPos())
	st.DurablePos = uint64(s.db.DurablePos())
	return st
}

// maxExpirePerSweep bounds the tombstones one sweep adds to a batch.
const maxExpirePerSweep = 1024

// expireClients forgets clients idle longer than the TTL (kv's idle rule), in
// memory and in the engine (a tombstone for the row rides along with the
// current batch).
func (s *Shard) expireClients(now int64) {
	ids := s.clients.ExpireIdle(now-int64(s.opts.ClientTTL), maxExpirePerSweep)
	for _, id := range ids {
		s.recs = append(s.recs, storage.Record{Key: kv.ClientRowKey(id), Version: s.next, Timestamp: now, Tombstone: true})
		s.next++
	}
	if len(ids) > 0 {
		s.log.Debug("client table: expired idle clients", "count", len(ids), "ttl", s.opts.ClientTTL)
	}
}
