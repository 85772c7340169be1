// Package token is the session token: its formats, parsing, writing and the
// rules by which a session advances and two tokens merge. The shard (which
// reads a token to decide what a replica may serve) and the Go client (which
// merges the tokens of concurrent replies) share this one copy, so that what
// the client writes back is exactly what the server reads
// (docs/design/resp-extensions.md, "Session tokens").
//
// It imports only the standard library: the client links it without the
// engine, and nothing of a shard's or a replica's state belongs here.
package token

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ErrBad is what every parse error is (errors.Is).
var ErrBad = errors.New("invalid session token")

// ParseError says what is wrong with a token: Why is the reason without the
// "invalid session token" prefix, for callers that word their own.
type ParseError struct{ Why string }

func (e *ParseError) Error() string { return ErrBad.Error() + ": " + e.Why }

// Is makes errors.Is(err, ErrBad) hold.
func (e *ParseError) Is(target error) bool { return target == ErrBad }

func bad(why string) error { return &ParseError{Why: why} }

// Pos is what a session advances by: the version an op wrote or read, with
// the view it was ordered in if known, and the replica group that produced it
// (0 on a single node or a single group). kv.Result.Pos gives it.
type Pos struct {
	Version   uint64
	View      uint64
	ViewKnown bool
	Group     uint32
}

// Session is the state a session token carries (docs/design/resp-extensions.md):
// the version of the session's last write and the highest version it has read,
// each with the view its op was ordered in when the shard knows it (a replica
// group: Pos.View). A replica may serve a session read only if it has applied
// both, and, where it knows the view of its op at that version, only if it is the
// token's: otherwise the version the session saw was dropped by a view change
// (internal/shard.ErrSessionLost).
//
// Versions are one log's positions. On a node of several replica groups
// (cluster.Multi) each group has its own log, so the session keeps one such
// part per group it touched (Groups), and a group's replica is given only its
// own part (For): a result names the group that produced it (Pos.Group)
// and advances that part. The top-level fields are the part of results that
// name no group (a single node, a single group): "group 0".
type Session struct {
	LastWrite uint64
	MaxRead   uint64
	// WriteView (if WriteViewKnown) is the view of op LastWrite, ReadView (if
	// ReadViewKnown) that of op MaxRead.
	WriteView, ReadView           uint64
	WriteViewKnown, ReadViewKnown bool
	// Groups are the parts of groups 1 and up, by increasing group, none
	// zero. Copies of a Session share the slice: it is never changed in
	// place (withGroup makes a new one), so a session copied into a
	// pipelined request is not advanced behind its back.
	Groups []GroupPos
}

// GroupPos is a session's part in one group of a node of several groups:
// Session's top-level fields for that group's log.
type GroupPos struct {
	Group                         uint32
	LastWrite, MaxRead            uint64
	WriteView, ReadView           uint64
	WriteViewKnown, ReadViewKnown bool
}

// Token bounds. A v1 or v2 token (one log) is at most maxTokenLen bytes, the
// contract's bound before tokens had parts per group. A v3 token carries up to
// MaxGroups parts, each at most maxPartLen bytes: a session that touched
// more groups than that cannot be written as a token the servers read back,
// and Parse says so rather than dropping parts (a dropped part would
// silently lose the session's guarantees in that group).
const (
	maxTokenLen = 256
	MaxGroups   = 1024
	// maxPartLen: "<group>:" (group < 2^32: 10 digits) and four numbers of
	// up to 20 digits with three dots, and the comma before the next part.
	maxPartLen    = 11 + 4*20 + 3 + 1
	maxTokenV3Len = len(tokenV3) + MaxGroups*maxPartLen
)

// Token formats:
//
//	v1.<lastWrite>.<maxRead>
//	v2.<lastWrite>.<writeView>.<maxRead>.<readView>
//	v3.<group>:<lastWrite>.<writeView>.<maxRead>.<readView>[,<group>:...]
//
// decimal numbers; a view is "-" when unknown. A session whose views are both
// unknown (a single node) is written as v1, so tokens stay readable by older
// servers and clients; v1 tokens parse with both views unknown. A session with
// parts per group (a node of several groups) is written as v3: its parts by
// increasing group, group 0 the top-level one (only if it is not zero), and a
// part with every field zero left out.
const (
	tokenV1 = "v1."
	tokenV2 = "v2."
	tokenV3 = "v3."
)

// Parse parses a token; "" is the fresh session. Its error is a *ParseError
// (errors.Is(err, ErrBad)).
func Parse(tok string) (Session, error) {
	if tok == "" {
		return Session{}, nil
	}
	if rest, ok := strings.CutPrefix(tok, tokenV3); ok {
		return parseV3(rest, len(tok))
	}
	if len(tok) > maxTokenLen {
		return Session{}, bad(fmt.Sprintf("longer than %d bytes", maxTokenLen))
	}
	if rest, ok := strings.CutPrefix(tok, tokenV2); ok {
		s, ok := parseV2Part(rest)
		if !ok {
			return Session{}, bad("want v2.<lastWrite>.<writeView>.<maxRead>.<readView>, versions decimal, views decimal or -")
		}
		return s, nil
	}
	rest, ok := strings.CutPrefix(tok, tokenV1)
	if !ok {
		return Session{}, bad("want v1.<lastWrite>.<maxRead>, v2.<lastWrite>.<writeView>.<maxRead>.<readView> or v3.<group>:<lastWrite>.<writeView>.<maxRead>.<readView>[,<group>:...]")
	}
	w, r, ok := strings.Cut(rest, ".")
	if !ok {
		return Session{}, bad("want v1.<lastWrite>.<maxRead>")
	}
	lw, err1 := strconv.ParseUint(w, 10, 64)
	mr, err2 := strconv.ParseUint(r, 10, 64)
	if err1 != nil || err2 != nil {
		return Session{}, bad("versions must be decimal")
	}
	return Session{LastWrite: lw, MaxRead: mr}, nil
}

// parseV2Part parses <lastWrite>.<writeView>.<maxRead>.<readView>.
func parseV2Part(s string) (Session, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return Session{}, false
	}
	var p Session
	var err [4]error
	p.LastWrite, err[0] = strconv.ParseUint(parts[0], 10, 64)
	p.WriteView, p.WriteViewKnown, err[1] = parseView(parts[1])
	p.MaxRead, err[2] = strconv.ParseUint(parts[2], 10, 64)
	p.ReadView, p.ReadViewKnown, err[3] = parseView(parts[3])
	for _, e := range err {
		if e != nil {
			return Session{}, false
		}
	}
	return p, true
}

// parseV3 parses a v3 token's parts (rest: after "v3.", n: the token's length).
func parseV3(rest string, n int) (Session, error) {
	if n > maxTokenV3Len {
		return Session{}, bad(fmt.Sprintf("a v3 token is at most %d bytes (%d groups)", maxTokenV3Len, MaxGroups))
	}
	if c := strings.Count(rest, ",") + 1; c > MaxGroups {
		return Session{}, bad(fmt.Sprintf("names %d groups, at most %d", c, MaxGroups))
	}
	var s Session
	prev := int64(-1)
	for part := range strings.SplitSeq(rest, ",") {
		gs, pos, ok := strings.Cut(part, ":")
		g, err := strconv.ParseUint(gs, 10, 32)
		if !ok || err != nil {
			return Session{}, bad("want v3.<group>:<lastWrite>.<writeView>.<maxRead>.<readView>[,<group>:...] (group a decimal below 2^32)")
		}
		if int64(g) <= prev {
			return Session{}, bad("v3 groups must be listed once each, by increasing id")
		}
		prev = int64(g)
		p, ok := parseV2Part(pos)
		if !ok {
			return Session{}, bad(fmt.Sprintf("group %d: want <lastWrite>.<writeView>.<maxRead>.<readView>, versions decimal, views decimal or -", g))
		}
		if g == 0 {
			s = p
			continue
		}
		if p.isZero() {
			continue // as String leaves it out
		}
		s.Groups = append(s.Groups, groupPos(uint32(g), p))
	}
	return s, nil
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

// appendPart appends <lastWrite>.<writeView>.<maxRead>.<readView> of p's
// top-level part.
func appendPart(b []byte, p Session) []byte {
	b = strconv.AppendUint(b, p.LastWrite, 10)
	b = append(b, '.')
	b = appendView(b, p.WriteView, p.WriteViewKnown)
	b = append(b, '.')
	b = strconv.AppendUint(b, p.MaxRead, 10)
	b = append(b, '.')
	return appendView(b, p.ReadView, p.ReadViewKnown)
}

// IsZero reports whether s is the fresh session.
func (s Session) IsZero() bool { return s.isZero() && len(s.Groups) == 0 }

// isZero reports whether s's top-level part is zero.
func (s Session) isZero() bool {
	return s.LastWrite == 0 && s.MaxRead == 0 && s.WriteView == 0 && s.ReadView == 0 && !s.WriteViewKnown && !s.ReadViewKnown
}

// String returns the token; the fresh session is "".
func (s Session) String() string {
	if s.IsZero() {
		return ""
	}
	if len(s.Groups) > 0 {
		b := make([]byte, 0, 32*(len(s.Groups)+1))
		b = append(b, tokenV3...)
		if !s.isZero() {
			b = append(b, "0:"...)
			b = appendPart(b, s.top())
		}
		for i, g := range s.Groups {
			if i > 0 || !s.isZero() {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, uint64(g.Group), 10)
			b = append(b, ':')
			b = appendPart(b, g.session())
		}
		return string(b)
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
	return string(appendPart(b, s))
}

// top returns s's top-level part alone.
func (s Session) top() Session {
	s.Groups = nil
	return s
}

func groupPos(g uint32, p Session) GroupPos {
	return GroupPos{Group: g, LastWrite: p.LastWrite, MaxRead: p.MaxRead, WriteView: p.WriteView, ReadView: p.ReadView,
		WriteViewKnown: p.WriteViewKnown, ReadViewKnown: p.ReadViewKnown}
}

func (g GroupPos) session() Session {
	return Session{LastWrite: g.LastWrite, MaxRead: g.MaxRead, WriteView: g.WriteView, ReadView: g.ReadView,
		WriteViewKnown: g.WriteViewKnown, ReadViewKnown: g.ReadViewKnown}
}

// For returns the part of s a replica of group g serves it by: s's part for g
// as a one-log session (no Groups). Group 0 is the top-level part. A group the
// session never touched has the fresh part: nothing to wait for there. (A key
// that moved into g needs nothing from its old group's part: g serves the
// slot only once it applied the take-over, after the final copy of every
// write the old group acknowledged; docs/design/cluster.md §5.)
func (s Session) For(g uint32) Session {
	if g == 0 {
		return s.top()
	}
	if i, ok := s.find(g); ok {
		return s.Groups[i].session()
	}
	return Session{}
}

func (s Session) find(g uint32) (int, bool) {
	return slices.BinarySearchFunc(s.Groups, g, func(p GroupPos, g uint32) int {
		switch {
		case p.Group < g:
			return -1
		case p.Group > g:
			return 1
		}
		return 0
	})
}

// withGroup returns s with group g's part set to p (top-level fields only),
// in a new Groups slice if it changes.
func (s Session) withGroup(g uint32, p Session) Session {
	if g == 0 {
		p.Groups = s.Groups
		return p
	}
	i, ok := s.find(g)
	if ok && s.Groups[i] == groupPos(g, p) {
		return s
	}
	gs := make([]GroupPos, 0, len(s.Groups)+1)
	gs = append(gs, s.Groups[:i]...)
	if !p.isZero() {
		gs = append(gs, groupPos(g, p))
	}
	if ok {
		i++
	}
	s.Groups = append(gs, s.Groups[i:]...)
	if len(s.Groups) == 0 {
		s.Groups = nil
	}
	return s
}

// Need is the lowest version a replica must have applied to serve this
// session's top-level part (For(g).Need() is group g's).
func (s Session) Need() uint64 { return max(s.LastWrite, s.MaxRead) }

// AfterWrite returns the session advanced by a write that produced r: the part
// of r's group.
func (s Session) AfterWrite(r Pos) Session {
	if r.Group == 0 { // a single node's, a single group's: no copies
		s.LastWrite, s.WriteView, s.WriteViewKnown = advance(s.LastWrite, s.WriteView, s.WriteViewKnown, r)
		return s
	}
	p := s.For(r.Group)
	p.LastWrite, p.WriteView, p.WriteViewKnown = advance(p.LastWrite, p.WriteView, p.WriteViewKnown, r)
	return s.withGroup(r.Group, p)
}

// AfterRead returns the session advanced by a read that produced r: the part
// of r's group.
func (s Session) AfterRead(r Pos) Session {
	if r.Group == 0 {
		s.MaxRead, s.ReadView, s.ReadViewKnown = advance(s.MaxRead, s.ReadView, s.ReadViewKnown, r)
		return s
	}
	p := s.For(r.Group)
	p.MaxRead, p.ReadView, p.ReadViewKnown = advance(p.MaxRead, p.ReadView, p.ReadViewKnown, r)
	return s.withGroup(r.Group, p)
}

// Merge returns the later of s and t in every part (each group's): the higher
// version with its view, as AfterWrite and AfterRead advance one. A front door
// merges the token a forwarded call returns into its connection's, which
// other groups' results advanced meanwhile.
func (s Session) Merge(t Session) Session {
	if len(s.Groups) == 0 && len(t.Groups) == 0 { // one log: no copies
		s.LastWrite, s.WriteView, s.WriteViewKnown = advance(s.LastWrite, s.WriteView, s.WriteViewKnown,
			Pos{Version: t.LastWrite, View: t.WriteView, ViewKnown: t.WriteViewKnown})
		s.MaxRead, s.ReadView, s.ReadViewKnown = advance(s.MaxRead, s.ReadView, s.ReadViewKnown,
			Pos{Version: t.MaxRead, View: t.ReadView, ViewKnown: t.ReadViewKnown})
		return s
	}
	for _, g := range t.partGroups() {
		p, q := s.For(g), t.For(g)
		p.LastWrite, p.WriteView, p.WriteViewKnown = advance(p.LastWrite, p.WriteView, p.WriteViewKnown,
			Pos{Version: q.LastWrite, View: q.WriteView, ViewKnown: q.WriteViewKnown})
		p.MaxRead, p.ReadView, p.ReadViewKnown = advance(p.MaxRead, p.ReadView, p.ReadViewKnown,
			Pos{Version: q.MaxRead, View: q.ReadView, ViewKnown: q.ReadViewKnown})
		s = s.withGroup(g, p)
	}
	return s
}

// partGroups lists the groups s has a part in (0 for the top-level one).
func (s Session) partGroups() []uint32 {
	gs := make([]uint32, 0, len(s.Groups)+1)
	if !s.isZero() {
		gs = append(gs, 0)
	}
	for _, g := range s.Groups {
		gs = append(gs, g.Group)
	}
	return gs
}

// advance moves a token part (version v with its view) to r's version if that
// is higher; the view goes with the version. At an equal version an unknown
// view is filled in from r.
func advance(v, view uint64, known bool, r Pos) (uint64, uint64, bool) {
	switch {
	case r.Version > v:
		return r.Version, r.View, r.ViewKnown
	case r.Version == v && !known && r.ViewKnown:
		return v, r.View, true
	}
	return v, view, known
}
