package script

import (
	"errors"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
)

// A transaction's commands (MULTI ... EXEC, kv.KindExec;
// docs/design/transactions.md) are parsed and run by the machinery redis.call
// uses (prepare, parse): the commands a transaction may queue are the ones a
// script may call, read by one parser.

func init() { kv.RegisterCommands(RunCommand) }

// RunCommand runs one queued command of a transaction through exec (the
// transaction's overlay) and appends its reply, RESP2, to b: the command's
// error reply for a parse or runtime error (the other commands still run, as
// in Redis). now is the transaction's clock, rnd its random source.
func RunCommand(b []byte, argv [][]byte, now int64, rnd *kv.OpRand, exec kv.ScriptExec) []byte {
	if r, ok := connReply(argv); ok {
		return append(b, r...)
	}
	if spec, ok := command.Lookup(argv[0]); ok && isEval(spec) {
		return append(b, evalInTx(spec, argv, now, rnd, exec)...)
	}
	res, err := do(argv, now, rnd, exec)
	if err != nil {
		return append(b, errorReply(txErrText(err))...)
	}
	return appendResult(b, res)
}

// txErrText is a command error's reply text in a transaction: the front
// door's (a script's differ only in the read-only and undeclared-key cases,
// which a transaction meets as these texts too).
func txErrText(err error) string {
	if errors.Is(err, kv.ErrScriptUndeclaredKey) {
		return "CROSSSLOT Keys in request don't hash to the same slot"
	}
	return errText(err)
}

// evalInTx runs EVAL body numkeys key... arg... inside a transaction: the
// script's commands run over the transaction's overlay (exec), as the
// transaction's own do, so it reads the transaction's earlier writes and the
// commands after it read its writes. A script that raises keeps the writes
// it made before it raised, as Redis's EVAL inside EXEC does (Redis never
// undoes a script's writes); an EVAL outside MULTI is its own op and lands
// none of them (docs/design/scripting.md). The transaction itself stays all
// or nothing: its records land together or not at all. EVALSHA reaches here
// only with a SHA the proposing node did not know (the front door turns a
// known one into EVAL with its body, so no replica needs a script cache):
// NOSCRIPT, as Redis answers at EXEC.
func evalInTx(spec *command.Spec, argv [][]byte, now int64, rnd *kv.OpRand, exec kv.ScriptExec) []byte {
	if strings.HasPrefix(spec.Name, "EVALSHA") {
		return errorReply("NOSCRIPT No matching script. Please use EVAL.")
	}
	n, err := command.ParseNumKeys(argv)
	if err != nil {
		return errorReply(txErrText(err))
	}
	op := kv.Op{Kind: kv.KindEval, Value: argv[1], Keys: argv[3:], Delta: n, Now: now}
	if spec.Name == "EVAL_RO" {
		// Its writes are refused, as EVAL_RO's outside (the overlay's op
		// is the transaction's, which may write).
		write := exec
		exec = func(sub *kv.Op) (kv.Result, error) {
			if sub.Kind.IsUpdate() {
				return kv.Result{}, kv.ErrScriptReadOnly
			}
			return write(sub)
		}
	}
	reply, _ := Run(&op, rnd, exec)
	return reply
}

// isEval reports whether spec is EVAL, EVALSHA, EVAL_RO or EVALSHA_RO.
func isEval(spec *command.Spec) bool {
	switch spec.Name {
	case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO":
		return true
	}
	return false
}

// Queueable reports why argv (a known command of the right arity) cannot be
// queued in a transaction, or nil: the commands a script cannot call cannot
// be in a transaction either (EVAL, blocking and admin commands, range reads).
func Queueable(spec *command.Spec, argv [][]byte) error {
	if _, ok := connReply(argv); ok {
		return nil
	}
	if isEval(spec) {
		return nil // evalInTx
	}
	if spec.Name == "OBJECT" {
		if _, err := command.ObjectSubcommand(argv); err != nil {
			return err // Redis's subcommands are commands: checked when queued
		}
	}
	if _, _, err := parse(spec, argv, 0); err != nil {
		var nc notCallable
		if errors.As(err, &nc) {
			return command.ReplyError("ERR command '" + strings.ToLower(spec.Name) + "' can not be used inside MULTI in Kefir (see docs/design/transactions.md)")
		}
	}
	return nil
}

// connReply is the reply of the connection commands Redis lets a
// transaction hold, which touch no state: PING, ECHO, and UNWATCH (a no-op
// there: EXEC compared the watches before the commands ran). ok false for
// any other command (or arity).
func connReply(argv [][]byte) ([]byte, bool) {
	switch {
	case command.Eq(argv[0], "PING") && len(argv) == 1:
		return []byte("+PONG\r\n"), true
	case command.Eq(argv[0], "PING") && len(argv) == 2, command.Eq(argv[0], "ECHO") && len(argv) == 2:
		return appendBulk(nil, argv[1]), true
	case command.Eq(argv[0], "UNWATCH") && len(argv) == 1:
		return []byte("+OK\r\n"), true
	}
	return nil, false
}

// appendResult appends res as RESP2, as the front door writes a command's
// result (internal/server writeResult) in RESP2.
func appendResult(b []byte, res kv.Result) []byte {
	switch res.Kind {
	case kv.ResOK:
		return append(b, "+OK\r\n"...)
	case kv.ResInt:
		b = append(b, ':')
		b = strconv.AppendInt(b, res.Int, 10)
		return append(b, '\r', '\n')
	case kv.ResBulk:
		return appendBulk(b, res.Bulk)
	case kv.ResArray:
		b = append(b, '*')
		b = strconv.AppendInt(b, int64(len(res.Array)), 10)
		b = append(b, '\r', '\n')
		for _, e := range res.Array {
			if e == nil {
				b = append(b, "$-1\r\n"...)
			} else {
				b = appendBulk(b, e)
			}
		}
		return b
	case kv.ResReply:
		return append(b, res.Bulk...)
	}
	return append(b, "$-1\r\n"...)
}

func appendBulk(b, v []byte) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(v)), 10)
	b = append(b, '\r', '\n')
	b = append(b, v...)
	return append(b, '\r', '\n')
}
