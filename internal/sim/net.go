package sim

import (
	"math/rand/v2"
	"time"
)

// Dist is a delay distribution: Base plus a random part. The random part is
// uniform in [0, Jitter) or, with Exp, exponential with mean Jitter (a long
// tail, so messages overtake each other now and then).
type Dist struct {
	Base, Jitter time.Duration
	Exp          bool
}

func (d Dist) sample(rng *rand.Rand) int64 {
	v := int64(d.Base)
	if d.Jitter > 0 {
		if d.Exp {
			v += int64(rng.ExpFloat64() * float64(d.Jitter))
		} else {
			v += rng.Int64N(int64(d.Jitter))
		}
	}
	return v
}

// Link is the behaviour of one direction of one link. Reordering comes from
// the delay distribution: two messages on a link with jitter arrive in either
// order.
type Link struct {
	Delay Dist
	Drop  float64 // probability that a message is lost
	Dup   float64 // probability that a message is delivered a second time (with its own delay)
}

// linkState is the simulator's mutable view of a directed link.
type linkState struct {
	Link
	blocked bool   // partitioned: messages are dropped (checked at send and at delivery)
	held    bool   // messages queue up until Release
	queued  []item // held messages
	// last: when the last message sent on the link is delivered
	// (Options.FIFO).
	last int64
}

// deliverAt sets the item's delivery time: now plus a link delay, and with
// Options.FIFO no earlier than the message sent before it on the link (a
// message at the same time is delivered after it: the queue orders ties by
// when they were scheduled).
func (s *Sim) deliverAt(l *linkState, it *item) {
	it.at = s.now + l.Delay.sample(s.rng)
	if s.o.FIFO {
		it.at = max(it.at, l.last)
		l.last = it.at
	}
}

func (s *Sim) link(from, to Addr) *linkState {
	return &s.links[int(from)*s.total+int(to)]
}

// SetLink changes one direction of a link.
func (s *Sim) SetLink(from, to Addr, l Link) {
	if s.trace != nil {
		s.tracef("set-link %d->%d %+v", from, to, l)
	}
	s.link(from, to).Link = l
}

// SetLinks changes both directions between every pair in a and every pair in b.
func (s *Sim) SetLinks(a, b []Addr, l Link) {
	for _, x := range a {
		for _, y := range b {
			if x != y {
				s.link(x, y).Link = l
				s.link(y, x).Link = l
			}
		}
	}
}

// Block cuts the one-way link from -> to (a one-way partition).
func (s *Sim) Block(from, to Addr) {
	if s.trace != nil {
		s.tracef("block %d->%d", from, to)
	}
	s.link(from, to).blocked = true
}

// Unblock restores the one-way link from -> to.
func (s *Sim) Unblock(from, to Addr) {
	if s.trace != nil {
		s.tracef("unblock %d->%d", from, to)
	}
	s.link(from, to).blocked = false
}

// Partition cuts every link between different groups, both ways. Endpoints
// not named in any group (clients, typically) keep talking to everyone.
func (s *Sim) Partition(groups ...[]Addr) {
	if s.trace != nil {
		s.tracef("partition %v", groups)
	}
	for i, g := range groups {
		for j, h := range groups {
			if i == j {
				continue
			}
			for _, a := range g {
				for _, b := range h {
					s.link(a, b).blocked = true
				}
			}
		}
	}
}

// Isolate cuts every replica link to and from a, both ways (clients included
// when withClients).
func (s *Sim) Isolate(a Addr, withClients bool) {
	if s.trace != nil {
		s.tracef("isolate %d clients=%t", a, withClients)
	}
	for b := 0; b < s.total; b++ {
		if Addr(b) == a || (!withClients && b >= s.cfg.Replicas) {
			continue
		}
		s.link(a, Addr(b)).blocked = true
		s.link(Addr(b), a).blocked = true
	}
}

// Heal removes every partition and block and releases held links.
func (s *Sim) Heal() {
	if s.trace != nil {
		s.tracef("heal")
	}
	for i := range s.links {
		s.links[i].blocked = false
	}
	for from := 0; from < s.total; from++ {
		for to := 0; to < s.total; to++ {
			if s.link(Addr(from), Addr(to)).held {
				s.Release(Addr(from), Addr(to))
			}
		}
	}
}

// Hold queues every message sent on from -> to until Release: a precise way to
// make one copy of a message arrive late (the scenarios use it).
func (s *Sim) Hold(from, to Addr) {
	if s.trace != nil {
		s.tracef("hold %d->%d", from, to)
	}
	s.link(from, to).held = true
}

// Release delivers the messages held on from -> to, in the order they were
// sent, each after a fresh link delay (arrivals keep that order when the link
// has no jitter), and stops holding.
func (s *Sim) Release(from, to Addr) {
	l := s.link(from, to)
	if s.trace != nil {
		s.tracef("release %d->%d (%d held)", from, to, len(l.queued))
	}
	l.held = false
	q := l.queued
	l.queued = nil
	for _, it := range q {
		s.deliverAt(l, &it)
		s.schedule(it)
	}
}

// send puts a message on the network.
func (s *Sim) send(from, to Addr, msg any) {
	s.stats.Sent++
	if to < 0 || int(to) >= s.total {
		panic("sim: message to unknown address")
	}
	l := s.link(from, to)
	if l.blocked {
		s.stats.Dropped++
		if s.trace != nil {
			s.tracef("drop %d->%d %v (partitioned)", from, to, msg)
		}
		return
	}
	if l.Drop > 0 && s.rng.Float64() < l.Drop {
		s.stats.Dropped++
		if s.trace != nil {
			s.tracef("drop %d->%d %v (loss)", from, to, msg)
		}
		return
	}
	it := item{kind: itDeliver, node: to, from: from, msg: msg}
	if l.held {
		l.queued = append(l.queued, it)
		return
	}
	s.deliverAt(l, &it)
	s.schedule(it)
	if l.Dup > 0 && s.rng.Float64() < l.Dup {
		s.stats.Duplicated++
		s.deliverAt(l, &it)
		s.schedule(it)
	}
}
