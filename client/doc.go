// Package client is Kefir's Go client. It speaks RESP, so every call it makes can
// be reproduced with redis-cli; per-call options, request ids and session tokens
// travel in the KEFIR.CALL wrapper (docs/design/resp-extensions.md).
//
// A Client keeps a small pool of connections. Each connection pipelines any number
// of concurrent calls: one goroutine writes queued calls in batches, one reads the
// replies and matches them in order; no goroutine is started per call.
//
// Every write carries a request id, and a write whose connection dies is resent
// with the same id, so a write is applied at most once. A server's client table
// keeps one request per client id, so concurrent writes never share one: each
// takes a random client id that no other write in flight uses, with its next
// sequence number (a lane, reused by later writes). When a write's fate cannot be
// settled — the deadline passed after it was sent, or the retry failed too — the
// call returns ErrUnknownOutcome: it may or may not have been applied.
//
// Replica groups: give Dial every node's address. Calls that carry options or a
// request id (every write) ask for redirects (KEFIR.CALL REDIRECT): a follower
// answers -MOVED <leader>, and the pool moves to that node and resends the call
// with the same request id, so it still executes at most once. Plain calls sent
// to a follower are forwarded by it instead. WithRetryUnavailable keeps a call
// retrying through a leader change (-UNAVAILABLE no leader) for a while; a
// write whose fate that change left open returns ErrUnknownOutcome.
//
// A cluster of several groups (docs/cluster.md, "The Go client"): Dial asks the
// node INFO cluster, and at a node of a cluster (cluster_enabled:1) the client
// routes by slot as a Redis Cluster client does. It keeps the slot map (CLUSTER
// SLOTS and its epoch) and a pool per node, sends each call that names a key to
// its group's leader (reads any replica may serve to the group's members), and
// on -MOVED sends that call to the node named and reads the map again: the map
// alone moves routes, so one group's redirect never moves another group's
// calls. -ASK sends its call once, after ASKING. MultiGet and MultiPut of keys
// of several slots are split by slot and merged (each slot's part atomic, the
// whole not). Txn goes to the leader of its first key's group (its commit
// too); Ping and Scan use the addresses given to Dial, whose nodes merge scans.
// WithCluster forces either way.
//
// Nilext fast path (experimental): with WithNilext, against a group running
// kefir server --nilext, Put and MultiPut outside a Session are sent by the
// client to every replica and complete in one round trip on a supermajority
// of acknowledgements (the leader's among them), falling back to the ordered
// path with the same request id when those do not come in time
// (docs/design/nilext.md).
//
// A call waits as long as its context allows, so pass one with a deadline: a
// server that stops answering without closing the connection is only noticed by
// TCP keep-alive. A call abandoned at its deadline does not poison its connection:
// the late reply is read and dropped, and later calls get their own replies.
//
// Example:
//
//	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
//	defer cancel()
//	c, err := client.Dial(ctx, []string{"127.0.0.1:6380"}, client.WithPassword(os.Getenv("KEFIR_PASSWORD")))
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer c.Close()
//
//	// A durable write, then a linearizable read.
//	if err := c.Put(ctx, "greeting", []byte("hello"), client.WithDurability(client.Sync)); err != nil {
//		log.Fatal(err)
//	}
//	v, err := c.Get(ctx, "greeting", client.WithConsistency(client.Linearizable))
//	switch {
//	case errors.Is(err, client.ErrNotFound):
//		fmt.Println("no greeting")
//	case err != nil:
//		log.Fatal(err)
//	default:
//		fmt.Println(string(v))
//	}
//
//	// Counters and compare-and-set.
//	n, err := c.Incr(ctx, "visits", 1)
//	swapped, err := c.CAS(ctx, "greeting", []byte("hello"), []byte("hi"))
//
//	// A session reads its own writes even at a weaker level, on any node.
//	s := c.Session()
//	_ = s.Put(ctx, "cart", []byte("apples"), client.WithDurability(client.CAD))
//	v, err = s.Get(ctx, "cart", client.WithConsistency(client.SessionConsistency))
//
//	// Keys that expire (SET … PX; PEXPIRE, PTTL, PERSIST). TTL returns
//	// NoExpiry for a key without one and ErrNotFound for a missing or
//	// expired key.
//	_ = c.Put(ctx, "session:42", []byte("token"), client.WithTTL(30*time.Minute))
//	ok, err := c.Expire(ctx, "session:42", time.Hour)
//	left, err := c.TTL(ctx, "session:42")
//
//	// Ordered range reads: keys in ["user:", "user;"), at most 100.
//	kvs, err := c.Scan(ctx, "user:", "user;", 100)
//	for _, kv := range kvs {
//		fmt.Printf("%s=%s\n", kv.Key, kv.Value)
//	}
//
//	// Scans in a loop: ScanInto reuses one buffer for the values, which stay
//	// valid until the next call with it (keys are strings of their own).
//	var buf client.ScanBuffer
//	kvs, err = c.ScanInto(ctx, &buf, "user:", "user;", 100)
//
// It must not import Kefir packages other than internal/level and internal/resp;
// users never need to import anything under internal/ (the level types are
// re-exported here).
package client
