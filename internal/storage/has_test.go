package storage

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"

	"github.com/kefirdb/kefir/internal/vfs"
)

// Has answers what Get finds (a value or not) from the index: a missing key,
// a value, a deletion, a key written again, an empty value, and a key whose
// record lives in a sealed segment rather than the write buffer.
func TestHasAgreesWithGet(t *testing.T) {
	o := memOpts(vfs.NewMem())
	o.Retention.KeepVersions = 3 // older versions retained must not count
	db := mustOpen(t, o)
	put(t, db, "a", 1, "x")
	put(t, db, "b", 2, "x")
	del(t, db, "b", 3)
	put(t, db, "c", 4, "x")
	del(t, db, "c", 5)
	put(t, db, "c", 6, "back")
	put(t, db, "e", 7, "")
	for i := 0; i < 200; i++ { // roll segments: "a" is read back from a file
		put(t, db, "filler", uint64(8+i), "0123456789012345678901234567890123456789")
	}
	for _, k := range []string{"a", "b", "c", "e", "never"} {
		_, gerr := db.Get([]byte(k))
		want := gerr == nil
		if gerr != nil && !errors.Is(gerr, ErrNotFound) {
			t.Fatalf("Get(%s): %v", k, gerr)
		}
		got, err := db.Has([]byte(k))
		if err != nil || got != want {
			t.Errorf("Has(%s) = %v, %v; Get finds a value: %v", k, got, err, want)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Has([]byte("a")); !errors.Is(err, ErrClosed) {
		t.Errorf("Has after Close: %v, want ErrClosed", err)
	}
}

// A batch holding one op's records at one version — an HSET of 10 fields
// writes 11 — takes the order check's fast path; a repeated key in the run
// does not.
func TestBatchOrderFastPathTakesAnHSetOfTenFields(t *testing.T) {
	recs := []Record{{Key: []byte("x"), Version: 5}}
	for i := 0; i < 11; i++ {
		recs = append(recs, Record{Key: []byte{'r', byte('a' + i)}, Version: 6})
	}
	recs = append(recs, Record{Key: []byte("y"), Version: 7})
	if !risingAbove(recs, 4) {
		t.Errorf("a run of 11 distinct keys at one version leaves the fast path")
	}
	recs[11].Key = []byte("ra")
	if risingAbove(recs, 4) {
		t.Errorf("a run repeating a key takes the fast path")
	}
}

// Changes moves with every Append that changes what reads find, and with
// nothing else: reads, a failed Append and a compaction (which moves records
// but changes no answer) leave it, so equal readings around a group of reads
// mean they saw one state (the single node's HGET relies on it).
func TestChangesMovesWithEveryAppend(t *testing.T) {
	db := mustOpen(t, memOpts(vfs.NewMem()))
	c := db.Changes()
	put(t, db, "a", 1, "x")
	if db.Changes() == c {
		t.Fatal("an Append did not move Changes")
	}
	c = db.Changes()
	del(t, db, "a", 2)
	if db.Changes() == c {
		t.Fatal("a deletion did not move Changes")
	}
	for i := 0; i < 200; i++ {
		put(t, db, "filler", uint64(3+i), "0123456789012345678901234567890123456789")
	}
	c = db.Changes()
	if _, err := db.Get([]byte("filler")); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Append(Record{Key: []byte("filler"), Value: []byte("old"), Version: 1}); !errors.Is(err, ErrVersionOrder) {
		t.Fatalf("an Append of an old version: %v", err)
	}
	if err := db.Compact(); err != nil {
		t.Fatal(err)
	}
	if db.Changes() != c {
		t.Fatalf("a Get, a failed Append and a compaction moved Changes from %d to %d", c, db.Changes())
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// An Append of records that carry their keys' probe hints (Probe, then other
// batches that insert, delete, split, share and compact, then the probed
// keys' records) leaves the index as the same history without hints does:
// every key reads the same value and version from both DBs, and the index
// holds its invariants. A hint trusted after its leaf changed (a change that
// skips bnode.mods) updates the item that moved into its slot, and the two
// DBs then disagree.
func TestAppendWithProbeHintsAgreesWithout(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	a, b := mustOpen(t, memOpts(vfs.NewMem())), mustOpen(t, memOpts(vfs.NewMem()))
	key := func() []byte {
		return fmt.Appendf(nil, "\xff\xffkefir/h/\x00\x00\x00\x00\x00\x00\x00\x07f%05d", rng.Intn(4000))
	}
	ver := uint64(0)
	rec := func(k []byte) Record {
		ver++
		r := Record{Key: k, Version: ver, Value: fmt.Appendf(nil, "v%d", ver)}
		if rng.Intn(5) == 0 {
			r.Value, r.Tombstone = nil, true
		}
		return r
	}
	appendBoth := func(ra, rb []Record) {
		t.Helper()
		if _, err := a.Append(ra...); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Append(rb...); err != nil {
			t.Fatal(err)
		}
	}
	held := 0
	for round := 0; round < 600; round++ {
		// The probes of a batch: the writer's, before its records.
		n := 1 + rng.Intn(40)
		keys, hints := make([][]byte, n), make([]Hint, n)
		for i := range keys {
			keys[i] = key()
			ok, h, err := a.Probe(keys[i])
			want, err2 := b.Has(keys[i])
			if err != nil || err2 != nil || ok != want {
				t.Fatalf("round %d: Probe(%q) = %v, %v; Has %v, %v", round, keys[i], ok, err, want, err2)
			}
			hints[i] = h
		}
		// Other batches in between (on one node a hint lives within its
		// batch; an engine with other writers, compaction, must hold too).
		for range rng.Intn(3) {
			var recs []Record
			for range 1 + rng.Intn(60) {
				recs = append(recs, rec(key()))
			}
			appendBoth(recs, recs)
		}
		if rng.Intn(50) == 0 {
			if err := a.Compact(); err != nil {
				t.Fatal(err)
			}
			if err := b.Compact(); err != nil {
				t.Fatal(err)
			}
		}
		// The probed keys' records, in the probes' order (a key probed
		// twice: both carry its hint), with their hints on a only.
		ra, rb := make([]Record, n), make([]Record, n)
		for i, k := range keys {
			rb[i] = rec(k)
			ra[i] = rb[i]
			ra[i].Hint = hints[i]
			if h := hints[i]; h.leaf != nil && h.leaf.mods == h.mods {
				held++
			}
		}
		appendBoth(ra, rb)
	}
	if held < 1000 {
		t.Fatalf("only %d hints held: the test does not exercise them", held)
	}
	for i := range 4000 {
		k := fmt.Appendf(nil, "\xff\xffkefir/h/\x00\x00\x00\x00\x00\x00\x00\x07f%05d", i)
		va, ea := a.Get(k)
		vb, eb := b.Get(k)
		if (ea == nil) != (eb == nil) || ea == nil && (string(va.Data) != string(vb.Data) || va.Version != vb.Version) {
			t.Fatalf("%q: with hints %q v%d (%v), without %q v%d (%v)", k, va.Data, va.Version, ea, vb.Data, vb.Version, eb)
		}
	}
	a.mu.RLock()
	err := a.idx.check()
	a.mu.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
}
