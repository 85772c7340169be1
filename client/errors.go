package client

import (
	"errors"
	"strings"
)

// Errors callers branch on with errors.Is.
var (
	// ErrNotFound: the key does not exist (Get), or the server answered -NOTFOUND.
	ErrNotFound = errors.New("kefir: not found")
	// ErrWrongType: the value is not what the operation needs (-WRONGTYPE). An
	// ErrNotInteger error matches it too, because Incr on a non-integer was
	// documented as ErrWrongType before the server answered as Redis does.
	ErrWrongType = errors.New("kefir: wrong type")
	// ErrNotInteger: Incr on a value that is not a decimal integer in the 64-bit
	// range (-ERR value is not an integer or out of range, as Redis answers).
	ErrNotInteger = errors.New("kefir: value is not an integer")
	// ErrTimeout: the context's deadline passed before the reply arrived. Errors that
	// are ErrTimeout also match context.DeadlineExceeded.
	ErrTimeout = errors.New("kefir: timeout")
	// ErrUnknownOutcome: a write was sent but its fate is unknown — the connection died
	// or the deadline passed after it left the client, and a retry with the same
	// request id could not settle it. It may or may not have been applied; it will
	// not be applied twice.
	ErrUnknownOutcome = errors.New("kefir: write outcome unknown")
	// ErrUnavailable: no server could be reached, or the server answered -UNAVAILABLE
	// (shutting down, fsync failed, no leader). Nothing was applied.
	ErrUnavailable = errors.New("kefir: unavailable")
	// ErrAuth: the server refused the password (-NOAUTH, -WRONGPASS).
	ErrAuth = errors.New("kefir: authentication failed")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("kefir: client closed")
	// ErrSessionLost: the Session saw a write that a crash of a single node took
	// back (an async or cad write acknowledged before it was durable), or, in a
	// replica group, that a view change dropped and whose op number went to
	// another write. The server refuses to serve it rather than answer without
	// the session's own writes; start a new Session. Not retryable.
	ErrSessionLost = errors.New("kefir: session lost writes in a crash")
	// ErrBadSessionToken: Session.Resume was given a token this client cannot
	// read (the error says why).
	ErrBadSessionToken = errors.New("kefir: bad session token")
)

// notIntegerMsg is Redis's reply text, after the prefix, for INCR on a
// non-integer. Earlier Kefir servers sent it with -WRONGTYPE.
const notIntegerMsg = "value is not an integer or out of range"

// sessionLostMsg starts the server's reply for a session that saw lost writes
// (shard.ErrSessionLost).
const sessionLostMsg = "ERR session token refers to writes lost in a crash"

// Error is an error reply from the server that has no sentinel of its own
// (-ERR bad arguments, unknown command, unsupported level, ...). Replies that do have
// one (-WRONGTYPE, -NOTFOUND, -UNAVAILABLE, -NOAUTH, -WRONGPASS, -ERR value is not
// an integer ...) are also *Error, so
// the message stays available via errors.As, and they match their sentinel via
// errors.Is.
type Error struct {
	// Prefix is the first word of the reply ("ERR", "WRONGTYPE", "MOVED").
	Prefix string
	// Msg is the whole reply without the leading '-'.
	Msg string
}

func (e *Error) Error() string { return "kefir: server error: " + e.Msg }

// Is maps the reply prefix to the package's sentinels (resp-extensions.md, "Errors").
func (e *Error) Is(target error) bool {
	switch target {
	case ErrWrongType:
		return e.Prefix == "WRONGTYPE" || e.notInteger()
	case ErrNotInteger:
		return e.notInteger()
	case ErrNotFound:
		return e.Prefix == "NOTFOUND"
	case ErrUnavailable:
		return e.Prefix == "UNAVAILABLE" || e.Prefix == "TRYAGAIN" || e.Prefix == "LOADING"
	case ErrAuth:
		return e.Prefix == "NOAUTH" || e.Prefix == "WRONGPASS"
	case ErrSessionLost:
		return strings.HasPrefix(e.Msg, sessionLostMsg)
	}
	return false
}

func (e *Error) notInteger() bool {
	_, rest, _ := strings.Cut(e.Msg, " ")
	return (e.Prefix == "ERR" || e.Prefix == "WRONGTYPE") && strings.HasPrefix(rest, notIntegerMsg)
}

func serverError(msg []byte) *Error {
	s := string(msg)
	prefix, _, _ := strings.Cut(s, " ")
	return &Error{Prefix: prefix, Msg: s}
}

// isStale reports whether err is the server's answer to a request id older than the
// latest one it executed for that client id.
func isStale(err error) bool {
	var se *Error
	return errors.As(err, &se) && se.Prefix == "ERR" && strings.HasPrefix(se.Msg, "ERR stale request")
}

// Internal outcomes of one attempt on one connection, which Client.do turns into
// the public errors above.
var (
	// errNotSent: the request never left the client; retrying is always safe.
	errNotSent = errors.New("kefir: request not sent")
	// errConnLost: the connection died after the request was sent.
	errConnLost = errors.New("kefir: connection lost")
)
