package shard

import (
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
)

// An HGET of one field (hgetOne: no snapshot) answers what the snapshot
// read answers (an HMGET of the field twice, which kv.Read serves): value,
// version and error, for a field present, empty, absent, a hash missing,
// expired, of another type, and a reserved key.
func TestHGetOneFieldAnswersAsTheSnapshotRead(t *testing.T) {
	s, _ := openHashShard(t)
	write := func(op kv.Op) {
		t.Helper()
		if _, err := s.Write(ctx, op, level.Async, ReqID{}); err != nil {
			t.Fatalf("%v: %v", op.Kind, err)
		}
	}
	write(kv.Op{Kind: kv.KindHSet, Key: []byte("h"), Keys: [][]byte{[]byte("empty"), {}, []byte("f1"), []byte("x")}})
	write(kv.Op{Kind: kv.KindHSet, Key: []byte("gone"), Keys: [][]byte{[]byte("f1"), []byte("x")}})
	write(kv.Op{Kind: kv.KindExpire, Key: []byte("gone"), ExpireAt: 1})
	write(kv.Op{Kind: kv.KindSet, Key: []byte("str"), Value: []byte("v")})
	for _, key := range []string{"h", "gone", "str", "missing", string(kv.ReservedPrefix) + "x"} {
		for _, f := range []string{"f1", "f2", "empty", "nope", ""} {
			one, err1 := s.Read(ctx, kv.Op{Kind: kv.KindHGet, Key: []byte(key), Keys: [][]byte{[]byte(f)}}, level.ConsLinearizable, Session{})
			two, err2 := s.Read(ctx, kv.Op{Kind: kv.KindHGet, Key: []byte(key), Keys: [][]byte{[]byte(f), []byte(f)}}, level.ConsLinearizable, Session{})
			got := fmt.Sprintf("%v %d %v", one.Array, one.Version, err1)
			want := fmt.Sprintf("%v %d %v", two.Array[:min(1, len(two.Array))], two.Version, err2)
			if err1 == nil && (len(one.Array) != 1 || (one.Array[0] == nil) != (two.Array[0] == nil)) {
				got += " (nil differs)"
			}
			if got != want {
				t.Errorf("HGET %q %q: %s, the snapshot read %s", key, f, got, want)
			}
			// ReadField, the front door's HGET path, answers the same.
			v, version, found, err := s.ReadField([]byte(key), []byte(f), level.ConsLinearizable, Session{})
			if got, want := fmt.Sprint(err), fmt.Sprint(err2); err != nil || err2 != nil {
				if got != want {
					t.Errorf("ReadField %q %q: %s, the snapshot read %s", key, f, got, want)
				}
			} else if (v == nil) != (two.Array[0] == nil) || string(v) != string(two.Array[0]) || found != (v != nil) || version != two.Version {
				t.Errorf("ReadField %q %q = %q %v v%d, the snapshot read %q v%d", key, f, v, found, version, two.Array[0], two.Version)
			}
		}
	}
}

// hgetOne rereads the hash's metadata after the row: between its two reads
// h is renamed to h2 and h2's f rewritten — the very row the read then finds,
// while h holds no hash. The read began before both writes, so it answers
// h's f as it was ("v") or h absent (nil), never "moved"; without the
// reread it answered "moved", a value h never held.
func TestHGetOneFieldRereadsTheMetadata(t *testing.T) {
	mutation.Require(t)
	s, _ := openHashShard(t)
	h, h2, f := []byte("h"), []byte("h2"), []byte("f1")
	done := false
	s.betweenKeys = func() {
		if done {
			return
		}
		done = true
		for _, op := range []kv.Op{
			{Kind: kv.KindRename, Keys: [][]byte{h, h2}},
			{Kind: kv.KindHSet, Key: h2, Keys: [][]byte{f, []byte("moved")}},
		} {
			if _, err := s.Write(ctx, op, level.Async, ReqID{}); err != nil {
				t.Fatalf("%v: %v", op.Kind, err)
			}
		}
	}
	r, err := s.Read(ctx, kv.Op{Kind: kv.KindHGet, Key: h, Keys: [][]byte{f}}, level.ConsLinearizable, Session{})
	if err != nil || len(r.Array) != 1 {
		t.Fatalf("HGET h f1: %+v, %v", r, err)
	}
	if !done {
		t.Fatal("the window between the reads was not exercised")
	}
	if got := r.Array[0]; got != nil && string(got) != "v" {
		t.Fatalf("HGET h f1 = %q: h never held it (it is h2's, written after the rename)", got)
	}
}
