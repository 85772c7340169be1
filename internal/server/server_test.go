package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"github.com/kefirdb/kefir/internal/command"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/vfs"
)

func startServer(t testing.TB, mod func(*Config)) *Server {
	t.Helper()
	cfg := Config{
		ClientAddr: "127.0.0.1:0",
		HTTPAddr:   "127.0.0.1:0",
		DataDir:    t.TempDir(),
		Logger:     slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// client is a minimal RESP client for tests: it sends commands and reads replies
// as their printed form (resp.Value.String()).
type client struct {
	t  testing.TB
	nc net.Conn
	rd *resp.Reader
}

func dial(t testing.TB, s *Server) *client {
	t.Helper()
	nc, err := net.Dial("tcp", s.ClientAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &client{t: t, nc: nc, rd: resp.NewReader(nc, 0)}
}

func (c *client) send(args ...string) {
	c.t.Helper()
	if _, err := c.nc.Write(appendCmd(nil, args...)); err != nil {
		c.t.Fatal(err)
	}
}

// appendCmd appends args as one RESP command to buf: several appended and
// written at once arrive as one pipeline.
func appendCmd(buf []byte, args ...string) []byte {
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	return resp.AppendCommand(buf, bs...)
}

func (c *client) reply() string {
	c.t.Helper()
	v, err := c.rd.ReadValue()
	if err != nil {
		c.t.Fatalf("read reply: %v", err)
	}
	return show(v)
}

// show prints a reply the way the test scripts spell it (close to redis-cli).
func show(v resp.Value) string {
	switch v.Kind {
	case resp.Simple, resp.Error:
		return string(v.Str)
	case resp.Int:
		return fmt.Sprintf("(integer) %d", v.Int)
	case resp.Bulk:
		return fmt.Sprintf("%q", v.Str)
	case resp.Null:
		return "(nil)"
	case resp.Array, resp.Map, resp.Set:
		var parts []string
		for _, e := range v.Elems {
			parts = append(parts, show(e))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return v.String()
}

func (c *client) do(args ...string) string {
	c.t.Helper()
	c.send(args...)
	return c.reply()
}

// expect runs a script of "command args => reply" lines.
func (c *client) expect(script string) {
	c.t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(script), "\n") {
		cmd, want, ok := strings.Cut(line, "=>")
		if !ok {
			c.t.Fatalf("bad script line %q", line)
		}
		got := c.do(strings.Fields(cmd)...)
		want = strings.TrimSpace(want)
		if strings.HasSuffix(want, "*") {
			if !strings.HasPrefix(got, strings.TrimSuffix(want, "*")) {
				c.t.Errorf("%s => %s, want prefix %s", strings.TrimSpace(cmd), got, want)
			}
		} else if got != want {
			c.t.Errorf("%s => %s, want %s", strings.TrimSpace(cmd), got, want)
		}
	}
}

func TestStringCommands(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	// The printed forms are resp.Value.String()'s.
	probe := c.do("SET", "probe", "1")
	if probe != "OK" {
		t.Fatalf("SET replied %s", probe)
	}
	c.expect(`
GET missing => (nil)
SET k v => OK
GET k => "v"
SET k w NX => (nil)
SET k w XX => OK
SET n w XX => (nil)
SET k x GET => "w"
SET k y NX GET => "x"
GET k => "x"
SETNX k z => (integer) 0
SETNX k2 z => (integer) 1
GETSET k2 q => "z"
APPEND k2 rs => (integer) 3
STRLEN k2 => (integer) 3
INCR c => (integer) 1
INCRBY c 10 => (integer) 11
DECR c => (integer) 10
DECRBY c 3 => (integer) 7
INCR k => ERR value is not an integer or out of range
DECRBY k 2 => ERR value is not an integer or out of range
GET k => "x"
INCRBY c abc => ERR value is not an integer*
EXISTS k k2 nope k => (integer) 3
DEL k nope k2 => (integer) 2
MSET a 1 b 2 => OK
MGET a nope b => *
KEFIR.CAS a 1 one => (integer) 1
KEFIR.CAS a 1 uno => (integer) 0
GET a => "one"
SET t v EX 10 => ERR TTLs*
SET t v NX XX => ERR syntax*
SET t v BOGUS => ERR syntax*
EXPIRE a 10 => ERR unsupported command 'expire'*
PING => PONG
PING hi => "hi"
ECHO hello => "hello"
SELECT 0 => OK
SELECT 1 => ERR*
GET => ERR wrong number of arguments for 'get' command
NOSUCH a b => ERR unknown command*
CLIENT SETNAME me => OK
CLIENT GETNAME => "me"
COMMAND COUNT => (integer)*
`)
	if got := c.do("MGET", "a", "nope", "b"); got != `["one", (nil), "2"]` {
		t.Errorf("MGET = %s", got)
	}
}

func TestScan(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.do("MSET", "b", "2", "a", "1", "d", "4", "c", "3")
	got := c.do("KEFIR.SCAN", "a", "d")
	if want := `["a", "1", "b", "2", "c", "3"]`; got != want {
		t.Errorf("scan = %s, want %s (ordered, end exclusive)", got, want)
	}
	if got := c.do("KEFIR.SCAN", "a", "", "LIMIT", "1"); strings.Contains(got, `"b"`) || !strings.Contains(got, `"a"`) {
		t.Errorf("scan limit 1 = %s", got)
	}
	if got := c.do("KEFIR.SCAN", "", "", "LIMIT", "0"); !strings.HasPrefix(got, "ERR") {
		t.Errorf("LIMIT 0 = %s", got)
	}
}

func TestPipelinedWritesShareOneFsyncAndReplyInOrder(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	syncsBefore := s.db.Stats().Syncs
	var buf []byte
	const n = 200
	for i := range n {
		buf = resp.AppendCommand(buf, []byte("INCR"), []byte("ctr"))
		if i == n/2 {
			buf = resp.AppendCommand(buf, []byte("GET"), []byte("ctr"))
		}
	}
	if _, err := c.nc.Write(buf); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if got := c.reply(); got != fmt.Sprintf("(integer) %d", i+1) {
			t.Fatalf("reply %d = %s", i, got)
		}
		if i == n/2 {
			if got := c.reply(); got != fmt.Sprintf(`"%d"`, i+1) {
				t.Fatalf("GET in the middle = %s", got)
			}
		}
	}
	// All arrived in one segment on loopback, so a handful of fsyncs at most — one
	// per batch, not one per write.
	if d := s.db.Stats().Syncs - syncsBefore; d > 10 {
		t.Errorf("%d pipelined sync writes took %d fsyncs", n, d)
	}
}

func TestProtocolErrorClosesOnlyThatConnection(t *testing.T) {
	s := startServer(t, nil)
	good := dial(t, s)
	good.expect("SET a 1 => OK")
	for _, garbage := range []string{"*2\r\n$3\r\nGET\r\n$-5\r\n", "*1\r\n$abc\r\n", "*1\r\n$3\r\nGETXX\r\n", "*abc\r\n", "\"unbalanced\r\n", "*1\r\n+OK\r\n"} {
		bad := dial(t, s)
		if _, err := bad.nc.Write([]byte(garbage)); err != nil {
			t.Fatal(err)
		}
		all, _ := io.ReadAll(bad.nc)
		if !bytes.HasPrefix(all, []byte("-ERR Protocol error")) {
			t.Errorf("garbage %q got %q", garbage, all)
		}
	}
	good.expect("GET a => \"1\"")
}

// A value over the bulk limit is answered with an error the client can read,
// in its place among the pipeline's replies, and the connection and the
// writes pipelined behind it carry on (issue 25 item 10). Before, the limit
// was a protocol error: the connection closed and the writes behind the value
// were lost.
func TestOversizedBulkIsRefused(t *testing.T) {
	bothModels(t, func(t *testing.T) {
		s := startServer(t, func(c *Config) { c.MaxBulk = 1024 })
		c := dial(t, s)
		var buf []byte
		buf = appendCmd(buf, "SET", "a", "1")
		buf = appendCmd(buf, "SET", "k", strings.Repeat("x", 200000))
		buf = appendCmd(buf, "SET", "b", "2")
		buf = appendCmd(buf, "MSET", "c", "3", "k", strings.Repeat("x", 2000))
		buf = appendCmd(buf, "INCR", "n")
		if _, err := c.nc.Write(buf); err != nil {
			t.Fatal(err)
		}
		for i, want := range []string{"OK", "ERR value of 200000 bytes exceeds the limit of 1024 bytes (--max-bulk); the command was not run",
			"OK", "ERR value of 2000 bytes exceeds the limit of 1024 bytes*", "(integer) 1"} {
			got := c.reply()
			if got != want && !(strings.HasSuffix(want, "*") && strings.HasPrefix(got, strings.TrimSuffix(want, "*"))) {
				t.Errorf("reply %d = %q, want %q", i, got, want)
			}
		}
		c.expect(`
			MGET a b c k => ["1", "2", (nil), (nil)]
			SET k ` + strings.Repeat("x", 1000) + ` => OK`)
	})
}

// One command's total size is bounded, not only each argument: a client must not
// make the node buffer a million arguments that are each small enough. Such a
// command is discarded and refused too; the connection carries on.
func TestOversizedRequestIsRefused(t *testing.T) {
	s := startServer(t, func(c *Config) { c.MaxBulk = 1024; c.MaxRequest = 8 << 10 })
	c := dial(t, s)
	args := []string{"MSET"}
	for i := range 20 {
		args = append(args, fmt.Sprintf("k%d", i), strings.Repeat("x", 1000))
	}
	if got := c.do(args...); got != "ERR command larger than the limit of 8192 bytes (--max-request); it was not run" {
		t.Fatalf("got %q", got)
	}
	c.expect("MSET a " + strings.Repeat("x", 1000) + " b " + strings.Repeat("y", 1000) + " => OK")
	c.expect("STRLEN b => (integer) 1000")
	c.expect("EXISTS k0 => (integer) 0")
}

func TestAuthentication(t *testing.T) {
	s := startServer(t, func(c *Config) { c.Password = "s3cret" })
	c := dial(t, s)
	c.expect(`
GET a => NOAUTH*
PING => NOAUTH*
AUTH wrong => WRONGPASS*
AUTH s3cret => OK
SET a 1 => OK
`)
	c2 := dial(t, s)
	if got := c2.do("HELLO", "3", "AUTH", "default", "s3cret"); !strings.Contains(got, "proto") {
		t.Fatalf("HELLO AUTH = %s", got)
	}
	c2.expect(`GET a => "1"`)
}

func TestWrongPasswordsAreRateLimited(t *testing.T) {
	s := startServer(t, func(c *Config) { c.Password = "s3cret" })
	c := dial(t, s)
	limited := false
	for range 10 {
		if got := c.do("AUTH", "guess"); strings.Contains(got, "too many") {
			limited = true
			break
		}
	}
	if !limited {
		t.Fatal("10 wrong passwords in a row were never rate-limited")
	}
	// Even the right password is refused while limited.
	if got := c.do("AUTH", "s3cret"); !strings.Contains(got, "too many") {
		t.Fatalf("right password while limited = %s", got)
	}
}

func TestHelloSwitchesToRESP3(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.send("HELLO", "3")
	v, err := c.rd.ReadValue()
	if err != nil || v.Kind != resp.Map {
		t.Fatalf("HELLO 3 = %v %v", v, err)
	}
	c.send("GET", "missing")
	v, err = c.rd.ReadValue()
	if err != nil || v.Kind != resp.Null {
		t.Fatalf("RESP3 null = %v (%v)", v, err)
	}
	if got := c.do("HELLO", "4"); !strings.HasPrefix(got, "NOPROTO") {
		t.Fatalf("HELLO 4 = %s", got)
	}
}

func TestLevelsAndSessions(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.expect(`
KEFIR.CONSISTENCY => "linearizable"
KEFIR.CONSISTENCY bounded(3) => OK
KEFIR.CONSISTENCY => "bounded(3)"
KEFIR.CONSISTENCY nonsense => ERR*
KEFIR.DURABILITY => "sync"
KEFIR.DURABILITY cad => OK
KEFIR.DURABILITY fast => ERR*
KEFIR.SESSION => ""
KEFIR.SESSION garbage => ERR invalid session token
KEFIR.SESSION v1.0.0 => OK
`)
	c.do("SET", "k", "v")
	tok := c.do("KEFIR.SESSION")
	if !strings.HasPrefix(tok, `"v1.`) {
		t.Fatalf("session after write = %s", tok)
	}
	got := c.do("KEFIR.CALL", "SESSION", "", "DURABILITY", "sync", "CMD", "SET", "k", "w")
	if !strings.Contains(got, `"v1.`) || !strings.Contains(got, "OK") {
		t.Fatalf("KEFIR.CALL SESSION = %s", got)
	}
	got = c.do("KEFIR.CALL", "SESSION", "v1.999999.0", "CMD", "GET", "k")
	if !strings.Contains(got, "UNAVAILABLE") || !strings.Contains(got, "v1.999999.0") {
		t.Fatalf("session ahead = %s", got)
	}
	c.expect(`
KEFIR.CALL CONSISTENCY eventual CMD GET k => "w"
KEFIR.CALL CMD KEFIR.CALL CMD GET k => ERR*
KEFIR.CALL DURABILITY sync DURABILITY sync CMD GET k => ERR*
KEFIR.CALL REQID 0 1 CMD GET k => ERR*
KEFIR.CALL => ERR*
KEFIR.CALL REQID 5 1 CMD INCR ctr => (integer) 1
KEFIR.CALL REQID 5 1 CMD INCR ctr => (integer) 1
KEFIR.CALL REQID 5 2 CMD INCR ctr => (integer) 2
KEFIR.CALL REQID 5 1 CMD INCR ctr => ERR stale request
`)
}

func TestMaxClients(t *testing.T) {
	s := startServer(t, func(c *Config) { c.MaxClients = 2 })
	a, b := dial(t, s), dial(t, s)
	a.expect("PING => PONG")
	b.expect("PING => PONG")
	c := dial(t, s)
	all, _ := io.ReadAll(c.nc)
	if !strings.Contains(string(all), "max number of clients") {
		t.Fatalf("third client got %q", all)
	}
}

func TestIdleConnectionsAreClosed(t *testing.T) {
	s := startServer(t, func(c *Config) { c.IdleTimeout = 100 * time.Millisecond })
	c := dial(t, s)
	c.expect("PING => PONG")
	start := time.Now()
	if _, err := io.ReadAll(c.nc); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("idle close took %v", d)
	}
}

func TestSecurityDefaults(t *testing.T) {
	base := Config{DataDir: t.TempDir(), ClientAddr: "127.0.0.1:0"}
	if err := base.Validate(); err != nil {
		t.Fatalf("loopback without password refused: %v", err)
	}
	for _, c := range []Config{
		{DataDir: "d", ClientAddr: "0.0.0.0:6380"},
		{DataDir: "d", ClientAddr: ":6380"},
		{DataDir: "d", ClientAddr: "10.1.2.3:6380"},
		{DataDir: "d", ClientAddr: "127.0.0.1:1", PeerAddr: "0.0.0.0:7000", Password: "p"},
		{DataDir: "d", ClientAddr: "127.0.0.1:1", HTTPAddr: "[::]:8080"},
	} {
		if err := c.Validate(); !errors.Is(err, ErrInsecure) {
			t.Errorf("%+v: err = %v, want ErrInsecure", c, err)
		}
	}
	ok := Config{DataDir: "d", ClientAddr: "0.0.0.0:6380", Password: "p", PeerAddr: "0.0.0.0:7000", ClusterSecret: "x"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("authenticated exposure refused: %v", err)
	}
}

func TestPeerHandshake(t *testing.T) {
	s := startServer(t, func(c *Config) { c.PeerAddr = "127.0.0.1:0"; c.ClusterSecret = "cluster" })
	nc, err := PeerDial(s.PeerAddr().String(), "n2", "cluster", 5*time.Second)
	if err != nil {
		t.Fatalf("right secret refused: %v", err)
	}
	nc.Close()
	if _, err := PeerDial(s.PeerAddr().String(), "n2", "wrong", 5*time.Second); !errors.Is(err, ErrPeerAuth) {
		t.Fatalf("wrong secret: err = %v, want ErrPeerAuth", err)
	}
	// A stray process speaking something else gets nothing but a refusal.
	raw, err := net.Dial("tcp", s.PeerAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	br := bufio.NewReader(raw)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(raw, "*1\r\n$4\r\nPING\r\n")
	line, _ := br.ReadString('\n')
	if !strings.HasPrefix(line, "ERR") {
		t.Fatalf("stray peer got %q", line)
	}
}

func TestHTTPAdmin(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.do("SET", "a", "1")
	c.do("GET", "a")
	base := "http://" + s.HTTPAddr().String()
	for path, want := range map[string]string{
		"/metrics": `kefir_commands_total{cmd="set"} 1`,
		"/status":  `"node_id": "n1"`,
		"/healthz": "ok",
		"/":        "<h1>Kefir node n1</h1>",
	} {
		r, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d, want %q in\n%.2000s", path, r.StatusCode, want, body)
		}
	}
	r, _ := http.Get(base + "/metrics")
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, m := range []string{"kefir_command_duration_seconds_bucket", "kefir_fsync_wait_seconds", "kefir_client_connections 1", "kefir_storage_log_bytes", "kefir_storage_disk_bytes", "kefir_storage_keys"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("metrics lack %s", m)
		}
	}
}

func TestInfo(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	info := c.do("INFO")
	for _, sec := range []string{"# Server", "# Clients", "# Stats", "# Keyspace", "# Kefir"} {
		if !strings.Contains(info, sec) {
			t.Errorf("INFO lacks %s", sec)
		}
	}
	if got := c.do("INFO", "kefir"); strings.Contains(got, "# Server") || !strings.Contains(got, "default_durability:sync") {
		t.Errorf("INFO kefir = %s", got)
	}
}

func TestGracefulShutdownFinishesInFlightAndPersists(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, func(c *Config) { c.DataDir = dir; c.Durability = level.Async })
	c := dial(t, s)
	c.expect("SET a 1 => OK")
	if err := s.Close(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := c.rd.ReadValue(); err == nil {
		t.Fatal("connection still open after shutdown")
	}
	s2 := startServer(t, func(c *Config) { c.DataDir = dir })
	dial(t, s2).expect(`GET a => "1"`)
}

func TestQuit(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s)
	c.expect("QUIT => OK")
	if _, err := c.rd.ReadValue(); err == nil {
		t.Fatal("connection open after QUIT")
	}
}

func TestHTTPAdminNeedsThePasswordWhenOneIsSet(t *testing.T) {
	s := startServer(t, func(c *Config) { c.Password = "pw" })
	base := "http://" + s.HTTPAddr().String()
	get := func(path, pwd string) int {
		req, _ := http.NewRequest("GET", base+path, nil)
		if pwd != "" {
			req.SetBasicAuth("admin", pwd)
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	if c := get("/status", ""); c != http.StatusUnauthorized {
		t.Errorf("/status without password: %d", c)
	}
	if c := get("/metrics", "wrong"); c != http.StatusUnauthorized {
		t.Errorf("/metrics with wrong password: %d", c)
	}
	if c := get("/status", "pw"); c != http.StatusOK {
		t.Errorf("/status with password: %d", c)
	}
	if c := get("/healthz", ""); c != http.StatusOK {
		t.Errorf("/healthz is for load balancers and needs no password: %d", c)
	}
}

// When an fsync fails, no reply claims the batch's sync writes succeeded: the
// connection closes without them (the client sees an unknown outcome), later
// writes answer -UNAVAILABLE, reads keep working and /healthz reports the failure.
func TestFailedFsyncNeverAcknowledges(t *testing.T) {
	fs := vfs.NewMem()
	s := startServer(t, func(c *Config) { c.FS = fs; c.DataDir = "/data" })
	c := dial(t, s)
	c.expect("SET a 1 => OK")
	fs.FailSyncs(1)
	c.send("SET", "b", "2")
	if v, err := c.rd.ReadValue(); err == nil {
		t.Fatalf("a sync write whose fsync failed was answered: %s", show(v))
	}
	c2 := dial(t, s)
	c2.expect(`
GET a => "1"
SET c 3 => UNAVAILABLE*
`)
	r, err := http.Get("http://" + s.HTTPAddr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/healthz after failed fsync = %d", r.StatusCode)
	}
}

// The test above must be able to fail: with async durability nothing waits for
// the fsync, so the reply is sent.
func TestAsyncWritesDoNotWaitForFsync(t *testing.T) {
	fs := vfs.NewMem()
	s := startServer(t, func(c *Config) { c.FS = fs; c.DataDir = "/data"; c.Durability = level.Async; c.SyncInterval = 0 })
	c := dial(t, s)
	fs.FailSyncs(1)
	c.expect("SET b 2 => OK")
}

func TestStartFailureStillClosesCleanly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s, err := New(Config{ClientAddr: ln.Addr().String(), DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err == nil {
		t.Fatal("Start on a busy port succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close after failed Start: %v", err)
	}
}

// GET takes the single node's ReadKey path: the spec the table returns for
// any spelling is the one the fast path compares against, and a single
// node's server has the path (and no deferred reads).
func TestGetTakesTheKeyReaderPath(t *testing.T) {
	for _, name := range []string{"GET", "get", "Get"} {
		if spec, ok := command.Lookup([]byte(name)); !ok || spec != getSpec {
			t.Fatalf("Lookup(%q) = %p, %v; the GET fast path compares against %p", name, spec, ok, getSpec)
		}
	}
	if s := startServer(t, nil); s.keys == nil || s.deferred != nil {
		t.Fatalf("single node: keys %v, deferred %v; want ReadKey and no deferred reads", s.keys, s.deferred)
	}
}
