package vrshard

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
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
