package sim

import (
	"math/rand/v2"
	"time"
)

// Swarm returns base with its fault knobs drawn at random from seed (swarm
// testing, as TigerBeetle's VOPR does): each seed explores a different mix of
// latency, jitter, loss, duplication, drift, torn writes, failing fsyncs and
// fault rates, instead of every seed sharing one middle-of-the-road setting.
// Fields base sets explicitly to non-zero values are kept.
func Swarm(seed uint64, base Options) Options {
	rng := rand.New(rand.NewPCG(seed, 0x737761726d))
	o := base
	o.Seed = seed
	if o.Net == (Link{}) {
		o.Net = Link{
			Delay: Dist{
				Base:   time.Duration(50+rng.IntN(2000)) * time.Microsecond,
				Jitter: time.Duration(rng.IntN(3000)) * time.Microsecond,
				Exp:    rng.IntN(2) == 0,
			},
			Drop: pick(rng, 0, 0.001, 0.01, 0.05),
			Dup:  pick(rng, 0, 0.001, 0.01, 0.05),
		}
	}
	if o.MaxDrift == 0 {
		o.MaxDrift = pick(rng, 0, 30e-6, 200e-6, 1e-3)
	}
	if !o.Torn {
		o.Torn = rng.IntN(4) != 0
	}
	if o.SyncFail == 0 {
		o.SyncFail = pick(rng, 0, 0, 0.001, 0.01)
	}
	if o.Sync == (Dist{}) {
		o.Sync = Dist{Base: time.Duration(20+rng.IntN(500)) * time.Microsecond, Jitter: time.Duration(rng.IntN(2000)) * time.Microsecond, Exp: true}
	}
	if o.Faults == nil {
		o.Faults = &Faults{
			Every:     Dist{Base: time.Duration(5+rng.IntN(50)) * time.Millisecond, Jitter: time.Duration(1+rng.IntN(50)) * time.Millisecond},
			Crash:     float64(rng.IntN(4)),
			Restart:   float64(1 + rng.IntN(4)),
			Partition: float64(rng.IntN(4)),
			OneWay:    float64(rng.IntN(4)),
			Heal:      float64(1 + rng.IntN(4)),
		}
	}
	return o
}

func pick(rng *rand.Rand, xs ...float64) float64 { return xs[rng.IntN(len(xs))] }
