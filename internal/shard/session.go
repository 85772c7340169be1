package shard

import (
	"fmt"
	"strconv"
	"strings"
)

// Session is the state a session token carries (docs/design/resp-extensions.md):
// the version of the session's last write and the highest version it has read.
// A replica may serve a session read only if it has applied both.
type Session struct {
	LastWrite uint64
	MaxRead   uint64
}

// maxTokenLen is the contract's bound on a token.
const maxTokenLen = 256

// ParseSession parses a token; "" is the fresh session.
func ParseSession(tok string) (Session, error) {
	if tok == "" {
		return Session{}, nil
	}
	if len(tok) > maxTokenLen {
		return Session{}, fmt.Errorf("%w: longer than %d bytes", ErrBadSession, maxTokenLen)
	}
	rest, ok := strings.CutPrefix(tok, "v1.")
	if !ok {
		return Session{}, fmt.Errorf("%w: want v1.<lastWrite>.<maxRead>", ErrBadSession)
	}
	w, r, ok := strings.Cut(rest, ".")
	if !ok {
		return Session{}, fmt.Errorf("%w: want v1.<lastWrite>.<maxRead>", ErrBadSession)
	}
	lw, err1 := strconv.ParseUint(w, 10, 64)
	mr, err2 := strconv.ParseUint(r, 10, 64)
	if err1 != nil || err2 != nil {
		return Session{}, fmt.Errorf("%w: versions must be decimal", ErrBadSession)
	}
	return Session{LastWrite: lw, MaxRead: mr}, nil
}

// String returns the token; the fresh session is "".
func (s Session) String() string {
	if s == (Session{}) {
		return ""
	}
	b := make([]byte, 0, 48)
	b = append(b, "v1."...)
	b = strconv.AppendUint(b, s.LastWrite, 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, s.MaxRead, 10)
	return string(b)
}

// Need is the lowest version a replica must have applied to serve this session.
func (s Session) Need() uint64 { return max(s.LastWrite, s.MaxRead) }

// AfterWrite returns the session advanced by a write that produced r.
func (s Session) AfterWrite(r Result) Session {
	s.LastWrite = max(s.LastWrite, r.Version)
	return s
}

// AfterRead returns the session advanced by a read that produced r.
func (s Session) AfterRead(r Result) Session {
	s.MaxRead = max(s.MaxRead, r.Version)
	return s
}
