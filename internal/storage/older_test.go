package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// The side table of older versions agrees with the items under random histories of
// multi-version keys (versions added and dropped, keys removed and re-added), through
// leaf splits and shares that move the items: tree.vers returns what was stored, and
// check holds.
func TestTreeOlderVersionsMatchModel(t *testing.T) {
	for seed := int64(0); seed < 10; seed++ {
		rng := rand.New(rand.NewSource(seed))
		tr := newTree()
		model := map[string][]ver{}
		next := uint64(0)
		for step := 0; step < 4000; step++ {
			key := fmt.Sprintf("k%04d", rng.Intn(600))
			switch r := rng.Intn(10); {
			case r < 6: // a new newest version, keeping 0–3 of the old ones
				next++
				vs := []ver{{version: next, pos: next * 10, size: 7, flags: uint32(rng.Intn(verFlags + 1))}}
				old := model[key]
				vs = append(vs, old[:min(len(old), rng.Intn(4))]...)
				if p := tr.get(key); p != nil {
					tr.update(p, tr.makeItem(*p, vs))
				} else {
					tr.insert(tr.newItem([]byte(key), vs))
				}
				model[key] = vs
			case r < 8: // retention drops all but the newest
				if p := tr.get(key); p != nil {
					vs := model[key][:1]
					tr.Set(tr.makeItem(*p, vs))
					model[key] = vs
				}
			default:
				if tr.remove(key) != (model[key] != nil) {
					t.Fatalf("remove(%s) disagrees with the model", key)
				}
				delete(model, key)
			}
			if step%100 == 99 {
				if err := tr.check(); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				n := 0
				tr.ascend("", func(it *item) bool {
					k := tr.keyOf(it)
					l := tr.vers(it)
					if got := l.appendTo(nil); !slices.Equal(got, model[k]) {
						t.Fatalf("seed %d step %d: %s has versions %v, want %v", seed, step, k, got, model[k])
					}
					n++
					return true
				})
				if n != len(model) {
					t.Fatalf("seed %d step %d: %d items, model %d", seed, step, n, len(model))
				}
			}
		}
	}
}

// check fails when the side table and the items disagree.
func TestTreeCheckCatchesSideTable(t *testing.T) {
	build := func() (*tree, *item) {
		tr := newTree()
		for i := 0; i < 200; i++ {
			vs := []ver{{version: 3}}
			if i%10 == 0 {
				vs = append(vs, ver{version: 2}, ver{version: 1, flags: verPruned})
			}
			tr.insert(tr.newItem(fmt.Appendf(nil, "%04d", i), vs))
		}
		if err := tr.check(); err != nil {
			t.Fatal(err)
		}
		return tr, tr.get("0050")
	}
	for _, c := range []struct {
		name    string
		corrupt func(tr *tree, p *item)
	}{
		{"orphan slot", func(tr *tree, p *item) { tr.older = append(tr.older, []ver{{version: 1}}) }},
		{"slot emptied", func(tr *tree, p *item) { tr.older[p.slot()] = nil }},
		{"slot emptied and freed", func(tr *tree, p *item) {
			tr.older[p.slot()] = nil
			tr.olderFree = append(tr.olderFree, p.slot())
		}},
		{"slot lost", func(tr *tree, p *item) { p.v.flags &= verFlags }},
		{"slot out of range", func(tr *tree, p *item) { tr.get("0051").v.flags |= uint32(len(tr.older)) << olderShift }},
		{"slot shared", func(tr *tree, p *item) { tr.get("0051").v.flags |= p.slot() << olderShift }},
		{"held slot listed free", func(tr *tree, p *item) { tr.olderFree = append(tr.olderFree, p.slot()) }},
		{"free slot listed twice", func(tr *tree, p *item) {
			tr.remove("0050")
			tr.olderFree = append(tr.olderFree, tr.olderFree[len(tr.olderFree)-1])
		}},
		{"versions out of order", func(tr *tree, p *item) { tr.older[p.slot()] = []ver{{version: 1}, {version: 2}} }},
		{"older as new as the newest", func(tr *tree, p *item) { tr.older[p.slot()] = []ver{{version: 3}} }},
		{"a slot in an older version", func(tr *tree, p *item) { tr.older[p.slot()] = []ver{{version: 2, flags: 1 << olderShift}} }},
	} {
		tr, p := build()
		c.corrupt(tr, p)
		if err := tr.check(); err == nil {
			t.Errorf("%s: check accepted it", c.name)
		}
	}
}

// Multi-version keys under every retention policy, snapshots, compaction, checkpoints and
// reopening (from the hint and by replay): after each step the tree's check holds (the
// side table agrees with the items), every retained version reads back its own value at
// its version, and the newest reads agree with a model.
func TestOlderVersionsSurviveEverything(t *testing.T) {
	for _, policy := range []string{"keep3", "keepfor", "snapshots"} {
		t.Run(policy, func(t *testing.T) {
			rng := rand.New(rand.NewSource(1))
			fs := vfs.NewMem()
			o := memOpts(fs)
			o.SegmentSize = 2 << 10
			clock := time.Unix(1000, 0)
			o.Now = func() time.Time { return clock }
			switch policy {
			case "keep3":
				o.Retention.KeepVersions = 3
			case "keepfor":
				o.Retention.KeepFor = 5 * time.Second
			}
			db := mustOpen(t, o)
			defer func() { db.Close() }()
			var snaps []*Snapshot
			type newest struct {
				v    uint64
				tomb bool
			}
			model := map[string]newest{}
			sawOlder, compactions := 0, int64(0) // that the run tests something
			version := uint64(0)
			val := func(k string, v uint64) string { return fmt.Sprintf("%s@%d", k, v) }
			verify := func(what string) {
				t.Helper()
				if err := db.idx.check(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				multi := 0
				for k, m := range model {
					got, err := db.Get([]byte(k))
					if m.tomb {
						if !errors.Is(err, ErrNotFound) {
							t.Fatalf("%s: Get %s = %q, %v; want not found", what, k, got.Data, err)
						}
					} else if err != nil || string(got.Data) != val(k, m.v) {
						t.Fatalf("%s: Get %s = %q, %v; want %q", what, k, got.Data, err, val(k, m.v))
					}
					vis, err := db.Versions([]byte(k))
					if m.tomb && errors.Is(err, ErrNotFound) {
						continue // compaction dropped the deletion
					}
					if err != nil || vis[0].Version != m.v {
						t.Fatalf("%s: Versions %s = %v, %v; newest should be %d", what, k, vis, err, m.v)
					}
					if len(vis) > 1 {
						multi++
					}
					for _, vi := range vis {
						got, err := db.GetAt([]byte(k), vi.Version)
						if vi.Tombstone {
							if !errors.Is(err, ErrNotFound) {
								t.Fatalf("%s: GetAt %s %d = %q, %v; want not found", what, k, vi.Version, got.Data, err)
							}
						} else if err != nil || string(got.Data) != val(k, vi.Version) {
							t.Fatalf("%s: GetAt %s %d = %q, %v", what, k, vi.Version, got.Data, err)
						}
					}
				}
				sawOlder = max(sawOlder, multi)
				for _, s := range snaps { // reads and scans at a version
					for k := range model {
						got, err := s.Get([]byte(k))
						if err == nil && (got.Version > s.Version() || string(got.Data) != val(k, got.Version)) {
							t.Fatalf("%s: snapshot at %d: Get %s = %q version %d", what, s.Version(), k, got.Data, got.Version)
						} else if err != nil && !errors.Is(err, ErrNotFound) {
							t.Fatalf("%s: snapshot at %d: Get %s: %v", what, s.Version(), k, err)
						}
					}
					err := s.Scan(nil, nil, 0, func(key []byte, v Value) bool {
						if v.Version > s.Version() || string(v.Data) != val(string(key), v.Version) {
							t.Fatalf("%s: snapshot at %d: Scan %s = %q version %d", what, s.Version(), key, v.Data, v.Version)
						}
						return true
					})
					if err != nil {
						t.Fatalf("%s: snapshot scan: %v", what, err)
					}
				}
			}
			reopen := func(fromHint bool) {
				t.Helper()
				for _, s := range snaps {
					s.Close()
				}
				snaps = nil
				if fromHint {
					if err := db.Checkpoint(); err != nil {
						t.Fatal(err)
					}
				}
				compactions += db.Stats().Compactions
				db.Close()
				if !fromHint {
					for _, p := range hintFiles(t, fs, "/db") {
						if err := fs.Remove(p); err != nil {
							t.Fatal(err)
						}
					}
				}
				db = mustOpen(t, o)
				if used := db.Stats().HintPos != 0; used != fromHint {
					t.Fatalf("reopen used the hint: %v, want %v", used, fromHint)
				}
				verify(fmt.Sprintf("reopened (hint %v)", fromHint))
			}
			for step := 0; step < 3000; step++ {
				k := fmt.Sprintf("key%02d", rng.Intn(40))
				switch r := rng.Intn(100); {
				case r < 80:
					version++
					tomb := rng.Intn(8) == 0
					rec := Record{Key: []byte(k), Version: version, Timestamp: clock.UnixNano(), Tombstone: tomb}
					if !tomb {
						rec.Value = []byte(val(k, version))
					}
					if _, err := db.Append(rec); err != nil {
						t.Fatal(err)
					}
					model[k] = newest{version, tomb}
				case r < 88:
					clock = clock.Add(time.Second)
				case r < 93 && policy == "snapshots":
					if len(snaps) < 3 {
						snaps = append(snaps, db.Snapshot(0))
					} else {
						i := rng.Intn(len(snaps))
						snaps[i].Close()
						snaps = slices.Delete(snaps, i, i+1)
					}
				case r < 96:
					if _, err := db.Sync(db.LastPos()); err != nil {
						t.Fatal(err)
					}
					if err := db.Compact(); err != nil {
						t.Fatal(err)
					}
					verify(fmt.Sprintf("step %d compacted", step))
				case r < 97:
					if err := db.Checkpoint(); err != nil {
						t.Fatal(err)
					}
				case r < 99:
					reopen(true)
				default:
					reopen(false)
				}
				if step%50 == 49 {
					verify(fmt.Sprintf("step %d", step))
				}
			}
			reopen(true)
			reopen(false)
			if compactions == 0 || sawOlder < 5 {
				t.Fatalf("%d compactions, at most %d keys with older versions at once: the run tests too little", compactions, sawOlder)
			}
			t.Logf("%d compactions, up to %d keys with older versions", compactions, sawOlder)
		})
	}
}

// A hint file's versions carry the four version flags only (the item's side-table slot,
// above them, never leaves the index: tree.vers clears it). A hint with another bit set
// is not used, the log is replayed instead, and the keys read as before.
func TestHintWithUnknownFlagsIsNotUsed(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.Retention.KeepVersions = 2
	db := mustOpen(t, o)
	put(t, db, "k", 1, "one")
	put(t, db, "k", 2, "two")
	if err := db.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = mustOpen(t, o)
	if db.Stats().HintPos == 0 {
		t.Fatal("reopen did not use the hint file")
	}
	db.Close()
	for _, p := range hintFiles(t, fs, "/db") {
		rewrite(t, fs, p, func(b []byte) []byte {
			// The last version's flags are the last byte before the item
			// count (8 bytes) and the checksum (4).
			i := len(b) - 13
			if b[i]&^verFlags != 0 {
				t.Fatalf("the hint holds flags %#x: more than the version's", b[i])
			}
			b[i] |= 1 << olderShift
			binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], seglog.CRCTable))
			return b
		})
	}
	db = mustOpen(t, o)
	defer db.Close()
	if db.Stats().HintPos != 0 {
		t.Fatal("a hint with unknown version flags was used")
	}
	if v, err := db.Get([]byte("k")); err != nil || string(v.Data) != "two" {
		t.Fatalf("Get = %q, %v", v.Data, err)
	}
	if v, err := db.GetAt([]byte("k"), 1); err != nil || string(v.Data) != "one" {
		t.Fatalf("GetAt 1 = %q, %v", v.Data, err)
	}
	if err := db.idx.check(); err != nil {
		t.Fatal(err)
	}
}
