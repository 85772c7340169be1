package e2e

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// watchIncrOutcome is what one WATCH/GET/MULTI/SET/EXEC increment came to.
type watchIncrOutcome int

const (
	incrCommitted watchIncrOutcome = iota // EXEC answered [OK]
	incrAborted                           // EXEC answered nil (or EXECABORT): nothing applied
	incrNotSent                           // failed before EXEC was sent
	incrUnknown                           // EXEC sent, no clean answer: it may have applied
)

// watchIncr runs Redis's optimistic increment of key on one connection:
// WATCH, GET, then MULTI, SET key read+1, EXEC in one write.
func watchIncr(nc net.Conn, rd *resp.Reader, key string) (read int64, out watchIncrOutcome, err error) {
	call := func(args ...string) (resp.Value, error) {
		bs := make([][]byte, len(args))
		for i, a := range args {
			bs[i] = []byte(a)
		}
		if _, err := nc.Write(resp.AppendCommand(nil, bs...)); err != nil {
			return resp.Value{}, err
		}
		return rd.ReadValue()
	}
	v, err := call("WATCH", key)
	if err != nil || v.Kind != resp.Simple {
		return 0, incrNotSent, errors.Join(err, errors.New("WATCH: "+string(v.Str)))
	}
	v, err = call("GET", key)
	if err != nil || v.Kind != resp.Bulk {
		return 0, incrNotSent, errors.Join(err, errors.New("GET: "+string(v.Str)))
	}
	read, err = strconv.ParseInt(string(v.Str), 10, 64)
	if err != nil {
		return 0, incrNotSent, err
	}
	var b []byte
	b = resp.AppendCommand(b, []byte("MULTI"))
	b = resp.AppendCommand(b, []byte("SET"), []byte(key), []byte(strconv.FormatInt(read+1, 10)))
	b = resp.AppendCommand(b, []byte("EXEC"))
	if _, err := nc.Write(b); err != nil {
		return read, incrUnknown, err // part of it may have left
	}
	for range 2 { // +OK, +QUEUED
		if v, err = rd.ReadValue(); err != nil {
			return read, incrUnknown, err
		}
	}
	if v, err = rd.ReadValue(); err != nil {
		return read, incrUnknown, err
	}
	switch {
	case v.Kind == resp.Null:
		return read, incrAborted, nil
	case v.Kind == resp.Array && len(v.Elems) == 1 && string(v.Elems[0].Str) == "OK":
		return read, incrCommitted, nil
	case v.Kind == resp.Error && len(v.Str) >= 9 && string(v.Str[:9]) == "EXECABORT":
		return read, incrAborted, nil
	}
	return read, incrUnknown, errors.New("EXEC: " + string(v.Str))
}

// WATCH/EXEC across a leader's SIGKILL, with real processes (issue 29: "an
// EXEC is one entry of the log, applied once or not at all across a leader
// change, and a WATCH is a read set validated" by the state machine): four
// connections spread over a 3-replica group's nodes (followers forward WATCH
// and EXEC) increment one counter with Redis's optimistic loop while the
// leader is killed and later restarted. No two committed increments read the
// same value (a lost update), the final count is the committed increments
// plus at most the EXECs whose outcome the client could not know, increments
// commit after the kill, and every replica ends with the same count.
func TestWatchExecAcrossLeaderKill(t *testing.T) {
	g := startGroup(t)
	l := g.settledLeader(-1)
	if got := redisCLI(t, g.nodes[l].ClientAddr, "SET", "ctr", "0"); got != "OK" {
		t.Fatalf("SET ctr 0 = %q", got)
	}
	var (
		mu               sync.Mutex
		reads            = map[int64]int{} // committed increments by the value they read
		committed        int
		afterKill        int
		unknown, aborted int
		killed           bool
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var nc net.Conn
			var rd *resp.Reader
			defer func() {
				if nc != nil {
					nc.Close()
				}
			}()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if nc == nil {
					c, err := net.DialTimeout("tcp", g.nodes[(w+i)%3].ClientAddr, time.Second)
					if err != nil {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					nc, rd = c, resp.NewReader(c, 0)
				}
				_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
				read, out, err := watchIncr(nc, rd, "ctr")
				mu.Lock()
				switch out {
				case incrCommitted:
					reads[read]++
					committed++
					if killed {
						afterKill++
					}
				case incrAborted:
					aborted++
				case incrUnknown:
					unknown++
				}
				mu.Unlock()
				if err != nil {
					// A refused or broken exchange: start again on a new
					// connection (the node may be the one killed).
					nc.Close()
					nc = nil
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	mu.Lock()
	killed = true
	mu.Unlock()
	g.nodes[l].Kill()
	time.Sleep(2 * time.Second)
	g.nodes[l].Start()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	l = g.settledLeader(-1)
	final, err := strconv.ParseInt(redisCLI(t, g.nodes[l].ClientAddr, "GET", "ctr"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d committed (%d after the kill), %d aborted, %d unknown; final %d", committed, afterKill, aborted, unknown, final)
	for v, n := range reads {
		if n > 1 {
			t.Errorf("%d committed increments read %d: lost updates", n, v)
		}
		if v >= final {
			t.Errorf("a committed increment read %d, but the final count is %d", v, final)
		}
	}
	if final < int64(committed) || final > int64(committed+unknown) {
		t.Errorf("final count %d, want between the %d committed and %d (the unknown ones)", final, committed, committed+unknown)
	}
	if afterKill == 0 {
		t.Errorf("no increment committed after the leader was killed")
	}
	want := strconv.FormatInt(final, 10)
	for i := range g.nodes {
		g.caughtUp(i, l)
		if got := redisCLI(t, g.nodes[i].ClientAddr, "KEFIR.CALL", "CONSISTENCY", "eventual", "CMD", "GET", "ctr"); got != want {
			t.Errorf("node %d: ctr = %q, want %s", i, got, want)
		}
	}
}
