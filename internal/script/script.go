// Package script is Kefir's Lua interpreter for EVAL and its kin
// (docs/design/scripting.md): gopher-lua in a deterministic sandbox, run by
// the state machine (internal/kv) at apply on every replica.
//
// kv is a pure core and must not import an interpreter, so this package
// registers itself with kv (kv.RegisterScripting) from its init; every
// engine that applies ops imports it. What it must guarantee is determinism:
// the same op over the same state gives the same reply and the same
// redis.call sequence on every replica and in every replay. So the sandbox
// has no clock, no I/O and no address-revealing tostring; math.random is a
// fixed-seed generator restarted for each script; each script runs in a
// fresh interpreter (no state from an earlier script); and a script's running
// time is bounded by a count of Lua instructions (Budget), not by a clock.
package script

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	lua "github.com/yuin/gopher-lua"
	luaparse "github.com/yuin/gopher-lua/parse"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

func init() { kv.RegisterScripting(Run) }

// Budget is the number of Lua VM instructions a script may execute; past it
// the script fails with errBudget's text, and none of its writes land.
// Counted, not timed, so that every replica stops the script at the same
// instruction. `while true do end` reaches it in ~0.4 s on the shared 2-core
// machine (docs/design/scripting.md).
var Budget int64 = 50_000_000

// MaxString bounds a string string.rep may build: the interpreter's own
// functions are not counted by Budget, and one call could otherwise take
// all of a replica's memory.
const MaxString = 64 << 20

// budget is a context.Context whose Done is called by gopher-lua once per VM
// instruction (mainLoopWithContext): it counts the calls and reports done
// after Budget of them. No clock and no goroutine: deterministic.
type budget struct {
	n, max int64
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (b *budget) Deadline() (time.Time, bool) { return time.Time{}, false }
func (b *budget) Done() <-chan struct{} {
	b.n++
	if b.n > b.max {
		return closed
	}
	return nil // a nil channel is never ready: the select takes its default
}
func (b *budget) Err() error {
	if b.n > b.max {
		return errBudget
	}
	return nil
}
func (b *budget) Value(any) any { return nil }

var errBudget = errors.New("script exceeded its budget of Lua instructions (a deterministic limit: see docs/design/scripting.md)")

// SHA returns a script body's SHA1, in hex (EVALSHA's name for it).
func SHA(body []byte) string {
	h := sha1.Sum(body)
	return hex.EncodeToString(h[:])
}

// protos caches compiled scripts by SHA: compiling is a pure function of
// the body, so a cached proto is what any replica would compile. Bounded:
// emptied when full.
var protos struct {
	sync.Mutex
	m map[string]*lua.FunctionProto
}

const maxProtos = 1024

// compileError is a script that does not compile; its text is Redis's
// reply after the "ERR " prefix.
type compileError string

func (e compileError) Error() string { return string(e) }

// Compile compiles body (cached), or returns Redis's error text for a script
// that does not compile ("ERR Error compiling script ...").
func Compile(body []byte) (*lua.FunctionProto, error) {
	sha := SHA(body)
	protos.Lock()
	p := protos.m[sha]
	protos.Unlock()
	if p != nil {
		return p, nil
	}
	chunk, err := luaparse.Parse(strings.NewReader(string(body)), "user_script")
	if err == nil {
		p, err = lua.Compile(chunk, "user_script")
	}
	if err != nil {
		return nil, compileError("Error compiling script (new function): " + strings.TrimSpace(err.Error()))
	}
	protos.Lock()
	if protos.m == nil || len(protos.m) >= maxProtos {
		protos.m = map[string]*lua.FunctionProto{}
	}
	protos.m[sha] = p
	protos.Unlock()
	return p, nil
}

// Run runs op's script (kv.ScriptRunner): KEYS are op.Keys[:op.Delta], ARGV
// the rest. It returns the script's reply in RESP2 and whether the script
// raised an error (the reply is then that error).
func Run(op *kv.Op, rnd *kv.OpRand, exec kv.ScriptExec) (reply []byte, raised bool) {
	proto, err := Compile(op.Value)
	if err != nil {
		return errorReply("ERR " + err.Error()), true
	}
	in, _ := interps.Get().(*interp)
	if in == nil {
		in = newInterp()
	}
	reply, raised, clean := in.run(proto, op, rnd, exec)
	if clean {
		interps.Put(in)
	} else {
		in.L.Close()
	}
	return reply, raised
}

// run runs a compiled script in the interpreter and restores it; clean
// false: it cannot be reused (the script raised an error, which leaves
// whatever it cut short behind, or restore refused it).
func (in *interp) run(proto *lua.FunctionProto, op *kv.Op, rnd *kv.OpRand, exec kv.ScriptExec) (reply []byte, raised, clean bool) {
	r := &run{L: in.L, op: op, rnd: rnd, exec: exec, sha: SHA(op.Value), rng: seed}
	if mutation.On && mut.processRandom {
		r.rng = clockSeed()
	}
	in.cur = r
	defer func() { in.cur = nil }()
	L := in.L
	keys, argv := L.NewTable(), L.NewTable()
	for i, k := range op.Keys {
		if i < int(op.Delta) {
			keys.Append(lua.LString(k))
		} else {
			argv.Append(lua.LString(k))
		}
	}
	L.G.Global.RawSetString("KEYS", keys)
	L.G.Global.RawSetString("ARGV", argv)
	L.SetContext(&budget{max: Budget})
	L.Push(L.NewFunctionFromProto(proto))
	if err := L.PCall(0, 1, nil); err != nil {
		return r.raised(err), true, false
	}
	reply = appendReply(nil, L, L.Get(-1), 0)
	L.Pop(1)
	return reply, false, in.restore()
}

// seed starts math.random's sequence for every script (Redis 6's rule).
const seed = 0x9E3779B97F4A7C15

// run is one script's execution.
type run struct {
	L    *lua.LState
	op   *kv.Op
	exec kv.ScriptExec
	sha  string
	rng  uint64 // math.random's state
	// rnd is the op's random source: RANDOMKEY's and HRANDFIELD's picks.
	rnd *kv.OpRand
	// callErr is the last error redis.call raised (with its line), so that
	// the script's final error reply names it as Redis does.
	callErr  string
	callLine string
}

// interp is a sandboxed interpreter, reused across scripts (one at a time)
// once restored to the state it was made in: opening the libraries is most
// of what a fresh one costs. Determinism needs a reused interpreter to be
// indistinguishable from a new one, so restore puts back every table a
// script can reach from its globals (the globals, the libraries, redis, the
// globals' guard) and the metatables of every type, and an interpreter a
// script left by an error is closed, not reused. What a script cannot reach
// — functions of the libraries are Go functions without state, and getfenv,
// setfenv and the debug library, which would reach further, are absent —
// needs no restoring. TestReusedInterpreterIsPristine pollutes one and
// compares.
type interp struct {
	L   *lua.LState
	cur *run // the script being run: redis.call and math.random use it
	// tables and saved are the reachable tables and their contents, in
	// the order the sandbox left them; metas their metatables.
	tables []*lua.LTable
	saved  [][]lua.LValue // key, value, key, value...
	keys   []map[lua.LValue]struct{}
	metas  []lua.LValue
	// typeMetas are the metatables of the values of each type (gopher-lua
	// keeps one per type; setmetatable changes it for strings, numbers...).
	typeMetas []lua.LValue
}

// typeSamples are a value of each type whose metatable is per type.
var typeSamples = []lua.LValue{lua.LNil, lua.LFalse, lua.LNumber(0), lua.LString(""), &lua.LFunction{}}

// interps are the interpreters not in use.
var interps sync.Pool

// newInterp makes a sandboxed interpreter: the libraries a script may use
// (base, table, string, math), without what reads files, the clock or the
// environment or prints, with a deterministic math.random, the redis table,
// Redis's guard on globals, every table rebuilt in key order (gopher-lua
// fills them from Go maps, whose order is random: pairs would walk them in
// another order on each replica).
func newInterp() *interp {
	// A small state that grows on demand: most scripts are a few calls.
	L := lua.NewState(lua.Options{SkipOpenLibs: true, CallStackSize: 200, MinimizeStackMemory: true, RegistrySize: 256, RegistryMaxSize: 1 << 20})
	in := &interp{L: L}
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		L.Push(L.NewFunction(lib.open))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0) // the libraries' own setup: cannot fail
	}
	g := L.G.Global
	for _, name := range []string{"dofile", "loadfile", "print", "require", "module", "collectgarbage", "_printregs", "gcinfo",
		"_GOPHER_LUA_VERSION", "getfenv", "setfenv"} {
		g.RawSetString(name, lua.LNil)
	}
	// tostring of a table or function names its address, which differs
	// between replicas: the type alone instead.
	tostring := g.RawGetString("tostring")
	g.RawSetString("tostring", L.NewFunction(func(L *lua.LState) int {
		switch v := L.Get(1); v.Type() {
		case lua.LTTable, lua.LTFunction, lua.LTUserData, lua.LTThread, lua.LTChannel:
			L.Push(lua.LString(v.Type().String()))
			return 1
		}
		L.Push(tostring)
		L.Push(L.Get(1))
		L.Call(1, 1)
		return 1
	}))
	str := g.RawGetString("string").(*lua.LTable)
	rep := str.RawGetString("rep")
	str.RawSetString("rep", L.NewFunction(func(L *lua.LState) int {
		s, n := L.CheckString(1), L.CheckInt(2)
		if n > 0 && len(s) > 0 && n > MaxString/len(s) {
			L.RaiseError("string.rep: a string longer than %d bytes", MaxString)
		}
		L.Push(rep)
		L.Push(lua.LString(s))
		L.Push(lua.LNumber(n))
		L.Call(2, 1)
		return 1
	}))
	// string.format hands its arguments to Go's fmt: a table's %s is its
	// address, which differs between replicas. Lua 5.1 (Redis's) refuses a
	// table there ("string expected"); so does this.
	format := str.RawGetString("format")
	str.RawSetString("format", L.NewFunction(func(L *lua.LState) int {
		n := L.GetTop()
		for i := 2; i <= n; i++ {
			switch v := L.Get(i); v.Type() {
			case lua.LTTable, lua.LTFunction, lua.LTUserData, lua.LTThread, lua.LTChannel:
				L.ArgError(i, "string expected, got "+v.Type().String())
			}
		}
		L.Push(format)
		for i := 1; i <= n; i++ {
			L.Push(L.Get(i))
		}
		L.Call(n, 1)
		return 1
	}))
	// The interpreter's own error messages may name a table's or a
	// function's address ("… with key 'table: 0x…'"); a script that
	// catches one with pcall could store it. pcall and xpcall hand
	// scripts the message with the addresses taken out (raised does the
	// same for the reply).
	for _, name := range []string{"pcall", "xpcall"} {
		orig := g.RawGetString(name)
		g.RawSetString(name, L.NewFunction(func(L *lua.LState) int {
			n := L.GetTop()
			L.Push(orig)
			for i := 1; i <= n; i++ {
				L.Push(L.Get(i))
			}
			L.Call(n, lua.MultRet)
			nret := L.GetTop() - n
			if nret >= 2 && L.Get(n+1) == lua.LFalse {
				if m, ok := L.Get(n + 2).(lua.LString); ok {
					L.Replace(n+2, lua.LString(scrubAddresses(string(m))))
				}
			}
			return nret
		}))
	}
	math := g.RawGetString("math").(*lua.LTable)
	math.RawSetString("random", L.NewFunction(func(L *lua.LState) int { return in.cur.random(L) }))
	math.RawSetString("randomseed", L.NewFunction(func(L *lua.LState) int {
		in.cur.rng = uint64(L.CheckInt64(1)) | 1
		return 0
	}))
	redis := L.NewTable()
	for name, f := range map[string]lua.LGFunction{
		"call":         func(L *lua.LState) int { return in.cur.call(L, true) },
		"pcall":        func(L *lua.LState) int { return in.cur.call(L, false) },
		"error_reply":  errorReplyFn,
		"status_reply": statusReplyFn,
		"sha1hex": func(L *lua.LState) int {
			L.Push(lua.LString(SHA([]byte(L.CheckString(1)))))
			return 1
		},
		"log":      func(*lua.LState) int { return 0 }, // the node's log is not the state machine's
		"setresp":  func(*lua.LState) int { return 0 },
		"set_repl": func(*lua.LState) int { return 0 },
		"replicate_commands": func(L *lua.LState) int {
			L.Push(lua.LTrue)
			return 1
		},
	} {
		redis.RawSetString(name, L.NewFunction(f))
	}
	for name, v := range map[string]int{"LOG_DEBUG": 0, "LOG_VERBOSE": 1, "LOG_NOTICE": 2, "LOG_WARNING": 3,
		"REPL_NONE": 0, "REPL_SLAVE": 1, "REPL_REPLICA": 1, "REPL_AOF": 2, "REPL_ALL": 3} {
		redis.RawSetString(name, lua.LNumber(v))
	}
	g.RawSetString("redis", redis)
	// Each script sets its own; here so that the keys exist (in order)
	// before a script's values replace them.
	g.RawSetString("KEYS", L.NewTable())
	g.RawSetString("ARGV", L.NewTable())

	// Rebuild in key order: the libraries, then the globals pointing at
	// them, and the string metatable's __index.
	libs := map[string]*lua.LTable{}
	for _, name := range []string{"string", "table", "math", "redis"} {
		libs[name] = sorted(L, g.RawGetString(name).(*lua.LTable))
	}
	ng := sorted(L, g)
	for name, t := range libs {
		ng.RawSetString(name, t)
	}
	ng.RawSetString("_G", ng)
	L.G.Global, L.Env = ng, ng
	// Strings' metatable: gopher-lua's is its (unordered) string table
	// itself; Lua's is {__index = string}.
	strMeta := L.NewTable()
	strMeta.RawSetString("__index", libs["string"])
	L.SetMetatable(lua.LString(""), strMeta)

	// Redis's guard: a script reads no undefined global and creates none.
	guard := L.NewTable()
	guard.RawSetString("__index", L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("Script attempted to access nonexistent global variable '%s'", L.CheckString(2))
		return 0
	}))
	guard.RawSetString("__newindex", L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("Attempt to modify a readonly table")
		return 0
	}))
	L.SetMetatable(ng, guard)

	in.tables = []*lua.LTable{ng, libs["string"], libs["table"], libs["math"], libs["redis"], guard, strMeta}
	for _, t := range in.tables {
		var kvs []lua.LValue
		t.ForEach(func(k, v lua.LValue) { kvs = append(kvs, k, v) })
		keys := make(map[lua.LValue]struct{}, len(kvs)/2)
		for j := 0; j < len(kvs); j += 2 {
			keys[kvs[j]] = struct{}{}
		}
		in.saved = append(in.saved, kvs)
		in.keys = append(in.keys, keys)
		in.metas = append(in.metas, t.Metatable)
	}
	for _, v := range typeSamples {
		in.typeMetas = append(in.typeMetas, L.GetMetatable(v))
	}
	return in
}

// sorted returns a copy of t with its keys inserted in key order (string
// keys; the libraries have no others).
func sorted(L *lua.LState, t *lua.LTable) *lua.LTable {
	var keys []string
	t.ForEach(func(k, _ lua.LValue) { keys = append(keys, k.String()) })
	sort.Strings(keys)
	n := L.CreateTable(0, len(keys))
	for _, k := range keys {
		n.RawSetString(k, t.RawGetString(k))
	}
	n.Metatable = t.Metatable
	return n
}

// restore puts the interpreter back as newInterp left it: the values and
// metatables of its reachable tables, the types' metatables, the global
// environment and an empty stack. False if it cannot (a script added a key
// to one of the tables, or left the stack): the interpreter is dropped.
func (in *interp) restore() bool {
	L := in.L
	if L.GetTop() != 0 {
		return false
	}
	L.RemoveContext()
	if mutation.On && mut.skipRestore {
		return true
	}
	g := in.tables[0]
	L.G.Global, L.Env = g, g
	for i, t := range in.tables {
		kvs, want := in.saved[i], in.keys[i]
		extra := false
		t.ForEach(func(k, _ lua.LValue) {
			if _, ok := want[k]; !ok {
				extra = true
			}
		})
		if extra {
			// A key the script added: deleting it would not do, as
			// gopher-lua's tables remember a key's insertion position
			// after its deletion (pairs would walk a key the script adds
			// again in another order than a new interpreter does).
			return false
		}
		for j := 0; j < len(kvs); j += 2 {
			if t.RawGet(kvs[j]) != kvs[j+1] {
				t.RawSet(kvs[j], kvs[j+1])
			}
		}
		t.Metatable = in.metas[i]
	}
	for i, v := range typeSamples {
		if L.GetMetatable(v) != in.typeMetas[i] {
			L.SetMetatable(v, in.typeMetas[i])
		}
	}
	return true
}

// random is math.random over a xorshift64* generator the script owns.
func (r *run) random(L *lua.LState) int {
	r.rng ^= r.rng >> 12
	r.rng ^= r.rng << 25
	r.rng ^= r.rng >> 27
	x := r.rng * 2685821657736338717
	f := float64(x>>11) / (1 << 53)
	switch L.GetTop() {
	case 0:
		L.Push(lua.LNumber(f))
	case 1:
		n := L.CheckInt(1)
		if n < 1 {
			L.ArgError(1, "interval is empty")
		}
		L.Push(lua.LNumber(int(f*float64(n)) + 1))
	default:
		lo, hi := L.CheckInt(1), L.CheckInt(2)
		if lo > hi {
			L.ArgError(2, "interval is empty")
		}
		L.Push(lua.LNumber(lo + int(f*float64(hi-lo+1))))
	}
	return 1
}

func errorReplyFn(L *lua.LState) int {
	t := L.NewTable()
	t.RawSetString("err", lua.LString(L.CheckString(1)))
	L.Push(t)
	return 1
}

func statusReplyFn(L *lua.LState) int {
	t := L.NewTable()
	t.RawSetString("ok", lua.LString(L.CheckString(1)))
	L.Push(t)
	return 1
}

// raised turns the error that ended the script into its reply, spelled as
// Redis 7 does: "ERR <message> script: <sha>, on @user_script:<line>.".
func (r *run) raised(err error) []byte {
	var msg string
	var ae *lua.ApiError
	if errors.As(err, &ae) {
		if t, ok := ae.Object.(*lua.LTable); ok {
			if e, ok := t.RawGetString("err").(lua.LString); ok {
				msg = string(e) // redis.call's error, a table as in Redis
			}
		}
		if msg == "" {
			msg = ae.Object.String()
		}
	} else {
		msg = err.Error()
	}
	msg = scrubAddresses(msg) // the same reply on every replica
	line := ""
	if msg == r.callErr {
		line = r.callLine
	} else if strings.HasPrefix(msg, "user_script:") {
		rest := msg[len("user_script:"):]
		if i := strings.IndexByte(rest, ':'); i > 0 {
			line = rest[:i]
		}
	}
	if !hasErrorCode(msg) {
		msg = "ERR " + msg
	}
	if line != "" {
		msg += " script: " + r.sha + ", on @user_script:" + line + "."
	}
	return errorReply(msg)
}

// hasErrorCode reports whether msg starts with an upper-case error code
// (ERR, WRONGTYPE, NOSCRIPT...), as a redis.call error does.
func hasErrorCode(msg string) bool {
	i := strings.IndexByte(msg, ' ')
	if i <= 0 {
		return false
	}
	for _, c := range msg[:i] {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// errorReply is a RESP error line (newlines, which would break the
// protocol, become spaces).
func errorReply(msg string) []byte {
	msg = strings.NewReplacer("\r", " ", "\n", " ").Replace(msg)
	return append(append([]byte{'-'}, msg...), '\r', '\n')
}

// addressRE matches how gopher-lua names a value by its address.
var addressRE = regexp.MustCompile(`\b(table|function|userdata|thread|channel): 0x[0-9a-fA-F]+`)

// scrubAddresses takes the addresses out of an error message: what a
// script or its reply sees must not differ between replicas.
func scrubAddresses(msg string) string {
	if !strings.Contains(msg, ": 0x") {
		return msg
	}
	return addressRE.ReplaceAllString(msg, "$1")
}
