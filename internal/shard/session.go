package shard

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
)

// Session is the state a session token carries (docs/design/resp-extensions.md):
// the version of the session's last write and the highest version it has read,
// each with the view its op was ordered in when the shard knows it (a replica
// group: kv.Result.View). A replica may serve a session read only if it has applied
// both, and, where it knows the view of its op at that version, only if it is the
// token's: otherwise the version the session saw was dropped by a view change
// (ErrSessionLost).
type Session struct {
	LastWrite uint64
	MaxRead   uint64
	// WriteView (if WriteViewKnown) is the view of op LastWrite, ReadView (if
	// ReadViewKnown) that of op MaxRead.
	WriteView, ReadView           uint64
	WriteViewKnown, ReadViewKnown bool
}

// maxTokenLen is the contract's bound on a token.
const maxTokenLen = 256

// Token formats:
//
//	v1.<lastWrite>.<maxRead>
//	v2.<lastWrite>.<writeView>.<maxRead>.<readView>
//
// decimal numbers; a view is "-" when unknown. A session whose views are both
// unknown (a single node) is written as v1, so tokens stay readable by older
// servers and clients; v1 tokens parse with both views unknown.
const (
	tokenV1 = "v1."
	tokenV2 = "v2."
)

// ParseSession parses a token; "" is the fresh session.
func ParseSession(tok string) (Session, error) {
	if tok == "" {
		return Session{}, nil
	}
	if len(tok) > maxTokenLen {
		return Session{}, fmt.Errorf("%w: longer than %d bytes", ErrBadSession, maxTokenLen)
	}
	if rest, ok := strings.CutPrefix(tok, tokenV2); ok {
		parts := strings.Split(rest, ".")
		if len(parts) != 4 {
			return Session{}, fmt.Errorf("%w: want v2.<lastWrite>.<writeView>.<maxRead>.<readView>", ErrBadSession)
		}
		var s Session
		var err [4]error
		s.LastWrite, err[0] = strconv.ParseUint(parts[0], 10, 64)
		s.WriteView, s.WriteViewKnown, err[1] = parseView(parts[1])
		s.MaxRead, err[2] = strconv.ParseUint(parts[2], 10, 64)
		s.ReadView, s.ReadViewKnown, err[3] = parseView(parts[3])
		for _, e := range err {
			if e != nil {
				return Session{}, fmt.Errorf("%w: versions must be decimal, views decimal or -", ErrBadSession)
			}
		}
		return s, nil
	}
	rest, ok := strings.CutPrefix(tok, tokenV1)
	if !ok {
		return Session{}, fmt.Errorf("%w: want v1.<lastWrite>.<maxRead> or v2.<lastWrite>.<writeView>.<maxRead>.<readView>", ErrBadSession)
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

func parseView(s string) (view uint64, known bool, err error) {
	if s == "-" {
		return 0, false, nil
	}
	view, err = strconv.ParseUint(s, 10, 64)
	return view, err == nil, err
}

func appendView(b []byte, view uint64, known bool) []byte {
	if !known {
		return append(b, '-')
	}
	return strconv.AppendUint(b, view, 10)
}

// String returns the token; the fresh session is "".
func (s Session) String() string {
	if s == (Session{}) {
		return ""
	}
	b := make([]byte, 0, 64)
	if !s.WriteViewKnown && !s.ReadViewKnown {
		b = append(b, tokenV1...)
		b = strconv.AppendUint(b, s.LastWrite, 10)
		b = append(b, '.')
		b = strconv.AppendUint(b, s.MaxRead, 10)
		return string(b)
	}
	b = append(b, tokenV2...)
	b = strconv.AppendUint(b, s.LastWrite, 10)
	b = append(b, '.')
	b = appendView(b, s.WriteView, s.WriteViewKnown)
	b = append(b, '.')
	b = strconv.AppendUint(b, s.MaxRead, 10)
	b = append(b, '.')
	b = appendView(b, s.ReadView, s.ReadViewKnown)
	return string(b)
}

// Need is the lowest version a replica must have applied to serve this session.
func (s Session) Need() uint64 { return max(s.LastWrite, s.MaxRead) }

// AfterWrite returns the session advanced by a write that produced r.
func (s Session) AfterWrite(r kv.Result) Session {
	s.LastWrite, s.WriteView, s.WriteViewKnown = advance(s.LastWrite, s.WriteView, s.WriteViewKnown, r)
	return s
}

// AfterRead returns the session advanced by a read that produced r.
func (s Session) AfterRead(r kv.Result) Session {
	s.MaxRead, s.ReadView, s.ReadViewKnown = advance(s.MaxRead, s.ReadView, s.ReadViewKnown, r)
	return s
}

// advance moves a token part (version v with its view) to r's version if that
// is higher; the view goes with the version. At an equal version an unknown
// view is filled in from r.
func advance(v, view uint64, known bool, r kv.Result) (uint64, uint64, bool) {
	switch {
	case r.Version > v:
		return r.Version, r.View, r.ViewKnown
	case r.Version == v && !known && r.ViewKnown:
		return v, r.View, true
	}
	return v, view, known
}
