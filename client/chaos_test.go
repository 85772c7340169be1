package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Under dropped connections, lost replies, slow replies and short deadlines all at
// once, a call must never receive another call's reply, a successful write must
// have been applied exactly once, and a write with an unknown outcome at most once.
func TestChaosNeverMismatchesRepliesOrDuplicatesWrites(t *testing.T) {
	s := newTestServer(t)
	s.noLog = true
	const keys = 50
	for i := range keys {
		s.set("g"+strconv.Itoa(i), "val-g"+strconv.Itoa(i))
	}
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	s.setHook(func(h hookInfo) action {
		rngMu.Lock()
		p := rng.IntN(100)
		delay := time.Duration(rng.IntN(2000)) * time.Microsecond
		rngMu.Unlock()
		time.Sleep(delay)
		switch {
		case p < 2:
			return actDropBeforeApply
		case p < 4:
			return actDropAfterApply
		}
		return actReply
	})
	c := dialTest(t, s, WithPoolSize(2), WithMaxRetries(2))

	const workers, ops = 16, 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]error{} // counter key -> Incr outcome
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for j := range ops {
				timeout := time.Duration(1+r.IntN(30)) * time.Millisecond
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				if r.IntN(2) == 0 {
					k := "g" + strconv.Itoa(r.IntN(keys))
					v, err := c.Get(ctx, k)
					switch {
					case err == nil && string(v) != "val-"+k:
						t.Errorf("Get(%s) = %q: another call's reply", k, v)
					case err != nil && !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrUnavailable):
						t.Errorf("Get(%s): unexpected error %v", k, err)
					}
				} else {
					k := fmt.Sprintf("ctr-%d-%d", w, j)
					n, err := c.Incr(ctx, k, 1)
					switch {
					case err == nil && n != 1:
						t.Errorf("Incr(%s) = %d: another call's reply or a duplicate", k, n)
					case err != nil && !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrUnknownOutcome) && !errors.Is(err, ErrUnavailable):
						t.Errorf("Incr(%s): unexpected error %v", k, err)
					}
					mu.Lock()
					outcomes[k] = err
					mu.Unlock()
				}
				cancel()
			}
		}()
	}
	wg.Wait()

	s.mu.Lock()
	defer s.mu.Unlock()
	unknown := 0
	for k, err := range outcomes {
		got := string(s.data[k])
		switch {
		case err == nil && got != "1":
			t.Errorf("%s: acknowledged but server has %q", k, got)
		case errors.Is(err, ErrUnknownOutcome) && got != "" && got != "1":
			t.Errorf("%s: unknown outcome but server has %q (applied twice?)", k, got)
		case err != nil && !errors.Is(err, ErrUnknownOutcome) && got != "":
			// A write that failed with a known outcome must not have been applied.
			t.Errorf("%s: failed with %v but server has %q", k, err, got)
		}
		if errors.Is(err, ErrUnknownOutcome) {
			unknown++
		}
	}
	t.Logf("%d writes, %d with unknown outcome, %d answered from the client table", len(outcomes), unknown, s.dups)
}
