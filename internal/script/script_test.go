package script

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

// store is a map state for kv.Apply: key → value, meta, version.
type store struct {
	m   map[string]rec
	ver uint64
}

type rec struct {
	data, meta []byte
	ver        uint64
}

type emitted struct {
	key, value, meta string
	tomb             bool
}

func newStore() *store { return &store{m: map[string]rec{}} }

func (s *store) get(k []byte) ([]byte, []byte, uint64, bool, error) {
	r, ok := s.m[string(k)]
	return r.data, r.meta, r.ver, ok, nil
}

// scan and list walk the map's keys in [start, end) in order.
func (s *store) scan(start, end []byte, limit int, visit func(key, data, meta []byte, version uint64) bool) error {
	var keys []string
	for k := range s.m {
		if k >= string(start) && (end == nil || k < string(end)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for i, k := range keys {
		r := s.m[k]
		if (limit > 0 && i >= limit) || !visit([]byte(k), r.data, r.meta, r.ver) {
			break
		}
	}
	return nil
}

func (s *store) list(start, end []byte, visit func(key []byte) bool) error {
	return s.scan(start, end, 0, func(k, _, _ []byte, _ uint64) bool { return visit(k) })
}

// eval applies one script op at the next version and returns the reply and
// the records it wrote.
func (s *store) eval(t *testing.T, kind kv.Kind, body string, nkeys int, now int64, args ...string) (string, []emitted) {
	t.Helper()
	op := kv.Op{Kind: kind, Value: []byte(body), Delta: int64(nkeys), Now: now}
	for _, a := range args {
		op.Keys = append(op.Keys, []byte(a))
	}
	return s.apply(t, &op, body)
}

// apply applies op at the next version, keeps its records and returns its
// reply (a ResReply's bytes) and records; what names op in a failure.
func (s *store) apply(t *testing.T, op *kv.Op, what string) (string, []emitted) {
	t.Helper()
	body := what
	s.ver++
	var out []emitted
	res, err := kv.ApplyWith(s.get, s.list, nil, s.ver, op, 1<<20, func(key, value, meta []byte, tomb bool) {
		out = append(out, emitted{string(key), string(value), string(meta), tomb})
	})
	if err != nil {
		t.Fatalf("%q: %v", body, err)
	}
	if res.Kind != kv.ResReply {
		t.Fatalf("%q: result kind %d", body, res.Kind)
	}
	for _, e := range out {
		if e.tomb {
			delete(s.m, e.key)
		} else {
			s.m[e.key] = rec{[]byte(e.value), []byte(e.meta), s.ver}
		}
	}
	return string(res.Bulk), out
}

// The conversions both ways and the error spellings, as Redis 7.0 answers
// them (taken from redis-server 7.0.15; TestScriptRepliesMatchRedis in
// internal/server compares with a live one).
func TestConversionsAndErrors(t *testing.T) {
	s := newStore()
	for _, c := range []struct {
		body string
		args []string
		want string
	}{
		{"return 1", nil, ":1\r\n"},
		{"return 3.7", nil, ":3\r\n"},
		{"return -3.7", nil, ":-3\r\n"},
		{"return 'x'", nil, "$1\r\nx\r\n"},
		{"return true", nil, ":1\r\n"},
		{"return false", nil, "$-1\r\n"},
		{"return nil", nil, "$-1\r\n"},
		{"return {1,2,{3,'x'},false,4}", nil, "*5\r\n:1\r\n:2\r\n*2\r\n:3\r\n$1\r\nx\r\n$-1\r\n:4\r\n"},
		{"return {1,nil,3}", nil, "*1\r\n:1\r\n"},
		{"return {ok='fine'}", nil, "+fine\r\n"},
		{"return {err='bad thing'}", nil, "-bad thing\r\n"},
		{"return redis.error_reply('My Error')", nil, "-My Error\r\n"},
		{"return redis.status_reply('PONG')", nil, "+PONG\r\n"},
		{"return {KEYS[1], ARGV[1], #KEYS, #ARGV}", []string{"k", "a", "b"}, "*4\r\n$1\r\nk\r\n$1\r\na\r\n:1\r\n:2\r\n"},
		{"return redis.call('set', KEYS[1], 'v')", []string{"k"}, "+OK\r\n"},
		{"return redis.call('get', KEYS[1])", []string{"k"}, "$1\r\nv\r\n"},
		{"return redis.call('get', 'nokey')", []string{"k"}, "$-1\r\n"},
		{"return type(redis.call('get', 'nokey'))", []string{"k"}, "$7\r\nboolean\r\n"},
		{"return redis.call('incr', KEYS[1])", []string{"k"}, "-ERR value is not an integer or out of range script: " + SHA([]byte("return redis.call('incr', KEYS[1])")) + ", on @user_script:1.\r\n"},
		{"return redis.pcall('incr', KEYS[1])", []string{"k"}, "-ERR value is not an integer or out of range\r\n"},
		{"error('boom')", nil, "-ERR user_script:1: boom script: " + SHA([]byte("error('boom')")) + ", on @user_script:1.\r\n"},
		{"return redis.call('nosuch')", nil, "-ERR Unknown Redis command called from script script: " + SHA([]byte("return redis.call('nosuch')")) + ", on @user_script:1.\r\n"},
		{"return redis.call()", nil, "-ERR Please specify at least one argument for this redis lib call script: " + SHA([]byte("return redis.call()")) + ", on @user_script:1.\r\n"},
		{"return redis.call('set','a')", nil, "-ERR Wrong number of args calling Redis command from script script: " + SHA([]byte("return redis.call('set','a')")) + ", on @user_script:1.\r\n"},
		{"return os", nil, "-ERR user_script:1: Script attempted to access nonexistent global variable 'os' script: " + SHA([]byte("return os")) + ", on @user_script:1.\r\n"},
		{"return redis.call('setnx', 'n', 1)", nil, ":1\r\n"},
		{"return redis.call('setnx', 'n', 1)", nil, ":0\r\n"},
		{"return redis.call('exists', 'n', 'k', 'zz')", nil, ":2\r\n"},
		{"return redis.call('mget', 'n', 'zz')", nil, "*2\r\n$1\r\n1\r\n$-1\r\n"},
		{"return redis.call('hset', 'h', 'f', 'v')", nil, ":1\r\n"},
		{"return redis.call('hget', 'h', 'f')", nil, "$1\r\nv\r\n"},
		{"return redis.call('hget', 'h', 'g')", nil, "$-1\r\n"},
		{"return redis.call('hdel', 'h', 'f')", nil, ":1\r\n"},
		{"return tostring({}) .. tostring(type)", nil, "$13\r\ntablefunction\r\n"},
		{"return redis.pcall('lpush', 'l', 'x')", nil, "-ERR unsupported command 'lpush': Kefir does not implement it (see docs/commands.md)\r\n"},
		{"return redis.pcall('keys', '*')", nil, "*2\r\n$1\r\nk\r\n$1\r\nn\r\n"},
		{"return redis.pcall('eval', 'return 1', 0)", nil, "-ERR command 'EVAL' is not supported in Kefir scripts (see docs/design/scripting.md)\r\n"},
		{"return redis.pcall('flushdb', 'bad')", nil, "-ERR syntax error\r\n"},
	} {
		got, _ := s.eval(t, kv.KindEval, c.body, min(1, len(c.args)), 1000, c.args...)
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.body, got, c.want)
		}
	}
}

// A script's writes land together in its op's one version, one record per
// key (the last state of a key it wrote twice), in the order it first wrote
// them; if it raises an error none lands.
func TestWritesLandTogetherOrNotAtAll(t *testing.T) {
	s := newStore()
	reply, out := s.eval(t, kv.KindEval, `
		redis.call('set', KEYS[1], '1')
		redis.call('incr', KEYS[1])
		redis.call('set', KEYS[2], 'x', 'PX', 500)
		redis.call('del', KEYS[2])
		redis.call('set', 'undeclared', 'u')
		return redis.call('get', KEYS[1])`, 2, 1000, "a", "b")
	if reply != "$1\r\n2\r\n" {
		t.Fatalf("reply %q", reply)
	}
	want := []emitted{{"a", "2", "", false}, {"b", "", "", true}, {"undeclared", "u", "", false}}
	if len(out) != len(want) {
		t.Fatalf("records %v, want %v", out, want)
	}
	for i := range want {
		if out[i] != want[i] {
			t.Fatalf("records %v, want %v", out, want)
		}
	}
	body := "redis.call('set', KEYS[1], 'lost'); redis.call('incr', KEYS[1])"
	reply, out = s.eval(t, kv.KindEval, body, 1, 1000, "c")
	if !strings.HasPrefix(reply, "-ERR value is not an integer") || len(out) != 0 {
		t.Fatalf("a script that raised: reply %q, records %v; want the error and none", reply, out)
	}
	// pcall catches the error: the script goes on and its writes land.
	reply, out = s.eval(t, kv.KindEval, "redis.call('set', KEYS[1], 'kept'); redis.pcall('incr', KEYS[1]); return 1", 1, 1000, "c")
	if reply != ":1\r\n" || len(out) != 1 || out[0].value != "kept" {
		t.Fatalf("pcall: reply %q, records %v", reply, out)
	}
}

// SET PX and EXPIRE in a script take the op's Now as their clock.
func TestScriptClockIsTheOpsNow(t *testing.T) {
	s := newStore()
	s.eval(t, kv.KindEval, "redis.call('set', KEYS[1], 'v', 'PX', 500)", 1, 1000, "k")
	if got, _ := s.eval(t, kv.KindEval, "return redis.call('pttl', KEYS[1])", 1, 1200, "k"); got != ":300\r\n" {
		t.Fatalf("pttl at 1200 of a key set at 1000 PX 500: %q", got)
	}
	if got, _ := s.eval(t, kv.KindEval, "return redis.call('get', KEYS[1])", 1, 1501, "k"); got != "$-1\r\n" {
		t.Fatalf("get after expiry: %q", got)
	}
	s.eval(t, kv.KindEval, "redis.call('set', KEYS[1], 'v'); return redis.call('expire', KEYS[1], 10)", 1, 2000, "k")
	if got, _ := s.eval(t, kv.KindEval, "return redis.call('ttl', KEYS[1])", 1, 2000, "k"); got != ":10\r\n" {
		t.Fatalf("ttl: %q", got)
	}
}

// EVAL_RO refuses writes with Redis's text.
func TestReadOnlyScriptRefusesWrites(t *testing.T) {
	s := newStore()
	body := "return redis.call('set','a','b')"
	got, out := s.eval(t, kv.KindEvalRO, body, 0, 0)
	want := "-ERR Write commands are not allowed from read-only scripts. script: " + SHA([]byte(body)) + ", on @user_script:1.\r\n"
	if got != want || len(out) != 0 {
		t.Fatalf("got %q (records %v), want %q", got, out, want)
	}
	if got, _ := s.eval(t, kv.KindEvalRO, "return redis.call('get','a')", 0, 0); got != "$-1\r\n" {
		t.Fatalf("a read: %q", got)
	}
	// EVAL_RO is a read: kv.Read runs it.
	s.m["a"] = rec{data: []byte("v"), ver: 3}
	op := kv.Op{Kind: kv.KindEvalRO, Value: []byte("return {redis.call('get', KEYS[1]), redis.pcall('del', KEYS[1])}"), Delta: 1, Keys: [][]byte{[]byte("a")}}
	res, err := kv.Read(s.get, nil, &op, 0)
	want = "*2\r\n$1\r\nv\r\n-ERR Write commands are not allowed from read-only scripts.\r\n"
	if err != nil || res.Kind != kv.ResReply || string(res.Bulk) != want || res.Version != 3 {
		t.Fatalf("kv.Read of EVAL_RO: %+v %q, %v; want %q at version 3", res, res.Bulk, err, want)
	}
	if kv.KindEvalRO.IsUpdate() || !kv.MultiKey(&op) {
		t.Fatal("EVAL_RO must be a read of one snapshot")
	}
}

// A script that runs too long is stopped by the instruction budget, at the
// same instruction everywhere, with an error and none of its writes; so is
// one that hides the loop under pcall.
func TestBudgetStopsRunawayScripts(t *testing.T) {
	old := Budget
	Budget = 2_000_000
	defer func() { Budget = old }()
	s := newStore()
	for _, body := range []string{
		"redis.call('set', 'w', 1); while true do end",
		"redis.call('set', 'w', 1); while true do pcall(function() while true do end end) end",
	} {
		got, out := s.eval(t, kv.KindEval, body, 0, 0)
		if !strings.HasPrefix(got, "-ERR user_script:1: script exceeded its budget of Lua instructions") || len(out) != 0 {
			t.Fatalf("%s: reply %q, records %v", body, got, out)
		}
	}
	got, _ := s.eval(t, kv.KindEval, "local x = string.rep('x', 1024*1024*1024)", 0, 0)
	if !strings.Contains(got, "string.rep") {
		t.Fatalf("a 1 GiB string.rep: %q", got)
	}
}

// The same op over two fresh states gives the same records and reply:
// math.random's sequence, pairs' order and the budget do not depend on the
// process (the replay test of internal/vrshard checks a crash's replay).
func TestScriptsAreDeterministic(t *testing.T) {
	if d := nondeterminism(t); d != "" {
		t.Fatal(d)
	}
}

// nondeterminism runs a script drawing math.random and walking pairs over
// five fresh states and describes the first difference ("" if none).
func nondeterminism(t *testing.T) string {
	t.Helper()
	body := `
		local t = {}
		for i = 1, 50 do t['k' .. math.random(1000)] = i end
		t.x, t.y, t[3.5] = 1, 2, 3
		local out = {}
		for k, v in pairs(t) do out[#out + 1] = tostring(k) .. '=' .. v end
		redis.call('set', KEYS[1], table.concat(out, ','))
		redis.call('incrby', KEYS[2], math.random(100))
		return {math.random(), redis.call('get', KEYS[1])}`
	var first string
	var firstOut []emitted
	for i := 0; i < 5; i++ {
		s := newStore()
		got, out := s.eval(t, kv.KindEval, body, 2, 1000, "a", "b")
		if i == 0 {
			first, firstOut = got, out
			continue
		}
		if got != first || fmt.Sprint(out) != fmt.Sprint(firstOut) {
			return fmt.Sprintf("run %d: %q %v, run 0: %q %v", i, got, out, first, firstOut)
		}
	}
	return ""
}

// BenchmarkRelease runs redis-py Lock's release script over a map state:
// the interpreter's cost per EVAL (a fresh, sandboxed state each run).
func BenchmarkRelease(b *testing.B) {
	s := newStore()
	body := []byte(`local t = redis.call('get', KEYS[1]) if not t or t ~= ARGV[1] then return 0 end redis.call('del', KEYS[1]) return 1`)
	op := kv.Op{Kind: kv.KindEval, Value: body, Delta: 1, Keys: [][]byte{[]byte("lk"), []byte("tok")}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := kv.Apply(s.get, 1, &op, 0, func(key, value, meta []byte, tomb bool) {}); err != nil {
			b.Fatal(err)
		}
	}
}

// pairs over the globals and the libraries walks them in one order on every
// replica. gopher-lua fills them from Go maps (random order), so the sandbox
// rebuilds them in key order; a new interpreter each time would otherwise
// show another order now and then.
func TestLibraryIterationOrderIsFixed(t *testing.T) {
	body := `
		local out = {}
		for _, t in ipairs({_G, string, table, math, redis}) do
			for k in pairs(t) do out[#out + 1] = tostring(k) end
		end
		return table.concat(out, ' ')`
	first := ""
	for i := 0; i < 30; i++ {
		got, _ := newStore().eval(t, kv.KindEval, body, 0, 0)
		if i == 0 {
			first = got
		} else if got != first {
			t.Fatalf("run %d walked\n%s\nrun 0\n%s", i, got, first)
		}
	}
}

// fingerprint is a script that describes everything a script can observe
// of its environment: the globals, the libraries and redis (keys, value
// types, in pairs order), the metatables of strings, numbers, booleans,
// nil and functions, whether a few library functions still work, and
// math.random's first number.
const fingerprint = `
	local out = {}
	local function walk(t, name)
		for k, v in pairs(t) do out[#out + 1] = name .. '.' .. tostring(k) .. ':' .. type(v) end
	end
	walk(_G, '_G') walk(string, 'string') walk(table, 'table') walk(math, 'math') walk(redis, 'redis')
	for _, v in ipairs({'', 0, true}) do
		local mt = getmetatable(v)
		out[#out + 1] = type(v) .. ' mt ' .. type(mt)
		if mt then walk(mt, type(v) .. 'mt') end
	end
	out[#out + 1] = type(getmetatable(type))
	out[#out + 1] = type(getmetatable(_G))
	if getmetatable(_G) then walk(getmetatable(_G), 'guard') end
	out[#out + 1] = ('abc'):upper() .. string.rep('x', 3) .. table.concat({1, 2}, ',') .. math.floor(2.5)
	out[#out + 1] = tostring(math.random(1000000))
	out[#out + 1] = tostring(pcall(function() return nosuch end))
	return table.concat(out, ' ')`

// A reused interpreter is indistinguishable from a new one, whatever the
// scripts before it changed (or tried to).
func TestReusedInterpreterIsPristine(t *testing.T) {
	for _, d := range pollutionShows(t) {
		t.Error(d)
	}
}

// pollutionShows runs polluting scripts, each in a new interpreter, and
// then the fingerprint in the same one if it was kept for reuse; it
// describes every fingerprint that differs from a new interpreter's.
func pollutionShows(t *testing.T) []string {
	t.Helper()
	var out []string
	fpOp := kv.Op{Kind: kv.KindEval, Value: []byte(fingerprint)}
	proto, err := Compile(fpOp.Value)
	if err != nil {
		t.Fatal(err)
	}
	noExec := func(*kv.Op) (kv.Result, error) { return kv.Result{}, nil }
	want, raised, _ := newInterp().run(proto, &fpOp, kv.NewOpRand(0, 0), noExec)
	if raised {
		t.Fatalf("the fingerprint failed: %s", want)
	}
	for _, pollute := range []string{
		"string.rep = nil",
		"string.upper = function() return 'no' end; table.concat = nil; math.floor = string.len",
		"redis.call = nil; redis.LOG_DEBUG = 99",
		"getmetatable('').__index = {}",
		"setmetatable('', {__index = {upper = function() return 'x' end}})",
		"setmetatable(0, {__add = function() return 1 end}); setmetatable(true, {}); setmetatable(type, {})",
		"setmetatable(_G, nil)",
		"getmetatable(_G).__index = nil; getmetatable(_G).__newindex = nil",
		"rawset(_G, 'zz', 1)",
		"rawset(string, 'zz', 1)",
		"_G.KEYS = nil; ARGV = nil",
		"math.randomseed(7); math.random(); math.random()",
		"for i = 1, 10 do rawset(math, i, i) end",
		"rawset(_G, 'tostring', nil)",
		"error('after polluting') ",
		"string.rep = nil; error({err = 'x'})",
		"_G._G = nil; _G.string = nil",
	} {
		in := newInterp()
		op := kv.Op{Kind: kv.KindEval, Value: []byte(pollute)}
		p, err := Compile(op.Value)
		if err != nil {
			t.Fatalf("%s: %v", pollute, err)
		}
		_, _, clean := in.run(p, &op, kv.NewOpRand(0, 0), noExec)
		if !clean {
			continue // dropped, never reused
		}
		got, _, _ := in.run(proto, &fpOp, kv.NewOpRand(0, 0), noExec)
		if string(got) != string(want) {
			out = append(out, fmt.Sprintf("after %q a reused interpreter shows\n%s\nwant\n%s", pollute, got, want))
		}
	}
	return out
}

// The determinism checks catch a replica whose interpreter leaks state from
// one script into the next, and one whose math.random is seeded by its own
// clock.
func TestMutationsAreCaught(t *testing.T) {
	mutation.Require(t)
	defer func() { mut = mutations{} }()
	mut.skipRestore = true
	if got := len(pollutionShows(t)); got < 10 {
		t.Errorf("with skipRestore, %d polluted interpreters showed; want most of them", got)
	}
	mut = mutations{processRandom: true}
	if nondeterminism(t) == "" {
		t.Error("with processRandom, five runs of a script drawing math.random agreed")
	}
}

// Every hash a script creates gets a generation of its own, although all
// of the script's records share its version: two new hashes do not share
// rows, and a hash the script deletes and creates again does not get its
// old fields back (both happened when a new hash's generation was the op's
// version).
func TestScriptHashesHaveTheirOwnGenerations(t *testing.T) {
	s := newStore()
	reply, _ := s.eval(t, kv.KindEval, `
		redis.call('hset', KEYS[1], 'a', '1')
		redis.call('hset', KEYS[2], 'b', '2')
		return {redis.call('hget', KEYS[1], 'b'), redis.call('hlen', KEYS[1]), redis.call('hget', KEYS[2], 'a'), redis.call('hget', KEYS[2], 'b')}`, 2, 1000, "h1", "h2")
	if want := "*4\r\n$-1\r\n:1\r\n$-1\r\n$1\r\n2\r\n"; reply != want {
		t.Fatalf("two new hashes in one script: reply %q, want %q", reply, want)
	}
	reply, _ = s.eval(t, kv.KindEval, `
		redis.call('hset', KEYS[1], 'a', '1')
		redis.call('del', KEYS[1])
		redis.call('hset', KEYS[1], 'b', '2')
		return {redis.call('hget', KEYS[1], 'a'), redis.call('hlen', KEYS[1])}`, 1, 1000, "h3")
	if want := "*2\r\n$-1\r\n:1\r\n"; reply != want {
		t.Fatalf("a hash deleted and created again: reply %q, want %q", reply, want)
	}
	// And after the op, as stored.
	reply, _ = s.eval(t, kv.KindEval, `return {redis.call('hget', KEYS[1], 'a'), redis.call('hget', KEYS[2], 'b'), redis.call('hget', KEYS[3], 'a')}`, 3, 1000, "h3", "h1", "h2")
	if want := "*3\r\n$-1\r\n$-1\r\n$-1\r\n"; reply != want {
		t.Fatalf("stored: reply %q, want %q", reply, want)
	}
}

// Nothing a script stores or answers names an address, which differs
// between replicas: string.format refuses a table (as Lua 5.1 does), and
// the messages of errors — raised, or caught with pcall/xpcall — have their
// addresses taken out.
func TestScriptsSeeNoAddresses(t *testing.T) {
	for _, body := range []string{
		`return string.format('%s', {})`,
		`redis.call('set', KEYS[1], string.format('%s %s', 'a', function() end)); return 1`,
		`error({})`,
		`local x; return x[{}]`,
		`local ok, e = pcall(function() local x; return x[{}] end); redis.call('set', KEYS[1], tostring(e)); return e`,
		`local ok, e = xpcall(function() local x; return x[{}] end, function(m) return m end); redis.call('set', KEYS[1], tostring(e)); return e`,
	} {
		s := newStore()
		reply, out := s.eval(t, kv.KindEval, body, 1, 1000, "k")
		if strings.Contains(reply, "0x") {
			t.Errorf("%s: reply %q names an address", body, reply)
		}
		for _, e := range out {
			if strings.Contains(e.value, "0x") {
				t.Errorf("%s: stored %q names an address", body, e.value)
			}
		}
	}
}

// At a node of several groups (the router sets kv.DeclaredKeysOnly) a script
// may touch its declared keys only — any other key may belong to another
// group — and is refused with an error that says so; a hash op's fields and
// the script's arguments are not keys.
func TestDeclaredKeysOnly(t *testing.T) {
	run := func(body string, nkeys int, args ...string) (string, []emitted) {
		s := newStore()
		op := kv.Op{Kind: kv.KindEval, Value: []byte(body), Delta: int64(nkeys), Now: 1000, Cond: kv.DeclaredKeysOnly}
		for _, a := range args {
			op.Keys = append(op.Keys, []byte(a))
		}
		var out []emitted
		res, err := kv.Apply(s.get, 1, &op, 1<<20, func(key, value, meta []byte, tomb bool) {
			out = append(out, emitted{string(key), string(value), string(meta), tomb})
		})
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		return string(res.Bulk), out
	}
	if reply, out := run(`redis.call('set', KEYS[1], ARGV[1]); redis.call('hset', KEYS[2], ARGV[1], ARGV[2]); return redis.call('hget', KEYS[2], ARGV[1])`, 2, "a", "h", "f", "v"); reply != "$1\r\nv\r\n" || len(out) != 4 {
		t.Fatalf("declared keys: reply %q, records %v", reply, out)
	}
	for _, body := range []string{
		`redis.call('set', ARGV[1], 'x'); return 1`,
		`return redis.call('get', 'other')`,
		`return redis.call('mget', KEYS[1], 'other')`,
		`redis.call('del', KEYS[1], ARGV[1]); return 1`,
	} {
		reply, out := run(body, 1, "a", "foo")
		if !strings.Contains(reply, "did not declare") || len(out) != 0 {
			t.Errorf("%s: reply %q, records %v; want the undeclared-key error and nothing written", body, reply, out)
		}
	}
	// Without the flag (one group), undeclared keys are allowed, as in Redis.
	s := newStore()
	if reply, _ := s.eval(t, kv.KindEval, `redis.call('set', ARGV[1], 'x'); return 1`, 0, 1000, "foo"); reply != ":1\r\n" {
		t.Fatalf("one group: reply %q", reply)
	}
}

// A number beyond int64 answers the nearest int64, the same on every CPU
// (a float64 of 2^63 or more converted to int64 differs between amd64 and
// arm64).
func TestHugeNumbersClamp(t *testing.T) {
	s := newStore()
	for body, want := range map[string]string{
		`return 1e300`:               ":9223372036854775807\r\n",
		`return -1e300`:              ":-9223372036854775808\r\n",
		`return 9223372036854775807`: ":9223372036854775807\r\n",
		`return 2.9`:                 ":2\r\n",
		`return -2.9`:                ":-2\r\n",
	} {
		if reply, _ := s.eval(t, kv.KindEval, body, 0, 1000); reply != want {
			t.Errorf("%s: reply %q, want %q", body, reply, want)
		}
	}
}
