package kv

import (
	"errors"
	"fmt"
	"testing"
)

// TestHashCopy: COPY of a hash copies its fields under a generation of its
// own (a write to either does not show in the other), with the source's
// TTL, honours REPLACE, and refuses a hash past the bound with a clear error.
func TestHashCopy(t *testing.T) {
	r := newHashRun(t)
	must := func(op Op, want string) {
		t.Helper()
		var got string
		if op.Kind.IsUpdate() {
			got = show(r.write(op))
		} else {
			got = show(r.read(op))
		}
		if got != want {
			t.Fatalf("%v %q %q: got %q, want %q", op.Kind, op.Key, op.Keys, got, want)
		}
	}
	must(Op{Kind: KindHSet, Key: []byte("src"), Keys: bs("a", "1", "b", "2")}, "2")
	must(Op{Kind: KindExpire, Key: []byte("src"), ExpireAt: 5000}, "1")
	must(Op{Kind: KindCopy, Keys: bs("src", "dst"), Cond: IfAbsent}, "1")
	must(Op{Kind: KindTTL, Key: []byte("dst"), Delta: UnitPTTL}, "4000")
	must(Op{Kind: KindHSet, Key: []byte("src"), Keys: bs("a", "src-only")}, "0")
	must(Op{Kind: KindHDel, Key: []byte("dst"), Keys: bs("b")}, "1")
	must(Op{Kind: KindHGetAll, Key: []byte("src")}, "[a src-only b 2]")
	must(Op{Kind: KindHGetAll, Key: []byte("dst")}, "[a 1]")
	// Without REPLACE an existing destination stays; with it, a string or a
	// hash there is replaced.
	must(Op{Kind: KindSet, Key: []byte("str"), Value: []byte("v")}, "OK")
	must(Op{Kind: KindCopy, Keys: bs("src", "str"), Cond: IfAbsent}, "0")
	must(Op{Kind: KindCopy, Keys: bs("src", "str"), Cond: Always}, "1")
	must(Op{Kind: KindHGetAll, Key: []byte("str")}, "[a src-only b 2]")
	must(Op{Kind: KindCopy, Keys: bs("src", "dst"), Cond: Always}, "1")
	must(Op{Kind: KindHGetAll, Key: []byte("dst")}, "[a src-only b 2]")
	must(Op{Kind: KindHLen, Key: []byte("dst")}, "2")
	// A string copied over a hash replaces it.
	must(Op{Kind: KindCopy, Keys: bs("str2", "dst"), Cond: Always}, "0")
	must(Op{Kind: KindSet, Key: []byte("str2"), Value: []byte("s")}, "OK")
	must(Op{Kind: KindCopy, Keys: bs("str2", "dst"), Cond: Always}, "1")
	must(Op{Kind: KindGet, Key: []byte("dst")}, "s")
	// Every live generation has a marker naming its key.
	for _, k := range []string{"src", "str"} {
		gen := mustGen(t, r.m, k)
		if v, ok := r.m[string(hashMarker(gen))]; !ok || v.del || v.val != k {
			t.Fatalf("marker of %s (gen %d): %+v", k, gen, v)
		}
	}

	// Past the bound: a clear error, nothing written.
	big := newHashRun(t)
	// (Built directly: an HSET of that many fields is slow to evaluate.)
	if _, err := big.write(Op{Kind: KindHSet, Key: []byte("big"), Keys: bs("f", "v")}); err != nil {
		t.Fatal(err)
	}
	gen := mustGen(t, big.m, "big")
	for i := 0; i <= MaxHashCopyFields; i++ {
		big.m[string(hashRowKey(gen, []byte(fmt.Sprint("f", i))))] = memVal{val: "v", ver: 2}
	}
	n := len(big.m)
	if _, err := big.write(Op{Kind: KindCopy, Keys: bs("big", "big2"), Cond: IfAbsent}); !errors.Is(err, ErrHashCopyTooBig) {
		t.Fatalf("COPY of a hash of %d fields: %v", MaxHashCopyFields+1, err)
	}
	if len(big.m) != n {
		t.Fatalf("a refused COPY wrote %d records", len(big.m)-n)
	}
	// Apply without a lister refuses rather than copy nothing.
	op := Op{Kind: KindCopy, Keys: bs("src", "x"), Cond: IfAbsent, Now: 1000}
	if _, err := Apply(r.m.get, 99, &op, 0, func(_, _, _ []byte, _ bool) {}); !errors.Is(err, ErrInvalidOp) {
		t.Fatalf("COPY of a hash without a lister: %v", err)
	}
}

func mustGen(t *testing.T, m mem, key string) uint64 {
	t.Helper()
	v, ok := m[key]
	if !ok || v.del {
		t.Fatalf("%s not stored", key)
	}
	gen, _, err := decodeHashMeta([]byte(v.val))
	if err != nil {
		t.Fatal(err)
	}
	return gen
}

// TestHashSweepOp: the sweep op deletes the rows of a dead generation only,
// rechecking at apply that its marker still names the key and that the key
// does not hold the generation; the last page takes the marker.
func TestHashSweepOp(t *testing.T) {
	r := newHashRun(t)
	write := func(op Op) Result {
		t.Helper()
		res, err := r.write(op)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	write(Op{Kind: KindHSet, Key: []byte("h"), Keys: bs("a", "1", "b", "2")})
	old := mustGen(t, r.m, "h")
	// Live: nothing deleted.
	if res := write(HashSweepOp([]byte("h"), old, bs("a", "b"), true)); res.Int != 0 {
		t.Fatalf("sweep of a live generation deleted %d", res.Int)
	}
	// Renamed: the marker names the new key, so a proposal made before the
	// rename (naming h) deletes nothing.
	write(Op{Kind: KindRename, Keys: bs("h", "h2")})
	if res := write(HashSweepOp([]byte("h"), old, bs("a", "b"), true)); res.Int != 0 {
		t.Fatalf("sweep of a renamed generation deleted %d", res.Int)
	}
	if got := show(r.read(Op{Kind: KindHGetAll, Key: []byte("h2")})); got != "[a 1 b 2]" {
		t.Fatalf("renamed hash after a stale sweep: %s", got)
	}
	// Dead (DEL), and a new hash at the key: the old rows go, page by page,
	// then the marker; the new hash is untouched.
	write(Op{Kind: KindDel, Keys: bs("h2")})
	write(Op{Kind: KindHSet, Key: []byte("h2"), Keys: bs("a", "new")})
	if res := write(HashSweepOp([]byte("h2"), old, bs("a"), false)); res.Int != 1 {
		t.Fatalf("first page deleted %d, want 1", res.Int)
	}
	if res := write(HashSweepOp([]byte("h2"), old, bs("b"), true)); res.Int != 1 {
		t.Fatalf("last page deleted %d, want 1", res.Int)
	}
	for k, v := range r.m {
		if g, _, ok := HashRowField([]byte(k)); ok && g == old && !v.del {
			t.Errorf("row %q of the dead generation is still stored", k)
		}
	}
	if v := r.m[string(hashMarker(old))]; !v.del {
		t.Errorf("marker of the dead generation is still stored")
	}
	if got := show(r.read(Op{Kind: KindHGetAll, Key: []byte("h2")})); got != "[a new]" {
		t.Fatalf("new hash after the sweep: %s", got)
	}
}
