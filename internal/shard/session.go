package shard

import (
	"github.com/kefirdb/kefir/internal/token"
)

// Session is the state a session token carries: internal/token's, which the
// Go client shares (one copy of the format and the merge rules). A replica
// may serve a session read only if it has applied the token's versions
// (Need) and, where it knows the view of its op at that version, only if it
// is the token's (ErrSessionLost). A session advances by a result's position
// (kv.Result.Pos): s.AfterWrite(res.Pos()).
type Session = token.Session

// GroupPos is a session's part in one group of a node of several groups.
type GroupPos = token.GroupPos

// MaxTokenGroups is how many groups' parts a token carries at most.
const MaxTokenGroups = token.MaxGroups

// ParseSession parses a token; "" is the fresh session. Its errors wrap
// ErrBadSession.
func ParseSession(tok string) (Session, error) { return token.Parse(tok) }
