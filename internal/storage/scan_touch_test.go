package storage

import (
	"bytes"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
)

// TestScanScatteredKeysAndValues checks what scanAt's walk and readBatch return
// when a range's keys and records lie scattered (inserted in random order, with
// overwrites and deletions), since the walk no longer copies a key where it finds it
// (copyKeys copies the batch's keys after touching them all) and readBatch touches
// the lines of its mapped reads before copying them (touchReads): every pair against
// a model, for whole scans across batches, bounded ones and limited ones, with and
// without a lent buffer; the keys handed out fresh (capped, and writing to them
// changes nothing the engine holds). It runs over mapped segments (the default,
// reopened so the active segment is mapped over its file and then appended past
// its mapping or short of growMap's first mapping: the pread path beside mapped
// reads) and NoZeroFill ones, with records in the write buffer too.
func TestScanScatteredKeysAndValues(t *testing.T) {
	for _, noZero := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoZeroFill=%v", noZero), func(t *testing.T) {
			o := Options{Devices: []Device{{Dir: t.TempDir()}}, SegmentSize: 256 << 10, NoZeroFill: noZero}
			db := mustOpen(t, o)
			rng := rand.New(rand.NewSource(7))
			model := map[string]string{}
			// Keys from 1 to 150 bytes (the walk's old arena guessed 24 per key).
			keyOf := func(i int) string {
				return fmt.Sprintf("k%05d%s", i, strings.Repeat("x", (i*37)%145))
			}
			valOf := func(i int, ver uint64) string {
				return fmt.Sprintf("%d@%d:%s", i, ver, strings.Repeat(string(rune('a'+i%26)), 200+(i*13+int(ver))%1500))
			}
			const keys = 700
			ver := uint64(0)
			write := func(n int) {
				for j := 0; j < n; j++ {
					i := rng.Intn(keys)
					ver++
					k := keyOf(i)
					if rng.Intn(8) == 0 {
						del(t, db, k, ver)
						delete(model, k)
						continue
					}
					v := valOf(i, ver)
					put(t, db, k, ver, v)
					model[k] = v
				}
			}
			check := func(when string) {
				t.Helper()
				sorted := make([]string, 0, len(model))
				for k := range model {
					sorted = append(sorted, k)
				}
				sort.Strings(sorted)
				var buf []byte
				var kept [][]byte
				for round := 0; round < 40; round++ {
					var start, end []byte
					limit := 0
					switch round % 4 {
					case 1:
						start = []byte(keyOf(rng.Intn(keys)))
						limit = 1 + rng.Intn(300)
					case 2:
						start = []byte(keyOf(rng.Intn(keys)))
						end = []byte(keyOf(rng.Intn(keys)))
					case 3:
						start = []byte(keyOf(rng.Intn(keys)))
						limit = 1 + rng.Intn(100)
					}
					want := sorted[sort.SearchStrings(sorted, string(start)):]
					if end != nil {
						want = want[:sort.SearchStrings(want, string(end))]
					}
					if limit > 0 && len(want) > limit {
						want = want[:limit]
					}
					var bp *[]byte
					if round%2 == 1 {
						buf = buf[:0]
						bp = &buf
					}
					got := 0
					err := db.ScanInto(start, end, 0, limit, bp, func(k []byte, v Value) bool {
						if got >= len(want) {
							t.Fatalf("%s: round %d: extra key %.20q…", when, round, k)
						}
						if string(k) != want[got] {
							t.Fatalf("%s: round %d: key %d is %.20q…, want %.20q…", when, round, got, k, want[got])
						}
						if cap(k) != len(k) {
							t.Fatalf("%s: round %d: key %.20q… has capacity %d > its length %d: an append would overwrite the next", when, round, k, cap(k), len(k))
						}
						if string(v.Data) != model[want[got]] {
							t.Fatalf("%s: round %d: %.20q… = %.30q…, want %.30q…", when, round, k, v.Data, model[want[got]])
						}
						kept = append(kept, k)
						got++
						return true
					})
					if err != nil || got != len(want) {
						t.Fatalf("%s: round %d: %d pairs of %d, %v", when, round, got, len(want), err)
					}
				}
				// The keys are the caller's: still intact after all the scans, and
				// overwriting them changes nothing the engine holds.
				for _, k := range kept {
					if _, ok := model[string(k)]; !ok {
						t.Fatalf("%s: a key kept from a scan now reads %.20q…", when, k)
					}
					for j := range k {
						k[j] = 0
					}
				}
				for _, k := range sorted[:min(len(sorted), 50)] {
					wantGet(t, db, k, model[k])
				}
			}
			write(1500) // ~1.5 MB: several segments
			if _, err := db.Sync(db.LastPos()); err != nil {
				t.Fatal(err)
			}
			check("synced")
			write(30) // some in the write buffer
			check("unsynced tail")
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = mustOpen(t, o) // the last segment mapped over its file as it stands
			write(400)          // appended past that mapping
			if _, err := db.Sync(db.LastPos()); err != nil {
				t.Fatal(err)
			}
			// The state the test means to reach: records read through mappings beside
			// records read with pread (a segment unmapped, or holding records past its
			// mapping). An appended active segment is mapped to its written end at every
			// flush (growMap), so with NoZeroFill the test shortens that mapping as a file
			// system that maps less would leave it; with zero-filled segments it depends
			// on the filler's timing.
			if noZero {
				db.mu.Lock()
				act := db.segs[len(db.segs)-1]
				act.shortenMap(act.size / 2)
				db.mu.Unlock()
			}
			db.mu.RLock()
			mapped, preads := false, false
			for _, s := range db.segs {
				p := s.mm.Load()
				mapped = mapped || p != nil
				preads = preads || p == nil || int64(len(*p)) < s.size
			}
			db.mu.RUnlock()
			if noZero && (!mapped || !preads) {
				t.Fatalf("reopened and appended: segments mapped %v, read with pread %v; want both", mapped, preads)
			}
			check("reopened and appended")
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTouchReadsStaysInsideMappings: touchReads loads only mapped bytes a read will
// copy (a read past a mapping is the pread path's), at most touchBudget of them.
func TestTouchReadsStaysInsideMappings(t *testing.T) {
	m := bytes.Repeat([]byte{1}, 1<<20)
	seg := &segment{id: 1000}
	seg.mm.Store(&m)
	unmapped := &segment{id: 5 << 20}
	hits := []scanHit{{seg: seg}, {seg: seg}, {seg: unmapped}, {seg: seg}}
	miss := []int{0, 1, 2, 3}
	for _, c := range []struct {
		reads []scanRead
		want  uint
	}{
		{[]scanRead{{lo: 1000, hi: 1000 + 128, k: 0, n: 1}}, 3},                     // lines at 0, 64, and the last byte
		{[]scanRead{{lo: 1000 + 1<<20 - 10, hi: 1000 + 1<<20 + 10, k: 1, n: 1}}, 0}, // past the mapping: not touched
		{[]scanRead{{lo: 5 << 20, hi: 5<<20 + 100, k: 2, n: 1}}, 0},                 // not mapped
		{[]scanRead{{lo: 1000, hi: 1000 + 1<<20, k: 3, n: 1}}, touchBudget/64 + 1},  // the budget
	} {
		if got := touchReads(hits, miss, c.reads); got != c.want {
			t.Fatalf("touchReads(%+v) = %d loads, want %d", c.reads, got, c.want)
		}
	}
}
