package simkv

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
)

// TestStoreRunsKV: the checkers' writes go through kv's codec and kv.Apply;
// the results are kv's bytes (what a vrshard replica's client table keeps)
// and read back as the checker's results; a failed op writes nothing; an
// image loads back to an equal store.
func TestStoreRunsKV(t *testing.T) {
	var s Store
	write := func(ver uint64, op check.Op) check.Result {
		t.Helper()
		b := s.ApplyEntry(ver, AppendOp(nil, op, 0), 0)
		res, err := DecodeWrite(op.Kind, b)
		if err != nil {
			t.Fatalf("op %d: %v", ver, err)
		}
		return res
	}
	if got := write(1, check.Op{Kind: check.Put, Key: "a", Value: "x"}); got != (check.Result{Found: true, Version: 1}) {
		t.Fatalf("put: %+v", got)
	}
	if got := write(2, check.Op{Kind: check.CAS, Key: "a", Expect: "nope", Value: "y"}); got.Found {
		t.Fatalf("a CAS of the wrong value swapped: %+v", got)
	}
	if got := write(3, check.Op{Kind: check.CAS, Key: "a", Expect: "x", Value: "y"}); !got.Found || got.Version != 3 {
		t.Fatalf("cas: %+v", got)
	}
	if got := write(4, check.Op{Kind: check.Incr, Key: "n", Delta: 5}); got.Value != "5" {
		t.Fatalf("incr: %+v", got)
	}
	write(5, check.Op{Kind: check.Delete, Key: "n"})
	if got := ReadKey(s.Get, "a", 0); got != (check.Result{Found: true, Value: "y", Version: 3}) {
		t.Fatalf("read a: %+v", got)
	}
	if got := ReadKey(s.Get, "n", 0); got.Found || got.Version != 5 {
		t.Fatalf("a deleted key reads as found or without its deletion's version: %+v", got)
	}

	// An op that fails (INCR of a value that is not a number) keeps nothing
	// and its error is in the result, as kv encodes it.
	bad := kv.Op{Kind: kv.KindIncrBy, Key: []byte("a"), Delta: 1}
	b := s.ApplyEntry(6, kv.AppendOp(nil, &bad), 0)
	if _, opErr, err := kv.DecodeResult(b); err != nil || !errors.Is(opErr, kv.ErrWrongType) {
		t.Fatalf("incr of a string: op error %v, decode error %v", opErr, err)
	}
	if _, err := DecodeWrite(check.Incr, b); err == nil {
		t.Fatal("DecodeWrite passed a failed op")
	}
	if r := s.Record("a"); r.Version != 3 || r.Data != "y" {
		t.Fatalf("a failed op changed the store: %+v", r)
	}

	img := s.Image()
	l, err := LoadImage(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(l.Image(), img) || l.Record("n") != s.Record("n") {
		t.Fatal("an image does not load back to the same store")
	}
	if _, err := LoadImage(img[:len(img)-1]); err == nil {
		t.Fatal("a cut image loaded")
	}
}

// TestToKVExpiry: an expiry on the recorder's clock becomes a PXAT in unix
// ms on the servers' clock.
func TestToKVExpiry(t *testing.T) {
	op := ToKV(check.Op{Kind: check.Put, Key: "k", Value: "v", ExpireAt: int64(1500 * time.Millisecond)}, int64(time.Hour))
	if want := int64(time.Hour/time.Millisecond) + 1500; op.ExpireAt != want {
		t.Fatalf("ExpireAt %d, want %d", op.ExpireAt, want)
	}
	if op := ToKV(check.Op{Kind: check.Put, Key: "k", Value: "v"}, int64(time.Hour)); op.ExpireAt != 0 {
		t.Fatalf("a put without an expiry got one: %d", op.ExpireAt)
	}
}

// TestTTLRoundTrip: an expiry the checker sets (Put, Expire) reads back
// from a PEXPIRETIME as the same expiry at millisecond resolution; PERSIST
// leaves none, and an absent key reads as not found.
func TestTTLRoundTrip(t *testing.T) {
	epoch := int64(time.Hour)
	var s Store
	now := (epoch + int64(time.Second)) / int64(time.Millisecond)
	read := func() check.Result {
		op := TTLOp(check.Op{Kind: check.TTL, Key: "k"})
		op.Now = now
		res, err := kv.Read(s.Get, nil, &op, 0)
		if err != nil {
			t.Fatal(err)
		}
		return TTLResult(res, epoch)
	}
	if r := read(); r.Found {
		t.Fatalf("absent key: %+v", r)
	}
	at := int64(5*time.Second) + 300_000 // not a whole millisecond
	apply := func(v uint64, op check.Op) check.Result {
		k := ToKV(op, epoch)
		k.Now = now
		res, err := s.Apply(v, &k)
		if err != nil {
			t.Fatal(err)
		}
		return WriteResult(op.Kind, res)
	}
	apply(1, check.Op{Kind: check.Put, Key: "k", Value: "v", ExpireAt: at})
	if r := read(); !r.Found || r.ExpireAt != at/int64(time.Millisecond)*int64(time.Millisecond) {
		t.Fatalf("after a put with expiry %d: %+v", at, r)
	}
	if w := apply(2, check.Op{Kind: check.Expire, Key: "k", ExpireAt: 2 * at}); !w.Found {
		t.Fatalf("expire of a live key: %+v", w)
	}
	if r := read(); !r.Found || r.ExpireAt != 2*at/int64(time.Millisecond)*int64(time.Millisecond) {
		t.Fatalf("after an expire to %d: %+v", 2*at, r)
	}
	if w := apply(3, check.Op{Kind: check.Persist, Key: "k"}); !w.Found {
		t.Fatalf("persist of a key with an expiry: %+v", w)
	}
	if r := read(); !r.Found || r.ExpireAt != 0 {
		t.Fatalf("after persist: %+v", r)
	}
	if w := apply(4, check.Op{Kind: check.Persist, Key: "k"}); w.Found {
		t.Fatalf("persist of a key without expiry: %+v", w)
	}
}
