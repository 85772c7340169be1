package transport

import (
	"flag"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/vr"
)

var chaosFor = flag.Duration("transport.chaos", 0, "run TestChaos for this long instead of its short default (e.g. -transport.chaos=2m)")

// TestChaosKeepsEachLinkInOrderAndRecovers: three nodes send numbered
// messages to each other without pause while links get random partitions,
// drop rates and delays, and node 3 is restarted again and again (a new
// transport on the same address). Whatever is lost, every receiver must see
// each sender's numbers strictly increasing (no duplicate, no reordering,
// also across reconnects), and once the faults heal every link delivers
// again.
//
//	go test -run TestChaos -transport.chaos=2m ./internal/transport/
func TestChaosKeepsEachLinkInOrderAndRecovers(t *testing.T) {
	dur := 700 * time.Millisecond
	if *chaosFor > 0 {
		dur = *chaosFor
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("chaos: seed=%d duration=%v", seed, dur)
	rng := rand.New(rand.NewPCG(seed, 1))

	const n = 3
	lns, peers := listeners(t, n)

	// Every delivered message is checked against the last op seen from its
	// sender by the same receiving transport instance.
	type instance struct {
		mu   sync.Mutex
		last map[uint64]uint64
	}
	var allMu sync.Mutex
	var all []*Transport // every instance, for the corruption check
	var violations atomic.Int64
	var delivered atomic.Int64
	newInstance := func(self uint64, ln net.Listener) (*Transport, *instance) {
		inst := &instance{last: map[uint64]uint64{}}
		tr, err := newVR(vrConfig{Config: Config{Self: self, Peers: peers, ClusterSecret: testSecret, Cluster: 7,
			DialBackoff: 2 * time.Millisecond, MaxDialBackoff: 20 * time.Millisecond, Seed: seed + self,
			Logger: slog.New(slog.DiscardHandler)}, Handler: func(from uint64, msgs []vr.Message) {
			inst.mu.Lock()
			defer inst.mu.Unlock()
			for _, m := range msgs {
				if m.Op <= inst.last[from] {
					if violations.Add(1) <= 5 {
						t.Errorf("node %d got op %d from %d after op %d", self, m.Op, from, inst.last[from])
					}
				}
				inst.last[from] = m.Op
			}
			delivered.Add(int64(len(msgs)))
		}})
		if err != nil {
			t.Fatal(err)
		}
		go tr.Serve(ln)
		allMu.Lock()
		all = append(all, tr)
		allMu.Unlock()
		return tr, inst
	}

	var trs [n]atomic.Pointer[Transport]
	insts := make([][]*instance, n)
	for i := range n {
		tr, inst := newInstance(uint64(i+1), lns[i])
		trs[i].Store(tr)
		insts[i] = append(insts[i], inst)
	}

	big := make([]byte, 8<<20)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var next [n + 1][n + 1]atomic.Uint64 // next op per (from, to)
	for i := range n {
		wg.Add(1)
		go func(from uint64) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				tr := trs[from-1].Load()
				// Alternate Send (writer goroutine) and SendAll (inline
				// writes); now and then a message big enough to be written
				// in parts, so a restart can cut one in the middle.
				var batch []vr.Message
				for to := uint64(1); to <= n; to++ {
					if to == from {
						continue
					}
					m := vr.Message{Type: vr.MsgCommit, From: from, To: to, Op: next[from][to].Add(1)}
					if m.Op%500 == 0 {
						m.Type, m.Entries = vr.MsgPrepare, []vr.Entry{{Op: m.Op, Request: vr.Request{Data: big}}}
					}
					if m.Op%2 == 0 {
						batch = append(batch, m)
					} else {
						_ = tr.sendVR(to, &m)
					}
				}
				_ = tr.sendAllVR(batch)
				time.Sleep(50 * time.Microsecond)
			}
		}(uint64(i + 1))
	}

	restarts, faults := 0, 0
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
		if rng.IntN(10) == 0 {
			// Restart node 3: a new process on the same address.
			old := trs[2].Load()
			old.Close()
			ln, err := net.Listen("tcp", peers[3])
			for err != nil && time.Now().Before(deadline.Add(5*time.Second)) {
				time.Sleep(time.Millisecond)
				ln, err = net.Listen("tcp", peers[3])
			}
			if err != nil {
				t.Fatalf("relisten: %v", err)
			}
			tr, inst := newInstance(3, ln)
			trs[2].Store(tr)
			insts[2] = append(insts[2], inst)
			restarts++
			continue
		}
		from := uint64(1 + rng.IntN(n))
		to := uint64(1 + rng.IntN(n-1))
		if to >= from {
			to++
		}
		var f Fault
		switch rng.IntN(4) {
		case 0:
			f.Partition = true
		case 1:
			f.DropRate = rng.Float64() * 0.3
		case 2:
			f.Delay = time.Duration(rng.IntN(5000)) * time.Microsecond
			f.Jitter = time.Duration(rng.IntN(5000)) * time.Microsecond
		}
		if err := trs[from-1].Load().SetLinkFault(to, f); err != nil {
			t.Fatal(err)
		}
		faults++
	}

	// Heal everything; every link must deliver again.
	for i := range n {
		for to := uint64(1); to <= n; to++ {
			if to != uint64(i+1) {
				_ = trs[i].Load().SetLinkFault(to, Fault{})
			}
		}
	}
	for i := range n {
		self := uint64(i + 1)
		inst := insts[i][len(insts[i])-1]
		for from := uint64(1); from <= n; from++ {
			if from == self {
				continue
			}
			mark := next[from][self].Load()
			eventually(t, 10*time.Second, func() bool {
				inst.mu.Lock()
				defer inst.mu.Unlock()
				return inst.last[from] > mark
			}, "link %d→%d delivering after heal (last op %d)", from, self, mark)
		}
	}
	close(stop)
	wg.Wait()
	for i := range n {
		trs[i].Load().Close()
	}
	var corrupt, inline, midFrame uint64
	for _, tr := range all {
		s := tr.Stats()
		corrupt += s.Total.Corrupt
		inline += s.Total.InlineWrites
		for _, p := range tr.peers() {
			midFrame += p.c.midFrameDrops.Load()
		}
	}
	t.Logf("chaos: %d messages delivered, %d fault changes, %d restarts of node 3, %d inline writes, %d partly written messages dropped at a reconnect",
		delivered.Load(), faults, restarts, inline, midFrame)
	if corrupt != 0 {
		t.Errorf("%d connections saw a corrupt frame: a reconnect carried part of a frame", corrupt)
	}
	if delivered.Load() == 0 || violations.Load() != 0 {
		t.Fatalf("%d delivered, %d order violations", delivered.Load(), violations.Load())
	}
}
