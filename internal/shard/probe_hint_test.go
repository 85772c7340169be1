package shard

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
)

// A hash write's probe of a field row (storage.DB.Probe) hands its hint to
// that row's record only, whose insert starts from the hint's item: never to
// another record of the op (HSET h a 1 b 2 probes a, then b, then stages
// both rows), of a later op in the batch (a string key as long as the rows),
// nor of a later batch (whose row keys reuse the arena's bytes: an HINCRBY,
// which probes nothing, first in a batch after a one-HSET batch stages its
// row where that HSET probed). Random batches of HSET, HDEL, HSETNX and
// HINCRBY of equal-length fields and SET and DEL of keys as long as their
// rows, on a shard over a storage.DB (the engine that takes hints), must
// read back what a plain model holds, after every batch. A hint given to any
// record staged after a probe (stage without the key check), or one kept
// from an earlier op (apply without its reset), fails it.
func TestProbeHintsGoToTheirOwnRecords(t *testing.T) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(db, Options{Logger: slog.New(slog.DiscardHandler), NoBackgroundSync: true, Durability: level.Async})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); db.Close() })
	if s.sdb == nil {
		t.Fatal("the shard does not see a storage.DB: no probe hints")
	}
	rng := rand.New(rand.NewPCG(26, 1))
	hashes := []string{"h1", "h2"}
	field := func() string { return fmt.Sprintf("f%02d", rng.IntN(40)) }
	// String keys as long as a row key of a field: a stale hint passes the
	// engine's length guard.
	strs := make([]string, 8)
	for i := range strs {
		strs[i] = fmt.Sprintf("s%d%s", i, strings.Repeat("x", kv.HashRowOverhead+3-2))
	}
	model := map[string]map[string]string{}
	strModel := map[string]string{}
	for round := range 600 {
		n := 1 + rng.IntN(120)
		if rng.IntN(2) == 0 {
			n = 1
		}
		reqs := make([]WriteReq, n)
		for i := range reqs {
			h := hashes[rng.IntN(len(hashes))]
			var op kv.Op
			switch rng.IntN(9) {
			case 0, 1, 2:
				var kvs [][]byte
				for range 1 + rng.IntN(3) {
					kvs = append(kvs, []byte(field()), fmt.Appendf(nil, "v%d.%d", round, i))
				}
				op = kv.Op{Kind: kv.KindHSet, Key: []byte(h), Keys: kvs}
			case 3:
				op = kv.Op{Kind: kv.KindHSet, Key: []byte(h), Keys: [][]byte{[]byte(field()), fmt.Appendf(nil, "nx%d.%d", round, i)}, Cond: kv.IfAbsent}
			case 4, 5:
				fs := [][]byte{[]byte(field())}
				if rng.IntN(2) == 0 {
					fs = append(fs, []byte(field()))
				}
				op = kv.Op{Kind: kv.KindHDel, Key: []byte(h), Keys: fs}
			case 6:
				op = kv.Op{Kind: kv.KindSet, Key: []byte(strs[rng.IntN(len(strs))]), Value: fmt.Appendf(nil, "s%d.%d", round, i)}
			case 7:
				k := []byte(strs[rng.IntN(len(strs))])
				op = kv.Op{Kind: kv.KindDel, Key: k, Keys: [][]byte{k}}
			case 8: // its own fields (i..: integers), as long as the others
				op = kv.Op{Kind: kv.KindHIncrBy, Key: []byte(h), Keys: [][]byte{fmt.Appendf(nil, "i%02d", rng.IntN(40))}, Delta: 1}
			}
			reqs[i] = WriteReq{Op: op}
		}
		if _, err := s.Apply(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			op := &reqs[i].Op
			if reqs[i].Err != nil {
				t.Fatalf("round %d write %d %v %q %q: %v", round, i, op.Kind, op.Key, op.Keys, reqs[i].Err)
			}
			m := model[string(op.Key)]
			if m == nil {
				m = map[string]string{}
				model[string(op.Key)] = m
			}
			switch op.Kind {
			case kv.KindHSet:
				for j := 0; j < len(op.Keys); j += 2 {
					if _, ok := m[string(op.Keys[j])]; !ok || op.Cond != kv.IfAbsent {
						m[string(op.Keys[j])] = string(op.Keys[j+1])
					}
				}
			case kv.KindHDel:
				for _, f := range op.Keys {
					delete(m, string(f))
				}
			case kv.KindHIncrBy:
				n, _ := strconv.Atoi(m[string(op.Keys[0])])
				m[string(op.Keys[0])] = strconv.Itoa(n + 1)
			case kv.KindSet:
				strModel[string(op.Key)] = string(op.Value)
			case kv.KindDel:
				delete(strModel, string(op.Key))
			}
		}
		for _, h := range hashes {
			for f := range 80 {
				f := fmt.Sprintf("%c%02d", "fi"[f/40], f%40)
				v, _, found, err := s.ReadField([]byte(h), []byte(f), level.ConsLinearizable, Session{})
				want, ok := model[h][f]
				if err != nil || found != ok || string(v) != want {
					t.Fatalf("round %d: HGET %s %s = %q, %v, %v; want %q, %v", round, h, f, v, found, err, want, ok)
				}
			}
		}
		for _, k := range strs {
			v, _, found, err := s.ReadKey([]byte(k), level.ConsLinearizable, Session{})
			want, ok := strModel[k]
			if err != nil || found != ok || string(v) != want {
				t.Fatalf("round %d: GET %s = %q, %v, %v; want %q, %v", round, k, v, found, err, want, ok)
			}
		}
	}
}
