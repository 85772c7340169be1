package vrshard

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// execOp is an EXEC of cmds (argument vectors) with watches: its keys are
// every key named (a router needs them; here only Delta's shape matters).
func execOp(ws []kv.Watch, cmds ...[]string) kv.Op {
	var cs [][][]byte
	var keys [][]byte
	for _, c := range cmds {
		var argv [][]byte
		for _, a := range c {
			argv = append(argv, []byte(a))
		}
		cs = append(cs, argv)
		keys = append(keys, argv[1])
	}
	for _, w := range ws {
		keys = append(keys, w.Key)
	}
	return kv.Op{Kind: kv.KindExec, Value: kv.EncodeTx(nil, cs, ws), Keys: keys, Delta: int64(len(keys))}
}

// A transaction (one KindExec op) retried with its request id after the
// leader that applied it died is answered from the client table at the new
// leader, the same reply bytes: its INCRs applied once. Its watch was
// compared by the state machine, not remembered by a leader: the same watch
// (now stale) in a new request conflicts at the new leader, and applies
// nothing.
func TestExecRetryAcrossLeaderChangeAppliesOnce(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader(5 * time.Second)
	w, err := c.reps[l].Read(context.Background(), kv.Op{Kind: kv.KindWatch, Keys: [][]byte{[]byte("n")}}, level.ConsLinearizable, shard.Session{})
	if err != nil || len(w.Array) != 1 {
		t.Fatalf("watch read: %+v, %v", w, err)
	}
	watch := []kv.Watch{{Key: []byte("n"), Seen: w.Array[0]}}
	tx := execOp(watch, []string{"INCR", "n"}, []string{"INCR", "n"}, []string{"GET", "n"})
	id := shard.ReqID{Client: 42, Seq: 1}
	const want = "*3\r\n:1\r\n:2\r\n$1\r\n2\r\n"
	first, err := c.write(tx, id, 5*time.Second)
	if err != nil || first.Kind != kv.ResReply || string(first.Bulk) != want {
		t.Fatalf("exec: %+v (%q), %v", first, first.Bulk, err)
	}
	c.waitApplied(first.Version, 5*time.Second)
	c.kill(l)
	again, err := c.write(tx, id, 10*time.Second)
	if err != nil || string(again.Bulk) != want || again.Version != first.Version {
		t.Fatalf("retry at the new leader: %+v (%q), %v; want the cached %q at %d", again, again.Bulk, err, want, first.Version)
	}
	stale, err := c.write(tx, shard.ReqID{Client: 42, Seq: 2}, 5*time.Second)
	if err != nil || string(stale.Bulk) != string(kv.NullArray) {
		t.Fatalf("a new request with the stale watch: %q, %v; want a null array", stale.Bulk, err)
	}
	fresh, err := c.write(execOp(nil, []string{"INCR", "n"}), shard.ReqID{Client: 42, Seq: 3}, 5*time.Second)
	if err != nil || string(fresh.Bulk) != "*1\r\n:3\r\n" {
		t.Fatalf("next transaction: %q, %v; want n at 3 (the first applied once, the stale one not at all)", fresh.Bulk, err)
	}
}
