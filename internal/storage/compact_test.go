package storage

import (
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"

	"github.com/kefirdb/kefir/internal/vfs"
)

func TestCompactionReclaimsAndKeepsLiveData(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.SegmentSize = 1 << 10
	db := mustOpen(t, o)
	v := uint64(0)
	for round := 0; round < 20; round++ {
		for k := 0; k < 20; k++ {
			v++
			put(t, db, fmt.Sprintf("k%02d", k), v, fmt.Sprintf("r%d-%040d", round, k))
		}
	}
	del(t, db, "k03", v+1)
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	before := db.Stats()
	if err := db.Compact(); err != nil {
		t.Fatal(err)
	}
	after := db.Stats()
	t.Logf("disk %d -> %d bytes, %d -> %d segments, %d compacted", before.DiskBytes, after.DiskBytes, before.Segments, after.Segments, after.Compactions)
	if after.DiskBytes*3 > before.DiskBytes || after.Compactions == 0 {
		t.Fatalf("compaction reclaimed too little: %d -> %d bytes", before.DiskBytes, after.DiskBytes)
	}
	check := func(db *DB) {
		for k := 0; k < 20; k++ {
			want := fmt.Sprintf("r19-%040d", k)
			if k == 3 {
				want = ""
			}
			wantGet(t, db, fmt.Sprintf("k%02d", k), want)
		}
	}
	check(db)
	db.Close()
	fs.Crash(nil)
	db2 := mustOpen(t, o)
	defer db2.Close()
	check(db2)
}

// TestCompactionModel runs random puts, deletes, snapshots and compactions with random
// retention, reopening (full replay) now and then, and checks every read against a model
// of all versions. Deleted keys must never come back; pinned versions must survive.
func TestCompactionModel(t *testing.T) {
	seeds := 60
	if testing.Short() {
		seeds = 15
	}
	hintReopens := 0
	defer func() {
		if !t.Failed() && hintReopens == 0 {
			t.Error("no reopen recovered from a hint file: the hint path went untested")
		}
	}()
	for seed := int64(0); seed < int64(seeds); seed++ {
		rng := rand.New(rand.NewSource(seed))
		fs := vfs.NewMem()
		o := memOpts(fs)
		o.SegmentSize = int64(300 + rng.Intn(1000))
		o.Retention.KeepVersions = rng.Intn(3)
		o.CompactionThreshold = 0.3 + rng.Float64()*0.7
		db := mustOpen(t, o)
		hist := map[string][]modelVer{} // every version ever written, oldest first
		var snaps []*Snapshot
		version := uint64(0)
		for step := 0; step < 600; step++ {
			key := fmt.Sprintf("k%d", rng.Intn(15))
			version++
			switch r := rng.Intn(20); {
			case r < 3:
				del(t, db, key, version)
				hist[key] = append(hist[key], modelVer{version, "", true})
			case r == 3:
				snaps = append(snaps, db.Snapshot(0))
			case r == 4 && len(snaps) > 0:
				i := rng.Intn(len(snaps))
				snaps[i].Close()
				snaps = append(snaps[:i], snaps[i+1:]...)
			case r == 5:
				if _, err := db.Sync(db.LastPos()); err != nil {
					t.Fatal(err)
				}
				if err := db.Compact(); err != nil {
					t.Fatalf("seed %d: Compact: %v", seed, err)
				}
			case r == 6 && len(snaps) == 0:
				db.Close()
				fs.Crash(nil)
				db = mustOpen(t, o)
				if db.Stats().HintPos > 0 {
					hintReopens++
				}
			case r == 7:
				if err := db.Checkpoint(); err != nil {
					t.Fatalf("seed %d: Checkpoint: %v", seed, err)
				}
			default:
				val := fmt.Sprintf("%s@%d", key, version)
				put(t, db, key, version, val)
				hist[key] = append(hist[key], modelVer{version, val, false})
			}
			// The version counter agrees with the index.
			total := 0
			for k := range hist {
				vs, _ := db.Versions([]byte(k))
				total += len(vs)
			}
			if st := db.Stats(); st.Versions != total {
				t.Fatalf("seed %d step %d: Stats.Versions = %d, index holds %d", seed, step, st.Versions, total)
			}
			// Latest values and every pinned snapshot read match the model.
			for k, vs := range hist {
				wantGet(t, db, k, vs[len(vs)-1].val)
				for _, s := range snaps {
					want := modelAt(vs, s.Version())
					got, err := s.Get([]byte(k))
					if want == "" {
						if !errors.Is(err, ErrNotFound) {
							t.Fatalf("seed %d step %d: snapshot %d Get(%s) = %q, %v; want not found", seed, step, s.Version(), k, got.Data, err)
						}
					} else if err != nil || string(got.Data) != want {
						t.Fatalf("seed %d step %d: snapshot %d Get(%s) = %q, %v; want %q", seed, step, s.Version(), k, got.Data, err, want)
					}
				}
			}
		}
		for _, s := range snaps {
			s.Close()
		}
		db.Close()
	}
}

type modelVer struct {
	v    uint64
	val  string
	tomb bool
}

func modelAt(vs []modelVer, at uint64) string {
	out := ""
	for _, v := range vs {
		if v.v <= at {
			out = v.val
		}
	}
	return out
}

func TestCompactionConcurrentWithReadsAndWrites(t *testing.T) {
	o := Options{Devices: []Device{{Dir: t.TempDir()}}, SegmentSize: 16 << 10, CacheBytes: -1}
	db := mustOpen(t, o)
	defer db.Close()
	const keys = 200
	var mu sync.Mutex
	latest := make([]uint64, keys)
	for k := 0; k < keys; k++ {
		put(t, db, fmt.Sprintf("k%03d", k), uint64(k+1), fmt.Sprint(k+1))
		latest[k] = uint64(k + 1)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	wg.Add(3)
	go func() { // writer
		defer wg.Done()
		v := uint64(keys)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v++
			k := i % keys
			key := fmt.Sprintf("k%03d", k)
			mu.Lock()
			_, err := db.Append(Record{Key: []byte(key), Value: []byte(fmt.Sprint(v)), Version: v})
			if err == nil {
				latest[k] = v
			}
			mu.Unlock()
			if err != nil {
				errc <- err
				return
			}
			if i%50 == 0 {
				db.Sync(db.LastPos())
			}
		}
	}()
	go func() { // reader: a value always matches its version
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v, err := db.Get([]byte(fmt.Sprintf("k%03d", i%keys)))
			if err != nil || string(v.Data) != fmt.Sprint(v.Version) {
				errc <- fmt.Errorf("Get = %q v%d, %v", v.Data, v.Version, err)
				return
			}
		}
	}()
	go func() { // compactor
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := db.Compact(); err != nil {
				errc <- err
				return
			}
		}
	}()
	for db.Stats().Compactions < 20 {
		select {
		case err := <-errc:
			close(stop)
			wg.Wait()
			t.Fatal(err)
		default:
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	for k := 0; k < keys; k++ {
		wantGet(t, db, fmt.Sprintf("k%03d", k), fmt.Sprint(latest[k]))
	}
}
