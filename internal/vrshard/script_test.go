package vrshard

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Scripts a replay must reproduce: redis-py Lock's release (a read that
// decides a delete), one that writes several keys and reads back its own
// write, one that writes a hash, one that raises after writing (none of its
// writes may land) and one drawing math.random.
var replayScripts = []string{
	`local t = redis.call('get', KEYS[1]) if not t or t ~= ARGV[1] then return 0 end redis.call('del', KEYS[1]) return 1`,
	`redis.call('set', KEYS[1], ARGV[1]) redis.call('incr', 'ctr') redis.call('del', KEYS[2]) return {redis.call('get', KEYS[1]), redis.call('get', 'ctr')}`,
	`return redis.call('hset', 'h', ARGV[1], 'x')`,
	`redis.call('set', KEYS[1], 'lost') redis.call('incr', KEYS[2]) return 1`,
	`redis.call('append', KEYS[1], tostring(math.random(1000))) return redis.call('strlen', KEYS[1])`,
}

// genScriptOps is genOps with about a third of the ops replaced by scripts.
func genScriptOps(seed uint64) []testOp {
	ops := genOps(rand.New(rand.NewPCG(seed, 0)), 60)
	rng := rand.New(rand.NewPCG(seed, 1))
	keys := []string{"a", "b", "c", "d"}
	for i := range ops {
		if rng.IntN(3) != 0 {
			continue
		}
		body := replayScripts[rng.IntN(len(replayScripts))]
		k1, k2 := keys[rng.IntN(4)], keys[rng.IntN(4)]
		ops[i].op = kv.Op{Kind: kv.KindEval, Value: []byte(body), Delta: 2, Now: 1000,
			Keys: [][]byte{[]byte(k1), []byte(k2), []byte(fmt.Sprint("v", rng.IntN(3)))}}
	}
	return ops
}

// A script is one op: replayed after an engine crash (part of its records
// kept, part lost), it leaves the state and gives the results of a run that
// never crashed.
func TestScriptReplayAfterEngineCrash(t *testing.T) {
	checkReplayAfterCrash(t, genScriptOps)
}

// The same script op applied on two fresh states gives the same records
// and the same result.
func TestScriptOpIsDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		ops := genScriptOps(seed)
		var first []outcome
		var firstState map[string]string
		for run := 0; run < 2; run++ {
			db := openMemEngine(t, vfs.NewMem())
			got := applyAll(t, newApplier(db), ops)
			state := dump(t, db)
			if run == 0 {
				first, firstState = got, state
				continue
			}
			for i := range got {
				if fmt.Sprint(got[i]) != fmt.Sprint(first[i]) {
					t.Fatalf("seed %d op %d: %+v, then %+v", seed, i+1, first[i], got[i])
				}
			}
			if fmt.Sprint(state) != fmt.Sprint(firstState) {
				t.Fatalf("seed %d: state %v, then %v", seed, firstState, state)
			}
		}
	}
}

// evalRO is a read-only script reading key (undeclared: a script may).
func evalRO(key string) kv.Op {
	return kv.Op{Kind: kv.KindEvalRO, Value: []byte("return redis.call('get', ARGV[1])"), Keys: [][]byte{[]byte(key)}}
}

// A read-only script is a read of every key: at the leader it waits for a
// pending nilext write of a key it reads although it declared none (the
// slow path, as a scan over the key), and TryRead leaves it to Read while
// any key has a cad write that is not readable yet.
func TestReadOnlyScriptReadsPendingWrites(t *testing.T) {
	c, l, _ := pendingNilextWrite(t)
	res, err := c.reps[l].Read(context.Background(), evalRO("k"), level.ConsLinearizable, shard.Session{})
	if err != nil || string(res.Bulk) != "$2\r\nv1\r\n" {
		t.Fatalf("a linearizable EVAL_RO of a key with a pending nilext write: %q, %v; want v1", res.Bulk, err)
	}
	if n := c.reps[l].Stats().NilextSlowReads; n != 1 {
		t.Fatalf("slow-path reads %d, want 1", n)
	}
}

func TestTryReadLeavesReadOnlyScriptsToRead(t *testing.T) {
	// The cad write's batch is held for 5 s: it stays unreadable until a
	// read waits for it.
	c := newCluster(t, 3, func(o *Options) { o.CadSyncDelay = 5 * time.Second })
	l := c.leader(5 * time.Second)
	if _, err := c.write(set("a", "0"), shard.ReqID{}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	c.waitApplied(c.reps[l].Info().Commit, 5*time.Second)
	r := c.reps[l]
	// The precondition — TryRead answers at all — needs the leader's lease,
	// which a loaded machine (-race) may not have granted yet: wait for it.
	var res kv.Result
	ok := testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool {
		var answered bool
		res, answered = r.TryRead(evalRO("a"), level.ConsLinearizable)
		return answered
	})
	if !ok || string(res.Bulk) != "$1\r\n0\r\n" {
		t.Fatalf("TryRead(EVAL_RO a) = %q, %v before the cad write; want 0, true", res.Bulk, ok)
	}
	if _, err := r.Write(context.Background(), set("a", "1"), level.CAD, shard.ReqID{Client: 5, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if res, ok := r.TryRead(evalRO("a"), level.ConsLinearizable); ok {
		t.Fatalf("TryRead(EVAL_RO a) = %q after an acknowledged cad write that is not readable", res.Bulk)
	}
	res, err := r.Read(context.Background(), evalRO("a"), level.ConsLinearizable, shard.Session{})
	if err != nil || string(res.Bulk) != "$1\r\n1\r\n" {
		t.Fatalf("Read(EVAL_RO a) = %q, %v; want 1", res.Bulk, err)
	}
}
