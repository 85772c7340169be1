package shard

import (
	"testing"

	"github.com/kefirdb/kefir/internal/level"
)

// An MGET reads every key at one engine version: between its reads of x and
// k another client writes x = x1 and, once that is acknowledged, k = k1. The
// MGET began before both, so [x0 k0] is right and [x0 k1] is a state no
// prefix of the history had. The tornMultiReads mutation returns it.
func TestMultiKeyReadSeesOneEngineVersion(t *testing.T) {
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
			r, err := n.s.Read(ctx, Op{Kind: KindMGet, Keys: [][]byte{[]byte("x"), []byte("k")}}, level.ConsLinearizable, Session{})
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
