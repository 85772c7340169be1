package vr

import (
	"cmp"
	"slices"
)

// MaxClients bounds the client table. Clients draw a fresh id per connection, so
// a table that only grows would hold one record per connection ever made. When an
// insert takes the table past MaxClients, the records of the clients whose latest
// executed request is oldest (lowest op) are dropped until a tenth of the room is
// free again. Dropping is a deterministic function of the committed sequence and
// of the table a snapshot carries, so every replica drops the same records at the
// same op and their dedup decisions never diverge; that is also why this is a
// constant and not a per-replica setting. The price is the one any bounded table
// pays: a retry (or a straggling nilext copy) from a client that has been silent
// while MaxClients other clients wrote may execute again.
const MaxClients = 1 << 17

// evictClients drops the oldest records while the table is over its cap.
func (r *Replica) evictClients() {
	limit := r.clientCap
	if limit <= 0 {
		limit = MaxClients
	}
	if len(r.clients) <= limit {
		return
	}
	keep := limit - limit/10
	recs := make([]*ClientRecord, 0, len(r.clients))
	for _, c := range r.clients {
		recs = append(recs, c)
	}
	// Op is unique per record (one op executes one client's request); Client
	// breaks ties only for records restored from a snapshot with equal ops.
	slices.SortFunc(recs, func(a, b *ClientRecord) int {
		if c := cmp.Compare(a.Op, b.Op); c != 0 {
			return c
		}
		return cmp.Compare(a.Client, b.Client)
	})
	// Only the op order decides, never how far this replica has applied, so
	// replicas that were handed the same ops in different batches agree. With
	// the real cap the dropped records are far older than any batch in flight
	// (MaxInflight ops), so a record still waiting for its result is not dropped.
	for _, c := range recs[:len(recs)-keep] {
		delete(r.clients, c.Client)
		r.clientsEvicted++
	}
}
