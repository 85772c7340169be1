package vr

import "github.com/kefirdb/kefir/internal/kv"

// MaxClients bounds the client table. Clients draw fresh ids (the Go client one
// per write it has in flight at once, reused by its later writes; a process
// that restarts draws new ones), so a table that only grows would hold one
// record per id ever drawn. When an
// insert takes the table past MaxClients, the records of the clients whose latest
// executed request is oldest (lowest op) are dropped until a tenth of the room is
// free again: internal/kv's count rule (kv.ClientTable). Dropping is a
// deterministic function of the committed sequence and of the table a snapshot
// carries, so every replica drops the same records at the same op and their dedup
// decisions never diverge; that is also why this is a constant and not a
// per-replica setting. The price is the one any bounded table pays: a retry (or a
// straggling nilext copy) from a client that has been silent while MaxClients
// other clients wrote may execute again.
const MaxClients = 1 << 17

// newClientTable returns the core's client table: kv's table under the count
// rule at cfg.ClientCap (tests) or MaxClients. Only the op order decides what
// it drops, never how far this replica has applied, so replicas that were
// handed the same ops in different batches agree. With the real cap the
// dropped records are far older than any batch in flight (MaxInflight ops), so
// a record still waiting for its result is not dropped.
func newClientTable(limit int) *kv.ClientTable {
	if limit <= 0 {
		limit = MaxClients
	}
	return kv.NewClientTable(limit)
}
