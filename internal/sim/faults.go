package sim

import "time"

// Faults is a random fault schedule ("nemesis"). Every Every, one action is
// drawn by weight. Only faults the protocol claims to tolerate are injected by
// default: at most MaxDown replicas are crashed at once.
type Faults struct {
	Every Dist
	// Until stops injecting at this virtual time, then heals the network and
	// restarts every crashed replica so the run can settle (default: run Duration/2).
	Until time.Duration
	// MaxDown bounds simultaneously crashed replicas (default (Replicas-1)/2).
	MaxDown int
	// Weights of the actions; all zero means equal weights.
	Crash, Restart, Partition, OneWay, Heal float64
}

func (s *Sim) fault() {
	f := s.o.Faults
	until := int64(f.Until)
	if until == 0 {
		until = int64(s.o.Duration) / 2
	}
	if s.now >= until {
		s.tracef("nemesis: done, healing")
		s.Heal()
		for i := range s.replicas {
			s.Restart(i)
		}
		return
	}
	defer s.schedule(item{at: s.now + f.Every.sample(s.rng), kind: itFault})
	w := [5]float64{f.Crash, f.Restart, f.Partition, f.OneWay, f.Heal}
	var sum float64
	for _, x := range w {
		sum += x
	}
	if sum == 0 {
		w, sum = [5]float64{1, 1, 1, 1, 1}, 5
	}
	x := s.rng.Float64() * sum
	act := 0
	for act < len(w)-1 && x >= w[act] {
		x -= w[act]
		act++
	}
	n := s.cfg.Replicas
	maxDown := f.MaxDown
	if maxDown == 0 {
		maxDown = (n - 1) / 2
	}
	switch act {
	case 0:
		down := 0
		for _, r := range s.replicas {
			if !r.up {
				down++
			}
		}
		if down < maxDown {
			s.Crash(s.rng.IntN(n))
		}
	case 1:
		s.Restart(s.rng.IntN(n))
	case 2:
		perm := s.rng.Perm(n)
		k := 1 + s.rng.IntN(max(1, n/2))
		var a, b []Addr
		for i, p := range perm {
			if i < k {
				a = append(a, Addr(p))
			} else {
				b = append(b, Addr(p))
			}
		}
		s.Partition(a, b)
	case 3:
		from, to := s.rng.IntN(n), s.rng.IntN(n)
		if from != to {
			s.Block(Addr(from), Addr(to))
		}
	case 4:
		s.Heal()
	}
}
