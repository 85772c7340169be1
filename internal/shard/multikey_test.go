package shard

import (
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
)

// An MGET reads every key at one engine version: between its reads of x and
// k another client writes x = x1 and, once that is acknowledged, k = k1. The
// MGET began before both, so [x0 k0] is right and [x0 k1] is a state no
// prefix of the history had. The tornMultiReads mutation returns it.
func TestMultiKeyReadSeesOneEngineVersion(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "snapshot", true: "tornMultiReads"}[broken], func(t *testing.T) {
			n := newNode(t, Options{})
			n.write(set("x", "x0"), level.Sync, ReqID{})
			n.write(set("k", "k0"), level.Sync, ReqID{})
			n.s.tornMultiReads = broken
			done := false
			n.s.betweenKeys = func() {
				if !done {
					done = true
					n.write(set("x", "x1"), level.Sync, ReqID{})
					n.write(set("k", "k1"), level.Sync, ReqID{})
				}
			}
			r, err := n.s.Read(ctx, kv.Op{Kind: kv.KindMGet, Keys: [][]byte{[]byte("x"), []byte("k")}}, level.ConsLinearizable, Session{})
			if err != nil || len(r.Array) != 2 {
				t.Fatalf("MGET x k: %+v, %v", r, err)
			}
			x, k := string(r.Array[0]), string(r.Array[1])
			torn := x == "x0" && k == "k1"
			switch {
			case broken && torn:
				return // caught
			case broken:
				t.Fatalf("tornMultiReads: MGET = [%s %s]; the window was not exercised", x, k)
			case torn || x != "x0" || k != "k0":
				t.Fatalf("MGET = [%s %s], want [x0 k0]: the read began before both writes and sees one version", x, k)
			}
		})
	}
}

// ReadKey is Read of a GET without the Op and Result: the same answer, the
// same refusals (a session ahead of this node, an unknown level).
func TestReadKeyAnswersAsReadDoes(t *testing.T) {
	n := newNode(t, Options{})
	w := n.write(set("k", "v"), level.Sync, ReqID{})
	for _, key := range []string{"k", "missing"} {
		r, err := n.s.Read(ctx, kv.Op{Kind: kv.KindGet, Key: []byte(key)}, level.ConsLinearizable, Session{})
		if err != nil {
			t.Fatal(err)
		}
		v, version, found, err := n.s.ReadKey([]byte(key), level.ConsLinearizable, Session{})
		if err != nil || found != (r.Kind == kv.ResBulk) || string(v) != string(r.Bulk) || version != r.Version {
			t.Fatalf("%s: ReadKey = %q, %d, %v, %v; Read = %+v", key, v, version, found, err, r)
		}
	}
	if _, _, _, err := n.s.ReadKey([]byte("k"), level.ConsLinearizable, Session{MaxRead: w.Version + 10}); !errors.Is(err, ErrSessionAhead) {
		t.Fatalf("session ahead: %v, want ErrSessionAhead", err)
	}
	if _, _, _, err := n.s.ReadKey([]byte("k"), level.Consistency{Kind: 99}, Session{}); err == nil {
		t.Fatal("an unknown consistency level was accepted")
	}
}

// An MSET naming a key twice stores the last value, and a write of the
// empty key fails alone: neither may fail the writes applied in the same
// batch. (Before internal/kv, the single node staged two records of one key
// at one version, or a record of the empty key, which the engine refuses
// with the whole batch: every write in it failed -UNAVAILABLE.)
func TestMSetOfOneKeyTwice(t *testing.T) {
	n := newNode(t, Options{})
	reqs := []WriteReq{
		{Op: set("b", "before")},
		{Op: kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("a"), []byte("1"), []byte("c"), []byte("3"), []byte("a"), []byte("2")}}},
		{Op: set("", "empty")},
		{Op: set("d", "after")},
	}
	p, err := n.s.Apply(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.s.Wait(ctx, p); err != nil {
		t.Fatal(err)
	}
	for i, r := range reqs {
		if i == 2 {
			if !errors.Is(r.Err, kv.ErrInvalidOp) {
				t.Errorf("SET of the empty key: %v, want ErrInvalidOp", r.Err)
			}
			continue
		}
		if r.Err != nil {
			t.Errorf("write %d (%v): %v", i, r.Op.Kind, r.Err)
		}
	}
	for k, want := range map[string]string{"a": "2", "b": "before", "c": "3", "d": "after"} {
		if v, ok := n.get(k); !ok || v != want {
			t.Errorf("GET %s = %q, %v; want %q", k, v, ok, want)
		}
	}
}
