package transport

import (
	"cmp"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// Fault is injected on one link at this node, for experiments (network
// distance) and tests. The zero Fault is a healthy link.
type Fault struct {
	// Delay holds every message sent on the link for this long before it is
	// written (one-way delay). Jitter adds a uniform extra in [0, Jitter)
	// per message; a message never overtakes the one sent before it, so
	// jitter delays bursts rather than reordering them.
	Delay, Jitter time.Duration
	// DropRate is the probability that a message sent on the link is
	// dropped (counted in FaultDropped).
	DropRate float64
	// Partition drops every message on the link, both the ones this node
	// sends and the ones it receives from the peer, so one call on one node
	// cuts the link both ways. Heal with the zero Fault.
	Partition bool
}

func (f Fault) validate() error {
	if f.Delay < 0 || f.Jitter < 0 || f.DropRate < 0 || f.DropRate > 1 {
		return fmt.Errorf("transport: invalid fault %+v: delays must be ≥ 0 and DropRate in [0, 1]", f)
	}
	return nil
}

// SetLinkFault replaces the fault on the link to peer `to`. Messages already
// queued keep the delay they were given; new ones get the new fault (order is
// kept either way).
func (t *Transport) SetLinkFault(to uint64, f Fault) error {
	if err := f.validate(); err != nil {
		return err
	}
	p := t.peers()[to]
	if p == nil {
		return fmt.Errorf("%w: %d", ErrUnknownPeer, to)
	}
	p.mu.Lock()
	p.fault = f
	p.mu.Unlock()
	p.partitioned.Store(f.Partition)
	t.log.Info("link fault set", "peer", to, "delay", f.Delay, "jitter", f.Jitter, "drop_rate", f.DropRate, "partition", f.Partition)
	return nil
}

// counters are one link's, updated with atomics on the hot paths.
type counters struct {
	sent, dropped, faultDropped, batches, bytesOut  atomic.Uint64
	inlineWrites                                    atomic.Uint64
	midFrameDrops                                   atomic.Uint64 // tests: the partial-head path ran
	received, readBatches, bytesIn, faultDroppedIn  atomic.Uint64
	corrupt, spoofed, unrouted                      atomic.Uint64
	connects, reconnects, dialFailures, inboundConn atomic.Uint64
	duplicates, replaced                            atomic.Uint64
	open                                            atomic.Int64
	connected                                       atomic.Bool
}

// LinkStats are the counters of the link to one peer, since New.
type LinkStats struct {
	Peer uint64
	// Outbound.
	Sent         uint64 // messages written to the connection
	Dropped      uint64 // messages dropped: queue full, failed dial or write, Close
	FaultDropped uint64 // messages dropped by an injected DropRate or Partition
	Batches      uint64 // writes (one syscall each, one per batch)
	InlineWrites uint64 // of Batches, written by SendAll on the caller's goroutine
	BytesOut     uint64 // frame bytes written
	Queued       int64  // messages waiting now (queue and delay line)
	Connected    bool   // the writer holds the pair's connection now
	Reconnects   uint64 // successful dials after the first
	DialFailures uint64 // failed dials and refused handshakes
	// Inbound.
	Received       uint64 // messages delivered to the Handler
	ReadBatches    uint64 // Handler calls
	BytesIn        uint64 // frame bytes read
	FaultDroppedIn uint64 // inbound messages discarded by a Partition
	Corrupt        uint64 // connections closed for a bad frame (checksum, size, decode)
	Spoofed        uint64 // connections closed for a message whose From or To is wrong
	Unrouted       uint64 // inbound messages for a group with no endpoint here (dropped)
	InboundConns   uint64 // authenticated inbound connections accepted
	// The pair's one connection.
	Open       int64  // authenticated connections with the peer open now (1 when linked; 2 briefly while one replaces another)
	Duplicates uint64 // dials refused or connections closed because the pair's connection beat them (dial races)
	Replaced   uint64 // times a new connection replaced the pair's connection (reconnects, a restarted peer)
}

func (s *LinkStats) add(o LinkStats) {
	s.Sent += o.Sent
	s.Dropped += o.Dropped
	s.FaultDropped += o.FaultDropped
	s.Batches += o.Batches
	s.InlineWrites += o.InlineWrites
	s.BytesOut += o.BytesOut
	s.Queued += o.Queued
	s.Reconnects += o.Reconnects
	s.DialFailures += o.DialFailures
	s.Received += o.Received
	s.ReadBatches += o.ReadBatches
	s.BytesIn += o.BytesIn
	s.FaultDroppedIn += o.FaultDroppedIn
	s.Corrupt += o.Corrupt
	s.Spoofed += o.Spoofed
	s.Unrouted += o.Unrouted
	s.InboundConns += o.InboundConns
	s.Open += o.Open
	s.Duplicates += o.Duplicates
	s.Replaced += o.Replaced
}

// Stats is a snapshot of the transport's counters, for the node's metrics.
type Stats struct {
	Links []LinkStats // one per peer, by peer id
	Total LinkStats   // the sum over Links (Peer and Connected unset)
	// Inbound connections refused before a peer was identified.
	AuthFailures     uint64 // wrong cluster secret or not a Kefir node
	IdentityRefusals uint64 // right secret, wrong node id, cluster or configuration
	ProtocolErrors   uint64 // malformed or abandoned handshakes
}

// Stats returns the current counters.
func (t *Transport) Stats() Stats {
	var s Stats
	for id, p := range t.peers() {
		c := &p.c
		l := LinkStats{
			Peer:           id,
			Sent:           c.sent.Load(),
			Dropped:        c.dropped.Load(),
			FaultDropped:   c.faultDropped.Load(),
			Batches:        c.batches.Load(),
			InlineWrites:   c.inlineWrites.Load(),
			BytesOut:       c.bytesOut.Load(),
			Queued:         p.queued.Load(),
			Connected:      c.connected.Load(),
			Reconnects:     c.reconnects.Load(),
			DialFailures:   c.dialFailures.Load(),
			Received:       c.received.Load(),
			ReadBatches:    c.readBatches.Load(),
			BytesIn:        c.bytesIn.Load(),
			FaultDroppedIn: c.faultDroppedIn.Load(),
			Corrupt:        c.corrupt.Load(),
			Spoofed:        c.spoofed.Load(),
			Unrouted:       c.unrouted.Load(),
			InboundConns:   c.inboundConn.Load(),
			Open:           c.open.Load(),
			Duplicates:     c.duplicates.Load(),
			Replaced:       c.replaced.Load(),
		}
		s.Links = append(s.Links, l)
		s.Total.add(l)
	}
	slices.SortFunc(s.Links, func(a, b LinkStats) int { return cmp.Compare(a.Peer, b.Peer) })
	s.AuthFailures = t.authFailures.Load()
	s.IdentityRefusals = t.identityFails.Load()
	s.ProtocolErrors = t.protoFailures.Load()
	return s
}

// Link returns the stats of the link to peer id (zero if unknown).
func (s Stats) Link(id uint64) LinkStats {
	for _, l := range s.Links {
		if l.Peer == id {
			return l
		}
	}
	return LinkStats{}
}
