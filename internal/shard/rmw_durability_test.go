package shard

import (
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
)

// A read-modify-write reports state it read. Under cad that state may not be
// durable yet; the reply must wait until it is, or a crash takes back a value a
// client was told about (found by review: GETSET and a failed SET NX replied at once).
func TestReadModifyWriteRepliesOnlyWithDurableState(t *testing.T) {
	t.Run("GETSET at cad", func(t *testing.T) {
		n := newNode(t, Options{NoBackgroundSync: true})
		n.write(set("k", "v1"), level.CAD, ReqID{})
		r := n.write(kv.Op{Kind: kv.KindGetSet, Key: []byte("k"), Value: []byte("v2")}, level.CAD, ReqID{})
		if string(r.Bulk) != "v1" {
			t.Fatalf("getset = %q", r.Bulk)
		}
		n.crash(3)
		if v, ok := n.get("k"); !ok || v != "v1" && v != "v2" {
			t.Fatalf("GETSET returned v1 to a client, then a crash lost it: get = %q %v", v, ok)
		}
	})
	t.Run("failed SET NX at sync", func(t *testing.T) {
		n := newNode(t, Options{NoBackgroundSync: true})
		n.write(set("k", "v1"), level.CAD, ReqID{})
		r := n.write(kv.Op{Kind: kv.KindSet, Key: []byte("k"), Value: []byte("x"), Cond: kv.IfAbsent}, level.Sync, ReqID{})
		if r.Kind != kv.ResNil {
			t.Fatalf("SET NX result = %+v, want nil (exists)", r)
		}
		n.crash(4)
		if _, ok := n.get("k"); !ok {
			t.Fatalf("SET NX (sync) told the client k exists, then a crash lost k")
		}
	})
	t.Run("plain SET at cad stays fast", func(t *testing.T) {
		n := newNode(t, Options{NoBackgroundSync: true})
		n.write(set("k", "v1"), level.CAD, ReqID{})
		n.write(set("k", "v2"), level.CAD, ReqID{})
		if st := n.s.Status(); st.Syncs != 0 {
			t.Fatalf("plain cad SETs (nil-externalizing) waited for %d syncs", st.Syncs)
		}
	})
}
