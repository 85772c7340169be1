package drivers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/ycsb"
	"github.com/kefirdb/kefir/internal/ycsb/kefirdb"
)

func workload(t *testing.T, name string) ycsb.Workload {
	t.Helper()
	w, err := ycsb.Standard(name)
	if err != nil {
		t.Fatal(err)
	}
	w.RecordCount, w.ValueSize = 500, 100
	return w
}

func startServer(t *testing.T) *RESPServer {
	t.Helper()
	s, err := StartRESPServer("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// loadAndRun drives a load and a short closed-loop run and fails on any error or miss.
func loadAndRun(t *testing.T, w ycsb.Workload, newDB ycsb.NewDB) *ycsb.Result {
	t.Helper()
	ctx := context.Background()
	res, err := ycsb.Load(ctx, w, newDB, 4)
	if err != nil || res.Errors != 0 || res.Ops != int64(w.RecordCount) {
		t.Fatalf("load: err %v, %d inserts, %d errors %v", err, res.Ops, res.Errors, res.FirstErrors)
	}
	res, err = ycsb.Run(ctx, w, newDB, ycsb.Config{Clients: 4, Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 || res.Ops == 0 {
		t.Fatalf("run: %d ops, %d errors %v", res.Ops, res.Errors, res.FirstErrors)
	}
	for _, op := range res.PerOp {
		if op.NotFound != 0 {
			t.Fatalf("%s: %d not found: the driver lost loaded records", op.Op, op.NotFound)
		}
	}
	return res
}

func TestRedisDriverOverTheInProcessServer(t *testing.T) {
	s := startServer(t)
	r, err := NewRedis(context.Background(), RedisConfig{Addr: s.Addr(), PoolSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	loadAndRun(t, workload(t, "a"), r.NewDB)
	db, _ := r.NewDB(0)
	ctx := context.Background()
	if err := db.Update(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := db.Read(ctx, "k"); err != nil || string(v) != "v1" {
		t.Fatalf("read back: %q, %v", v, err)
	}
	if _, err := db.Read(ctx, "missing"); !errors.Is(err, ycsb.ErrNotFound) {
		t.Fatalf("missing key: err %v, want ycsb.ErrNotFound", err)
	}
}

func TestKefirDriverSpeaksKefirCallToTheInProcessServer(t *testing.T) {
	s := startServer(t)
	k, err := kefirdb.New(context.Background(), kefirdb.Config{Addrs: []string{s.Addr()}, PoolSize: 2,
		Consistency: client.Linearizable, Durability: client.Sync})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	loadAndRun(t, workload(t, "b"), k.NewDB)
	db, _ := k.NewDB(0)
	if _, err := db.Read(context.Background(), "missing"); !errors.Is(err, ycsb.ErrNotFound) {
		t.Fatalf("missing key: err %v, want ycsb.ErrNotFound", err)
	}
}

func TestServerRejectsMalformedInput(t *testing.T) {
	s := startServer(t)
	r, err := NewRedis(context.Background(), RedisConfig{Addr: s.Addr(), PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.c.Do(context.Background(), "NOSUCH").Err(); err == nil {
		t.Fatal("unknown command accepted")
	}
	if err := r.c.Do(context.Background(), "GET").Err(); err == nil {
		t.Fatal("GET without a key accepted")
	}
}

// The trivial server parses each command into one buffer it reuses for the next: a
// stored value must not alias it, and a pipelined batch is answered in order.
func TestRESPServerPipelinedBatchKeepsStoredValues(t *testing.T) {
	s := startServer(t)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	batch := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nfirst\r\n" +
		"*3\r\n$3\r\nSET\r\n$1\r\ne\r\n$0\r\n\r\n" +
		"*3\r\n$3\r\nSET\r\n$1\r\nj\r\n$6\r\nsecond\r\n" +
		"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*2\r\n$3\r\nGET\r\n$1\r\ne\r\n*2\r\n$3\r\nGET\r\n$7\r\nmissing\r\n"
	if _, err := c.Write([]byte(batch)); err != nil {
		t.Fatal(err)
	}
	want := "+OK\r\n+OK\r\n+OK\r\n$5\r\nfirst\r\n$0\r\n\r\n$-1\r\n"
	got := make([]byte, len(want))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Fatalf("replies %q (%v), want %q", got, err, want)
	}
}

// The server parses commands in place in its input buffer: a command split across
// reads (here: written a few bytes at a time), one larger than the buffer, and large
// values sent from where they are stored (writev) must all come back intact and in order.
func TestRESPServerSplitAndOversizedCommands(t *testing.T) {
	s := startServer(t)
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := make([]byte, 200<<10) // over the 64 KiB input buffer
	for i := range big {
		big[i] = byte('a' + i%26)
	}
	mid := big[:1000] // a value sent by reference
	var batch []byte
	batch = append(batch, "*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$"+strconv.Itoa(len(big))+"\r\n"...)
	batch = append(append(batch, big...), "\r\n"...)
	batch = append(batch, "*3\r\n$3\r\nset\r\n$3\r\nmid\r\n$1000\r\n"...)
	batch = append(append(batch, mid...), "\r\n"...)
	batch = append(batch, "*2\r\n$3\r\nGET\r\n$3\r\nmid\r\n*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n*1\r\n$4\r\nPING\r\n"...)
	go func() {
		// Small pieces first (every header boundary split), then the rest at once.
		for i := 0; i < 64; i += 3 {
			c.Write(batch[i : i+3])
			time.Sleep(time.Millisecond)
		}
		c.Write(batch[66:])
	}()
	var want []byte
	want = append(want, "+OK\r\n+OK\r\n$1000\r\n"...)
	want = append(append(want, mid...), "\r\n$"+strconv.Itoa(len(big))+"\r\n"...)
	want = append(append(want, big...), "\r\n+PONG\r\n"...)
	got := make([]byte, len(want))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("replies differ (%v): got %d bytes starting %q, want %d", err, len(got), got[:min(40, len(got))], len(want))
	}
}
