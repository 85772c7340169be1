package script

import (
	"errors"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
)

// cmds splits "SET k v; INCR k" into argument vectors.
func cmds(s string) [][][]byte {
	var out [][][]byte
	for _, c := range strings.Split(s, ";") {
		var argv [][]byte
		for _, f := range strings.Fields(c) {
			argv = append(argv, []byte(f))
		}
		if len(argv) > 0 {
			out = append(out, argv)
		}
	}
	return out
}

// watch is what a WATCH of key sees in s at now.
func (s *store) watch(t *testing.T, now int64, keys ...string) []kv.Watch {
	t.Helper()
	op := kv.Op{Kind: kv.KindWatch, Now: now}
	for _, k := range keys {
		op.Keys = append(op.Keys, []byte(k))
	}
	res, err := kv.Read(s.get, s.scan, &op, 0)
	if err != nil {
		t.Fatal(err)
	}
	ws := make([]kv.Watch, len(keys))
	for i, k := range keys {
		ws[i] = kv.Watch{Key: []byte(k), Seen: res.Array[i]}
	}
	return ws
}

// exec applies one EXEC op at the next version and returns its reply and
// records.
func (s *store) exec(t *testing.T, now int64, txt string, ws []kv.Watch) (string, []emitted) {
	t.Helper()
	op := kv.Op{Kind: kv.KindExec, Value: kv.EncodeTx(nil, cmds(txt), ws), Now: now}
	return s.apply(t, &op, txt)
}

// A transaction's commands run in order over their own writes; their
// records land together at the op's one version, one per key; runtime and
// syntax errors are their command's element and the others apply (Redis).
func TestExecRunsCommandsAsOneOp(t *testing.T) {
	s := newStore()
	s.exec(t, 1000, "SET h x", nil) // a string, for WRONGTYPE below
	got, out := s.exec(t, 1000, "SET k 5; INCR k; INCRBY k 10; GET k; HSET h f v; INCR h; SET k v BADOPT; SETNX k 1; SETNX n 1; MGET k n zz; DEL h; EXISTS h", nil)
	want := "*12\r\n+OK\r\n:6\r\n:16\r\n$2\r\n16\r\n" +
		"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n" +
		"-ERR value is not an integer or out of range\r\n" +
		"-ERR syntax error\r\n:0\r\n:1\r\n*3\r\n$2\r\n16\r\n$1\r\n1\r\n$-1\r\n:1\r\n:0\r\n"
	if got != want {
		t.Fatalf("reply\n got %q\nwant %q", got, want)
	}
	// k written four times, n once, h deleted: three records, in first-write order.
	if len(out) != 3 || out[0].key != "k" || out[0].value != "16" || out[1].key != "n" || out[2].key != "h" || !out[2].tomb {
		t.Fatalf("records %+v", out)
	}
	for _, k := range []string{"k", "n"} {
		if s.m[k].ver != s.ver {
			t.Fatalf("%s at version %d, op at %d", k, s.m[k].ver, s.ver)
		}
	}
	if got, _ := s.exec(t, 1000, "", nil); got != "*0\r\n" {
		t.Fatalf("empty transaction: %q", got)
	}
}

// WATCH's observation is compared at apply with the state as of op−1: a
// write of a watched key (even of the same value), its deletion, its
// creation or its expiry makes EXEC apply nothing and answer a null array;
// writes of other keys, and a watched key that stayed absent, do not.
func TestWatchConflicts(t *testing.T) {
	for _, c := range []struct {
		name      string
		setup     string // before WATCH
		between   string // after WATCH, before EXEC ("" none)
		now       int64  // EXEC's clock (WATCH's is 1000, or now if watchLate)
		conflict  bool
		watchLate bool
	}{
		{"untouched", "SET w 1", "", 1000, false, false},
		{"other key written", "SET w 1", "SET o 2", 1000, false, false},
		{"rewritten same value", "SET w 1", "SET w 1", 1000, true, false},
		{"incremented", "SET w 1", "INCR w", 1000, true, false},
		{"deleted", "SET w 1", "DEL w", 1000, true, false},
		{"created", "", "SET w 1", 1000, true, false},
		{"absent stays absent", "", "SET o 1", 1000, false, false},
		{"expired since watch", "SET w 1 PX 500", "", 2000, true, false},
		{"expiry set", "SET w 1", "PEXPIRE w 100000", 1000, true, false},
		{"expired before watch", "SET w 1 PX 10", "", 2000, false, true},
		{"hash field written", "HSET w f 1", "HSET w g 2", 1000, true, false},
		{"hash field rewritten", "HSET w f 1", "HSET w f 2", 1000, true, false},
		{"other hash written", "HSET w f 1", "HSET o f 2", 1000, false, false},
		{"no-op write", "SET w 1", "SET w 2 NX", 1000, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStore()
			if c.setup != "" {
				s.exec(t, 1000, c.setup, nil)
			}
			at := int64(1000)
			if c.watchLate {
				at = c.now
			}
			ws := s.watch(t, at, "w")
			if c.between != "" {
				s.exec(t, 1000, c.between, nil)
			}
			before := len(s.m)
			got, out := s.exec(t, c.now, "SET r done; INCR cnt", ws)
			if c.conflict {
				if got != "*-1\r\n" || len(out) != 0 || len(s.m) != before {
					t.Fatalf("a conflict applied: %q %+v", got, out)
				}
				return
			}
			if got != "*2\r\n+OK\r\n:1\r\n" || len(out) != 2 {
				t.Fatalf("no conflict, but %q %+v", got, out)
			}
		})
	}
}

func TestTxCodec(t *testing.T) {
	cs := cmds("SET k v; INCR k; MGET a b c")
	// Observations as Observe makes them: live at version 7, then absent;
	// each with its origin (epoch 0, no slot table).
	ws := []kv.Watch{{Key: []byte("k"), Seen: []byte{3, 7, 0, 0}}, {Key: []byte(""), Seen: []byte{2, 0, 0}}}
	b := kv.EncodeTx(nil, cs, ws)
	gc, gw, err := kv.DecodeTx(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(gc) != 3 || string(gc[2][3]) != "c" || len(gw) != 2 || string(gw[0].Key) != "k" || gw[0].Seen[1] != 7 || len(gw[1].Key) != 0 {
		t.Fatalf("round trip: %q %q", gc, gw)
	}
	// Every truncation, every extension and every single-byte change that
	// breaks the framing is refused; none panics.
	for i := 0; i < len(b); i++ {
		if _, _, err := kv.DecodeTx(b[:i]); !errors.Is(err, kv.ErrInvalidOp) {
			t.Fatalf("truncated at %d: %v", i, err)
		}
		for _, x := range []byte{0, 0x7f, 0xff} {
			c := append([]byte(nil), b...)
			c[i] = x
			_, _, _ = kv.DecodeTx(c)
		}
	}
	if _, _, err := kv.DecodeTx(append(b, 0)); !errors.Is(err, kv.ErrTxCorrupt) {
		t.Fatalf("trailing byte: %v", err)
	}
	if _, _, err := kv.DecodeTx([]byte{0xff, 0xff, 0xff, 0xff, 0x0f}); !errors.Is(err, kv.ErrTxCorrupt) {
		t.Fatalf("huge count: %v", err)
	}
	// A corrupt op is refused at apply as an invalid op (the same on every
	// replica), writing nothing.
	op := kv.Op{Kind: kv.KindExec, Value: b[:len(b)-1]}
	if _, err := kv.Apply(newStore().get, 1, &op, 0, func([]byte, []byte, []byte, bool) { t.Fatal("emitted") }); !errors.Is(err, kv.ErrInvalidOp) {
		t.Fatalf("corrupt op: %v", err)
	}
	// And the op itself survives the log's codec.
	op = kv.Op{Kind: kv.KindExec, Value: b, Keys: [][]byte{[]byte("k")}, Delta: 1, Now: 42}
	d, err := kv.DecodeOp(kv.AppendOp(nil, &op))
	if err != nil || d.Kind != kv.KindExec || string(d.Value) != string(b) || d.Now != 42 || d.Delta != 1 {
		t.Fatalf("op codec: %+v %v", d, err)
	}
}

// A watch's observation must carry its origin (kv.TxOrigin): one without
// it — the format of development builds before the origin was added, which
// no release logged — or otherwise not Observe's bytes is refused by the
// decoder (so the front door logs none) and at apply, as an invalid op that
// writes nothing, instead of being compared without the origin.
func TestWatchWithoutOriginIsRefused(t *testing.T) {
	s := newStore()
	s.exec(t, 1000, "SET k 1", nil)
	good := s.watch(t, 1000, "k")[0].Seen
	for _, seen := range [][]byte{
		{1, 1},            // live at version 1, no origin: the old format
		{0},               // absent, no origin
		{},                // nothing
		{7, 1, 0, 0},      // an unknown flag
		{3, 1, 0},         // the origin cut short
		{2, 0, 0, 0},      // a byte after the origin
		append(good, 0x5), // a byte after a real observation
	} {
		ws := []kv.Watch{{Key: []byte("k"), Seen: seen}}
		b := kv.EncodeTx(nil, cmds("SET k 2"), ws)
		_, _, err := kv.DecodeTx(b)
		if !errors.Is(err, kv.ErrTxWatchFormat) || !strings.Contains(err.Error(), `watch of key "k"`) {
			t.Fatalf("%v decoded: %v", seen, err)
		}
		op := kv.Op{Kind: kv.KindExec, Value: b, Keys: [][]byte{[]byte("k")}, Delta: 1, Now: 1000}
		if _, err := kv.Apply(s.get, 9, &op, 0, func([]byte, []byte, []byte, bool) { t.Fatal("emitted") }); !errors.Is(err, kv.ErrInvalidOp) {
			t.Fatalf("%v applied: %v", seen, err)
		}
	}
	_, _, err := kv.DecodeTx(kv.EncodeTx(nil, cmds("SET k 2"), []kv.Watch{{Key: []byte("k"), Seen: []byte{1, 1}}}))
	if err == nil || !strings.Contains(err.Error(), "no origin") {
		t.Fatalf("the old format's error does not say why: %v", err)
	}
	if got, _ := s.exec(t, 1000, "SET k 2", []kv.Watch{{Key: []byte("k"), Seen: good}}); got != "*1\r\n+OK\r\n" {
		t.Fatalf("a real observation: %q", got)
	}
}

func TestQueueable(t *testing.T) {
	for _, c := range []struct {
		cmd string
		ok  bool
	}{{"SET k v", true}, {"SET k v BADOPT", true}, {"HGET h f", true}, {"PING", true}, {"UNWATCH", true}, {"ECHO x", true}, {"EVAL x 0", true}, {"EVALSHA_RO x 0", true}, {"SCRIPT LOAD x", false}, {"KEYS *", true}, {"SCAN 0", true}, {"HGETALL h", true}, {"RENAME a b", true}, {"RANDOMKEY", true}, {"HRANDFIELD h", true}, {"HRANDFIELD h 1 WITHVALUES", true}, {"FLUSHDB", true}, {"FLUSHALL ASYNC", true}} {
		argv := cmds(c.cmd)[0]
		spec, ok := command.Lookup(argv[0])
		if !ok {
			t.Fatal(c.cmd)
		}
		if err := Queueable(spec, argv); (err == nil) != c.ok {
			t.Fatalf("%s: %v", c.cmd, err)
		}
	}
}

// A transaction of reads (KindExecRO) is a read: kv.Read runs it over the
// reader's state (a hash's rows through its scanner), its watches compared
// there; a write in one is refused.
func TestReadOnlyExec(t *testing.T) {
	s := newStore()
	s.exec(t, 1000, "SET k 1; HSET h f v", nil)
	ws := s.watch(t, 1000, "k", "h")
	read := func(txt string, ws []kv.Watch) string {
		op := kv.Op{Kind: kv.KindExecRO, Value: kv.EncodeTx(nil, cmds(txt), ws), Now: 1000}
		res, err := kv.Read(s.get, s.scan, &op, 0)
		if err != nil || res.Kind != kv.ResReply {
			t.Fatalf("%q: %+v, %v", txt, res, err)
		}
		return string(res.Bulk)
	}
	if got := read("GET k; HGET h f; SET k 2", ws); got != "*3\r\n$1\r\n1\r\n$1\r\nv\r\n-ERR Write commands are not allowed from read-only scripts.\r\n" {
		t.Fatalf("read-only exec: %q", got)
	}
	s.exec(t, 1000, "HSET h f w", nil)
	if got := read("GET k", ws); got != "*-1\r\n" {
		t.Fatalf("a watched hash changed: %q", got)
	}
	if kv.KindExecRO.IsUpdate() || !kv.MultiKey(&kv.Op{Kind: kv.KindExecRO}) {
		t.Fatal("a read-only exec is a read of one snapshot")
	}
}
