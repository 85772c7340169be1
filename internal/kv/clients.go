package kv

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
)

// The client table: at-most-once execution of retried writes. A client tags
// each write with (client id, request number), numbers increasing; the table
// keeps, per client, its latest executed request and that request's outcome,
// so a retry is answered with the cached outcome instead of executing again.
// Every engine keeps this one table (ClientTable), decides with this one rule
// (Check), and persists it as these rows (ClientRowKey, AppendClientRow,
// DecodeClientRow): the single node (internal/shard), the VR core's replicated
// table (internal/vr) with its engine rows (internal/vrshard), and the
// simulator's replicas (which run the VR core). Pure, like the rest of kv: the
// caller passes times in and writes the rows it is handed.

// ClientEntry is one client's latest executed request.
type ClientEntry struct {
	Client uint64
	ReqNum uint64
	// Op is the position the request executed at: the VR op number in a
	// replica group, the version of its table row on a single node. The count
	// rule evicts the lowest first.
	Op uint64
	// Result is the request's outcome as AppendResult encodes it (decode with
	// DecodeResult). In a replica group it is part of the replicated state.
	Result []byte
	// Touched is the unix-nanosecond time of the client's latest write (the
	// timestamp of its row), for the idle rule (ExpireIdle). It is local: a
	// replica group's snapshots and messages do not carry it.
	Touched int64
}

// Dedup is the client table's answer for a tagged request.
type Dedup uint8

const (
	// NewRequest: the table holds no later request of this client: execute it.
	NewRequest Dedup = iota
	// Duplicate: the request is the client's latest executed one: answer it
	// with the cached result (ClientEntry.Result).
	Duplicate
	// Stale: the client has since executed a later request, so this one was
	// executed (or superseded) long ago and its result is gone: refuse it.
	Stale
)

// ClientTable is the in-memory client table. Two eviction rules bound it,
// each chosen by its owner because it is part of that owner's guarantee:
//
//   - the count rule (Cap > 0; a replica group, internal/vr): when an insert
//     takes the table past Cap, the entries with the lowest Op are dropped
//     until a tenth of the room is free. It depends only on the sequence of
//     inserts, so every replica drops the same entries at the same op and
//     their dedup decisions never diverge (a clock-based rule could not be).
//   - the idle rule (ExpireIdle; a single node, its --client-ttl): entries
//     whose client has not written since a cutoff the caller computes from
//     its clock are dropped.
//
// Either way a retry from a client the table forgot executes again: the
// price of any bounded table.
type ClientTable struct {
	m map[uint64]*ClientEntry
	// Cap bounds the table by the count rule; 0: no count bound.
	Cap int
	// Evicted counts entries the count rule dropped.
	Evicted uint64
}

// NewClientTable returns an empty table bounded by the count rule at limit
// entries (0: no count bound).
func NewClientTable(limit int) *ClientTable {
	return &ClientTable{m: map[uint64]*ClientEntry{}, Cap: limit}
}

// Len is the number of clients in the table.
func (t *ClientTable) Len() int { return len(t.m) }

// Get returns client's entry, or nil. The entry is the table's: a caller may
// update its Result (a replica group learns an op's outcome after ordering it).
func (t *ClientTable) Get(client uint64) *ClientEntry { return t.m[client] }

// Check is the dedup decision for request reqNum of client, with the entry it
// was taken from (nil for a client the table does not hold).
func (t *ClientTable) Check(client, reqNum uint64) (Dedup, *ClientEntry) {
	e := t.m[client]
	switch {
	case e == nil || reqNum > e.ReqNum:
		return NewRequest, e
	case reqNum == e.ReqNum:
		return Duplicate, e
	}
	return Stale, e
}

// Executed reports whether request reqNum of client was executed or
// superseded (Check answers Duplicate or Stale).
func (t *ClientTable) Executed(client, reqNum uint64) bool {
	d, _ := t.Check(client, reqNum)
	return d != NewRequest
}

// Put records e as its client's latest executed request (replacing what the
// table held for the client), applies the count rule, and returns the table's
// entry (nil if the count rule dropped it at once, which only a Cap too small
// for one batch can do).
func (t *ClientTable) Put(e ClientEntry) *ClientEntry {
	p := &e
	t.m[e.Client] = p
	t.evict()
	return t.m[e.Client]
}

// Load replaces the table's contents with es (a snapshot's or a restart's).
func (t *ClientTable) Load(es []ClientEntry) {
	t.m = make(map[uint64]*ClientEntry, len(es))
	for _, e := range es {
		t.m[e.Client] = &e
	}
}

// Entries returns a copy of the table in client order (a snapshot's).
func (t *ClientTable) Entries() []ClientEntry {
	out := make([]ClientEntry, 0, len(t.m))
	for _, e := range t.m {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b ClientEntry) int { return cmp.Compare(a.Client, b.Client) })
	return out
}

// MinOp returns the lowest Op in the table, or ok false if it is empty.
func (t *ClientTable) MinOp() (op uint64, ok bool) {
	for _, e := range t.m {
		if !ok || e.Op < op {
			op, ok = e.Op, true
		}
	}
	return op, ok
}

// evict applies the count rule.
func (t *ClientTable) evict() {
	if t.Cap <= 0 || len(t.m) <= t.Cap {
		return
	}
	keep := t.Cap - t.Cap/10
	es := make([]*ClientEntry, 0, len(t.m))
	for _, e := range t.m {
		es = append(es, e)
	}
	// Op is unique per entry in a replica group (one op executes one client's
	// request); Client breaks ties only for entries restored from a snapshot
	// with equal ops. Only the op order decides, never how far a replica has
	// applied, so replicas handed the same ops in different batches agree.
	slices.SortFunc(es, func(a, b *ClientEntry) int {
		if c := cmp.Compare(a.Op, b.Op); c != 0 {
			return c
		}
		return cmp.Compare(a.Client, b.Client)
	})
	for _, e := range es[:len(es)-keep] {
		delete(t.m, e.Client)
		t.Evicted++
	}
}

// ExpireIdle applies the idle rule: it drops the entries last touched before
// cutoff, at most limit of them (limit <= 0: all), and returns their client
// ids, least recently touched first (ties by id), so that which entries one
// call drops does not depend on map order.
func (t *ClientTable) ExpireIdle(cutoff int64, limit int) []uint64 {
	var idle []*ClientEntry
	for _, e := range t.m {
		if e.Touched < cutoff {
			idle = append(idle, e)
		}
	}
	if len(idle) == 0 {
		return nil
	}
	slices.SortFunc(idle, func(a, b *ClientEntry) int {
		if c := cmp.Compare(a.Touched, b.Touched); c != 0 {
			return c
		}
		return cmp.Compare(a.Client, b.Client)
	})
	if limit > 0 && len(idle) > limit {
		idle = idle[:limit]
	}
	ids := make([]uint64, len(idle))
	for i, e := range idle {
		ids[i] = e.Client
		delete(t.m, e.Client)
	}
	return ids
}

// The table's rows. An engine persists the table as one reserved key per
// client, rewritten by each of the client's writes in the same engine append
// as the write's records, so that a write and its row survive a crash
// together:
//
//	key:     ClientRowPrefix | client id (8 bytes, big-endian)
//	value:   request number uvarint | AppendResult(outcome)
//	version: the entry's Op; timestamp: the entry's Touched
//
// The prefix's bytes say "vrclient/" because the replica group's rows were
// the first in this format. A single node's rows written before issue 26 used
// ReservedKey("client/") and another value (LegacyClientRowPrefix,
// DecodeLegacyClientRow); a single node rewrites them at open.

// ClientRowPrefix starts every client-table row's key.
var ClientRowPrefix = ReservedKey("vrclient/")

// ClientRowEnd ends the range of rows: ClientRowPrefix with its last byte
// ('/') incremented.
var ClientRowEnd = ReservedKey("vrclient0")

// ClientRowKey is the key of client's row.
func ClientRowKey(client uint64) []byte {
	return binary.BigEndian.AppendUint64(append(make([]byte, 0, len(ClientRowPrefix)+8), ClientRowPrefix...), client)
}

// ClientRowID returns the client id a row key under prefix names.
func ClientRowID(prefix, key []byte) (uint64, error) {
	if len(key) != len(prefix)+8 {
		return 0, fmt.Errorf("%w: client row key %q: bad length", ErrCorrupt, key)
	}
	return binary.BigEndian.Uint64(key[len(prefix):]), nil
}

// AppendClientRow appends the value of a row for request reqNum with outcome
// (res, opErr) to b. The encoded outcome is b's tail from the returned
// offset: the ClientEntry.Result of the row's entry.
func AppendClientRow(b []byte, reqNum uint64, res Result, opErr error) (row []byte, result int) {
	b = binary.AppendUvarint(b, reqNum)
	result = len(b)
	return AppendResult(b, res, opErr), result
}

// RowValue is the value of e's row (what AppendClientRow wrote for it).
func (e *ClientEntry) RowValue() []byte {
	return append(binary.AppendUvarint(make([]byte, 0, 10+len(e.Result)), e.ReqNum), e.Result...)
}

// DecodeClientRow decodes a row (its key, value, version and timestamp) into
// its entry. The entry's Result aliases value.
func DecodeClientRow(key, value []byte, version uint64, ts int64) (ClientEntry, error) {
	id, err := ClientRowID(ClientRowPrefix, key)
	if err != nil {
		return ClientEntry{}, err
	}
	req, n := binary.Uvarint(value)
	if n <= 0 {
		return ClientEntry{}, fmt.Errorf("%w: client %d row: bad request number", ErrCorrupt, id)
	}
	if _, _, err := DecodeResult(value[n:]); err != nil {
		return ClientEntry{}, fmt.Errorf("client %d row: %w", id, err)
	}
	return ClientEntry{Client: id, ReqNum: req, Op: version, Result: value[n:], Touched: ts}, nil
}

// LegacyClientRowPrefix starts the keys of a single node's rows written
// before issue 26 (same key layout, ClientRowPrefix's place).
var LegacyClientRowPrefix = ReservedKey("client/")

// DecodeLegacyClientRow decodes a single node's row written before issue 26:
// request number uvarint | result kind byte | int varint | version uvarint |
// bulk (the rest); no error (a single node cached only successful writes).
// The entry's Result is re-encoded in today's format.
func DecodeLegacyClientRow(key, value []byte, version uint64, ts int64) (ClientEntry, error) {
	id, err := ClientRowID(LegacyClientRowPrefix, key)
	if err != nil {
		return ClientEntry{}, err
	}
	d := Decoder{B: value}
	req := d.Uvarint()
	kind := ResultKind(d.Byte())
	i := d.Varint()
	ver := d.Uvarint()
	if d.Err != nil {
		return ClientEntry{}, fmt.Errorf("client %d legacy row: %w", id, d.Err)
	}
	if kind < ResOK || kind > ResNil {
		return ClientEntry{}, fmt.Errorf("%w: client %d legacy row: result kind %d", ErrCorrupt, id, kind)
	}
	res := Result{Kind: kind, Int: i, Version: ver}
	if kind == ResBulk {
		res.Bulk = d.B
	}
	return ClientEntry{Client: id, ReqNum: req, Op: version, Result: AppendResult(nil, res, nil), Touched: ts}, nil
}

// AppendClientEntries appends a list of entries (a snapshot's table: the VR
// log's checkpoints, the peer wire, the simulator's log): count uvarint, then
// per entry client, request number, op uvarints and the result as a byte
// string. Touched is not encoded (it is local).
func AppendClientEntries(b []byte, es []ClientEntry) []byte {
	b = binary.AppendUvarint(b, uint64(len(es)))
	for _, c := range es {
		b = binary.AppendUvarint(b, c.Client)
		b = binary.AppendUvarint(b, c.ReqNum)
		b = binary.AppendUvarint(b, c.Op)
		b = AppendBytes(b, c.Result)
	}
	return b
}

// DecodeClientEntries reads what AppendClientEntries wrote from d. Results
// are copies. A count the remaining bytes cannot hold (every entry takes at
// least 4) fails d without allocating.
func DecodeClientEntries(d *Decoder) []ClientEntry {
	n := d.Uvarint()
	if d.Err != nil || n == 0 {
		return nil
	}
	if n > uint64(len(d.B))/4 {
		d.Err = fmt.Errorf("%w: %d client entries in %d bytes", ErrCorrupt, n, len(d.B))
		return nil
	}
	es := make([]ClientEntry, n)
	for i := range es {
		c := &es[i]
		c.Client, c.ReqNum, c.Op = d.Uvarint(), d.Uvarint(), d.Uvarint()
		c.Result = append([]byte(nil), d.Bytes()...)
	}
	if d.Err != nil {
		return nil
	}
	return es
}
