// Package resptxn runs the transactions of check's workload generator
// (check.RunTxns) against a RESP store — redis-server, or Kefir once it
// has MULTI/EXEC (issue 29) — as MULTI … EXEC blocks, so that
// check.CheckTxns can judge what the store did.
//
// A list append is APPEND k " x" and a list read GET k (the string of
// space-separated elements); a register write is SET k x and a read GET k.
// By default every micro-op of a transaction is queued in one MULTI, so
// reads see the state at EXEC, with the transaction's own earlier writes:
// what MULTI/EXEC promises is atomic execution, which the checker judges as
// strict serializability. Watch runs transactions interactively, the
// optimistic way clients use WATCH: see Mode.
package resptxn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/resp"
)

// Runner is a check.TxnRunner over RESP: one connection per process.
type Runner struct {
	Addr string
	// Timeout bounds one transaction's round trip (0 = 5 s); past it the
	// outcome is unknown.
	Timeout time.Duration
	// Mode: Atomic (one MULTI block), Watch (interactive, optimistic), or
	// one of the deliberately broken modes the checker must catch.
	Mode Mode

	mu    sync.Mutex
	conns map[int]*conn
}

// Mode is how a transaction is sent.
type Mode uint8

const (
	// Atomic queues the whole transaction in one MULTI block.
	Atomic Mode = iota
	// Watch is an interactive optimistic transaction: WATCH its keys, run
	// the reads before its first write as plain GETs, then MULTI, the rest,
	// EXEC; EXEC answers nil (an abort) if a watched key changed meanwhile.
	Watch
	// NoWatch is Watch without the WATCH: a read-modify-write can lose
	// updates. Deliberately broken, for the checker to catch.
	NoWatch
	// Split sends each micro-op in its own MULTI block: not atomic.
	// Deliberately broken, for the checker to catch.
	Split
)

type conn struct {
	nc  net.Conn
	rd  *resp.Reader
	buf []byte
}

// errUnknown marks a transaction whose outcome the runner could not learn.
var errUnknown = errors.New("resptxn: outcome unknown")

// Run executes t's micro-ops atomically (unless Split) and returns them
// with their reads filled in. EXEC answering nil or EXECABORT is a definite
// abort (check.ErrTxnAborted); a lost connection or timeout leaves the
// outcome unknown.
func (r *Runner) Run(ctx context.Context, t check.Txn) ([]check.Mop, error) {
	c, err := r.conn(t.Process)
	if err != nil {
		// Nothing was sent: the transaction did not happen.
		return nil, fmt.Errorf("resptxn: dial %s: %v: %w", r.Addr, err, check.ErrTxnAborted)
	}
	timeout := r.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.nc.SetDeadline(deadline)
	mops := append([]check.Mop(nil), t.Mops...)
	if r.Mode == Watch || r.Mode == NoWatch {
		if err := c.interactive(mops, r.Mode == Watch); err != nil {
			if !errors.Is(err, check.ErrTxnAborted) {
				r.drop(t.Process, c)
				return nil, fmt.Errorf("resptxn: transaction %d: %w (%v)", t.ID, errUnknown, err)
			}
			return nil, err
		}
		return mops, nil
	}
	groups := [][]check.Mop{mops}
	if r.Mode == Split {
		groups = groups[:0]
		for i := range mops {
			groups = append(groups, mops[i:i+1])
		}
	}
	for i, g := range groups {
		if err := c.exec(g); err != nil {
			if i == 0 && errors.Is(err, check.ErrTxnAborted) {
				return nil, err
			}
			if !errors.Is(err, check.ErrTxnAborted) {
				r.drop(t.Process, c)
			}
			// Part of a split transaction ran: its outcome is neither.
			return nil, fmt.Errorf("resptxn: transaction %d: %w (%v)", t.ID, errUnknown, err)
		}
	}
	return mops, nil
}

// Close closes every connection.
func (r *Runner) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for p, c := range r.conns {
		errs = append(errs, c.nc.Close())
		delete(r.conns, p)
	}
	return errors.Join(errs...)
}

func (r *Runner) conn(p int) (*conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.conns[p]; c != nil {
		return c, nil
	}
	nc, err := net.DialTimeout("tcp", r.Addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if r.conns == nil {
		r.conns = map[int]*conn{}
	}
	c := &conn{nc: nc, rd: resp.NewReader(nc, 0)}
	r.conns[p] = c
	return c, nil
}

// drop closes a connection whose stream state is unknown.
func (r *Runner) drop(p int, c *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = c.nc.Close()
	if r.conns[p] == c {
		delete(r.conns, p)
	}
}

// interactive runs mops as an optimistic transaction: WATCH its keys (if
// watch), the reads before the first write as plain GETs, then MULTI, the
// rest and EXEC — even when the rest is empty, since EXEC is what validates
// the watched keys, and so the plain reads.
func (c *conn) interactive(mops []check.Mop, watch bool) error {
	if watch {
		keys := keysOf(mops)
		c.buf = resp.AppendBulk(resp.AppendArrayHeader(c.buf[:0], 1+len(keys)), []byte("WATCH"))
		for _, k := range keys {
			c.buf = resp.AppendBulk(c.buf, []byte(k))
		}
		if err := c.roundTrip(1); err != nil {
			return err
		}
	}
	first := len(mops)
	for i, m := range mops {
		if m.Kind != check.MopRead {
			first = i
			break
		}
	}
	c.buf = c.buf[:0]
	for _, m := range mops[:first] {
		c.buf = resp.AppendCommand(c.buf, []byte("GET"), []byte(m.Key))
	}
	if _, err := c.nc.Write(c.buf); err != nil {
		return fmt.Errorf("resptxn: send: %w", err)
	}
	for i := range mops[:first] {
		v, err := c.rd.ReadValue()
		if err != nil {
			return fmt.Errorf("resptxn: read: %w", err)
		}
		if v.Kind == resp.Error {
			return fmt.Errorf("resptxn: %v: %s", mops[i], v.Str)
		}
		if err := fill(&mops[i], v); err != nil {
			return err
		}
	}
	return c.exec(mops[first:])
}

// roundTrip sends c.buf and reads n replies, failing on an error reply.
func (c *conn) roundTrip(n int) error {
	if _, err := c.nc.Write(c.buf); err != nil {
		return fmt.Errorf("resptxn: send: %w", err)
	}
	for range n {
		v, err := c.rd.ReadValue()
		if err != nil {
			return fmt.Errorf("resptxn: read: %w", err)
		}
		if v.Kind == resp.Error {
			return fmt.Errorf("resptxn: %s", v.Str)
		}
	}
	return nil
}

func keysOf(mops []check.Mop) []string {
	var keys []string
	seen := map[string]bool{}
	for _, m := range mops {
		if !seen[m.Key] {
			seen[m.Key] = true
			keys = append(keys, m.Key)
		}
	}
	return keys
}

// exec sends MULTI, the mops and EXEC in one write and fills in the reads
// from EXEC's reply. An error wrapping check.ErrTxnAborted means EXEC
// discarded the block; any other error leaves the stream unusable.
func (c *conn) exec(mops []check.Mop) error {
	c.buf = resp.AppendCommand(c.buf[:0], []byte("MULTI"))
	for _, m := range mops {
		switch m.Kind {
		case check.MopAppend:
			c.buf = resp.AppendCommand(c.buf, []byte("APPEND"), []byte(m.Key), []byte(" "+strconv.Itoa(m.Value)))
		case check.MopWrite:
			c.buf = resp.AppendCommand(c.buf, []byte("SET"), []byte(m.Key), []byte(strconv.Itoa(m.Value)))
		case check.MopRead:
			c.buf = resp.AppendCommand(c.buf, []byte("GET"), []byte(m.Key))
		default:
			return fmt.Errorf("resptxn: unknown micro-op %v: %w", m.Kind, check.ErrTxnAborted)
		}
	}
	c.buf = resp.AppendCommand(c.buf, []byte("EXEC"))
	if _, err := c.nc.Write(c.buf); err != nil {
		return fmt.Errorf("resptxn: send: %w", err)
	}
	// MULTI's +OK and each +QUEUED (or a queuing error, after which EXEC
	// answers EXECABORT).
	for i := 0; i <= len(mops); i++ {
		if _, err := c.rd.ReadValue(); err != nil {
			return fmt.Errorf("resptxn: read: %w", err)
		}
	}
	v, err := c.rd.ReadValue()
	if err != nil {
		return fmt.Errorf("resptxn: read EXEC: %w", err)
	}
	switch {
	case v.IsNull():
		return fmt.Errorf("resptxn: EXEC answered nil: %w", check.ErrTxnAborted)
	case v.Kind == resp.Error:
		if strings.HasPrefix(string(v.Str), "EXECABORT") {
			return fmt.Errorf("resptxn: %s: %w", v.Str, check.ErrTxnAborted)
		}
		return fmt.Errorf("resptxn: EXEC: %s", v.Str)
	case v.Kind != resp.Array || len(v.Elems) != len(mops):
		return fmt.Errorf("resptxn: EXEC answered %v for %d commands", v, len(mops))
	}
	for i := range mops {
		e := v.Elems[i]
		if e.Kind == resp.Error {
			return fmt.Errorf("resptxn: %v: %s", mops[i], e.Str)
		}
		if mops[i].Kind != check.MopRead {
			continue
		}
		if err := fill(&mops[i], e); err != nil {
			return err
		}
	}
	return nil
}

// fill sets a read's result from GET's reply.
func fill(m *check.Mop, v resp.Value) error {
	if m.List == nil {
		m.Value = 0
		if v.IsNull() {
			return nil
		}
		n, err := strconv.Atoi(string(v.Str))
		if err != nil {
			return fmt.Errorf("resptxn: register %s holds %q: %v", m.Key, v.Str, err)
		}
		m.Value = n
		return nil
	}
	m.List = []int{}
	if v.IsNull() {
		return nil
	}
	for _, f := range strings.Fields(string(v.Str)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("resptxn: list %s holds %q: %v", m.Key, v.Str, err)
		}
		m.List = append(m.List, n)
	}
	return nil
}
