package shard

import (
	"fmt"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
)

// On a single node, with the shard's clock moved by hand: a key is there up
// to its expiry and gone after it on every read path (ReadKey, Read's GET
// path, kv.Read), the shard stamps its clock into writes (an INCR of an
// expired key starts from 0), it survives a crash, and FindExpired finds
// exactly the expired keys for active expiry's replicated delete, which
// rechecks: a key written again meanwhile stays.
func TestExpiryOnOneNode(t *testing.T) {
	clock := time.UnixMilli(1_000_000)
	n := newNode(t, Options{Now: func() time.Time { return clock }})
	at := clock.UnixMilli() + 500
	n.write(kv.Op{Kind: kv.KindSet, Key: []byte("e"), Value: []byte("v"), ExpireAt: at}, level.Sync, ReqID{})
	n.write(kv.Op{Kind: kv.KindSet, Key: []byte("f"), Value: []byte("1"), ExpireAt: at}, level.Sync, ReqID{})
	n.write(kv.Op{Kind: kv.KindSet, Key: []byte("p"), Value: []byte("v")}, level.Sync, ReqID{})
	present := func(key string) bool {
		t.Helper()
		_, _, found, err := n.s.ReadKey([]byte(key), level.ConsLinearizable, Session{})
		if err != nil {
			t.Fatal(err)
		}
		_, ok := n.get(key)
		r, err := n.s.Read(ctx, kv.Op{Kind: kv.KindExists, Keys: [][]byte{[]byte(key), []byte("nope")}}, level.ConsLinearizable, Session{})
		if err != nil {
			t.Fatal(err)
		}
		if found != ok || ok != (r.Int == 1) {
			t.Fatalf("%s: ReadKey %v, GET %v, EXISTS %d disagree", key, found, ok, r.Int)
		}
		return ok
	}
	clock = clock.Add(500 * time.Millisecond) // the expiry's own millisecond: still there
	if !present("e") {
		t.Fatal("e gone in its expiry's millisecond")
	}
	n.crash(1)
	clock = clock.Add(time.Millisecond)
	if present("e") || present("f") || !present("p") {
		t.Fatal("after the expiry: e or f still there, or p gone")
	}
	if r := n.write(kv.Op{Kind: kv.KindIncrBy, Key: []byte("f"), Delta: 5}, level.Sync, ReqID{}); r.Int != 5 {
		t.Fatalf("INCR of an expired key = %d, want 5", r.Int)
	}
	expired, sampled, next, err := FindExpired(n.db, nil, clock.UnixMilli(), 0, 100)
	if err != nil || sampled != 1 || next != nil || len(expired) != 1 || string(expired[0]) != "e" {
		t.Fatalf("FindExpired = %q of %d sampled, next %q, %v; want [e] of 1 (f lost its expiry, p never had one)", expired, sampled, next, err)
	}
	// A SET between the find and the delete wins.
	n.write(kv.Op{Kind: kv.KindSet, Key: []byte("e"), Value: []byte("again")}, level.Sync, ReqID{})
	if r := n.write(kv.Op{Kind: kv.KindExpireIfDue, Keys: expired}, level.Sync, ReqID{}); r.Int != 0 {
		t.Fatalf("ExpireIfDue deleted %d keys, want 0", r.Int)
	}
	if v, ok := n.get("e"); !ok || v != "again" {
		t.Fatalf("e = %q, %v after the recheck", v, ok)
	}
}

// SampleTTL (INFO keyspace's avg_ttl) averages only the keys whose expiry
// is still ahead, starts where it is told and wraps once to the keys before
// it, and reads at most TTLSampleKeys values.
func TestSampleTTL(t *testing.T) {
	clock := time.UnixMilli(1_000_000)
	n := newNode(t, Options{Now: func() time.Time { return clock }})
	now := clock.UnixMilli()
	set := func(key string, at int64) {
		n.write(kv.Op{Kind: kv.KindSet, Key: []byte(key), Value: []byte("v"), ExpireAt: at}, level.Sync, ReqID{})
	}
	set("a", now+1000)
	set("b", now+3000)
	set("c", now+5) // passes before the sample
	set("d", 0)     // no expiry
	clock = clock.Add(10 * time.Millisecond)
	now = clock.UnixMilli()
	for _, from := range []string{"", "a", "b", "bb", "z"} {
		sum, k, err := SampleTTL(n.db, []byte(from), now)
		if err != nil || k != 2 || sum != 990+2990 {
			t.Fatalf("from %q: SampleTTL = %d over %d, %v; want %d over 2", from, sum, k, err, 990+2990)
		}
	}
	for i := range 2 * TTLSampleKeys {
		set(fmt.Sprintf("k%04d", i), now+100)
	}
	if _, k, err := SampleTTL(n.db, []byte("k"), now); err != nil || k != TTLSampleKeys {
		t.Fatalf("SampleTTL over %d keys with a TTL sampled %d, %v; want %d", 2*TTLSampleKeys+2, k, err, TTLSampleKeys)
	}
}
