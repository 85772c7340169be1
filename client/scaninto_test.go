package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// pairsReply is a scan reply of n pairs: key<prefix><i>, value of size bytes of a
// letter that depends on prefix and i.
func pairsReply(prefix string, n, size int) resp.Value {
	v := resp.Value{Kind: resp.Array}
	for i := 0; i < n; i++ {
		v.Elems = append(v.Elems, resp.Value{Kind: resp.Bulk, Str: []byte(fmt.Sprintf("%s%06d", prefix, i))},
			resp.Value{Kind: resp.Bulk, Str: bytes.Repeat([]byte{pairLetter(prefix, i)}, size)})
	}
	return v
}

func pairLetter(prefix string, i int) byte { return byte('a' + (int(prefix[0])+i)%26) }

func checkPairs(t *testing.T, what string, kvs []KV, prefix string, n, size int) {
	t.Helper()
	if len(kvs) != n {
		t.Fatalf("%s: %d pairs, want %d", what, len(kvs), n)
	}
	for i, kv := range kvs {
		if want := fmt.Sprintf("%s%06d", prefix, i); kv.Key != want {
			t.Fatalf("%s: pair %d: key %q, want %q", what, i, kv.Key, want)
		}
		if want := bytes.Repeat([]byte{pairLetter(prefix, i)}, size); !bytes.Equal(kv.Value, want) {
			t.Fatalf("%s: pair %d: value %.10q… (%d B), want %.10q… (%d B)", what, i, kv.Value, len(kv.Value), want, len(want))
		}
		if cap(kv.Value) != len(kv.Value) {
			t.Fatalf("%s: pair %d: value of capacity %d > its length %d: an append would overwrite the next", what, i, cap(kv.Value), len(kv.Value))
		}
	}
}

// TestDecodePairsInto: a reply decoded into a ScanBuffer is the same as a fresh
// decode, whether the buffer is empty, big enough or too small (grown before the
// copy, so no value is left in the old array); nulls stay nil and empty values
// non-nil; and once the buffer fits, a reply costs one allocation (the keys' string)
// where a fresh decode costs three.
func TestDecodePairsInto(t *testing.T) {
	var buf ScanBuffer
	for _, c := range []struct {
		prefix  string
		n, size int
	}{{"a", 50, 1000}, {"b", 10, 1000}, {"c", 100, 3000}, {"d", 3, 10}, {"e", 0, 0}, {"f", 50, 1000}} {
		v := pairsReply(c.prefix, c.n, c.size)
		kvs, err := decodePairs(v, &buf)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range v.Elems {
			for j := range e.Str {
				e.Str[j] = 'X' // the reader reuses its buffer
			}
		}
		checkPairs(t, c.prefix, kvs, c.prefix, c.n, c.size)
	}

	// Nulls and empty values, into a zero buffer (no array yet) and a used one.
	for _, b := range []*ScanBuffer{{}, &buf} {
		v := resp.Value{Kind: resp.Array, Elems: []resp.Value{
			{Kind: resp.Bulk, Str: []byte("k1")}, {Kind: resp.Null},
			{Kind: resp.Bulk, Str: []byte("k2")}, {Kind: resp.Bulk, Str: []byte{}},
			{Kind: resp.Bulk, Str: []byte("k3")}, {Kind: resp.Null},
		}}
		kvs, err := decodePairs(v, b)
		if err != nil || len(kvs) != 3 {
			t.Fatalf("nulls: %v, %v", kvs, err)
		}
		if kvs[0].Value != nil || kvs[2].Value != nil {
			t.Fatalf("a null value decoded as %q, %q", kvs[0].Value, kvs[2].Value)
		}
		if kvs[1].Value == nil || len(kvs[1].Value) != 0 {
			t.Fatalf("an empty value decoded as %q (nil %v)", kvs[1].Value, kvs[1].Value == nil)
		}
	}

	v := pairsReply("g", 50, 1000)
	if got := testing.AllocsPerRun(20, func() { _, _ = decodePairs(v, &buf) }); got > 1 {
		t.Fatalf("a 50-pair reply into a buffer that fits: %.0f allocations, want 1 (the keys)", got)
	}
	if _, err := decodePairs(resp.Value{Kind: resp.Array, Elems: v.Elems[:3]}, &buf); err == nil {
		t.Fatal("an odd reply decoded without an error")
	}
}

// TestScanIntoReusesBufferAcrossCalls: a loop of ScanInto calls over one buffer
// returns each range's own pairs (the buffer reused, grown when a range is bigger).
func TestScanIntoReusesBufferAcrossCalls(t *testing.T) {
	s := newTestServer(t)
	for i := 0; i < 200; i++ {
		s.set(fmt.Sprintf("a%06d", i), strings.Repeat(string(rune(pairLetter("a", i))), 100+i%7*300))
	}
	c := dialTest(t, s)
	ctx := testCtx(t)
	var buf ScanBuffer
	for round, r := range [][2]int{{0, 50}, {10, 20}, {100, 200}, {5, 6}, {0, 200}, {150, 160}} {
		kvs, err := c.ScanInto(ctx, &buf, fmt.Sprintf("a%06d", r[0]), fmt.Sprintf("a%06d", r[1]), 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) != r[1]-r[0] {
			t.Fatalf("round %d: %d pairs, want %d", round, len(kvs), r[1]-r[0])
		}
		for j, kv := range kvs {
			i := r[0] + j
			if want := fmt.Sprintf("a%06d", i); kv.Key != want {
				t.Fatalf("round %d: key %q, want %q", round, kv.Key, want)
			}
			if want := strings.Repeat(string(rune(pairLetter("a", i))), 100+i%7*300); string(kv.Value) != want {
				t.Fatalf("round %d: %s = %.10q… (%d B), want %.10q… (%d B)", round, kv.Key, kv.Value, len(kv.Value), want, len(want))
			}
		}
	}
}

// TestScanIntoAbandonedCallLeavesBufferAlone: a ScanInto whose caller gave up
// (timeout) while its scan was in flight must not decode the late reply into the
// buffer the caller has since reused: here the buffer holds another client's scan
// when the abandoned reply arrives, and that scan's values must stay as they were.
func TestScanIntoAbandonedCallLeavesBufferAlone(t *testing.T) {
	s := newTestServer(t)
	for i := 0; i < 20; i++ {
		s.set(fmt.Sprintf("a%06d", i), strings.Repeat("a", 1000))
		s.set(fmt.Sprintf("slow%06d", i), strings.Repeat("S", 1000))
	}
	release := make(chan struct{})
	s.setHook(func(h hookInfo) action {
		if h.argv[0] == "KEFIR.SCAN" && strings.HasPrefix(h.argv[1], "slow") {
			<-release
		}
		return actReply
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	c1 := dialTest(t, s, WithPoolSize(1))
	c2 := dialTest(t, s, WithPoolSize(1))
	var buf ScanBuffer
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c1.ScanInto(short, &buf, "slow", "slox", 0); !errors.Is(err, ErrTimeout) {
		t.Fatalf("slow scan: err = %v, want ErrTimeout", err)
	}
	ctx := testCtx(t)
	kvs, err := c2.ScanInto(ctx, &buf, "a", "b", 0)
	if err != nil || len(kvs) != 20 {
		t.Fatalf("scan: %d pairs, %v", len(kvs), err)
	}
	close(release)
	// c1's connection answers in order: once this returns, the late reply was read.
	if err := c1.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for i, kv := range kvs {
		if string(kv.Value) != strings.Repeat("a", 1000) {
			t.Fatalf("pair %d (%s): value now %.10q…: the abandoned scan's reply was decoded into the reused buffer", i, kv.Key, kv.Value)
		}
	}
}
