package server

import (
	"bytes"
	"context"
	"runtime"
	"sync/atomic"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// Scan prefetch: the KEFIR.SCANs a connection has pipelined behind the one it
// runs are read ahead, concurrently, and answered in order.
//
// One connection's commands run one at a time, so a client that multiplexes
// its callers on one connection (Kefir's Go client pipelines every caller's
// calls on a pool of two) got one core's worth of scans: YCSB-E through one
// connection read 100 values of 1 KB at a time on the server while the other
// core idled (docs/design/scans.md, "Scans in parallel on one connection").
// Now, when a KEFIR.SCAN runs, the KEFIR.SCANs buffered right behind it (plain,
// or in a KEFIR.CALL with only CONSISTENCY and REDIRECT) start reading on
// goroutines of their own; each command still goes through the ordinary
// dispatch in its turn, and takes the result read for it (prefetched) instead
// of reading.
//
// Why that answers as running them in turn would:
//   - only a run of consecutive scans is read ahead, started after the first
//     one's turn came (its own writes before it flushed, its sync-key barrier
//     passed): no write of this connection lies between them, so each reads
//     the state it would have read, or a later one — and a scan's reply may
//     come from any state between its arrival and its reply (linearizable:
//     every scan of the run was sent before the first reply left);
//   - a level that depends on what the connection saw before (a session, a
//     replica group's follower levels) is not read ahead: on a replica group
//     only linearizable scans are (served at the leader), with a session
//     token (KEFIR.CALL SESSION) none;
//   - the result is used only by the command it was read for (its number on
//     the connection, resp.Reader.Commands) and only if that command is the
//     scan read ahead (same range, limit and level); anything else drops
//     every prefetch (waiting for each first) and reads as before — so no
//     command takes a result read before it arrived.

// prefetchOn turns the prefetch off for tests that compare with it off.
var prefetchOn = true

// prefetchedScans counts the scans answered from a prefetch (tests).
var prefetchedScans atomic.Uint64

// scanSpec and callSpec are the commands the prefetch looks for.
var scanSpec, callSpec = command.MustLookup("KEFIR.SCAN"), command.MustLookup("KEFIR.CALL")

// maxPrefetch is how many scans a connection reads ahead at most: enough to
// keep every core busy beside the one running the current scan.
var maxPrefetch = min(15, max(1, 2*runtime.GOMAXPROCS(0)-1))

// prefetched is a KEFIR.SCAN read ahead of its turn.
type prefetched struct {
	seq  uint64 // its command's number on the connection (resp.Reader.Commands)
	n    int    // its command's length in bytes
	op   kv.Op  // the range is its own copy: the reader's buffer moves on
	cons level.Consistency
	done chan struct{}
	res  kv.Result
	p    shard.Pending
	err  error
}

// scanAhead reports whether the loop should hand c to a worker for this
// command so that the scans behind it are read ahead: a KEFIR.SCAN (plain or
// wrapped) with more commands buffered.
func (c *conn) scanAhead(spec *command.Spec, known bool, args [][]byte) bool {
	if !prefetchOn || !known || c.rd.Buffered() == 0 {
		return false
	}
	if spec == callSpec {
		spec, _ = wrappedSpec(args)
	}
	return spec == scanSpec
}

// prefetchable reports whether scans may be read ahead on c now.
func (c *conn) prefetchable() bool {
	return prefetchOn && !c.inline && !c.multi && !c.srv.clusterOn && c.authed && len(c.syncKeys) == 0
}

// startPrefetch reads ahead the KEFIR.SCANs buffered right behind the
// command being run and those already read ahead, up to maxPrefetch of them
// in all, at session sess: as each one's turn comes, another starts.
func (c *conn) startPrefetch(sess shard.Session) {
	skip := 0
	for _, pf := range c.pre {
		skip += pf.n
	}
	for len(c.pre) < maxPrefetch {
		args, n := c.rd.PeekCommand(c.peek[:0], skip)
		c.peek = args
		if n == 0 {
			return
		}
		op, cons, ok := c.peekScan(args)
		if !ok {
			return
		}
		skip += n
		pf := &prefetched{seq: c.rd.Commands() + uint64(len(c.pre)) + 1, n: n, op: op, cons: cons, done: make(chan struct{})}
		pf.op.ScanBuf = lendScanBuf()
		c.pre = append(c.pre, pf)
		srv := c.srv
		go func() {
			defer close(pf.done)
			pf.res, pf.p, pf.err = srv.readPath(false, pf.op, pf.cons, sess)
		}()
	}
}

// peekScan parses a buffered command for startPrefetch: a KEFIR.SCAN, alone or
// in a KEFIR.CALL with no option but CONSISTENCY and REDIRECT, at a level it
// may read ahead; ok false for anything else (which then runs as usual).
func (c *conn) peekScan(args [][]byte) (op kv.Op, cons level.Consistency, ok bool) {
	inner := args
	spec, known := command.Lookup(args[0])
	if !known {
		return op, cons, false
	}
	if spec == callSpec {
		inner = nil
		redirect := false
		for i := 1; i < len(args); {
			switch {
			case eq(args[i], "CMD"):
				inner = args[i+1:]
				i = len(args)
			case eq(args[i], "REDIRECT") && !redirect:
				redirect = true
				i++
			case eq(args[i], "CONSISTENCY") && i+1 < len(args) && cons.IsZero():
				l, err := level.ParseConsistency(string(args[i+1]))
				if err != nil || c.srv.shard.CheckConsistency(l) != nil {
					return op, cons, false
				}
				cons = l
				i += 2
			default:
				return op, cons, false
			}
		}
		if len(inner) == 0 {
			return op, cons, false
		}
		if spec, known = command.Lookup(inner[0]); !known {
			return op, cons, false
		}
	}
	if spec != scanSpec || !spec.ArityOK(len(inner)) {
		return op, cons, false
	}
	op, err := parseRead(spec, inner)
	if err != nil {
		return op, cons, false
	}
	if cons.IsZero() {
		cons = c.cons
	}
	if c.srv.grp != nil && cons.Kind != level.Linearizable {
		return op, cons, false
	}
	b := make([]byte, 0, len(op.Key)+len(op.End))
	b = append(b, op.Key...)
	op.Key = b[:len(op.Key):len(op.Key)]
	if op.End != nil {
		b = append(b, op.End...)
		op.End = b[len(op.Key):]
	}
	return op, cons, true
}

// takePrefetch returns the prefetch read for the scan op at level cons, which
// is about to run, or nil: then no prefetch is left either.
func (c *conn) takePrefetch(op *kv.Op, cons level.Consistency) *prefetched {
	if len(c.pre) == 0 {
		return nil
	}
	pf := c.pre[0]
	c.pre[0] = nil
	c.pre = c.pre[1:]
	<-pf.done
	if pf.seq == c.rd.Commands() && pf.cons == cons && pf.op.Limit == op.Limit && bytes.Equal(pf.op.Key, op.Key) &&
		bytes.Equal(pf.op.End, op.End) && (pf.op.End == nil) == (op.End == nil) {
		prefetchedScans.Add(1)
		return pf
	}
	returnScanBuf(pf.op.ScanBuf)
	c.dropPrefetch()
	return nil
}

// dropPrefetch forgets every prefetch, once each has finished.
func (c *conn) dropPrefetch() {
	for i, pf := range c.pre {
		<-pf.done
		returnScanBuf(pf.op.ScanBuf)
		c.pre[i] = nil
	}
	c.pre = c.pre[:0]
}

// readPath runs read op as a connection's readPath does, inline (on an event
// loop: it must not wait) or not.
func (s *Server) readPath(inline bool, op kv.Op, cons level.Consistency, sess shard.Session) (res kv.Result, p shard.Pending, err error) {
	switch {
	case inline:
		var ok bool
		if res, ok = s.shard.TryRead(op, cons); !ok {
			return res, p, errWouldWait
		}
	case s.reads.Deferred:
		// A read of a value the leader's log holds but has not made durable
		// is answered now and its reply held with the batch's (release), so
		// the connection's later commands do not wait behind it.
		res, p, err = s.shard.ReadDeferred(context.Background(), op, cons, sess)
	default:
		res, err = s.shard.Read(context.Background(), op, cons, sess)
	}
	return res, p, err
}
