package server

import (
	"bytes"
	"strings"
	"sync"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/script"
)

// Scripts at the front door (docs/design/scripting.md): EVAL and its kin
// become one kv.KindEval op carrying the script's body, keys and arguments;
// the state machine runs it (internal/script, at apply, on every replica).
// What is the node's own is the script cache: SCRIPT LOAD and EVAL put
// bodies in it, EVALSHA finds its body there, here, before the op is
// proposed or forwarded — the log and the leader never see a SHA.

// scriptCache is the node's script bodies by SHA1 (hex, lower case), local
// like Redis's. Bodies EVAL added are bounded (evalMax; dropped together
// when full): a client that sends a new script each time must not fill the
// node's memory. SCRIPT LOAD's stay until SCRIPT FLUSH.
type scriptCache struct {
	mu     sync.Mutex
	m      map[string]cachedScript
	evaled int
}

type cachedScript struct {
	body   []byte
	loaded bool // by SCRIPT LOAD (kept), not only by EVAL
}

const evalMax = 1024

func (s *scriptCache) put(body []byte, loaded bool) string {
	sha := script.SHA(body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]cachedScript{}
	}
	old, ok := s.m[sha]
	if ok && (old.loaded || !loaded) {
		return sha
	}
	if !loaded {
		if s.evaled >= evalMax {
			for k, v := range s.m {
				if !v.loaded {
					delete(s.m, k)
				}
			}
			s.evaled = 0
		}
		s.evaled++
	} else if ok {
		s.evaled-- // promoted from EVAL's to SCRIPT LOAD's
	}
	s.m[sha] = cachedScript{body: append([]byte(nil), body...), loaded: loaded || old.loaded}
	return sha
}

func (s *scriptCache) get(sha []byte) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.m[strings.ToLower(string(sha))]
	return c.body, ok
}

func (s *scriptCache) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m, s.evaled = nil, 0
}

var errNoScript = &replyError{"NOSCRIPT No matching script. Please use EVAL."}

// parseScript parses EVAL, EVALSHA, EVAL_RO and EVALSHA_RO into a script op
// (a is the batch's arena for a write, nil for a read),
// with Redis's checks in Redis's order: EVALSHA's lookup, numkeys, EVAL's
// compilation. Now stays 0: the proposing node stamps it, as
// for every write.
func (c *conn) parseScript(spec *command.Spec, args [][]byte, a *arena) (kv.Op, error) {
	body := args[1]
	if spec.Name == "EVALSHA" || spec.Name == "EVALSHA_RO" {
		// Redis looks the SHA up first: EVALSHA of an unknown script
		// answers NOSCRIPT whatever its numkeys.
		b, ok := c.srv.scripts.get(args[1])
		if !ok {
			return kv.Op{}, errNoScript
		}
		body = b
	}
	n, err := command.ParseNumKeys(args)
	if err != nil {
		return kv.Op{}, err
	}
	if spec.Name == "EVAL" || spec.Name == "EVAL_RO" {
		if _, err := script.Compile(body); err != nil {
			return kv.Op{}, errf("ERR %s", err.Error())
		}
		c.srv.scripts.put(body, false)
	}
	// A write's bytes are copied into the batch's arena (a is the
	// connection's); a read (a nil a) runs before the next command is read.
	cp := func(b []byte) []byte { return b }
	if a != nil {
		cp = a.copy
	}
	op := kv.Op{Kind: kv.KindEval, Value: cp(body), Delta: n, Keys: make([][]byte, len(args)-3)}
	if strings.HasSuffix(spec.Name, "_RO") {
		op.Kind = kv.KindEvalRO // a read: conn.read
	}
	for i := 3; i < len(args); i++ {
		op.Keys[i-3] = cp(args[i])
	}
	return op, nil
}

// isScript reports whether spec is EVAL, EVALSHA, EVAL_RO or EVALSHA_RO.
func isScript(spec *command.Spec) bool {
	switch spec.Name {
	case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO":
		return true
	}
	return false
}

// forwardedScript is what a follower forwards for a script op: EVAL (or
// EVAL_RO) with the body, never EVALSHA, whose SHA the leader may not have.
func forwardedScript(op *kv.Op, raw [][]byte) {
	if op.Kind == kv.KindEvalRO {
		raw[0] = []byte("EVAL_RO")
	} else {
		raw[0] = []byte("EVAL")
	}
	raw[1] = op.Value
}

// forwardedScriptArgs is forwardedScript for a read's arguments (a new
// slice: args are the reader's).
func forwardedScriptArgs(op *kv.Op, args [][]byte) [][]byte {
	out := append([][]byte(nil), args...)
	forwardedScript(op, out)
	return out
}

// scriptCmd runs SCRIPT LOAD | EXISTS | FLUSH | KILL.
func (c *conn) scriptCmd(args [][]byte) error {
	w := c.w
	sub := strings.ToUpper(string(args[1]))
	arity := map[string]int{"LOAD": 3, "EXISTS": -3, "FLUSH": -2, "KILL": 2}[sub]
	switch {
	case arity == 0:
		return errf("ERR unknown subcommand '%s'. Try SCRIPT HELP.", clip(args[1]))
	case (arity > 0 && len(args) != arity) || (arity < 0 && len(args) < -arity) || (sub == "FLUSH" && len(args) > 3):
		return errf("ERR wrong number of arguments for 'script|%s' command", strings.ToLower(sub))
	}
	switch sub {
	case "LOAD":
		if _, err := script.Compile(args[2]); err != nil {
			return errf("ERR %s", err.Error())
		}
		return w.WriteBulkString(c.srv.scripts.put(args[2], true))
	case "EXISTS":
		_ = w.WriteArrayHeader(len(args) - 2)
		for _, sha := range args[2:] {
			_, ok := c.srv.scripts.get(sha)
			_ = w.WriteInt(boolInt(ok))
		}
		return nil
	case "FLUSH":
		if len(args) == 3 && !eq(args[2], "ASYNC") && !eq(args[2], "SYNC") {
			return errf("ERR SCRIPT FLUSH only support SYNC|ASYNC option")
		}
		c.srv.scripts.flush()
		return w.WriteSimple("OK")
	}
	// KILL: a script runs inside one op's apply, bounded by its instruction
	// budget: there is never one to kill from outside.
	return errf("NOTBUSY No scripts in execution right now.")
}

// writeReply writes a script's reply (kv.ResReply: RESP2 bytes), in the
// connection's protocol (a nil is "_" in RESP3).
func (c *conn) writeReply(b []byte) {
	if c.w.Protocol() == 2 {
		_ = c.w.WriteRaw(b) // RESP2 already, written by the state machine
		return
	}
	if bytes.Equal(b, kv.NullArray) {
		_ = c.w.WriteNullArray() // an EXEC whose watched key changed (tx.go)
		return
	}
	v, err := resp.NewReader(bytes.NewReader(b), len(b)+16).ReadValue()
	if err != nil {
		_ = c.w.WriteError("ERR script reply: " + err.Error())
		return
	}
	_ = c.w.WriteValue(execToResp3(v, c.execShapes))
}
