package shard

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// limitRecorder is the real engine, noting the limits scans ask it for.
type limitRecorder struct {
	*storage.DB
	limits []int
}

func (l *limitRecorder) Scan(start, end []byte, at uint64, limit int, fn func([]byte, storage.Value) bool) error {
	l.limits = append(l.limits, limit)
	return l.DB.Scan(start, end, at, limit, fn)
}

func TestScanUserSkipsReservedKeysAndPassesTheLimitDown(t *testing.T) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: "/data"}}, FS: vfs.NewMem(), Inline: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var recs []storage.Record
	version := uint64(0)
	add := func(k string) {
		version++
		recs = append(recs, storage.Record{Key: []byte(k), Value: []byte("v-" + k), Version: version})
	}
	for i := range 5 {
		add(fmt.Sprintf("user%d", i))
	}
	// Twenty reserved keys sort after the users and before the tail keys.
	for i := range 20 {
		add(string(kv.ReservedPrefix) + fmt.Sprintf("client/%02d", i))
	}
	add("\xff\xffz-after-reserved")
	add("\xff\xffzz-after-reserved")
	if _, err := db.Append(recs...); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		start, end string
		limit      int
		want       []string
	}{
		{"user", "", 2, []string{"user0", "user1"}},
		{"user", "user9", 1000, []string{"user0", "user1", "user2", "user3", "user4"}},
		// The engine sees reserved keys inside the window; the scan must go on past them.
		{"user3", "", 4, []string{"user3", "user4", "\xff\xffz-after-reserved", "\xff\xffzz-after-reserved"}},
		{"\xff", "", 1, []string{"\xff\xffz-after-reserved"}},
	}
	for _, c := range cases {
		rec := &limitRecorder{DB: db}
		var end []byte
		if c.end != "" {
			end = []byte(c.end)
		}
		var got []string
		err := kv.ScanUser(EngineScanner(rec), []byte(c.start), end, c.limit, 0, func(k, data []byte, _ uint64) {
			if string(data) != "v-"+string(k) {
				t.Errorf("value of %q = %q", k, data)
			}
			got = append(got, string(k))
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("scan [%q, %q) limit %d = %q, want %q", c.start, c.end, c.limit, got, c.want)
		}
		if rec.limits[0] != c.limit {
			t.Errorf("scan [%q, %q) limit %d asked the engine for limit %d: a small scan must not read a whole batch of values",
				c.start, c.end, c.limit, rec.limits[0])
		}
	}
}
