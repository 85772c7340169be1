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
	"fmt"
	"strings"
	"sync"
	"time"

	lua "github.com/yuin/gopher-lua"
	luaparse "github.com/yuin/gopher-lua/parse"

	"github.com/kefirdb/kefir/internal/kv"
)

func init() { kv.RegisterScripting(Run) }

// Budget is the number of Lua VM instructions a script may execute; past it
// the script fails with ErrBudget's text, and none of its writes land.
// Counted, not timed, so that every replica stops the script at the same
// instruction. About a second of pure Lua on a current core.
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
		return nil, fmt.Errorf("Error compiling script (new function): %s", strings.TrimSpace(err.Error()))
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
func Run(op *kv.Op, exec kv.ScriptExec) (reply []byte, raised bool) {
	sha := SHA(op.Value)
	proto, err := Compile(op.Value)
	if err != nil {
		return errorReply("ERR " + err.Error()), true
	}
	// A small state that grows on demand: most scripts are a few calls,
	// and a fresh state per script must be cheap.
	L := lua.NewState(lua.Options{SkipOpenLibs: true, CallStackSize: 200, MinimizeStackMemory: true, RegistrySize: 256, RegistryMaxSize: 1 << 20})
	defer L.Close()
	r := &run{L: L, op: op, exec: exec, sha: sha}
	if err := r.sandbox(); err != nil {
		return errorReply("ERR " + err.Error()), true
	}
	L.SetContext(&budget{max: Budget})
	fn := L.NewFunctionFromProto(proto)
	L.Push(fn)
	if err := L.PCall(0, 1, nil); err != nil {
		return r.raised(err), true
	}
	v := L.Get(-1)
	var b []byte
	return appendReply(b, L, v, 0), false
}

// run is one script's execution.
type run struct {
	L    *lua.LState
	op   *kv.Op
	exec kv.ScriptExec
	sha  string
	rng  uint64
	// callErr is the last error redis.call raised (with its line), so that
	// the script's final error reply names it as Redis does.
	callErr  string
	callLine string
}

// sandbox opens the libraries a script may use (base, table, string,
// math), removes what reads files, the clock, the environment or prints,
// makes math.random deterministic, and defines KEYS, ARGV and redis.
func (r *run) sandbox() error {
	L := r.L
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		L.Push(L.NewFunction(lib.open))
		L.Push(lua.LString(lib.name))
		if err := L.PCall(1, 0, nil); err != nil {
			return fmt.Errorf("script: open %s: %w", lib.name, err)
		}
	}
	g := L.G.Global
	for _, name := range []string{"dofile", "loadfile", "print", "require", "module", "collectgarbage", "_printregs", "gcinfo", "_GOPHER_LUA_VERSION"} {
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
	if s, ok := g.RawGetString("string").(*lua.LTable); ok {
		rep := s.RawGetString("rep")
		s.RawSetString("rep", L.NewFunction(func(L *lua.LState) int {
			str, n := L.CheckString(1), L.CheckInt(2)
			if n > 0 && len(str) > 0 && n > MaxString/len(str) {
				L.RaiseError("string.rep: a string longer than %d bytes", MaxString)
			}
			L.Push(rep)
			L.Push(lua.LString(str))
			L.Push(lua.LNumber(n))
			L.Call(2, 1)
			return 1
		}))
	}
	if m, ok := g.RawGetString("math").(*lua.LTable); ok {
		r.rng = 0x9E3779B97F4A7C15 // the same sequence for every script (Redis 6's rule)
		m.RawSetString("random", L.NewFunction(r.random))
		m.RawSetString("randomseed", L.NewFunction(func(L *lua.LState) int {
			r.rng = uint64(L.CheckInt64(1)) | 1
			return 0
		}))
	}
	nk := int(r.op.Delta)
	keys, argv := L.NewTable(), L.NewTable()
	for i, k := range r.op.Keys {
		if i < nk {
			keys.Append(lua.LString(k))
		} else {
			argv.Append(lua.LString(k))
		}
	}
	g.RawSetString("KEYS", keys)
	g.RawSetString("ARGV", argv)
	redis := L.NewTable()
	L.SetFuncs(redis, map[string]lua.LGFunction{
		"call":         func(L *lua.LState) int { return r.call(L, true) },
		"pcall":        func(L *lua.LState) int { return r.call(L, false) },
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
	})
	for name, v := range map[string]int{"LOG_DEBUG": 0, "LOG_VERBOSE": 1, "LOG_NOTICE": 2, "LOG_WARNING": 3} {
		redis.RawSetString(name, lua.LNumber(v))
	}
	g.RawSetString("redis", redis)
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
	L.SetMetatable(g, guard)
	return nil
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
