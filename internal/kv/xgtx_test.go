package kv

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/mutation"
)

// try applies op at the next version and returns its result and error (an
// op that errs lands nothing).
func (s *mvStore) try(op Op) (Result, error) {
	v := s.last + 1
	var recs []mvRec
	var keys []string
	res, err := Apply(s.at(s.last), v, &op, 0, func(key, value, meta []byte, tomb bool) {
		keys = append(keys, string(key))
		recs = append(recs, mvRec{v, append([]byte(nil), value...), tomb, bytes.Clone(meta)})
	})
	if err != nil {
		return res, err
	}
	for i, k := range keys {
		s.vers[k] = append(s.vers[k], recs[i])
	}
	s.last = v
	return res, nil
}

func (s *mvStore) mustReply(t *testing.T, op Op, want string) {
	t.Helper()
	res, err := s.try(op)
	if err != nil {
		t.Fatalf("%v: %v", op.Kind, err)
	}
	if got := string(res.Bulk); !strings.HasPrefix(got, want) {
		t.Fatalf("%v answered %q, want %q…", op.Kind, got, want)
	}
}

func (s *mvStore) locks(t *testing.T) uint64 {
	t.Helper()
	n, err := TxLockCount(s.at(s.last))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// xfer is a cross-group transfer of 10 from x (group a, the primary) to y
// (group b), read at each group's current state: its two prepares.
func xfer(t *testing.T, txid string, ga, gb *mvStore, x, y string) (pa, pb Op) {
	t.Helper()
	read := func(s *mvStore, k string) (int64, uint64) {
		d, _, v, ok, _ := s.at(s.last)([]byte(k))
		if !ok {
			return 0, 0
		}
		n, err := ParseInt(d)
		if err != nil {
			t.Fatal(err)
		}
		return n, v
	}
	xv, xver := read(ga, x)
	_, yver := read(gb, y)
	_ = xv
	var err error
	pa, err = NewTxPrepare([]byte(txid), []byte(x), ga.last, TxOrigin{},
		[]TxCheck{{Key: []byte(x), Version: xver}}, []Op{{Kind: KindIncrBy, Key: []byte(x), Delta: -10}})
	if err != nil {
		t.Fatal(err)
	}
	pb, err = NewTxPrepare([]byte(txid), []byte(x), gb.last, TxOrigin{},
		[]TxCheck{{Key: []byte(y), Version: yver}}, []Op{{Kind: KindIncrBy, Key: []byte(y), Delta: 10}})
	if err != nil {
		t.Fatal(err)
	}
	return pa, pb
}

func TestXgtxPrepareDecideResolve(t *testing.T) {
	ga, gb := newMV(), newMV()
	ga.set(t, "x", "100")
	gb.set(t, "y", "0")
	pa, pb := xfer(t, "t1", ga, gb, "x", "y")
	ga.mustReply(t, pa, "+PREPARED")
	gb.mustReply(t, pb, "+PREPARED")
	if ga.locks(t) != 1 || gb.locks(t) != 1 {
		t.Fatalf("lock counts %d %d, want 1 1", ga.locks(t), gb.locks(t))
	}
	// Prepared, nothing landed yet.
	if ga.get("x") != "100" || gb.get("y") != "0" {
		t.Fatalf("landed at prepare: x=%s y=%s", ga.get("x"), gb.get("y"))
	}
	// A plain write of a locked key does not apply; a read is not gated.
	if _, err := ga.try(Op{Kind: KindSet, Key: b("x"), Value: b("5")}); !errors.Is(err, ErrTxLocked) {
		t.Fatalf("SET of a write-locked key: %v, want ErrTxLocked", err)
	}
	if _, err := ga.try(Op{Kind: KindSet, Key: b("other"), Value: b("5")}); err != nil {
		t.Fatalf("SET of an unlocked key: %v", err)
	}
	ga.mustReply(t, NewTxDecide([]byte("t1"), b("x"), true), "+COMMITTED")
	gb.mustReply(t, NewTxResolve([]byte("t1"), b("y"), true), "+COMMITTED")
	if ga.get("x") != "90" || gb.get("y") != "10" {
		t.Fatalf("after commit x=%s y=%s, want 90 10", ga.get("x"), gb.get("y"))
	}
	if ga.locks(t) != 0 || gb.locks(t) != 0 {
		t.Fatalf("locks left: %d %d", ga.locks(t), gb.locks(t))
	}
	if _, err := ga.try(Op{Kind: KindSet, Key: b("x"), Value: b("5")}); err != nil {
		t.Fatalf("SET after the resolve: %v", err)
	}
	// The reserved records are out of the user's keyspace.
	for k := range ga.vers {
		if !IsReserved([]byte(k)) && k != "x" && k != "other" {
			t.Errorf("user-visible key %q", k)
		}
	}
}

func TestXgtxIdempotentAndFirstDecisionWins(t *testing.T) {
	ga, gb := newMV(), newMV()
	ga.set(t, "x", "100")
	gb.set(t, "y", "0")
	pa, pb := xfer(t, "t1", ga, gb, "x", "y")
	ga.mustReply(t, pa, "+PREPARED")
	gb.mustReply(t, pb, "+PREPARED")
	// The same prepare again (a retry under a new request id).
	gb.mustReply(t, pb, "+PREPARED")
	if gb.locks(t) != 1 {
		t.Fatalf("a second prepare counted again: %d", gb.locks(t))
	}
	// A push's abort reaches the primary first: the coordinator's commit
	// after it answers the abort.
	ga.mustReply(t, NewTxDecide([]byte("t1"), b("x"), false), "+ABORTED")
	ga.mustReply(t, NewTxDecide([]byte("t1"), b("x"), true), "+ABORTED")
	if ga.get("x") != "100" || ga.locks(t) != 0 {
		t.Fatalf("aborted at the primary: x=%s locks %d", ga.get("x"), ga.locks(t))
	}
	gb.mustReply(t, NewTxResolve([]byte("t1"), b("y"), false), "+ABORTED")
	last := gb.last
	gb.mustReply(t, NewTxResolve([]byte("t1"), b("y"), false), "+ABORTED")
	if gb.get("y") != "0" || gb.locks(t) != 0 {
		t.Fatalf("aborted at b: y=%s locks %d", gb.get("y"), gb.locks(t))
	}
	// The second resolve wrote nothing (only the version moved).
	for k, rs := range gb.vers {
		if rs[len(rs)-1].v > last {
			t.Errorf("second resolve wrote %q", k)
		}
	}
	// A prepare of the aborted transaction arriving late at the primary
	// must not lock.
	ga.mustReply(t, pa, "-TXABORT transaction")
	if ga.locks(t) != 0 {
		t.Fatal("a prepare after the abort locked")
	}
}

func TestXgtxDecideCommitWithoutPrepareAborts(t *testing.T) {
	ga := newMV()
	ga.set(t, "x", "1")
	ga.mustReply(t, NewTxDecide([]byte("t9"), b("x"), true), "+ABORTED")
}

func TestXgtxLockConflicts(t *testing.T) {
	ga, gb := newMV(), newMV()
	ga.set(t, "x", "100")
	ga.set(t, "{x}r", "7")
	gb.set(t, "y", "0")
	pa, _ := xfer(t, "t1", ga, gb, "x", "y")
	// t1 also reads r at ga.
	checks, writes, _ := DecodeTxCommit(&Op{Kind: KindTxCommit, Delta: pa.Delta, Cond: pa.Cond, Value: pa.Value, Keys: pa.Keys})
	checks = append(checks, TxCheck{Key: b("{x}r"), Version: 2})
	pa, err := NewTxPrepare([]byte("t1"), b("x"), ga.last, TxOrigin{}, checks, writes)
	if err != nil {
		t.Fatal(err)
	}
	ga.mustReply(t, pa, "+PREPARED")

	// Another prepare that writes the read-locked key, or reads the
	// write-locked one, aborts (one that only reads the read-locked key
	// shares it: TestXgtxSharedReadLocks).
	p2, _ := NewTxPrepare([]byte("t2"), b("{x}r"), ga.last, TxOrigin{}, []TxCheck{{Key: b("{x}r"), Version: 2}}, []Op{{Kind: KindSet, Key: b("{x}r"), Value: b("1")}})
	ga.mustReply(t, p2, "-TXABORT conflict on key '{x}r': locked")
	p2, _ = NewTxPrepare([]byte("t2"), b("x"), ga.last, TxOrigin{}, []TxCheck{{Key: b("x"), Version: 1}}, nil)
	ga.mustReply(t, p2, "-TXABORT conflict on key 'x': locked")
	// So does a single-group commit that checks the write-locked key
	// (SERIALIZABLE read)... (one that checks the read-locked key shares
	// it: TestXgtxSharedReadLocks)
	c, _ := NewTxCommit(ga.last, TxSerializable, TxOrigin{}, []TxCheck{{Key: b("x"), Version: 1}, {Key: b("z")}}, []Op{{Kind: KindSet, Key: b("z"), Value: b("1")}})
	ga.mustReply(t, c, "-TXABORT conflict on key 'x': locked")
	// ...or writes a locked one.
	c, _ = NewTxCommit(ga.last, TxSI, TxOrigin{}, []TxCheck{{Key: b("x"), Version: 1}}, []Op{{Kind: KindSet, Key: b("x"), Value: b("1")}})
	ga.mustReply(t, c, "-TXABORT conflict on key 'x': locked")
	c, _ = NewTxCommit(ga.last, TxSerializable, TxOrigin{}, []TxCheck{{Key: b("{x}r"), Version: 2}}, []Op{{Kind: KindSet, Key: b("{x}r"), Value: b("1")}})
	ga.mustReply(t, c, "-TXABORT conflict on key '{x}r': locked")
	if ga.locks(t) != 1 {
		t.Fatalf("lock count %d", ga.locks(t))
	}
	// A write of the read-locked key is refused: applied, a reader could
	// see it at a and the state before t1 at b.
	for _, op := range []Op{
		{Kind: KindSet, Key: b("{x}r"), Value: b("8")},
		{Kind: KindDel, Keys: [][]byte{b("{x}r")}},
		{Kind: KindMSet, Keys: [][]byte{b("{x}q"), b("1"), b("{x}r"), b("2")}},
		{Kind: KindHSet, Key: b("{x}r"), Keys: [][]byte{b("f"), b("v")}},
		{Kind: KindExec, Delta: 1, Keys: [][]byte{b("{x}r")}, Value: EncodeTx(nil, [][][]byte{{b("SET"), b("{x}r"), b("1")}}, nil)},
		{Kind: KindFlush},
	} {
		res, err := ga.try(op)
		if !errors.Is(err, ErrTxLocked) {
			t.Errorf("%v of a read-locked key: %v %+v, want ErrTxLocked", op.Kind, err, res)
		}
	}
	// The single node's direct call for hash writes is gated too.
	if _, err := ApplyHash(ga.at(ga.last), nil, ga.last+1, &Op{Kind: KindHSet, Key: b("{x}r"), Keys: [][]byte{b("f"), b("v")}}, func(_, _, _ []byte, _ bool) {}, ApplyOptions{}); !errors.Is(err, ErrTxLocked) {
		t.Errorf("ApplyHash of a read-locked key: %v, want ErrTxLocked", err)
	}
	// Reads are not gated.
	if _, err := Read(ga.at(ga.last), nil, &Op{Kind: KindGet, Key: b("x")}, 0); err != nil {
		t.Fatal(err)
	}
	if ok, _ := TxWriteLocked(ga.at(ga.last), b("x")); !ok {
		t.Error("x not write-locked")
	}
	if ok, _ := TxWriteLocked(ga.at(ga.last), b("{x}r")); ok {
		t.Error("r write-locked")
	}
	if ga.get("{x}r") != "7" {
		t.Fatalf("r = %s", ga.get("{x}r"))
	}
}

func TestXgtxLockMutationsCaught(t *testing.T) {
	mutation.Require(t)
	ga, gb := newMV(), newMV()
	ga.set(t, "x", "100")
	gb.set(t, "y", "0")
	pa, pb := xfer(t, "t1", ga, gb, "x", "y")
	ga.mustReply(t, pa, "+PREPARED")
	gb.mustReply(t, pb, "+PREPARED")

	XgtxMut.WriteReadLocked = true
	// t2 read-locks w at b.
	p2, _ := NewTxPrepare([]byte("t2"), b("x"), gb.last, TxOrigin{}, []TxCheck{{Key: b("w")}}, nil)
	gb.mustReply(t, p2, "+PREPARED")
	_, err := gb.try(Op{Kind: KindSet, Key: b("w"), Value: b("1")})
	XgtxMut.WriteReadLocked = false
	if err == nil {
		t.Log("writeReadLocked caught: the write of a read-locked key applied")
	} else {
		t.Fatalf("writeReadLocked not caught: %v", err)
	}

	XgtxMut.ResolveIgnoresDecision = true
	gb.mustReply(t, NewTxResolve([]byte("t1"), b("y"), false), "+ABORTED")
	XgtxMut.ResolveIgnoresDecision = false
	if gb.get("y") == "0" {
		t.Fatal("resolveIgnoresDecision not caught: an aborted transaction's write stayed out")
	}
}

func TestXgtxPrepareValidates(t *testing.T) {
	ga, gb := newMV(), newMV()
	ga.set(t, "x", "100")
	gb.set(t, "y", "0")
	pa, _ := xfer(t, "t1", ga, gb, "x", "y")
	ga.set(t, "x", "50") // written after t1 read it
	ga.mustReply(t, pa, "-TXABORT conflict on key 'x': written at version")
	if ga.locks(t) != 0 {
		t.Fatal("a failed prepare locked")
	}
	// A write that fails evaluation answers its error and locks nothing.
	ga.set(t, "s", "notanint")
	p, _ := NewTxPrepare([]byte("t3"), b("s"), ga.last, TxOrigin{}, []TxCheck{{Key: b("s"), Version: ga.last}}, []Op{{Kind: KindIncrBy, Key: b("s"), Delta: 1}})
	ga.mustReply(t, p, "-ERR value is not an integer")
	if ga.locks(t) != 0 {
		t.Fatal("a failed prepare locked")
	}
	// Malformed: no primary, ranged.
	p.Expected = nil
	if _, err := ga.try(p); !errors.Is(err, ErrInvalidOp) {
		t.Fatalf("prepare without a primary: %v", err)
	}
	if _, err := NewTxPrepare([]byte("t4"), b("s"), 1, TxOrigin{}, []TxCheck{{Key: b("s"), Ranges: []TxRange{{0, 1}}}}, nil); !errors.Is(err, ErrInvalidOp) {
		t.Fatalf("ranged prepare: %v", err)
	}
}

// TestXgtxReplayRebuildsLocks: the locks are records of the group's state,
// so a replica that replays the log from nothing (a restart, a snapshot
// install) holds the same locks and decides the same.
func TestXgtxReplayRebuildsLocks(t *testing.T) {
	ga, gb := newMV(), newMV()
	var log []Op
	do := func(op Op) {
		log = append(log, op)
		ga.try(op)
	}
	do(Op{Kind: KindSet, Key: []byte("x"), Value: []byte("100")})
	gb.set(t, "y", "0")
	pa, _ := xfer(t, "t1", ga, gb, "x", "y")
	do(AppendDecode(t, pa))
	do(Op{Kind: KindSet, Key: []byte("x"), Value: []byte("1")}) // refused
	r := newMV()
	for _, op := range log {
		r.try(op)
	}
	if r.locks(t) != 1 || r.get("x") != "100" {
		t.Fatalf("replayed: locks %d x=%s", r.locks(t), r.get("x"))
	}
	if _, err := r.try(Op{Kind: KindSet, Key: b("x"), Value: b("5")}); !errors.Is(err, ErrTxLocked) {
		t.Fatalf("after replay a SET of the locked key: %v", err)
	}
	r.mustReply(t, NewTxDecide([]byte("t1"), b("x"), true), "+COMMITTED")
	if r.get("x") != "90" || r.locks(t) != 0 {
		t.Fatalf("replayed then decided: x=%s locks %d", r.get("x"), r.locks(t))
	}
}

// AppendDecode round-trips op through the log's codec, as a replica reads it.
func AppendDecode(t *testing.T, op Op) Op {
	t.Helper()
	d, err := DecodeOp(AppendOp(nil, &op))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestXgtxCodec(t *testing.T) {
	pa, err := NewTxPrepare([]byte("t1"), b("x"), 3, TxOrigin{Epoch: 2, State: SlotOwned}, []TxCheck{{Key: b("x"), Version: 3}}, []Op{{Kind: KindSet, Key: b("x"), Value: b("v")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []Op{pa, NewTxDecide(b("t1"), b("x"), true), NewTxResolve(b("t1"), b("y"), false)} {
		d := AppendDecode(t, op)
		if d.Kind != op.Kind || !bytes.Equal(d.Key, op.Key) || !bytes.Equal(d.Expected, op.Expected) || d.Cond != op.Cond {
			t.Errorf("%v round trip: %+v", op.Kind, d)
		}
		if ks, _ := d.RoutingKeys(); len(ks) == 0 {
			t.Errorf("%v routes by nothing", op.Kind)
		}
	}
	dec := NewTxDecide(b("t"), b("x"), true)
	if !dec.WritesAll() || pa.WritesAll() {
		t.Error("WritesAll")
	}
	res, opErr, err := DecodeResult(AppendResult(nil, Result{}, &TxLockedError{Key: b("k"), TxID: b("t")}))
	if err != nil || !errors.Is(opErr, ErrTxLocked) {
		t.Fatalf("ErrTxLocked through the client table: %v %v %v", res, opErr, err)
	}
}

// TestXgtxMovesWaitForLocks: a migrating slot takes no new locks, and its
// hand-over is refused (ErrTxLocked, retried by the mover) until the locks
// in it are resolved: locks never move with a slot.
func TestXgtxMovesWaitForLocks(t *testing.T) {
	g := newMV()
	all := []SlotRange{{Start: 0, End: NumSlots - 1}}
	g.apply(t, Op{Kind: KindSlotInit, Key: EncodeSlotRanges(all), Delta: 1})
	g.set(t, "x", "1")
	g.set(t, "y", "1")
	xs, ys := KeySlot(b("x")), KeySlot(b("y"))
	origin, _ := SlotOrigin(g.at(g.last), b("x"))
	p, _ := NewTxPrepare([]byte("t1"), b("x"), g.last, origin, []TxCheck{{Key: b("x"), Version: 2}}, []Op{{Kind: KindSet, Key: b("x"), Value: b("2")}})
	g.mustReply(t, p, "+PREPARED")
	xr := []SlotRange{{Start: xs, End: xs}}
	yr := []SlotRange{{Start: ys, End: ys}}
	for _, r := range [][]SlotRange{xr, yr} {
		if _, err := g.try(*slotSet(r, SlotMigrating, 2, 2)); err != nil {
			t.Fatal(err)
		}
	}
	// y's slot is migrating: a prepare there aborts, locking nothing.
	o2, _ := SlotOrigin(g.at(g.last), b("y"))
	p2, _ := NewTxPrepare([]byte("t2"), b("y"), g.last, o2, []TxCheck{{Key: b("y"), Version: 3}}, nil)
	g.mustReply(t, p2, "-TXABORT key 'y': its slot")
	// y's slot holds no lock: handed over. x's waits for t1.
	if _, err := g.try(*slotSet(yr, SlotNone, 2, 2)); err != nil {
		t.Fatalf("hand-over of an unlocked slot: %v", err)
	}
	if _, err := g.try(*slotSet(xr, SlotNone, 2, 2)); !errors.Is(err, ErrTxLocked) {
		t.Fatalf("hand-over of a locked slot: %v, want ErrTxLocked", err)
	}
	g.mustReply(t, NewTxDecide([]byte("t1"), b("x"), true), "+COMMITTED")
	if _, err := g.try(*slotSet(xr, SlotNone, 2, 2)); err != nil {
		t.Fatalf("hand-over after the resolve: %v", err)
	}
}

// TestXgtxTwoPartsInOneGroup: a transaction prepares once per slot, and two
// of its slots may be one group's: each part locks and validates its own
// keys (keyed by the transaction alone, the second prepare answered
// PREPARED as the first had, checking nothing: the e2e bank test's
// read-only totals were off by a transfer).
func TestXgtxTwoPartsInOneGroup(t *testing.T) {
	g := newMV()
	g.set(t, "a", "1")
	g.set(t, "b", "1")
	pa, _ := NewTxPrepare([]byte("t1"), b("a"), g.last, TxOrigin{}, []TxCheck{{Key: b("a"), Version: 1}}, nil)
	pb, _ := NewTxPrepare([]byte("t1"), b("a"), g.last, TxOrigin{}, []TxCheck{{Key: b("b"), Version: 1}}, nil)
	g.mustReply(t, pa, "+PREPARED")
	g.mustReply(t, pb, "-TXABORT conflict on key 'b': written at version 2")
	g.set(t, "c", "1")
	pc, _ := NewTxPrepare([]byte("t1"), b("a"), g.last, TxOrigin{}, []TxCheck{{Key: b("c"), Version: g.last}}, nil)
	g.mustReply(t, pc, "+PREPARED")
	if _, err := g.try(Op{Kind: KindSet, Key: b("c"), Value: b("2")}); !errors.Is(err, ErrTxLocked) {
		t.Fatalf("a write of the second part's key: %v, want ErrTxLocked", err)
	}
	g.mustReply(t, NewTxDecide([]byte("t1"), b("a"), true), "+COMMITTED")
	g.mustReply(t, NewTxResolve([]byte("t1"), b("c"), true), "+COMMITTED")
	if g.locks(t) != 0 {
		t.Fatalf("locks left: %d", g.locks(t))
	}
}

// A state that can hold no locks (the single node) skips the lock rule:
// ApplyLockFree and ApplyOptions.NoTxLocks apply a write of a key another
// state would refuse — which is why a replica group must never use them.
func TestXgtxLockFreeEntriesSkipTheRule(t *testing.T) {
	ga, gb := newMV(), newMV()
	ga.set(t, "x", "100")
	gb.set(t, "y", "0")
	pa, _ := xfer(t, "t1", ga, gb, "x", "y")
	ga.mustReply(t, pa, "+PREPARED")
	emit := func(_, _, _ []byte, _ bool) {}
	set := func() *Op { return &Op{Kind: KindSet, Key: b("x"), Value: b("1")} }
	hset := func() *Op { return &Op{Kind: KindHSet, Key: b("x"), Keys: [][]byte{b("f"), b("v")}} }
	get := ga.at(ga.last)
	for name, err := range map[string]error{
		"Apply":     func() error { _, err := Apply(get, ga.last+1, set(), 0, emit); return err }(),
		"ApplyWith": func() error { _, err := ApplyWith(get, nil, nil, ga.last+1, set(), 0, emit); return err }(),
		"ApplyHash": func() error { _, err := ApplyHash(get, nil, ga.last+1, hset(), emit, ApplyOptions{}); return err }(),
		"ApplyWithOptions": func() error {
			_, err := ApplyWithOptions(get, nil, nil, ga.last+1, set(), 0, emit, ApplyOptions{})
			return err
		}(),
	} {
		if !errors.Is(err, ErrTxLocked) {
			t.Errorf("%s of a locked key: %v, want ErrTxLocked", name, err)
		}
	}
	if _, err := ApplyLockFree(get, ga.last+1, set(), 0, emit); err != nil {
		t.Errorf("ApplyLockFree: %v", err)
	}
	if _, err := ApplyWithOptions(get, nil, nil, ga.last+1, set(), 0, emit, ApplyOptions{NoTxLocks: true}); err != nil {
		t.Errorf("ApplyWithOptions, NoTxLocks: %v", err)
	}
}

// TestXgtxMovesWaitForPendingCommits: a commit decided at the primary
// whose other participant has not resolved keeps the primary's slot from
// being handed over, though the primary's own part resolved with the
// decision (no lock left there): decision records never move, so the
// participant's push would reach the slot's next owner, find no decision
// and abort its part of a committed transaction. The forget (every
// participant resolved) lets the hand-over through. With the mutation
// MoveIgnoresPending the hand-over goes through at once.
func TestXgtxMovesWaitForPendingCommits(t *testing.T) {
	for _, mut := range []bool{false, true} {
		if mut && !mutation.On {
			continue
		}
		XgtxMut.MoveIgnoresPending = mut
		handed := func() bool {
			g := newMV()
			all := []SlotRange{{Start: 0, End: NumSlots - 1}}
			g.apply(t, Op{Kind: KindSlotInit, Key: EncodeSlotRanges(all), Delta: 1})
			g.set(t, "x", "1")
			xs := KeySlot(b("x"))
			origin, _ := SlotOrigin(g.at(g.last), b("x"))
			p, _ := NewTxPrepare([]byte("t1"), b("x"), g.last, origin, []TxCheck{{Key: b("x"), Version: 2}}, []Op{{Kind: KindSet, Key: b("x"), Value: b("2")}})
			g.mustReply(t, p, "+PREPARED")
			// The other participant is a slot of another group ("other").
			g.mustReply(t, NewTxDecide([]byte("t1"), b("x"), true, b("x"), b("other")), "+COMMITTED")
			if ids, err := TxPendingIDs(g.at(g.last)); err != nil || len(ids) != 1 {
				t.Fatalf("pending list after the commit: %q %v", ids, err)
			}
			xr := []SlotRange{{Start: xs, End: xs}}
			if _, err := g.try(*slotSet(xr, SlotMigrating, 2, 2)); err != nil {
				t.Fatal(err)
			}
			_, err := g.try(*slotSet(xr, SlotNone, 2, 2))
			if err == nil {
				return true
			}
			if !errors.Is(err, ErrTxLocked) {
				t.Fatalf("hand-over with a pending commit: %v, want ErrTxLocked", err)
			}
			fg := NewTxForget([]byte("t1"), b("x"), [][]byte{b("other")})
			if _, err := g.try(fg); err != nil {
				t.Fatal(err)
			}
			if ids, err := TxPendingIDs(g.at(g.last)); err != nil || len(ids) != 0 {
				t.Fatalf("pending list after the forget: %q %v", ids, err)
			}
			if _, err := g.try(*slotSet(xr, SlotNone, 2, 2)); err != nil {
				t.Fatalf("hand-over after every participant resolved: %v", err)
			}
			return false
		}()
		XgtxMut.MoveIgnoresPending = false
		if handed != mut {
			t.Fatalf("mutation %t: handed over at once %t", mut, handed)
		}
	}
}

// Prepared transactions that only read a key share its lock: two read it
// and both prepare; a writer's prepare of it, a plain write of it and a
// single-group commit that writes it are refused while either holds it,
// and a reader's prepare of a write-locked key is refused; the lock goes
// with the last reader's resolve, whatever the order of the resolves.
func TestXgtxSharedReadLocks(t *testing.T) {
	g := newMV()
	g.set(t, "{s}k", "1")
	read := func(txid string, writes ...Op) Op {
		t.Helper()
		p, err := NewTxPrepare([]byte(txid), b("{s}k"), g.last, TxOrigin{}, []TxCheck{{Key: b("{s}k"), Version: 1}}, writes)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	g.mustReply(t, read("r1", Op{Kind: KindSet, Key: b("{s}a"), Value: b("1")}), "+PREPARED")
	g.mustReply(t, read("r2", Op{Kind: KindSet, Key: b("{s}b"), Value: b("1")}), "+PREPARED")
	g.mustReply(t, read("r3"), "+PREPARED")
	if n := g.locks(t); n != 3 {
		t.Fatalf("%d prepared parts, want 3", n)
	}
	holders := func() []string {
		_, hs, ok, err := txLockHolders(g.at(g.last), b("{s}k"))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, h := range hs {
			out = append(out, string(h))
		}
		if !ok {
			return nil
		}
		return out
	}
	if got := strings.Join(holders(), ","); got != "r1,r2,r3" {
		t.Fatalf("the lock of k is held by %q, want r1,r2,r3", got)
	}
	refused := func() {
		t.Helper()
		g.mustReply(t, read("w", Op{Kind: KindSet, Key: b("{s}k"), Value: b("2")}), "-TXABORT conflict on key '{s}k': locked")
		if _, err := g.try(Op{Kind: KindSet, Key: b("{s}k"), Value: b("2")}); !errors.Is(err, ErrTxLocked) {
			t.Fatalf("SET of a shared read-locked key: %v, want ErrTxLocked", err)
		}
		c, _ := NewTxCommit(g.last, TxSI, TxOrigin{}, []TxCheck{{Key: b("{s}k"), Version: 1}}, []Op{{Kind: KindSet, Key: b("{s}k"), Value: b("2")}})
		g.mustReply(t, c, "-TXABORT conflict on key '{s}k': locked")
	}
	refused()
	// A single-group commit that only reads k shares the lock as well.
	c, _ := NewTxCommit(g.last, TxSerializable, TxOrigin{}, []TxCheck{{Key: b("{s}k"), Version: 1}, {Key: b("{s}c")}}, []Op{{Kind: KindSet, Key: b("{s}c"), Value: b("1")}})
	g.mustReply(t, c, ":") // its committed version
	// The resolves in any order: the lock stays while a reader holds it.
	g.mustReply(t, NewTxResolve([]byte("r2"), b("{s}k"), true), "+COMMITTED")
	if got := strings.Join(holders(), ","); got != "r1,r3" {
		t.Fatalf("after r2's resolve the lock is held by %q, want r1,r3", got)
	}
	refused()
	g.mustReply(t, NewTxResolve([]byte("r1"), b("{s}k"), false), "+ABORTED")
	if got := strings.Join(holders(), ","); got != "r3" {
		t.Fatalf("after r1's resolve the lock is held by %q, want r3", got)
	}
	refused()
	// A resolve again changes nothing.
	g.mustReply(t, NewTxResolve([]byte("r1"), b("{s}k"), false), "+ABORTED")
	g.mustReply(t, NewTxResolve([]byte("r3"), b("{s}k"), true), "+COMMITTED")
	if hs := holders(); hs != nil || g.locks(t) != 0 {
		t.Fatalf("locks left after every resolve: %q, %d prepared", hs, g.locks(t))
	}
	if g.get("{s}b") != "1" || g.get("{s}a") != "<nil>" || g.get("{s}c") != "1" {
		t.Fatalf("a=%q b=%q c=%q: want r2's write and the single-group commit's", g.get("{s}a"), g.get("{s}b"), g.get("{s}c"))
	}
	if _, err := g.try(Op{Kind: KindSet, Key: b("{s}k"), Value: b("2")}); err != nil {
		t.Fatalf("SET after the last reader's resolve: %v", err)
	}
	// A writer's lock excludes a reader's prepare.
	_, _, kv, _, _ := g.at(g.last)(b("{s}k"))
	p, _ := NewTxPrepare([]byte("w2"), b("{s}k"), g.last, TxOrigin{}, []TxCheck{{Key: b("{s}k"), Version: kv}}, []Op{{Kind: KindSet, Key: b("{s}k"), Value: b("3")}})
	g.mustReply(t, p, "+PREPARED")
	p, _ = NewTxPrepare([]byte("r4"), b("{s}k"), g.last, TxOrigin{}, []TxCheck{{Key: b("{s}k"), Version: kv}}, nil)
	g.mustReply(t, p, "-TXABORT conflict on key '{s}k': locked")
}

// The mutation ReadLockAdmitsWriter (shared read locks that do not exclude
// writers) is caught: a writer's prepare of a key two readers share
// answers +PREPARED.
func TestXgtxSharedReadLockMutationCaught(t *testing.T) {
	mutation.Require(t)
	g := newMV()
	g.set(t, "{s}k", "1")
	for _, id := range []string{"r1", "r2"} {
		p, _ := NewTxPrepare([]byte(id), b("{s}k"), g.last, TxOrigin{}, []TxCheck{{Key: b("{s}k"), Version: 1}}, nil)
		g.mustReply(t, p, "+PREPARED")
	}
	XgtxMut.ReadLockAdmitsWriter = true
	defer func() { XgtxMut.ReadLockAdmitsWriter = false }()
	p, _ := NewTxPrepare([]byte("w"), b("{s}k"), g.last, TxOrigin{}, []TxCheck{{Key: b("{s}k"), Version: 1}}, []Op{{Kind: KindSet, Key: b("{s}k"), Value: b("2")}})
	res, err := g.try(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(res.Bulk), "+PREPARED") {
		t.Fatalf("ReadLockAdmitsWriter not caught: the writer's prepare answered %q", res.Bulk)
	}
	t.Log("ReadLockAdmitsWriter caught: a writer prepared a key two readers share")
}
