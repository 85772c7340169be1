package vr

// ViewStatus returns the replica's view and status: the part of Info a
// driver reads after every event to see whether a view change began or
// ended (Info builds the whole report, peers included, which is too much
// for every message).
func (r *Replica) ViewStatus() (view uint64, status Status) { return r.view, r.status }
