package shard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
)

// oldClientRow returns a single node's client-table row as main wrote it before
// issue 26 (key \xff\xffkefir/client/<id>, value seq | kind | int | version |
// bulk), byte for byte: the encoder is spelled out here, not borrowed from
// today's code, and TestLegacyRowEncoderIsMains pins it to golden bytes.
func oldClientRow(client, seq uint64, res kv.Result, version uint64, ts int64) storage.Record {
	key := binary.BigEndian.AppendUint64([]byte("\xff\xffkefir/client/"), client)
	b := binary.AppendUvarint(nil, seq)
	b = append(b, byte(res.Kind))
	b = binary.AppendVarint(b, res.Int)
	b = binary.AppendUvarint(b, res.Version)
	b = append(b, res.Bulk...)
	return storage.Record{Key: key, Value: b, Version: version, Timestamp: ts}
}

// TestLegacyRowEncoderIsMains: golden bytes of rows main's clientRecord wrote.
func TestLegacyRowEncoderIsMains(t *testing.T) {
	for _, g := range []struct {
		rec        storage.Record
		key, value string
	}{
		{oldClientRow(7, 3, kv.Result{Kind: kv.ResInt, Int: 5, Version: 4}, 11, 0),
			"\xff\xffkefir/client/\x00\x00\x00\x00\x00\x00\x00\a", "\x03\x02\n\x04"},
		{oldClientRow(0x0102030405060708, 300, kv.Result{Kind: kv.ResBulk, Bulk: []byte("old\x00v"), Version: 9}, 11, 0),
			"\xff\xffkefir/client/\x01\x02\x03\x04\x05\x06\a\b", "\xac\x02\x03\x00\told\x00v"},
	} {
		if string(g.rec.Key) != g.key || string(g.rec.Value) != g.value {
			t.Fatalf("legacy row %q %q, main wrote %q %q", g.rec.Key, g.rec.Value, g.key, g.value)
		}
	}
}

// TestClientRowsWrittenBeforeIssue26KeepTheirDedupAnswers: a single node's
// data directory holding client-table rows in the format main wrote opens,
// answers retries of those writes from the table (not by executing them
// again), refuses their stale requests, keeps their idle time, rewrites the
// rows in kv's format (no legacy row left) and keeps all of that across the
// next restart.
func TestClientRowsWrittenBeforeIssue26KeepTheirDedupAnswers(t *testing.T) {
	now := time.Unix(1000, 0)
	n := newNode(t, Options{ClientTTL: time.Hour, Now: func() time.Time { return now }})
	n.s.Close()
	// The state main left: x incremented to 5 by client 7's request 3 (result
	// 5 at version v), y set by client 8's GETSET (old value "a"), and x moved
	// on since (client 9, request 1, touched long ago).
	v := n.db.LastVersion() + 1
	old := now.Add(-50 * time.Minute).UnixNano()
	if _, err := n.db.Append(
		storage.Record{Key: []byte("x"), Value: []byte("5"), Version: v, Timestamp: old},
		oldClientRow(7, 3, kv.Result{Kind: kv.ResInt, Int: 5, Version: v}, v, old),
	); err != nil {
		t.Fatal(err)
	}
	if _, err := n.db.Append(
		storage.Record{Key: []byte("y"), Value: []byte("b"), Version: v + 1, Timestamp: old},
		oldClientRow(8, 2, kv.Result{Kind: kv.ResBulk, Bulk: []byte("a"), Version: v + 1}, v+1, old),
	); err != nil {
		t.Fatal(err)
	}
	if _, err := n.db.Append(
		storage.Record{Key: []byte("x"), Value: []byte("6"), Version: v + 2, Timestamp: old - int64(time.Hour)},
		oldClientRow(9, 1, kv.Result{Kind: kv.ResInt, Int: 6, Version: v + 2}, v+2, old-int64(time.Hour)),
	); err != nil {
		t.Fatal(err)
	}
	n.db.Close()

	for life := range 2 {
		n.open()
		if life == 0 {
			if got := n.s.Status().Clients; got != 3 {
				t.Fatalf("life %d: the table holds %d clients, want 3", life, got)
			}
		}
		legacy, current := 0, 0
		if err := n.db.Scan([]byte("\xff\xffkefir/"), []byte("\xff\xffkefir0"), 0, 0, func(k []byte, _ storage.Value) bool {
			switch {
			case bytes.HasPrefix(k, kv.LegacyClientRowPrefix):
				legacy++
			case bytes.HasPrefix(k, kv.ClientRowPrefix):
				current++
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if legacy != 0 || current != n.s.Status().Clients {
			t.Fatalf("life %d: %d legacy rows and %d current ones in the engine, table %d", life, legacy, current, n.s.Status().Clients)
		}
		// Retries are answered from the table: x stays 6, y stays b.
		if r := n.write(incr("x", 1), level.Sync, ReqID{Client: 7, Seq: 3}); r.Kind != kv.ResInt || r.Int != 5 || r.Version != v {
			t.Fatalf("life %d: retry of client 7's INCR answered %+v, want 5 at version %d", life, r, v)
		}
		getset := kv.Op{Kind: kv.KindGetSet, Key: []byte("y"), Value: []byte("b")}
		if r := n.write(getset, level.Sync, ReqID{Client: 8, Seq: 2}); r.Kind != kv.ResBulk || string(r.Bulk) != "a" {
			t.Fatalf("life %d: retry of client 8's GETSET answered %+v, want \"a\"", life, r)
		}
		if _, err := n.s.Write(ctx, incr("x", 1), level.Sync, ReqID{Client: 7, Seq: 2}); !errors.Is(err, ErrStaleRequest) {
			t.Fatalf("life %d: client 7's older request: %v, want ErrStaleRequest", life, err)
		}
		if got, _ := n.get("x"); got != "6" {
			t.Fatalf("life %d: x = %q: a retry executed again", life, got)
		}
		if life == 0 {
			n.s.Close()
			n.db.Close()
		}
	}
	// The idle time went on through the rewrite: client 9 (idle 110 minutes)
	// expires at the next sweep, clients 7 and 8 (idle 50) do not.
	n.s.sweepEvery = 1
	n.write(set("z", "1"), level.Sync, ReqID{})
	n.write(set("z", "2"), level.Sync, ReqID{})
	if got := n.s.Status().Clients; got != 2 {
		t.Fatalf("after the sweep the table holds %d clients, want 2 (client 9 idle > TTL)", got)
	}
}

// TestClientRowRewriteCutByACrash: a crash inside the rewrite's append can
// keep a client's new row without the old row's tombstone (the engine keeps a
// prefix of an append). The next open answers from the new row — which may
// be newer than the old one — and deletes the old row.
func TestClientRowRewriteCutByACrash(t *testing.T) {
	n := newNode(t, Options{})
	n.s.Close()
	v := n.db.LastVersion() + 1
	cur := kv.ClientEntry{Client: 7, ReqNum: 4, Result: kv.AppendResult(nil, kv.Result{Kind: kv.ResInt, Int: 9, Version: v + 1}, nil)}
	if _, err := n.db.Append(
		oldClientRow(7, 3, kv.Result{Kind: kv.ResInt, Int: 5, Version: v}, v, 1),
		storage.Record{Key: kv.ClientRowKey(7), Value: cur.RowValue(), Version: v + 1, Timestamp: 2},
	); err != nil {
		t.Fatal(err)
	}
	n.db.Close()
	n.open()
	if r := n.write(incr("x", 1), level.Sync, ReqID{Client: 7, Seq: 4}); r.Kind != kv.ResInt || r.Int != 9 {
		t.Fatalf("retry of request 4 answered %+v, want 9 from the current row", r)
	}
	if _, err := n.s.Write(ctx, incr("x", 1), level.Sync, ReqID{Client: 7, Seq: 3}); !errors.Is(err, ErrStaleRequest) {
		t.Fatalf("request 3: %v, want ErrStaleRequest", err)
	}
	if _, err := n.db.Get(oldClientRow(7, 0, kv.Result{}, 0, 0).Key); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the old row is still there: %v", err)
	}
	if got, _ := n.get("x"); got != "" {
		t.Fatalf("x = %q: a retry executed", got)
	}
}
