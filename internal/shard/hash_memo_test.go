package shard

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
)

// Repeated HGETs of a hash between writes read one engine record each, the
// field's row, as a GET reads one (hgetOne: the metadata record from the memo,
// no reread while the engine's change count stands still); a write anywhere
// moves the count, and the next HGET reads the metadata again. Before, each
// read three records (metadata, row, metadata again).
func TestRepeatedHGetsReadOneRecordEach(t *testing.T) {
	s, e := openHashShard(t)
	write := func(op kv.Op) {
		t.Helper()
		if _, err := s.Write(ctx, op, level.Async, ReqID{}); err != nil {
			t.Fatalf("%v: %v", op.Kind, err)
		}
	}
	hget := func(f string) string {
		t.Helper()
		r, err := s.Read(ctx, kv.Op{Kind: kv.KindHGet, Key: []byte("hm"), Keys: [][]byte{[]byte(f)}}, level.Consistency{}, Session{})
		if err != nil || len(r.Array) != 1 {
			t.Fatalf("HGET hm %s: %+v, %v", f, r, err)
		}
		return string(r.Array[0])
	}
	write(kv.Op{Kind: kv.KindHSet, Key: []byte("hm"), Keys: [][]byte{[]byte("f0"), []byte("a"), []byte("f1"), []byte("b")}})
	hget("f0") // the memo is filled
	e.shared.Store(0)
	for i := 0; i < 10; i++ {
		if got := hget(fmt.Sprint("f", i%2)); got != "ab"[i%2:i%2+1] {
			t.Fatalf("HGET hm f%d = %q", i%2, got)
		}
	}
	if n := e.shared.Load(); n != 10 {
		t.Fatalf("10 HGETs of one hash read %d engine records, want 10 (the rows)", n)
	}
	write(kv.Op{Kind: kv.KindSet, Key: []byte("other"), Value: []byte("x")})
	e.shared.Store(0)
	if got := hget("f1"); got != "b" {
		t.Fatalf("HGET hm f1 after a write = %q", got)
	}
	if n := e.shared.Load(); n != 2 {
		t.Fatalf("an HGET after a write read %d engine records, want 2 (metadata and row)", n)
	}
}

// hgetOne (memo and change count included) answers what the snapshot read
// answers (an HMGET of the field twice, which kv.Read serves) after every
// step of random histories of hash writes, RENAME, DEL, SET over a hash and
// expiry, with HGETs repeated between writes and a clock that passes expiry
// times without a write; the staleHashMeta mutation (trust the memo and skip
// the reread whatever the count says) is caught.
func TestHGetMemoAgreesWithTheSnapshotRead(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "memo", true: "staleHashMeta"}[broken], func(t *testing.T) {
			if broken {
				mutation.Require(t)
			}
			s, _ := openHashShard(t)
			s.staleHashMeta = broken
			rng := rand.New(rand.NewPCG(29, 1))
			keys := []string{"h", "h2"}
			field := func() []byte { return fmt.Appendf(nil, "f%d", rng.IntN(4)) }
			now := int64(1_000_000)
			wrong := 0
			for step := 0; step < 3000 && wrong == 0; step++ {
				key := []byte(keys[rng.IntN(2)])
				now += int64(rng.IntN(3))
				op := kv.Op{Key: key, Now: now}
				switch rng.IntN(9) {
				case 0, 1:
					op.Kind, op.Keys = kv.KindHSet, [][]byte{field(), fmt.Appendf(nil, "v%d", step)}
				case 2:
					op.Kind, op.Keys = kv.KindHDel, [][]byte{field()}
				case 3:
					op.Kind, op.Key, op.Keys = kv.KindRename, nil, [][]byte{key, []byte(keys[rng.IntN(2)])}
				case 4:
					op.Kind, op.Key, op.Keys = kv.KindDel, nil, [][]byte{key}
				case 5:
					op.Kind, op.ExpireAt = kv.KindExpire, now+int64(rng.IntN(6))
				case 6:
					op.Kind, op.Value = kv.KindSet, []byte("s")
				default: // no write: the HGETs below meet the memo again
				}
				if op.Kind != 0 {
					// RENAME of a missing key and WRONGTYPE answer errors; the state is what matters.
					_, _ = s.Write(ctx, op, level.Async, ReqID{})
				}
				for r := 0; r < 3; r++ {
					k, f := []byte(keys[rng.IntN(2)]), field()
					at := now + int64(rng.IntN(4))
					one, err1 := s.Read(ctx, kv.Op{Kind: kv.KindHGet, Key: k, Keys: [][]byte{f}, Now: at}, level.ConsLinearizable, Session{})
					two, err2 := s.Read(ctx, kv.Op{Kind: kv.KindHGet, Key: k, Keys: [][]byte{f, f}, Now: at}, level.ConsLinearizable, Session{})
					got := fmt.Sprintf("%q %v", one.Array, err1)
					want := fmt.Sprintf("%q %v", two.Array[:min(1, len(two.Array))], err2)
					if err1 == nil && err2 == nil && (one.Array[0] == nil) != (two.Array[0] == nil) {
						got += " (nil differs)"
					}
					if got != want {
						wrong++
						if !broken {
							t.Fatalf("step %d after %v: HGET %s %s at %d = %s, the snapshot read %s", step, op.Kind, k, f, at, got, want)
						}
					}
					if broken {
						continue
					}
					// ReadField (the front door's HGET path) reads at the shard's clock.
					v, version, found, err1 := s.ReadField(k, f, level.ConsLinearizable, Session{})
					two, err2 = s.Read(ctx, kv.Op{Kind: kv.KindHGet, Key: k, Keys: [][]byte{f, f}}, level.ConsLinearizable, Session{})
					got, want = fmt.Sprint(err1), fmt.Sprint(err2)
					if err1 == nil && err2 == nil {
						got = fmt.Sprintf("%q %v v%d", v, found, version)
						want = fmt.Sprintf("%q %v v%d", two.Array[0], two.Array[0] != nil, two.Version)
					}
					if got != want {
						t.Fatalf("step %d after %v: ReadField %s %s = %s, the snapshot read %s", step, op.Kind, k, f, got, want)
					}
				}
			}
			if broken && wrong == 0 {
				t.Fatal("staleHashMeta: every HGET agreed with the snapshot read; the test does not see a stale memo")
			}
		})
	}
}

// HGETs on several goroutines while a writer rewrites the hash, renames it
// away and back (the memo is shared by every reader, published atomically;
// the race detector runs this in CI): every answer is a value the field held,
// and no reader sees a value older than one it saw before (each read is a
// state of the hash, and states only move forward).
func TestConcurrentHGetsWithWrites(t *testing.T) {
	s, _ := openHashShard(t)
	h, h2, f := []byte("h"), []byte("h2"), []byte("f")
	write := func(op kv.Op) {
		if _, err := s.Write(ctx, op, level.Async, ReqID{}); err != nil {
			t.Errorf("%v: %v", op.Kind, err)
		}
	}
	write(kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{f, []byte("0")}})
	done := make(chan struct{})
	errs := make(chan error, 4)
	for g := 0; g < 3; g++ {
		go func() {
			last := -1
			for {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				v, _, found, err := s.ReadField(h, f, level.ConsLinearizable, Session{})
				if err != nil {
					errs <- err
					return
				}
				if !found {
					continue // between the RENAMEs
				}
				var n int
				if _, err := fmt.Sscan(string(v), &n); err != nil || n < last {
					errs <- fmt.Errorf("HGET h f = %q after %d", v, last)
					return
				}
				last = n
			}
		}()
	}
	for i := 1; i <= 2000; i++ {
		write(kv.Op{Kind: kv.KindHSet, Key: h, Keys: [][]byte{f, fmt.Append(nil, i)}})
		if i%100 == 0 {
			write(kv.Op{Kind: kv.KindRename, Keys: [][]byte{h, h2}})
			write(kv.Op{Kind: kv.KindRename, Keys: [][]byte{h2, h}})
		}
	}
	close(done)
	for g := 0; g < 3; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
