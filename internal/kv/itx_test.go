package kv

import (
	"bytes"
	"strings"
	"testing"
)

// mvStore is a multiversion store for the transaction tests: every version
// of every key, read at any version (the engine's GetAt).
type mvStore struct {
	vers map[string][]mvRec
	last uint64
}

type mvRec struct {
	v    uint64
	data []byte
	tomb bool
	meta []byte // expiry (TxDoomed's tests)
}

func newMV() *mvStore { return &mvStore{vers: map[string][]mvRec{}} }

func (s *mvStore) at(v uint64) Getter {
	return func(key []byte) ([]byte, []byte, uint64, bool, error) {
		rs := s.vers[string(key)]
		for i := len(rs) - 1; i >= 0; i-- {
			if rs[i].v <= v {
				if rs[i].tomb {
					return nil, nil, 0, false, nil
				}
				return rs[i].data, rs[i].meta, rs[i].v, true, nil
			}
		}
		return nil, nil, 0, false, nil
	}
}

// apply applies op at the next version, as a replica does.
func (s *mvStore) apply(t *testing.T, op Op) Result {
	t.Helper()
	v := s.last + 1
	res, err := Apply(s.at(s.last), v, &op, 0, func(key, value, meta []byte, tomb bool) {
		s.vers[string(key)] = append(s.vers[string(key)], mvRec{v, append([]byte(nil), value...), tomb, bytes.Clone(meta)})
	})
	if err != nil {
		t.Fatalf("apply %v: %v", op.Kind, err)
	}
	s.last = v
	return res
}

func (s *mvStore) set(t *testing.T, k, v string) {
	s.apply(t, Op{Kind: KindSet, Key: []byte(k), Value: []byte(v)})
}

func (s *mvStore) get(k string) string {
	d, _, _, ok, _ := s.at(s.last)([]byte(k))
	if !ok {
		return "<nil>"
	}
	return string(d)
}

// txn is a transaction as the front door keeps it: a start version, the
// versions it saw, its buffered writes over its snapshot.
type txn struct {
	s      *mvStore
	start  uint64
	iso    Cond
	seen   map[string]uint64
	ov     TxOverlay
	writes []Op
}

func (s *mvStore) begin(iso Cond) *txn {
	return &txn{s: s, start: s.last, iso: iso, seen: map[string]uint64{}}
}

func (x *txn) snap() Getter {
	g := x.s.at(x.start)
	return func(key []byte) ([]byte, []byte, uint64, bool, error) {
		d, m, v, ok, err := g(key)
		x.seen[string(key)] = v
		return d, m, v, ok, err
	}
}

func (x *txn) get(t *testing.T, k string) string {
	res, err := Read(x.ov.View(x.snap(), x.start+1), nil, &Op{Kind: KindGet, Key: []byte(k)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Kind == ResNil {
		return "<nil>"
	}
	return string(res.Bulk)
}

func (x *txn) write(t *testing.T, op Op) {
	if _, err := x.ov.Apply(x.snap(), x.start+1, &op, 0); err != nil {
		t.Fatal(err)
	}
	x.writes = append(x.writes, op)
}

// commit builds the commit op as the front door does and applies it (its
// checks whole-key: commitRanged with no ranges).
func (x *txn) commit(t *testing.T) string {
	t.Helper()
	return x.commitRanged(t, nil)
}

func committed(r string) bool { return strings.HasPrefix(r, ":") }

func set(k, v string) Op { return Op{Kind: KindSet, Key: []byte(k), Value: []byte(v)} }

// Write skew (digest 001 IA-0): two transactions each read x and y (both
// on call) and take one off call. SI lets both commit (neither wrote what the
// other wrote); SERIALIZABLE aborts the second (it read what the first wrote).
func TestTxWriteSkew(t *testing.T) {
	for _, tc := range []struct {
		iso        Cond
		bothCommit bool
	}{{TxSI, true}, {TxSerializable, false}} {
		s := newMV()
		s.set(t, "x", "on")
		s.set(t, "y", "on")
		t1, t2 := s.begin(tc.iso), s.begin(tc.iso)
		for _, x := range []*txn{t1, t2} {
			if x.get(t, "x") != "on" || x.get(t, "y") != "on" {
				t.Fatal("snapshot")
			}
		}
		t1.write(t, set("x", "off"))
		t2.write(t, set("y", "off"))
		r1, r2 := t1.commit(t), t2.commit(t)
		if !committed(r1) {
			t.Fatalf("iso %d: first commit %q", tc.iso, r1)
		}
		if committed(r2) != tc.bothCommit {
			t.Fatalf("iso %d: second commit %q, want committed=%v", tc.iso, r2, tc.bothCommit)
		}
		if !tc.bothCommit && !strings.HasPrefix(r2, "-TXABORT conflict on key 'x'") {
			t.Fatalf("abort reply %q", r2)
		}
		if want := map[bool]string{true: "off", false: "on"}[tc.bothCommit]; s.get("y") != want {
			t.Fatalf("iso %d: y = %s, want %s", tc.iso, s.get("y"), want)
		}
	}
}

// Lost update: two transactions increment one counter from one snapshot;
// the second aborts under both levels, and the counter holds one increment.
func TestTxLostUpdateAborts(t *testing.T) {
	for _, iso := range []Cond{TxSI, TxSerializable} {
		s := newMV()
		s.set(t, "n", "10")
		t1, t2 := s.begin(iso), s.begin(iso)
		t1.write(t, Op{Kind: KindIncrBy, Key: []byte("n"), Delta: 1})
		t2.write(t, Op{Kind: KindIncrBy, Key: []byte("n"), Delta: 1})
		if t1.get(t, "n") != "11" {
			t.Fatal("own write not read")
		}
		if r := t1.commit(t); !committed(r) {
			t.Fatalf("first: %s", r)
		}
		if r := t2.commit(t); !strings.HasPrefix(r, "-TXABORT conflict on key 'n': written at version 2 after the transaction's start version 1") {
			t.Fatalf("iso %d second: %s", iso, r)
		}
		if s.get("n") != "11" {
			t.Fatalf("n = %s", s.get("n"))
		}
	}
}

// A key deleted in the window is a conflict too (it is absent where the
// snapshot had it), and a key created in it (absent at the start).
func TestTxDeleteOrCreateInWindowAborts(t *testing.T) {
	s := newMV()
	s.set(t, "a", "1")
	x := s.begin(TxSI)
	x.write(t, set("a", "2"))
	x.write(t, set("b", "2"))
	s.apply(t, Op{Kind: KindDel, Keys: [][]byte{[]byte("a")}})
	if r := x.commit(t); !strings.Contains(r, "conflict on key 'a': deleted") {
		t.Fatalf("%s", r)
	}
	y := s.begin(TxSI)
	y.write(t, set("b", "3"))
	s.set(t, "b", "other")
	if r := y.commit(t); !strings.Contains(r, "conflict on key 'b': written at version") {
		t.Fatalf("%s", r)
	}
	if s.get("b") != "other" {
		t.Fatal(s.get("b"))
	}
}

// Snapshot reads: a transaction reads the state at its start whatever
// commits after it, and its own writes in front of it.
func TestTxSnapshotReads(t *testing.T) {
	s := newMV()
	s.set(t, "k", "old")
	x := s.begin(TxSI)
	s.set(t, "k", "new")
	s.apply(t, Op{Kind: KindDel, Keys: [][]byte{[]byte("k")}})
	s.set(t, "j", "later")
	if x.get(t, "k") != "old" || x.get(t, "j") != "<nil>" {
		t.Fatalf("snapshot: k=%s j=%s", x.get(t, "k"), x.get(t, "j"))
	}
	x.write(t, set("j", "mine"))
	if x.get(t, "j") != "mine" {
		t.Fatal("own write")
	}
	// Read-only: a serializable reader of an old snapshot commits (nothing
	// to write: the front door answers it without the log; through the log
	// it still passes, having no written key under SI).
	ro := s.begin(TxSI)
	ro.get(t, "k")
	s.set(t, "k", "again")
	if r := ro.commit(t); !committed(r) {
		t.Fatal(r)
	}
}

// A write that fails at commit (INCRBY of a non-integer) lands none of the
// transaction's writes and answers its error.
func TestTxFailingWriteLandsNothing(t *testing.T) {
	s := newMV()
	s.set(t, "s", "text")
	op, err := NewTxCommit(s.last, TxSI, TxOrigin{}, nil, []Op{set("a", "1"), {Kind: KindIncrBy, Key: []byte("s"), Delta: 1}})
	if err != nil {
		t.Fatal(err)
	}
	res := s.apply(t, op)
	if string(res.Bulk) != "-ERR value is not an integer or out of range\r\n" || res.Version != 0 {
		t.Fatalf("%q %d", res.Bulk, res.Version)
	}
	if s.get("a") != "<nil>" {
		t.Fatal("a landed")
	}
}

// A crash replay of a commit reads back its own records (the applier reports
// the op's own version): the check passes, as it did when the op first ran.
func TestTxReplayOwnRecordPasses(t *testing.T) {
	s := newMV()
	s.set(t, "a", "1")
	op, _ := NewTxCommit(1, TxSI, TxOrigin{}, []TxCheck{{Key: []byte("a"), Version: 1}}, []Op{set("a", "2")})
	own := func(key []byte) ([]byte, []byte, uint64, bool, error) { return nil, nil, 2, false, nil }
	if err := TxValidate(own, 2, &op, nil, []TxCheck{{Key: []byte("a"), Version: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := TxValidate(own, 3, &op, nil, []TxCheck{{Key: []byte("a"), Version: 1}}); err == nil {
		t.Fatal("another op's deletion passed")
	}
}

func TestTxCommitKeys(t *testing.T) {
	op, err := NewTxCommit(7, TxSerializable, TxOrigin{}, []TxCheck{{Key: []byte("r"), Version: 3}}, []Op{set("w", "v"), {Kind: KindDel, Keys: [][]byte{[]byte("d")}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := op.WrittenKeys(); len(got) != 2 || string(got[0]) != "w" || string(got[1]) != "d" {
		t.Fatalf("written %q", got)
	}
	if got, _ := op.RoutingKeys(); len(got) != 3 || string(got[2]) != "r" {
		t.Fatalf("routing %q", got)
	}
	if _, err := NewTxCommit(1, TxSI, TxOrigin{}, nil, []Op{{Kind: KindAppend, Key: []byte("k")}}); err == nil {
		t.Fatal("APPEND accepted")
	}
}
