package server

import (
	"bytes"
	"errors"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
)

// Forwarding is the router's (internal/cluster, forward.go there): a
// follower hands it the writes and reads it cannot serve, and relays the
// leader's replies as its own. This file only picks them out of a batch.

// forwardWrites forwards the batch's writes that this node refused as a
// follower, all to the leader in one pipeline, and returns their outcomes by
// batch index (nil when there were none). Writes that asked for redirects get
// -MOVED instead.
func (c *conn) forwardWrites() []*cluster.Call {
	if c.srv.grp == nil {
		return nil
	}
	var out []*cluster.Call
	var calls []*cluster.Call
	addr := ""
	for i := range c.writes {
		r := &c.writes[i]
		if r.Err == nil || !errors.Is(r.Err, cluster.ErrNotLeader) {
			continue
		}
		q := &c.meta[i]
		if q.redirect {
			r.Err = c.srv.router.Redirect(r.Err)
			continue
		}
		if e, ok := cluster.SlotRedirect(r.Err); ok && c.clusterAware {
			r.Err = e
			continue
		}
		// No leader known (a view change): forward waits for one. All of
		// the batch's writes go to one leader, in order.
		if a, ok := c.srv.router.LeaderFor(r.Err); ok && addr == "" {
			addr = a
		}
		if out == nil {
			out = make([]*cluster.Call, len(c.writes))
		}
		sess := c.sess
		if q.session {
			sess = q.sess
		}
		fc := &cluster.Call{Args: q.raw, Dur: r.Durability, ID: r.ID, Sess: sess}
		out[i] = fc
		calls = append(calls, fc)
	}
	if len(calls) > 0 {
		c.srv.router.Forward(addr, calls)
	}
	return out
}

// writeForwarded relays a forwarded command's outcome as this node's reply.
func (c *conn) writeForwarded(fc *cluster.Call, cmd int, session bool, _ replyShape) {
	if fc.Err != nil || fc.Reply.Kind == resp.Error {
		c.markErr(cmd)
	}
	if session {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(fc.NewSess.String())
	} else if fc.Err == nil {
		// Merged, not replaced: the token went out before the batch's
		// local writes (another group's, on a node of several) advanced
		// the connection's.
		c.sess = c.sess.Merge(fc.NewSess)
	}
	if fc.Err != nil {
		c.writeErr(fc.Err)
		return
	}
	if fc.Reply.Kind == resp.Null && (cmd == execSpec.ID || cmd == kefirExecSpec.ID) {
		// The leader's *-1 (a watched key changed) reads as a null: an
		// EXEC's is a null array ("*-1" in RESP2).
		_ = c.w.WriteNullArray()
		return
	}
	_ = c.w.WriteValue(execToResp3(fc.Reply, c.execShapes))
}

// forwardRead serves a read this node cannot prove at level cons by
// forwarding it to the leader (or answering -MOVED / -UNAVAILABLE no leader)
// — or to the member err names for it (a chain's tail: forwarded, never
// -MOVED, cluster.ReadElsewhere).
func (c *conn) forwardRead(args [][]byte, cons level.Consistency, sess shard.Session, o callOpts, err error) error {
	if o.redirect && !cluster.ReadElsewhere(err) {
		return c.srv.router.Redirect(err)
	}
	if e, ok := cluster.SlotRedirect(err); ok && c.clusterAware {
		return e
	}
	addr, _ := c.srv.router.LeaderFor(err) // none known: forward waits for one
	fc := &cluster.Call{Args: args, Cons: cons, Sess: sess}
	c.srv.router.Forward(addr, []*cluster.Call{fc})
	if fc.Err != nil {
		return fc.Err
	}
	if fc.Reply.Kind == resp.Error {
		c.timed[len(c.timed)-1].err = true
	}
	if o.session {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(fc.NewSess.String())
	} else {
		c.sess = c.sess.Merge(fc.NewSess)
	}
	if fc.Reply.Kind == resp.Null && bytes.Equal(args[0], kefirExecROName) {
		return c.w.WriteNullArray() // an EXEC's null is an array's (writeForwarded)
	}
	return c.w.WriteValue(execToResp3(fc.Reply, c.execShapes))
}
