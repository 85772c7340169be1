package vrshard

// Leads reports whether this replica is the leader of its group now: the one
// replica that runs active expiry (docs/design/expiry.md). Its answer may be
// stale the moment it returns; that is harmless, since a deposed leader's
// proposals are refused and an expiry delete rechecks at apply.
func (r *Replica) Leads() bool { return r.isLeader.Load() }
