package client

import "github.com/kefirdb/kefir/internal/lanes"

// Request ids and lanes. A server's client table (docs/design/client-table.md)
// keeps, per client id, only the latest executed request number and its
// result: a retry of request n is answered from the table while n is the
// latest, and refused as stale once n+1 executed. That is at-most-once only
// for a client with one request outstanding at a time. The client pipelines
// many concurrent writes, and after a connection dies each caller retries its
// own write, in any order, at whichever node now leads: had the writes shared
// a client id, a retried n would be refused because n+1 (retried first, or
// executed with n at the old leader) was now the latest — an error for a write
// that may well have executed, and the "stale request" failures of a leader
// failover (issue 31).
//
// So every write takes a lane: a random client id and its request counter,
// used by one write at a time — the write's request id is (lane id, next
// number), kept across all its retries. A lane returns to the pool when its
// write's outcome is settled (a reply, or not sent at all), so the next
// number on it is sent only when no copy of the previous one can still be
// retried by this client; a lane whose write's outcome is unknown (or whose
// caller gave up while it was in flight) is retired, since its request may
// still be queued somewhere. The pool holds as many lanes as writes were ever
// concurrent, so the servers' tables hold that many ids per client. The
// nilext fast path draws its ids here too (its d-log cleanup needs the same
// one-write-per-id order: nilext.go).

// The pool is internal/lanes' (shared with a node's forwarder, which gives
// plain clients' forwarded writes their ids by the same rule).
type lane = lanes.Lane
