package kv

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestClientTableCheck: the dedup decision, the one every engine takes.
func TestClientTableCheck(t *testing.T) {
	tab := NewClientTable(0)
	if d, e := tab.Check(1, 1); d != NewRequest || e != nil {
		t.Fatalf("unknown client: %v %+v", d, e)
	}
	res := AppendResult(nil, Result{Kind: ResInt, Int: 4, Version: 7}, nil)
	tab.Put(ClientEntry{Client: 1, ReqNum: 5, Op: 7, Result: res})
	for _, c := range []struct {
		req  uint64
		want Dedup
	}{{6, NewRequest}, {5, Duplicate}, {4, Stale}, {1, Stale}} {
		d, e := tab.Check(1, c.req)
		if d != c.want || e == nil || e.ReqNum != 5 {
			t.Fatalf("request %d: %v %+v, want %v", c.req, d, e, c.want)
		}
		if got := tab.Executed(1, c.req); got != (c.want != NewRequest) {
			t.Fatalf("request %d: Executed %v", c.req, got)
		}
	}
	if _, e := tab.Check(1, 5); !bytes.Equal(e.Result, res) {
		t.Fatalf("duplicate answered with %q, want %q", e.Result, res)
	}
	// A later request replaces the entry.
	tab.Put(ClientEntry{Client: 1, ReqNum: 6, Op: 9})
	if d, _ := tab.Check(1, 5); d != Stale || tab.Len() != 1 {
		t.Fatalf("after request 6, request 5 is %v (len %d)", d, tab.Len())
	}
}

// TestClientTableCountRuleDropsLowestOps: past its cap the table drops the
// entries with the lowest ops until a tenth of the room is free, whatever the
// client ids (a table restored from a snapshot has no insertion order), and
// two tables fed the same entries in different orders agree.
func TestClientTableCountRuleDropsLowestOps(t *testing.T) {
	var orders [2][]uint64
	for i, rev := range []bool{false, true} {
		tab := NewClientTable(10)
		// Client ids in the opposite order of their ops; loaded as a
		// snapshot, then one insert past the cap.
		var es []ClientEntry
		for op := uint64(1); op <= 10; op++ {
			es = append(es, ClientEntry{Client: 100 - op, ReqNum: 1, Op: op})
		}
		if rev {
			slices.Reverse(es)
		}
		tab.Load(es)
		tab.Put(ClientEntry{Client: 89, ReqNum: 1, Op: 11})
		if tab.Len() != 9 || tab.Evicted != 2 {
			t.Fatalf("kept %d entries, evicted %d; want 9 (cap 10 less a tenth), 2", tab.Len(), tab.Evicted)
		}
		for op := uint64(1); op <= 2; op++ {
			if tab.Get(100-op) != nil {
				t.Fatalf("the entry of op %d survived", op)
			}
		}
		for _, e := range tab.Entries() {
			orders[i] = append(orders[i], e.Client)
		}
		if op, ok := tab.MinOp(); !ok || op != 3 {
			t.Fatalf("MinOp = %d %v, want 3", op, ok)
		}
	}
	if !slices.Equal(orders[0], orders[1]) || !slices.IsSorted(orders[0]) {
		t.Fatalf("tables disagree or are not in client order: %v %v", orders[0], orders[1])
	}
}

// TestClientTableExpireIdle: the idle rule drops entries touched before the
// cutoff, least recently touched first, at most limit per call, and keeps
// the rest.
func TestClientTableExpireIdle(t *testing.T) {
	tab := NewClientTable(0)
	for c, touched := range map[uint64]int64{1: 50, 2: 10, 3: 100, 4: 10, 5: 200} {
		tab.Put(ClientEntry{Client: c, ReqNum: 1, Touched: touched})
	}
	if got := tab.ExpireIdle(150, 2); !slices.Equal(got, []uint64{2, 4}) {
		t.Fatalf("first sweep dropped %v, want [2 4] (oldest first, ties by id)", got)
	}
	if got := tab.ExpireIdle(150, 0); !slices.Equal(got, []uint64{1, 3}) {
		t.Fatalf("second sweep dropped %v, want [1 3]", got)
	}
	if tab.Len() != 1 || tab.Get(5) == nil || tab.ExpireIdle(150, 0) != nil {
		t.Fatalf("left %+v", tab.Entries())
	}
}

// Rows as the current main wrote them (golden bytes, produced by main's
// internal/vrshard applier and internal/shard clientRecord at 5619a60+):
// a replica group's rows are today's format; a single node's are the legacy one.
var (
	goldenGroupRows = []struct{ key, value string }{
		{"\xff\xffkefir/vrclient/\x00\x00\x00\x00\x00\x00\x00\a", "\x03\x02\n\x04\x00\x00"},
		{"\xff\xffkefir/vrclient/\x01\x02\x03\x04\x05\x06\a\b", "\xac\x02\x03\x00\t\x00\x00old\x00v"},
		{"\xff\xffkefir/vrclient/\x00\x00\x00\x00\x00\x00\x00\t", "\x01\x00\x00\x00\x01'value is not an integer or out of range"},
	}
	goldenSingleRows = []struct{ key, value string }{
		{"\xff\xffkefir/client/\x00\x00\x00\x00\x00\x00\x00\a", "\x03\x02\n\x04"},
		{"\xff\xffkefir/client/\x01\x02\x03\x04\x05\x06\a\b", "\xac\x02\x03\x00\told\x00v"},
		{"\xff\xffkefir/client/\x00\x00\x00\x00\x00\x00\x00\t", "\x01\x01\x00\x02"},
		{"\xff\xffkefir/client/\x00\x00\x00\x00\x00\x00\x00\n", "\x02\x04\x00\x00"},
	}
	// What the golden rows hold: client, request number, outcome.
	goldenGroup = []struct {
		client, req uint64
		res         Result
		err         error
	}{
		{7, 3, Result{Kind: ResInt, Int: 5, Version: 4}, nil},
		{0x0102030405060708, 300, Result{Kind: ResBulk, Bulk: []byte("old\x00v"), Version: 9}, nil},
		{9, 1, Result{}, ErrWrongType},
	}
	goldenSingle = []struct {
		client, req uint64
		res         Result
	}{
		{7, 3, Result{Kind: ResInt, Int: 5, Version: 4}},
		{0x0102030405060708, 300, Result{Kind: ResBulk, Bulk: []byte("old\x00v"), Version: 9}},
		{9, 1, Result{Kind: ResOK, Version: 2}},
		{10, 2, Result{Kind: ResNil}},
	}
)

func showResult(res Result, err error) string {
	return fmt.Sprintf("%d/%d/%q/%d/%v", res.Kind, res.Int, res.Bulk, res.Version, err)
}

// TestClientRowsOfMainStillDecode: today's rows are byte for byte the rows a
// replica group wrote before (so its data directories need no change), and a
// single node's legacy rows decode to the same entries.
func TestClientRowsOfMainStillDecode(t *testing.T) {
	for i, g := range goldenGroup {
		row, off := AppendClientRow(nil, g.req, g.res, g.err)
		if string(ClientRowKey(g.client)) != goldenGroupRows[i].key || string(row) != goldenGroupRows[i].value {
			t.Fatalf("row %d: %q %q, main wrote %q %q", i, ClientRowKey(g.client), row, goldenGroupRows[i].key, goldenGroupRows[i].value)
		}
		e, err := DecodeClientRow([]byte(goldenGroupRows[i].key), []byte(goldenGroupRows[i].value), 42, 77)
		if err != nil || e.Client != g.client || e.ReqNum != g.req || e.Op != 42 || e.Touched != 77 || !bytes.Equal(e.Result, row[off:]) || !bytes.Equal(e.RowValue(), row) {
			t.Fatalf("row %d decodes to %+v, %v", i, e, err)
		}
		res, opErr, err := DecodeResult(e.Result)
		if err != nil || showResult(res, opErr) != showResult(g.res, g.err) || !errors.Is(opErr, g.err) {
			t.Fatalf("row %d: result %s, %v; want %s", i, showResult(res, opErr), err, showResult(g.res, g.err))
		}
	}
	for i, g := range goldenSingle {
		e, err := DecodeLegacyClientRow([]byte(goldenSingleRows[i].key), []byte(goldenSingleRows[i].value), 42, 77)
		if err != nil || e.Client != g.client || e.ReqNum != g.req || e.Op != 42 || e.Touched != 77 {
			t.Fatalf("legacy row %d decodes to %+v, %v", i, e, err)
		}
		if want := AppendResult(nil, g.res, nil); !bytes.Equal(e.Result, want) {
			t.Fatalf("legacy row %d: result %q, want %q", i, e.Result, want)
		}
		// Decoded in today's format, the entry is a current row.
		e2, err := DecodeClientRow(ClientRowKey(e.Client), e.RowValue(), 42, 77)
		if err != nil || !bytes.Equal(e2.Result, e.Result) || e2.ReqNum != e.ReqNum {
			t.Fatalf("legacy row %d rewritten: %+v, %v", i, e2, err)
		}
	}
	// Corrupt rows are refused, not guessed at.
	for _, bad := range []struct{ key, value string }{
		{goldenGroupRows[0].key, ""},
		{goldenGroupRows[0].key, "\x03\x02"},
		{goldenGroupRows[0].key[:10], goldenGroupRows[0].value},
	} {
		if _, err := DecodeClientRow([]byte(bad.key), []byte(bad.value), 1, 1); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("row %q %q: %v", bad.key, bad.value, err)
		}
	}
	for _, bad := range []string{"", "\x03", "\x03\x09\x00\x00", "\x03\x02"} {
		if _, err := DecodeLegacyClientRow([]byte(goldenSingleRows[0].key), []byte(bad), 1, 1); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("legacy row %q: %v", bad, err)
		}
	}
}

// TestClientEntriesCodec: a snapshot's table round-trips, and a count the
// bytes cannot hold fails without allocating it.
func TestClientEntriesCodec(t *testing.T) {
	es := []ClientEntry{{Client: 1, ReqNum: 2, Op: 3, Result: []byte("r")}, {Client: 1 << 60, ReqNum: 5, Op: 6}}
	b := AppendClientEntries([]byte("x"), es)
	d := Decoder{B: append(b[1:], 'y')}
	got := DecodeClientEntries(&d)
	if d.Err != nil || string(d.B) != "y" || len(got) != 2 || got[0].Client != 1 || string(got[0].Result) != "r" || got[1].Client != 1<<60 || got[1].Op != 6 || len(got[1].Result) != 0 {
		t.Fatalf("round trip: %+v, %v, rest %q", got, d.Err, d.B)
	}
	d = Decoder{B: []byte{0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4}}
	if got := DecodeClientEntries(&d); got != nil || !errors.Is(d.Err, ErrCorrupt) {
		t.Fatalf("huge count: %+v, %v", got, d.Err)
	}
	d = Decoder{B: AppendClientEntries(nil, es)[:6]}
	if got := DecodeClientEntries(&d); got != nil || !errors.Is(d.Err, ErrCorrupt) {
		t.Fatalf("truncated: %+v, %v", got, d.Err)
	}
}
