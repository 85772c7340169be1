package scenario

import (
	"time"

	"github.com/kefirdb/kefir/internal/level"
)

func steps(groups ...any) []Step {
	var out []Step
	for _, g := range groups {
		switch g := g.(type) {
		case Step:
			out = append(out, g)
		case []Step:
			out = append(out, g...)
		default:
			panic("scenario: steps takes Step or []Step")
		}
	}
	return out
}

var (
	lin  = level.ConsLinearizable
	ccm  = level.ConsCrossClient
	sync = level.Sync
	cad  = level.CAD
)

// Figure6SimpleMajority: nilext write a completes on S1..S3 while its copies
// to S4, S5 are late; b follows a in real time and reaches everyone; a then
// lands on S4, S5 after b. The leader crashes. With simple-majority
// acknowledgement the survivors' durability logs (ab, ab, ba, ba) cannot tell
// the order and a read may return a. With Skyros's supermajority, a cannot
// complete before its late copies land, so b does not follow it. Any engine:
// the history must be linearizable and no sync write lost.
var Figure6SimpleMajority = Scenario{
	Name:     "figure6-simple-majority",
	Doc:      "a completes on a simple majority while its copies to S4, S5 are late; b follows a; the leader crashes; a later read must return b",
	Source:   "digest 004 §2.4, Skyros Figure 6",
	Replicas: 5, Clients: 3,
	Steps: steps(
		HoldClient(0, 3, 4),
		Do(0, Put("k", "a", sync)),
		Do(1, Put("k", "b", sync)),
		ReleaseClient(0, 3, 4),
		Sleep(5*time.Millisecond),
		Crash(0),
		Settle(),
		Do(2, Get("k", lin)),
	),
	Checks: []Checker{Linearizable, Durability},
}

// ThreeCycle: the f = 2 execution whose pairwise-majority durability-log order
// is the cycle x -> y -> z -> x (digest 004 §6.1). Three clients write the same
// key; arrival orders are forced so that S2 = [z x y], S3 = [x y z],
// S4 = [y z x]; then the leader S1 and S5 crash and the new leader hears only
// S2, S3, S4. For a faithful Skyros the background finalizer must be slow
// enough that nothing was finalized (an engine-side knob). x completes before
// y is invoked, so y must win over x.
var ThreeCycle = Scenario{
	Name:     "three-cycle-f2",
	Doc:      "forces d-logs S2=[z x y], S3=[x y z], S4=[y z x] with x before y in real time; the leader and S5 crash; a later read must not return x",
	Source:   "digest 004 §6.1 (RecoverDurabilityLog counterexample)",
	Replicas: 5, Clients: 4,
	Steps: steps(
		// z reaches S2 only; its other copies are slow.
		HoldClient(2, 0, 2, 3, 4),
		Invoke(2, Put("k", "z", sync)),
		Sleep(2*time.Millisecond),
		// x reaches S1, S2 (after z), S3, S5 and completes; S4's copy is late.
		HoldClient(0, 3),
		Do(0, Put("k", "x", sync)),
		// y follows x in real time: it reaches S4 first, then the others.
		HoldClient(1, 0, 1, 2, 4),
		Invoke(1, Put("k", "y", sync)),
		Sleep(2*time.Millisecond),
		ReleaseClient(1, 0, 1, 2, 4),
		Await(1),
		// z now reaches S3, S4, S1, S5 and completes.
		ReleaseClient(2, 2, 3, 0, 4),
		Await(2),
		// x finally reaches S4.
		ReleaseClient(0, 3),
		Sleep(2*time.Millisecond),
		Crash(0), Crash(4),
		Settle(),
		Do(3, Get("k", lin)),
	),
	Checks: []Checker{Linearizable, Durability},
	KnownHazard: "the paper's RecoverDurabilityLog builds the cycle x->y->z->x from these logs; " +
		"a faithful implementation may order y before x and return x (digest 004 §6.1)",
}

// LaggingFollowerRead: CAD's Figure 4. Follower S5 is cut off after it saw
// k=1; the leader writes and serves k=2; a later read routed to S5 must not
// return 1 (cross-client monotonic reads). Engines without follower reads
// ignore the routing and serve it at the leader.
var LaggingFollowerRead = Scenario{
	Name:     "lagging-follower-monotonic-read",
	Doc:      "S5 is cut off after seeing k=1; k=2 is written and read; a read routed to S5 must not return 1",
	Source:   "digest 003 §2.7 Figure 4, §5.4",
	Replicas: 5, Clients: 3,
	Steps: steps(
		Do(0, Put("k", "1", cad)),
		Sleep(20*time.Millisecond),
		Isolate(4),
		Do(0, Put("k", "2", cad)),
		Do(1, Get("k", ccm)),
		InvokeVia(2, 4, Get("k", ccm)),
		Await(2),
		Heal(),
	),
	Checks: []Checker{CrossClient, Linearizable},
}

// ReadThenTotalCrash: CAD's Figure 1 and B8. A cad write is read by one
// client; then every replica crashes at once and restarts. The value that was
// read must survive (cad), and every sync write acknowledged must survive.
var ReadThenTotalCrash = Scenario{
	Name:     "read-then-total-crash",
	Doc:      "a cad write is read, then every replica crashes and restarts; the value read and every sync write must survive",
	Source:   "digest 003 §1.2 Figure 1, §5.4 B8",
	Replicas: 3, Clients: 2,
	Steps: steps(
		Do(0, Put("s", "1", sync)),
		Do(0, Put("k", "1", sync)),
		Do(0, Put("k", "2", cad)),
		Do(1, Get("k", ccm)),
		CrashAll(),
		Sleep(10*time.Millisecond),
		RestartAll(),
		Settle(),
		Do(1, Get("k", lin)),
		Do(1, Get("s", lin)),
	),
	Checks: []Checker{Durability, CrossClient, Linearizable},
}

// DeposedLeader: the leader S1 is cut off from the other replicas while
// clients still reach it; the others move on and accept a write. A read routed
// to the old leader must not return the old value (leases / read-index; digest
// 004 §5.3 SIGSTOP case, digest 003 §2.11).
var DeposedLeader = Scenario{
	Name:     "deposed-leader-read",
	Doc:      "the leader is cut off from the other replicas but not from clients; the others accept k=2; a read at the old leader must not return 1",
	Source:   "digest 003 §2.11, §5.4 extras; digest 004 §5.3",
	Replicas: 5, Clients: 3,
	Steps: steps(
		Do(0, Put("k", "1", sync)),
		Partition([]int{0}, []int{1, 2, 3, 4}),
		Settle(),
		Do(1, Put("k", "2", sync)),
		InvokeVia(2, 0, Get("k", lin)),
		Await(2),
		Heal(),
	),
	Checks: []Checker{Linearizable},
}

// AsymmetricPartition: follower S5 hears the leader but cannot answer it
// (leader -> S5 works, S5 -> leader is cut), the case that tests lease
// timing (digest 003 §2.15.1, §5.4 extras). Writes go on; a read routed to S5
// must stay monotonic.
var AsymmetricPartition = Scenario{
	Name:     "asymmetric-partition",
	Doc:      "S5 hears the leader but cannot answer it; writes go on; a read routed to S5 must stay monotonic",
	Source:   "digest 003 §5.4 extras",
	Replicas: 5, Clients: 3,
	Steps: steps(
		Do(0, Put("k", "1", cad)),
		Block(4, 0),
		Do(0, Put("k", "2", cad)),
		Do(1, Get("k", ccm)),
		Sleep(500*time.Millisecond),
		Do(0, Put("k", "3", cad)),
		Do(1, Get("k", ccm)),
		InvokeVia(2, 4, Get("k", ccm)),
		Await(2),
		Heal(),
	),
	Checks: []Checker{CrossClient, Linearizable},
}

// All is the library, in a fixed order.
var All = []*Scenario{
	&Figure6SimpleMajority, &ThreeCycle, &LaggingFollowerRead, &ReadThenTotalCrash, &DeposedLeader, &AsymmetricPartition,
}
