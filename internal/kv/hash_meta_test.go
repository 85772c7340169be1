package kv

import (
	"bytes"
	"testing"
)

// HashMeta's row keys are hashRowKey's, from its copied head (hashRowPre
// long) or, when the arena has no room, by the appends; and the metadata
// record it writes decodes to it.
func TestHashRowPreIsTheRowKeysHead(t *testing.T) {
	if hashRowPre != len(hashRows)+8 {
		t.Fatalf("hashRowPre %d, the row key's head is %d bytes", hashRowPre, len(hashRows)+8)
	}
	for _, gen := range []uint64{1, 255, 1 << 40, 1<<48 + 7, ^uint64(0)} {
		data := appendHashMeta(nil, gen, 3)
		m, ok := LiveHashMeta(data, hashTypeMeta, 9, true)
		if !ok || m.Gen != gen || m.N != 3 || m.Ver != 9 {
			t.Fatalf("LiveHashMeta of gen %d: %+v, %v", gen, m, ok)
		}
		var scratch []byte
		var rows [][]byte
		for i := range 400 { // past the arena's first 4 KiB: the slow path
			field := bytes.Repeat([]byte{byte(i)}, i%40)
			rows = append(rows, m.RowKey(&scratch, field))
		}
		for i, row := range rows { // none overwritten by a later one
			if want := hashRowKey(gen, bytes.Repeat([]byte{byte(i)}, i%40)); !bytes.Equal(row, want) || cap(row) != len(want) {
				t.Fatalf("gen %d field %d: row %q (cap %d), want %q", gen, i, row, cap(row), want)
			}
		}
		m.N = 200
		v, meta := m.Record(&scratch)
		if g, n, err := decodeHashMeta(v); g != gen || n != 200 || err != nil || MetaType(meta) != TypeHash || HasExpiry(meta) {
			t.Fatalf("Record of gen %d: %d %d %v, meta %x", gen, g, n, err, meta)
		}
	}
	for _, c := range []struct {
		data, meta []byte
		live       bool
	}{
		{appendHashMeta(nil, 5, 1), hashTypeMeta, false},              // not live
		{appendHashMeta(nil, 5, 1), EncodeMeta(TypeHash, 1000), true}, // an expiry
		{appendHashMeta(nil, 5, 1), nil, true},                        // a string
		{appendHashMeta(nil, 5, 0), hashTypeMeta, true},               // no fields
		{[]byte("short"), hashTypeMeta, true},                         // corrupt
	} {
		if m, ok := LiveHashMeta(c.data, c.meta, 1, c.live); ok {
			t.Errorf("LiveHashMeta(%x, %x, live %v) = %+v, want none", c.data, c.meta, c.live, m)
		}
	}
}
