package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
)

// FLUSHALL and FLUSHDB at a node of several groups: one flush per group
// that owns slots, each at its group's leader (this node's replica, or
// forwarded as KEFIR.TXAPPLY: writeAtLeader), all at once; the reply waits for every one
// (cluster/flush.go says why it is not atomic across groups and what
// refuses it). A single group's FLUSHALL stays one write of the batch.

var (
	flushAllSpec = command.MustLookup("FLUSHALL")
	flushDBSpec  = command.MustLookup("FLUSHDB")
)

// flushesAcross reports whether spec is a flush that goes to every group.
func (c *conn) flushesAcross(spec *command.Spec) bool {
	return (spec == flushAllSpec || spec == flushDBSpec) && c.srv.multi != nil && len(c.srv.multi.Slots().Groups) > 1
}

// flushAcross runs a flush at every group and answers +OK once each is
// applied at its durability; on the event loop (c.inline) it does nothing
// and sets c.wouldWait, so that a worker runs it.
func (c *conn) flushAcross(spec *command.Spec, args [][]byte, o callOpts) error {
	if _, _, err := parseMoreWrite(spec, args, &c.arena); err != nil {
		return err // the ASYNC|SYNC syntax, as for one group
	}
	if c.inline {
		c.wouldWait = true
		return nil
	}
	d := o.dur
	if d.IsZero() {
		d = c.dur
	}
	if err := c.srv.shard.CheckDurability(d); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), flushAcrossTimeout)
	defer cancel()
	if err := c.srv.flushGroups(ctx, d); err != nil {
		return err
	}
	if o.session {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(o.sess.String())
	}
	return c.w.WriteSimple("OK")
}

// flushAcrossTimeout bounds a flush across groups: each part is one write
// at its group (a forward retries a leader change for up to 10 s).
const flushAcrossTimeout = 15 * time.Second

// flushGroups sends one flush to every group that owns slots and waits for
// all of them. An error names each group that failed and says the others
// were flushed.
func (s *Server) flushGroups(ctx context.Context, d level.Durability) error {
	targets, err := s.multi.FlushTargets()
	if err != nil {
		return err
	}
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Delta names the group meant: a group its key no longer
			// routes to (a move since FlushTargets, or a stale map here)
			// refuses it rather than be flushed twice (cluster.flushCheck).
			_, fwd, err := s.writeAtLeader(ctx, kv.Op{Kind: kv.KindFlush, Key: t.Key, Delta: int64(t.Group)}, d)
			if err == nil && fwd != nil && fwd.Kind == resp.Error {
				err = &cluster.ReplyError{Msg: string(fwd.Str)}
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	var failed []string
	var first error
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Sprintf("group %d: %v", targets[i].Group, err))
			if first == nil {
				first = err
			}
		}
	}
	if failed == nil {
		return nil
	}
	prefix := "ERR"
	var re *cluster.ReplyError
	if errors.As(first, &re) && strings.HasPrefix(re.Msg, "TRYAGAIN") {
		prefix = "TRYAGAIN" // a move or a hand-over: a retry will do
	}
	return errf("%s FLUSHALL flushed %d of %d groups; %s", prefix, len(targets)-len(failed), len(targets), strings.Join(failed, "; "))
}
