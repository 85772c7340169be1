package client

import (
	"context"
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

// advance merges a token from a reply. Replies of concurrent calls can arrive in
// any order; for tokens in today's format (v1.<lastWrite>.<maxRead>) the merge
// takes the larger of each part, so the session never moves backwards. A token in
// a format this client does not know replaces the current one.
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
	aw, ar, okA := parseV1(a)
	bw, br, okB := parseV1(b)
	switch {
	case a == "":
		return b, true
	case !okA || !okB:
		return "", false
	}
	return "v1." + strconv.FormatUint(max(aw, bw), 10) + "." + strconv.FormatUint(max(ar, br), 10), true
}

func parseV1(t string) (write, read uint64, ok bool) {
	rest, found := strings.CutPrefix(t, "v1.")
	if !found {
		return 0, 0, false
	}
	ws, rs, found := strings.Cut(rest, ".")
	if !found {
		return 0, 0, false
	}
	w, err1 := strconv.ParseUint(ws, 10, 64)
	r, err2 := strconv.ParseUint(rs, 10, 64)
	return w, r, err1 == nil && err2 == nil
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
