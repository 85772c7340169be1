package chain

import (
	"os"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Each deliberate bug must be caught at a named seed, for the reason named:
// by the invariant check, and where a client can see the bug, by the
// linearizability check over the simulated clients' history alone (noCheck).
// KEFIR_CHAIN_MUTSCAN=1 runs TestMutationScan, which lists the seeds that
// catch each, to pick new ones after a deliberate change of the simulation.
//
// ackBeforeTail shows in a client's history only through CRAQ reads (a
// member answers from a version it wrongly thinks clean, and a later read at
// the tail goes back in time): it needs one hot key to show at a seed.
// truncateEarly makes a joiner that is not yet a replica the master's tail;
// its reads are refused, so clients see a stall, not a wrong answer.
// noResend (a lost order never re-sent) stalls a reconfiguration: the run
// never ends with the master idle. So does precopyToEnd (a pre-copy that
// ends only at the tail's end) while the writes outrun the joiner's pace.
var chainMutations = []struct {
	name    string
	set     func(*simOpts)
	shape   func(*simOpts) // nil: defaultSim
	seed    uint64
	noCheck bool
	want    string
}{
	{"ackBeforeTail", func(o *simOpts) { o.mut.ackBeforeTail = true }, nil, 2, false, "acknowledged up to"},
	{"ackBeforeTail", func(o *simOpts) { o.mut.ackBeforeTail = true }, hotKey, 625, true, "linearizable: VIOLATED"},
	{"skipFlush", func(o *simOpts) { o.mut.skipFlush = true }, nil, 1, false, "is not a prefix of its predecessor"},
	{"skipFlush", func(o *simOpts) { o.mut.skipFlush = true }, nil, 2, true, "linearizable: VIOLATED"},
	{"truncateEarly", func(o *simOpts) { o.mmut.truncateEarly = true }, nil, 7, false, "is not a valid tail"},
	{"ausiEarly", func(o *simOpts) { o.mut.ausiEarly = true }, ausiChain, 1, true, "linearizable: VIOLATED"},
	{"ignoreToken", func(o *simOpts) { o.mut.ignoreToken = true }, auChain, 4, true, "session: VIOLATED"},
	{"compactPastLA", func(o *simOpts) { o.mut.compactPastLA = true }, compacting, 1, false, "past its successor"},
	{"compactPastLA", func(o *simOpts) { o.mut.compactPastLA = true }, compacting, 86, true, "linearizable: VIOLATED"},
	{"noResend", func(o *simOpts) { o.mmut.noResend = true }, lossyLinks, 1, false, "no quiescence"},
	{"precopyToEnd", func(o *simOpts) { o.mut.precopyToEnd = true }, outrun, 26, false, "no quiescence"},
	{"restartShortest", func(o *simOpts) { o.mmut.restartShortest = true }, wholeChain, 2, true, "linearizable: VIOLATED"},
	{"restartAtOnce", func(o *simOpts) { o.mmut.restartAtOnce = true }, wholeChain, 2, true, "linearizable: VIOLATED"},
}

// wholeChain: the whole-chain restarts' shape (TestSimWholeChainRestart).
// A chain restarted from a shorter history than its longest loses
// acknowledged updates: the clients' reads go back. (The member holding the
// longer one, joined to it, no longer keeps entries the chain does not:
// its source holds no update after which to continue its history, and a
// snapshot replaces it — so the invariant check has nothing to see.)
func wholeChain(o *simOpts) { *o = wholeRestarting(o.seed) }

// lossyLinks: links that lose and double orders and answers (lossySim's),
// the master re-sending after 4 ticks.
func lossyLinks(o *simOpts) { o.resend, o.loss, o.dup = 4, 100, 100 }

// ausiChain: AUSI, one hot key, reads at the tail and CRAQ reads. A head
// that answers before the acknowledgement comes back lets a read at a
// member the update has not reached miss an update that completed.
func ausiChain(o *simOpts) { o.mode, o.keys, o.clients = AUSI, 1, 4 }

// auChain: AU, every read a session read at a random member. A member that
// answers without holding the session's token returns a version older than
// the session's own write.
func auChain(o *simOpts) { o.mode, o.allWeak = AU, true }

// outrun: TestSimOutrun's shape (outrunning): joiners paced below the
// rate of writes that go on while they pre-copy.
func outrun(o *simOpts) { *o = outrunning(o.seed) }

// hotKey: one key, four clients.
func hotKey(o *simOpts) { o.keys, o.clients = 1, 4 }

// compacting: every member compacts its history as far as it may.
func compacting(o *simOpts) { o.compact = true }

func mutationSim(seed uint64, shape func(*simOpts)) simOpts {
	o := defaultSim(seed)
	if shape != nil {
		shape(&o)
	}
	return o
}

func TestMutationsCaught(t *testing.T) {
	mutation.Require(t)
	for _, mc := range chainMutations {
		name := mc.name
		if mc.noCheck {
			name += "/history-only"
		}
		t.Run(name, func(t *testing.T) {
			o := mutationSim(mc.seed, mc.shape)
			o.noCheck = mc.noCheck
			mc.set(&o)
			err := simVerdict(o)
			if err == nil {
				t.Fatalf("mutation %s not caught at seed %d", mc.name, mc.seed)
			}
			if !strings.Contains(err.Error(), mc.want) {
				t.Fatalf("mutation %s at seed %d caught for another reason than %q: %v", mc.name, mc.seed, mc.want, err)
			}
			// The same seed passes without the mutation: the catch is the bug's.
			if err := simVerdict(mutationSim(mc.seed, mc.shape)); err != nil {
				t.Fatalf("seed %d fails without the mutation: %v", mc.seed, err)
			}
		})
	}
}

func TestMutationScan(t *testing.T) {
	mutation.Require(t)
	if os.Getenv("KEFIR_CHAIN_MUTSCAN") == "" {
		t.Skip("set KEFIR_CHAIN_MUTSCAN=1 to list the seeds that catch each mutation")
	}
	for _, noCheck := range []bool{false, true} {
		for _, mc := range chainMutations {
			var caught []uint64
			for seed := uint64(1); seed <= 300 && len(caught) < 8; seed++ {
				o := mutationSim(seed, mc.shape)
				o.noCheck = noCheck
				mc.set(&o)
				if err := simVerdict(o); err != nil {
					caught = append(caught, seed)
					t.Logf("%s noCheck=%t seed %d: %.300v", mc.name, noCheck, seed, err)
				}
			}
			t.Logf("%s noCheck=%t caught at seeds %v", mc.name, noCheck, caught)
		}
	}
}
