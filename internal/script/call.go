package script

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"

	lua "github.com/yuin/gopher-lua"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
)

// call is redis.call (raise true: an error is raised, as a table {err=...})
// and redis.pcall (an error is returned as that table).
func (r *run) call(L *lua.LState, raise bool) int {
	n := L.GetTop()
	if n == 0 {
		return r.fail(L, raise, "ERR Please specify at least one argument for this redis lib call")
	}
	argv := make([][]byte, n)
	for i := 1; i <= n; i++ {
		switch v := L.Get(i).(type) {
		case lua.LString:
			argv[i-1] = []byte(v)
		case lua.LNumber:
			argv[i-1] = []byte(lua.LVAsString(v)) // Lua's own number formatting, as Redis's lua_tolstring
		default:
			return r.fail(L, raise, "ERR Lua redis lib command arguments must be strings or integers")
		}
	}
	res, err := do(argv, r.op.Now, r.rnd, r.exec)
	if err != nil {
		return r.fail(L, raise, errText(err))
	}
	L.Push(toLua(L, res))
	return 1
}

// do runs the command argv through exec (a script's or a transaction's
// overlay) at the op's clock now, picking with the op's random source rnd:
// its result as its reply, or its error (a command.ReplyError for a refusal
// before it ran).
func do(argv [][]byte, now int64, rnd *kv.OpRand, exec kv.ScriptExec) (kv.Result, error) {
	op, shape, msg := prepare(argv, now)
	if msg != "" {
		return kv.Result{}, command.ReplyError(msg)
	}
	if shape == composite {
		return runComposite(argv, rnd, func(op kv.Op) (kv.Result, error) { return exec(&op) })
	}
	res, err := exec(&op)
	if err != nil {
		return kv.Result{}, err
	}
	return shaped(&op, res, shape), nil
}

// prepare turns a command's argument vector into a kv op, as redis.call
// and a transaction's command (tx.go) need it: now is the op's clock. A
// non-empty msg is the command's error reply.
func prepare(argv [][]byte, now int64) (kv.Op, shape, string) {
	spec, ok := command.Lookup(argv[0])
	if !ok {
		return kv.Op{}, asIs, "ERR Unknown Redis command called from script"
	}
	if spec.Has(command.Unsupported) {
		return kv.Op{}, asIs, command.UnsupportedError(spec.Name) // the front door's one text
	}
	if !spec.ArityOK(len(argv)) {
		return kv.Op{}, asIs, "ERR Wrong number of args calling Redis command from script"
	}
	op, shape, err := parse(spec, argv, now)
	if err != nil {
		return kv.Op{}, asIs, errText(err)
	}
	return op, shape, ""
}

// fail raises msg as redis.call's error table, or returns it (pcall).
func (r *run) fail(L *lua.LState, raise bool, msg string) int {
	t := L.NewTable()
	t.RawSetString("err", lua.LString(msg))
	if raise {
		r.callErr = msg
		r.callLine = ""
		if w := L.Where(1); strings.HasPrefix(w, "user_script:") {
			r.callLine = strings.TrimSuffix(strings.TrimPrefix(w, "user_script:"), ":")
		}
		L.Error(t, 1)
	}
	L.Push(t)
	return 1
}

// errText is a command error's reply text, as the front door spells it
// (internal/server errorText) for the errors a command inside a script can
// meet.
func errText(err error) string {
	var re command.ReplyError
	var nc notCallable
	switch {
	case errors.As(err, &re):
		return string(re)
	case errors.As(err, &nc):
		return string(nc)
	case errors.Is(err, kv.ErrWrongKind):
		return kv.ErrWrongKind.Error()
	case errors.Is(err, kv.ErrWrongType):
		return "ERR value is not an integer or out of range"
	case errors.Is(err, kv.ErrScriptReadOnly):
		return "ERR Write commands are not allowed from read-only scripts."
	case errors.Is(err, kv.ErrScriptUndeclaredKey):
		return kv.ErrScriptUndeclaredKey.Error()
	case errors.Is(err, kv.ErrScanOneGroup):
		return kv.ErrScanOneGroup.Error()
	case errors.Is(err, kv.ErrFlushOneGroup):
		return kv.ErrFlushOneGroup.Error()
	case errors.Is(err, kv.ErrOpRangeReads):
		return kv.ErrOpRangeReads.Error()
	}
	return "ERR " + err.Error()
}

// toLua converts a command's result to Lua as Redis does: status → {ok=},
// integer → number, bulk → string, nil → false, array → table (nil → false);
// a reply already in RESP2 (kv.ResReply: BITFIELD's array of integers and
// nils) element by element, the same way.
func toLua(L *lua.LState, res kv.Result) lua.LValue {
	switch res.Kind {
	case kv.ResReply:
		v, _ := respToLua(L, res.Bulk)
		return v
	case kv.ResOK:
		t := L.NewTable()
		t.RawSetString("ok", lua.LString("OK"))
		return t
	case kv.ResInt:
		return lua.LNumber(res.Int)
	case kv.ResBulk:
		return lua.LString(res.Bulk)
	case kv.ResArray:
		t := L.CreateTable(len(res.Array), 0)
		for _, b := range res.Array {
			if b == nil {
				t.Append(lua.LFalse)
			} else {
				t.Append(lua.LString(b))
			}
		}
		return t
	}
	return lua.LFalse
}

// maxDepth bounds the nesting of a script's reply (Redis: the Lua stack).
const maxDepth = 64

// appendReply appends v, a script's return value, as RESP2, converted as
// Redis does: string → bulk, number → integer (truncated), true → 1, false
// and nil → nil bulk, {err=} → error, {ok=} → status, other tables → array of
// their elements 1.. up to the first nil.
func appendReply(b []byte, L *lua.LState, v lua.LValue, depth int) []byte {
	switch v := v.(type) {
	case lua.LString:
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, '\r', '\n')
		b = append(b, v...)
		return append(b, '\r', '\n')
	case lua.LNumber:
		f := float64(v)
		// Truncated toward zero, and clamped: float64(MaxInt64) is 2^63,
		// and converting 2^63 or more to int64 differs between CPUs
		// (amd64 gives MinInt64, arm64 MaxInt64), so replicas could differ.
		var n int64
		switch {
		case math.IsNaN(f):
		case f >= math.MaxInt64:
			n = math.MaxInt64
		case f <= math.MinInt64:
			n = math.MinInt64
		default:
			n = int64(f)
		}
		b = append(b, ':')
		b = strconv.AppendInt(b, n, 10)
		return append(b, '\r', '\n')
	case lua.LBool:
		if v {
			return append(b, ":1\r\n"...)
		}
	case *lua.LTable:
		if e, ok := v.RawGetString("err").(lua.LString); ok {
			return append(b, errorReply(string(e))...)
		}
		if s, ok := v.RawGetString("ok").(lua.LString); ok {
			msg := strings.NewReplacer("\r", " ", "\n", " ").Replace(string(s))
			return append(append(append(b, '+'), msg...), '\r', '\n')
		}
		if depth >= maxDepth {
			return append(b, errorReply("ERR reached lua stack limit")...)
		}
		n := 0
		for v.RawGetInt(n+1) != lua.LNil {
			n++
		}
		b = append(b, '*')
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, '\r', '\n')
		for i := 1; i <= n; i++ {
			b = appendReply(b, L, v.RawGetInt(i), depth+1)
		}
		return b
	}
	return append(b, "$-1\r\n"...)
}

// respToLua converts the RESP2 value at the start of b to Lua as toLua
// does, and returns what follows it. Malformed bytes (never what a command
// answers) are false.
func respToLua(L *lua.LState, b []byte) (lua.LValue, []byte) {
	i := bytes.Index(b, []byte("\r\n"))
	if len(b) == 0 || i < 0 {
		return lua.LFalse, nil
	}
	line, rest := string(b[1:i]), b[i+2:]
	switch b[0] {
	case '+':
		t := L.NewTable()
		t.RawSetString("ok", lua.LString(line))
		return t, rest
	case '-':
		t := L.NewTable()
		t.RawSetString("err", lua.LString(line))
		return t, rest
	case ':':
		n, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			return lua.LFalse, nil
		}
		return lua.LNumber(n), rest
	case '$':
		n, err := strconv.Atoi(line)
		if err != nil || n < 0 || n+2 > len(rest) {
			return lua.LFalse, rest
		}
		return lua.LString(rest[:n]), rest[n+2:]
	case '*':
		n, err := strconv.Atoi(line)
		if err != nil || n < 0 {
			return lua.LFalse, rest
		}
		t := L.CreateTable(n, 0)
		for range n {
			var v lua.LValue
			v, rest = respToLua(L, rest)
			t.Append(v)
		}
		return t, rest
	}
	return lua.LFalse, nil
}
