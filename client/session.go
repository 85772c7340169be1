package client

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kefirdb/kefir/internal/token"
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

// mergeTokens merges two tokens by internal/token's rules (each group's later
// part), false if either does not parse.
func mergeTokens(a, b string) (string, bool) {
	if a == "" {
		return b, true
	}
	ta, errA := token.Parse(a)
	tb, errB := token.Parse(b)
	if errA != nil || errB != nil {
		return "", false
	}
	return ta.Merge(tb).String(), true
}

// parseToken parses a session token (the server's formats: internal/token,
// which the server reads them with), wrapping its error in
// ErrBadSessionToken.
func parseToken(t string) (token.Session, error) {
	s, err := token.Parse(t)
	if err != nil {
		why := err.Error()
		if pe := (*token.ParseError)(nil); errors.As(err, &pe) {
			why = pe.Why
		}
		return token.Session{}, fmt.Errorf("%w %.80q: %s", ErrBadSessionToken, t, why)
	}
	return s, nil
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
	return s.c.scan(ctx, s, nil, start, end, limit, opts)
}

// ScanInto is Client.ScanInto within the session.
func (s *Session) ScanInto(ctx context.Context, buf *ScanBuffer, start, end string, limit int, opts ...CallOption) ([]KV, error) {
	return s.c.scan(ctx, s, buf, start, end, limit, opts)
}
