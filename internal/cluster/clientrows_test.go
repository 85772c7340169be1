package cluster

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// ClientRows answers each client's row, or the request mark the group
// imported for it if that names a later request: a group's marks go on
// with its rows to the next group a slot moves to (docs/design/cluster.md
// §9, "Marks did not go a second hop").
func TestClientRowsCarryLaterMarks(t *testing.T) {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	row := func(req uint64, n int64) []byte {
		b, _ := kv.AppendClientRow(nil, req, kv.Result{Kind: kv.ResInt, Int: n}, nil)
		return b
	}
	rowKey := func(c uint64) []byte {
		return binary.BigEndian.AppendUint64(append([]byte(nil), kv.ClientRowPrefix...), c)
	}
	recs := []storage.Record{
		{Key: rowKey(1), Value: row(5, 10), Version: 1}, // row only
		{Key: rowKey(2), Value: row(7, 20), Version: 1}, // row later than its mark
		{Key: kv.SlotClientKey(2), Value: row(6, 21), Version: 1},
		{Key: rowKey(3), Value: row(2, 30), Version: 1}, // mark later than its row
		{Key: kv.SlotClientKey(3), Value: row(9, 31), Version: 1},
		{Key: kv.SlotClientKey(4), Value: row(4, 40), Version: 1}, // mark only
	}
	if _, err := db.Append(recs...); err != nil {
		t.Fatal(err)
	}
	ids, rows, err := ClientRows(db, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64][]byte{1: row(5, 10), 2: row(7, 20), 3: row(9, 31), 4: row(4, 40)}
	if len(ids) != len(want) {
		t.Fatalf("ids %v, want 4", ids)
	}
	for i, c := range ids {
		if i > 0 && ids[i-1] >= c {
			t.Fatalf("ids not ascending: %v", ids)
		}
		if !bytes.Equal(rows[i], want[c]) {
			t.Errorf("client %d: %x, want %x", c, rows[i], want[c])
		}
	}
}
