package client

import (
	"cmp"
	"context"
	"fmt"
	"slices"
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
	for _, q := range tb.groups {
		i, ok := slices.BinarySearchFunc(ta.groups, q.group, func(p groupPart, g uint32) int { return cmp.Compare(p.group, g) })
		if !ok {
			ta.groups = slices.Insert(ta.groups, i, q)
			continue
		}
		ta.groups[i].write = ta.groups[i].write.merge(q.write)
		ta.groups[i].read = ta.groups[i].read.merge(q.read)
	}
	return ta.String(), true
}

// A session token (the server's formats; internal/shard session.go, which a
// test keeps this parser in step with):
//
//	v1.<lastWrite>.<maxRead>
//	v2.<lastWrite>.<writeView>.<maxRead>.<readView>
//	v3.<group>:<lastWrite>.<writeView>.<maxRead>.<readView>[,<group>:...]
//
// A view is the replica group's view the version's op was ordered in, "-" when
// unknown; the server answers a session whose write a view change dropped with
// ErrSessionLost. A token without any known view is written as v1. A node of
// several replica groups (a cluster) keeps one part per group, each group's
// log having its own versions: v3, parts by increasing group, group 0 the
// one-log part (only if not zero), parts of zeros left out; merging takes each
// group's later part.
type token struct {
	write, read tokenPart
	groups      []groupPart // by increasing group, none zero
}

// groupPart is a v3 token's part of one group (1 and up).
type groupPart struct {
	group       uint32
	write, read tokenPart
}

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

// The server's bounds: a v1 or v2 token is at most maxTokenLen bytes; a v3
// one at most maxTokenGroups parts of at most maxPartLen bytes each.
const (
	maxTokenLen    = 256
	maxTokenGroups = 1024
	maxPartLen     = 11 + 4*20 + 3 + 1
	maxTokenV3Len  = len("v3.") + maxTokenGroups*maxPartLen
)

func parseToken(t string) (token, error) {
	bad := func(why string) (token, error) {
		return token{}, fmt.Errorf("%w %.80q: %s", ErrBadSessionToken, t, why)
	}
	if t == "" {
		return token{}, nil
	}
	if rest, ok := strings.CutPrefix(t, "v3."); ok {
		if len(t) > maxTokenV3Len {
			return bad(fmt.Sprintf("a v3 token is at most %d bytes", maxTokenV3Len))
		}
		if n := strings.Count(rest, ",") + 1; n > maxTokenGroups {
			return bad(fmt.Sprintf("names %d groups, at most %d", n, maxTokenGroups))
		}
		var tok token
		prev := int64(-1)
		for part := range strings.SplitSeq(rest, ",") {
			gs, pos, ok := strings.Cut(part, ":")
			g, err := strconv.ParseUint(gs, 10, 32)
			if !ok || err != nil {
				return bad("want v3.<group>:<lastWrite>.<writeView>.<maxRead>.<readView>[,<group>:...]")
			}
			if int64(g) <= prev {
				return bad("groups must be listed once each, by increasing id")
			}
			prev = int64(g)
			w, r, ok := parseTokenParts(pos)
			if !ok {
				return bad("versions must be decimal, views decimal or -")
			}
			switch {
			case g == 0:
				tok.write, tok.read = w, r
			case w != tokenPart{} || r != tokenPart{}:
				tok.groups = append(tok.groups, groupPart{group: uint32(g), write: w, read: r})
			}
		}
		return tok, nil
	}
	if len(t) > maxTokenLen {
		return bad(fmt.Sprintf("longer than %d bytes", maxTokenLen))
	}
	var tok token
	if rest, ok := strings.CutPrefix(t, "v2."); ok {
		w, r, ok := parseTokenParts(rest)
		if !ok {
			return bad("want v2.<lastWrite>.<writeView>.<maxRead>.<readView>, versions decimal, views decimal or -")
		}
		tok.write, tok.read = w, r
		return tok, nil
	}
	rest, ok := strings.CutPrefix(t, "v1.")
	if !ok {
		return bad("want v1.<lastWrite>.<maxRead>, v2.<lastWrite>.<writeView>.<maxRead>.<readView> or v3.<group>:<lastWrite>.<writeView>.<maxRead>.<readView>[,<group>:...]")
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

// parseTokenParts parses <lastWrite>.<writeView>.<maxRead>.<readView>.
func parseTokenParts(s string) (w, r tokenPart, ok bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return w, r, false
	}
	var errs [4]error
	w.version, errs[0] = strconv.ParseUint(parts[0], 10, 64)
	w.view, w.known, errs[1] = parseTokenView(parts[1])
	r.version, errs[2] = strconv.ParseUint(parts[2], 10, 64)
	r.view, r.known, errs[3] = parseTokenView(parts[3])
	for _, err := range errs {
		if err != nil {
			return w, r, false
		}
	}
	return w, r, true
}

func parseTokenView(s string) (uint64, bool, error) {
	if s == "-" {
		return 0, false, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil, err
}

func (t token) String() string {
	view := func(p tokenPart) string {
		if !p.known {
			return "-"
		}
		return strconv.FormatUint(p.view, 10)
	}
	parts := func(w, r tokenPart) string {
		return strconv.FormatUint(w.version, 10) + "." + view(w) + "." + strconv.FormatUint(r.version, 10) + "." + view(r)
	}
	top := t.write != tokenPart{} || t.read != tokenPart{}
	if len(t.groups) > 0 {
		var b strings.Builder
		b.WriteString("v3.")
		if top {
			b.WriteString("0:" + parts(t.write, t.read))
		}
		for i, g := range t.groups {
			if i > 0 || top {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatUint(uint64(g.group), 10) + ":" + parts(g.write, g.read))
		}
		return b.String()
	}
	if !top {
		return ""
	}
	if !t.write.known && !t.read.known {
		return "v1." + strconv.FormatUint(t.write.version, 10) + "." + strconv.FormatUint(t.read.version, 10)
	}
	return "v2." + parts(t.write, t.read)
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
