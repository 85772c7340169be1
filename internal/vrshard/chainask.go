package vrshard

import (
	"context"
	"sync"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Batching CRAQ's version queries (docs/design/chain.md, "The version
// query"). The tail answers one number for every key — its commit point —
// so one query serves every dirty read waiting at a member; what a read
// needs is an answer computed after it began (every write answered before
// it began is then at most the answer). A query already on its way was
// sent before a read that arrives now: the tail may have computed its
// answer before a write, answered before that read began, committed there.
// So a read that finds a query in flight waits for the next one, which is
// sent as soon as the one in flight returns and carries every read that
// arrived meanwhile: under load a member sends at most one query per
// round trip to the tail, however many dirty reads it serves. Nothing
// changes on the wire (KEFIR.CHAINVERSION group epoch, one per round
// trip), so an older tail still works: its "unknown command" answers the
// whole batch, and each read goes to the tail whole.

// maxVersionQueries bounds the version queries a member has in flight:
// a read that finds that many waits for the first to return, which sends
// the next for every read queued meanwhile.
const maxVersionQueries = 1

// chainAsker is a member's queue of reads waiting for a version query.
type chainAsker struct {
	mu      sync.Mutex
	senders int           // sender goroutines running (sendVersionQueries), at most maxVersionQueries
	next    []*versionAsk // the reads the next query answers
	// inFlight: the query in flight under the mutation chainVersionInFlight.
	inFlight *versionAsk
}

// versionAsk is one read's wait for a version: which tail it asked, in
// which epoch, and the answer once done is closed.
type versionAsk struct {
	tail  uint64
	addr  string
	epoch uint64
	done  chan struct{}
	v     uint64
	err   error
}

// askVersion asks the tail (tail, at client address addr) for its version
// in epoch through the member's batch (chainAsker): the answer of a query
// sent after this call began. ctx bounds the wait; the query itself is
// bounded by chainVersionAsk.
func (r *Replica) askVersion(ctx context.Context, tail uint64, addr string, epoch uint64) (uint64, error) {
	if mutation.On && r.mut.chainVersionInFlight {
		// Deliberately broken (tests): the read rides the query in flight,
		// sent before it began.
		return r.askVersionInFlight(ctx, tail, addr, epoch)
	}
	w := &versionAsk{tail: tail, addr: addr, epoch: epoch, done: make(chan struct{})}
	a := &r.asker
	a.mu.Lock()
	a.next = append(a.next, w)
	start := a.senders < maxVersionQueries
	if start {
		a.senders++
	}
	a.mu.Unlock()
	if start {
		go r.sendVersionQueries()
	}
	select {
	case <-w.done:
		return w.v, w.err
	case <-ctx.Done():
		return 0, ctx.Err() // the batch's answer, when it comes, is dropped
	}
}

// sendVersionQueries sends one query for every read queued, answers them,
// and goes on while reads queued up during the round trip; it ends when
// none did. One query per tail and epoch in the batch (after a chain
// change a batch may hold reads that asked the old tail and the new).
func (r *Replica) sendVersionQueries() {
	a := &r.asker
	for {
		a.mu.Lock()
		batch := a.next
		a.next = nil
		if len(batch) == 0 {
			a.senders--
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		for len(batch) > 0 {
			w0 := batch[0]
			v, err := r.sendVersionQuery(w0.tail, w0.addr, w0.epoch)
			n := 0
			for _, w := range batch {
				if w.tail == w0.tail && w.addr == w0.addr && w.epoch == w0.epoch {
					w.v, w.err = v, err
					close(w.done)
					continue
				}
				batch[n] = w // another tail or epoch: its own query, next
				n++
			}
			clear(batch[n:])
			batch = batch[:n]
		}
	}
}

// sendVersionQuery is one query's round trip (Options.AskTail), bounded by
// chainVersionAsk and by nothing a single read's context says: the batch
// outlives any one of its reads.
func (r *Replica) sendVersionQuery(tail uint64, addr string, epoch uint64) (uint64, error) {
	r.st.chainVersionQueries.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), chainVersionAsk)
	defer cancel()
	return r.opts.AskTail(ctx, tail, addr, epoch)
}

// askVersionInFlight is the mutation chainVersionInFlight: a read that
// finds a query in flight takes that query's answer, though it was sent
// before the read began.
func (r *Replica) askVersionInFlight(ctx context.Context, tail uint64, addr string, epoch uint64) (uint64, error) {
	a := &r.asker
	a.mu.Lock()
	if c := a.inFlight; c != nil {
		a.mu.Unlock()
		select {
		case <-c.done:
			return c.v, c.err
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	c := &versionAsk{tail: tail, addr: addr, epoch: epoch, done: make(chan struct{})}
	a.inFlight = c
	a.mu.Unlock()
	c.v, c.err = r.sendVersionQuery(tail, addr, epoch)
	a.mu.Lock()
	a.inFlight = nil
	a.mu.Unlock()
	close(c.done)
	return c.v, c.err
}
