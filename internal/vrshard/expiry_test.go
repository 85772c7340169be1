package vrshard

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A log entry written before key expiry (format 1) still decodes, and a
// format 3 entry carries the proposer's Now, the expiry and its options.
func TestEntryFormatsAcrossExpiry(t *testing.T) {
	// encodeOp(nil, header{proposer: 1, seq: 2, ts: 3}, SET k v) at ae3fe84.
	old, _ := hex.DecodeString("01010206" + "060000016b01760000")
	h, op, err := decodeOp(old)
	if err != nil || h != (header{1, 2, 3}) || op.Kind != kv.KindSet || string(op.Key) != "k" || op.Now != 0 {
		t.Fatalf("format 1 entry: %+v %+v %v", h, op, err)
	}
	in := kv.Op{Kind: kv.KindSet, Key: []byte("k"), Value: []byte("v"), Now: 1733380000000, ExpireAt: 1733380010000, TTL: kv.TTLKeep}
	b := encodeOp(nil, header{1, 2, 3}, &in)
	if b[0] != dataFormat || dataFormat == forgetFormat {
		t.Fatalf("format byte %d (forget entries: %d)", b[0], forgetFormat)
	}
	if _, _, ok, _ := decodeForget(b); ok {
		t.Fatal("an op entry decodes as a forget entry")
	}
	if _, got, err := decodeOp(b); err != nil || got.Now != in.Now || got.ExpireAt != in.ExpireAt || got.TTL != in.TTL {
		t.Fatalf("format 2 entry: %+v %v", got, err)
	}
	if _, _, err := decodeOp(append([]byte{4}, b[1:]...)); err == nil {
		t.Fatal("an unknown format decoded")
	}
}

// A snapshot carries each key's meta in its trailer, and a snapshot without
// meta is what a build before expiry sent (no trailer).
func TestSnapshotCarriesMeta(t *testing.T) {
	for _, withMeta := range []bool{false, true} {
		db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: "/db"}}, FS: vfs.NewMem(), Inline: true})
		if err != nil {
			t.Fatal(err)
		}
		meta := kv.EncodeMeta(kv.TypeString, 4102444800000)
		recs := []storage.Record{{Key: []byte("a"), Value: []byte("1"), Version: 1}, {Key: []byte("b"), Value: []byte("2"), Version: 2}}
		if withMeta {
			recs[1].Meta = meta
		}
		if _, err := db.Append(recs...); err != nil {
			t.Fatal(err)
		}
		snap := db.Snapshot(0)
		data, err := captureData(snap, nil)
		snap.Close()
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		rd := reader{b: data}
		n := rd.uvarint()
		metas, err := snapshotMetas(rd, n)
		if err != nil || n != 2 {
			t.Fatalf("snapshotMetas: %v (n %d)", err, n)
		}
		if withMeta && (len(metas) != 1 || !bytes.Equal(metas[1], meta)) {
			t.Fatalf("metas %v, want b's", metas)
		}
		if !withMeta && metas != nil {
			t.Fatalf("metas %v without meta", metas)
		}
		// A corrupt trailer is refused, not ignored.
		if withMeta {
			rd := reader{b: append(bytes.Clone(data[:len(data)-len(meta)-2]), 9, 9)}
			if _, err := snapshotMetas(rd, rd.uvarint()); err == nil {
				t.Fatal("a corrupt meta trailer passed")
			}
		}
	}
}

// A replica that lost its disk and rejoins by a snapshot has every key's
// expiry: state transfer carries meta.
func TestWipedReplicaGetsExpiriesBySnapshot(t *testing.T) {
	c := newCluster(t, 3, func(o *Options) {
		o.CheckpointOps = 40 // compact often, so the log no longer starts at op 1
		o.KeepTail = 5
	})
	const at = 4102444800000
	var last kv.Result
	var err error
	for i := range 120 {
		op := set(fmt.Sprint("k", i%30), fmt.Sprint("v", i))
		if i%2 == 1 {
			op.ExpireAt = at + int64(i)
		}
		if last, err = c.write(op, shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	l := c.leader(5 * time.Second)
	f := (l + 1) % 3
	c.waitApplied(last.Version, 5*time.Second)
	c.wipe(f)
	for i := range 20 {
		if last, err = c.write(set(fmt.Sprint("late", i), "x"), shard.ReqID{}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	c.open(f, false, nil)
	c.waitApplied(last.Version, 15*time.Second)
	c.waitRecovered(f, 15*time.Second)
	if c.reps[f].Stats().SnapsLoaded == 0 {
		t.Fatal("the wiped replica caught up without a snapshot: the test did not test state transfer")
	}
	for k := range 30 {
		i := 90 + k // the last write of k<k%30>
		key := fmt.Sprint("k", i%30)
		v, err := c.reps[f].Engine().Get([]byte(key))
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		want := int64(0)
		if i%2 == 1 {
			want = at + int64(i)
		}
		if got := kv.ExpireAt(v.Meta); got != want {
			t.Errorf("%s on the restored replica expires at %d, want %d", key, got, want)
		}
	}
}
