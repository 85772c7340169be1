package client

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Session is a causal session: its reads see its own writes and never go back in
// time (ARCHITECTURE §2, level "session"), on whichever connection or node serves
// them. It carries a session token that every call sends (KEFIR.CALL SESSION) and
// that every reply advances. A Session is safe for concurrent use; to continue a
// session in another process, pass Token() along and call SetToken there.
type Session struct {
	c     *Client
	mu    sync.Mutex
	token string
}

// Session starts a fresh session (empty token).
func (c *Client) Session() *Session { return &Session{c: c} }

// Token returns the current session token.
func (s *Session) Token() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.token
}

// SetToken replaces the session token, e.g. to resume a session.
func (s *Session) SetToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.token = token
}

// Resume is SetToken for a token from elsewhere (another process, a store): it
// refuses, with an error wrapping ErrBadSessionToken that says what is wrong, a
// token this client cannot read, instead of sending it with every call.
func (s *Session) Resume(token string) error {
	if _, err := parseToken(token); err != nil {
		return err
	}
	s.SetToken(token)
	return nil
}

// advance merges a token from a reply. Replies of concurrent calls can arrive in
// any order; for tokens in the formats this client knows the merge takes the
// larger version of each part (with its view), so the session never moves
// backwards. A token in a format this client does not know replaces the current
// one.
func (s *Session) advance(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if merged, ok := mergeTokens(s.token, token); ok {
		s.token = merged
		return
	}
	s.token = token
}

func mergeTokens(a, b string) (string, bool) {
	if a == "" {
		return b, true
	}
	ta, errA := parseToken(a)
	tb, errB := parseToken(b)
	if errA != nil || errB != nil {
		return "", false
	}
	ta.write = ta.write.merge(tb.write)
	ta.read = ta.read.merge(tb.read)
	return ta.String(), true
}

// A session token (the server's formats; internal/shard session.go, which a
// test keeps this parser in step with):
//
//	v1.<lastWrite>.<maxRead>
//	v2.<lastWrite>.<writeView>.<maxRead>.<readView>
//
// A view is the replica group's view the version's op was ordered in, "-" when
// unknown; the server answers a session whose write a view change dropped with
// ErrSessionLost. A token without any known view is written as v1.
type token struct{ write, read tokenPart }

type tokenPart struct {
	version, view uint64
	known         bool // view is known
}

// merge returns the later of two parts: the higher version, with its view;
// at an equal version a known view wins over an unknown one.
func (p tokenPart) merge(q tokenPart) tokenPart {
	if q.version > p.version || (q.version == p.version && !p.known && q.known) {
		return q
	}
	return p
}

const maxTokenLen = 256

func parseToken(t string) (token, error) {
	bad := func(why string) (token, error) {
		return token{}, fmt.Errorf("%w %q: %s", ErrBadSessionToken, t, why)
	}
	if len(t) > maxTokenLen {
		return bad(fmt.Sprintf("longer than %d bytes", maxTokenLen))
	}
	if t == "" {
		return token{}, nil
	}
	var tok token
	if rest, ok := strings.CutPrefix(t, "v2."); ok {
		parts := strings.Split(rest, ".")
		if len(parts) != 4 {
			return bad("want v2.<lastWrite>.<writeView>.<maxRead>.<readView>")
		}
		var errs [4]error
		tok.write.version, errs[0] = strconv.ParseUint(parts[0], 10, 64)
		tok.write.view, tok.write.known, errs[1] = parseTokenView(parts[1])
		tok.read.version, errs[2] = strconv.ParseUint(parts[2], 10, 64)
		tok.read.view, tok.read.known, errs[3] = parseTokenView(parts[3])
		for _, err := range errs {
			if err != nil {
				return bad("versions must be decimal, views decimal or -")
			}
		}
		return tok, nil
	}
	rest, ok := strings.CutPrefix(t, "v1.")
	if !ok {
		return bad("want v1.<lastWrite>.<maxRead> or v2.<lastWrite>.<writeView>.<maxRead>.<readView>")
	}
	ws, rs, ok := strings.Cut(rest, ".")
	if !ok {
		return bad("want v1.<lastWrite>.<maxRead>")
	}
	var err1, err2 error
	tok.write.version, err1 = strconv.ParseUint(ws, 10, 64)
	tok.read.version, err2 = strconv.ParseUint(rs, 10, 64)
	if err1 != nil || err2 != nil {
		return bad("versions must be decimal")
	}
	return tok, nil
}

func parseTokenView(s string) (uint64, bool, error) {
	if s == "-" {
		return 0, false, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil, err
}

func (t token) String() string {
	if !t.write.known && !t.read.known {
		return "v1." + strconv.FormatUint(t.write.version, 10) + "." + strconv.FormatUint(t.read.version, 10)
	}
	view := func(p tokenPart) string {
		if !p.known {
			return "-"
		}
		return strconv.FormatUint(p.view, 10)
	}
	return "v2." + strconv.FormatUint(t.write.version, 10) + "." + view(t.write) + "." +
		strconv.FormatUint(t.read.version, 10) + "." + view(t.read)
}

// Get is Client.Get within the session.
func (s *Session) Get(ctx context.Context, key string, opts ...CallOption) ([]byte, error) {
	return s.c.get(ctx, s, key, opts)
}

// Put is Client.Put within the session.
func (s *Session) Put(ctx context.Context, key string, value []byte, opts ...CallOption) error {
	return s.c.put(ctx, s, key, value, opts)
}

// Delete is Client.Delete within the session.
func (s *Session) Delete(ctx context.Context, key string, opts ...CallOption) (bool, error) {
	return s.c.del(ctx, s, key, opts)
}

// CAS is Client.CAS within the session.
func (s *Session) CAS(ctx context.Context, key string, expected, value []byte, opts ...CallOption) (bool, error) {
	return s.c.cas(ctx, s, key, expected, value, opts)
}

// Incr is Client.Incr within the session.
func (s *Session) Incr(ctx context.Context, key string, delta int64, opts ...CallOption) (int64, error) {
	return s.c.incr(ctx, s, key, delta, opts)
}

// MultiGet is Client.MultiGet within the session.
func (s *Session) MultiGet(ctx context.Context, keys []string, opts ...CallOption) ([][]byte, error) {
	return s.c.multiGet(ctx, s, keys, opts)
}

// MultiPut is Client.MultiPut within the session.
func (s *Session) MultiPut(ctx context.Context, kvs []KV, opts ...CallOption) error {
	return s.c.multiPut(ctx, s, kvs, opts)
}

// Scan is Client.Scan within the session.
func (s *Session) Scan(ctx context.Context, start, end string, limit int, opts ...CallOption) ([]KV, error) {
	return s.c.scan(ctx, s, start, end, limit, opts)
}
