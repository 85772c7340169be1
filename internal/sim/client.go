package sim

import (
	"fmt"

	"github.com/kefirdb/kefir/internal/check"
)

// Invoke starts op on client i now. The client must be idle (closed loop:
// one operation in flight per client).
func (s *Sim) Invoke(i int, op check.Op) {
	s.invoke(i, op, Event{Kind: Invoke})
}

// InvokeVia starts op on client i, asking it to send the operation to replica
// r (see Event.Route).
func (s *Sim) InvokeVia(i int, op check.Op, r int) {
	s.invoke(i, op, Event{Kind: Invoke, Route: Addr(r), Routed: true})
}

func (s *Sim) invoke(i int, op check.Op, ev Event) {
	c := s.clients[i]
	if c.pending >= 0 {
		panic(fmt.Sprintf("sim: client %d already has op #%d in flight", i, c.pending))
	}
	op.Client = i
	c.seq++
	c.pending = s.rec.Invoke(op)
	id := s.cfg.ClientAddr(i)
	if s.trace != nil {
		s.tracef("invoke c%d seq=%d %v(%s) route=%t:%d", i, c.seq, op.Kind, op.Key, ev.Routed, ev.Route)
	}
	ev.Seq, ev.Op = c.seq, op
	s.step(id, c.node, ev)
}

// Idle reports whether client i has no operation in flight.
func (s *Sim) Idle(i int) bool { return s.clients[i].pending < 0 }

func (s *Sim) invokeNext(i int) {
	c := s.clients[i]
	if c.pending >= 0 || c.done >= s.o.OpsPerClient {
		return
	}
	s.Invoke(i, s.o.Workload.Next(s.rng, i, c.done))
}

func (s *Sim) complete(i int, d Completion) {
	c := s.clients[i]
	if c.pending < 0 || d.Seq != c.seq {
		panic(fmt.Sprintf("sim: client %d completed seq %d, in flight: %d (op #%d)", i, d.Seq, c.seq, c.pending))
	}
	id := c.pending
	c.pending = -1
	c.done++
	if s.trace != nil {
		s.tracef("done c%d seq=%d %v %+v", i, d.Seq, d.Outcome, d.Result)
	}
	switch d.Outcome {
	case check.OK:
		s.rec.Complete(id, d.Result)
	case check.Failed:
		s.rec.Fail(id)
	default:
		s.rec.Unknown(id)
	}
	if s.o.Workload == nil {
		return
	}
	if c.done < s.o.OpsPerClient {
		s.schedule(item{at: s.now + s.o.Think.sample(s.rng), kind: itInvoke, node: s.cfg.ClientAddr(i)})
		return
	}
	for _, c := range s.clients {
		if c.done < s.o.OpsPerClient {
			return
		}
	}
	if s.trace != nil {
		s.tracef("workload finished")
	}
	s.Stop()
}
