package e2e

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
)

// respConn is a plain RESP client, as redis-cli is: no request ids, so a
// write's outcome is whatever the node it talks to answers.
type respConn struct {
	addr string
	nc   net.Conn
	rd   *resp.Reader
}

// do sends one command and returns its reply; a connection error closes the
// connection (the next do redials).
// connect dials c.addr unless connected: an error means nothing was sent.
func (c *respConn) connect() error {
	if c.nc != nil {
		return nil
	}
	nc, err := net.DialTimeout("tcp", c.addr, time.Second)
	if err != nil {
		return err
	}
	c.nc, c.rd = nc, resp.NewReader(nc, 0)
	return nil
}

func (c *respConn) do(args ...string) (resp.Value, error) {
	if err := c.connect(); err != nil {
		return resp.Value{}, err
	}
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	_ = c.nc.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.nc.Write(resp.AppendCommand(nil, bs...)); err != nil {
		c.nc.Close()
		c.nc = nil
		return resp.Value{}, err
	}
	v, err := c.rd.ReadValue()
	if err != nil {
		c.nc.Close()
		c.nc = nil
	}
	return v, err
}

// A follower forwards plain clients' writes to the leader. When the leader is
// SIGKILLed under them, the follower retries each write itself, with the
// request id it gave it, to the new leader (issue 25 item 12): every write
// gets its true outcome. Before, writes in flight or sent while the follower
// still named the dead leader failed with "UNAVAILABLE forward: dial leader
// ...: connection refused (a forwarded write's outcome is unknown; retry it
// with the same request id)", which a plain client cannot do.
//
// Checked: the history (SETs, INCRs, linearizable GETs, all through
// followers) is linearizable, with writes reported "not applied" left out
// (check.Failed: if one had been applied, a read or an INCR result would
// show it); each client's counter ends equal to its acknowledged INCRs plus
// at most its unknown ones; and no write's outcome was unknown.
func TestForwardedWritesSurviveLeaderKill(t *testing.T) {
	g := startGroup(t)
	l := g.settledLeader(-1)
	var followers []int
	for i := range g.nodes {
		if i != l {
			followers = append(followers, i)
		}
	}
	rec := check.NewRecorder(nil)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	type tally struct{ ok, unknown, notApplied int }
	incrs := map[int]*tally{}
	var writes, unknown, notApplied atomic.Int64
	var unknownErrs []string
	const clients = 4
	keys := []string{"a", "b", "c"}
	for cid := range clients {
		incrs[cid] = &tally{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &respConn{addr: g.nodes[followers[cid%2]].ClientAddr}
			defer func() {
				if c.nc != nil {
					c.nc.Close()
				}
			}()
			rng := rand.New(rand.NewPCG(uint64(cid), 25))
			ctr := "ctr-" + strconv.Itoa(cid)
			for i := 0; !stop.Load(); i++ {
				key := keys[rng.IntN(len(keys))]
				op := check.Op{Client: cid, Key: key, Cons: level.ConsLinearizable, Dur: level.Sync}
				var args []string
				switch rng.IntN(3) {
				case 0:
					op.Kind = check.Get
					args = []string{"GET", key}
				case 1:
					op.Kind, op.Value = check.Put, fmt.Sprintf("c%d-%d", cid, i)
					args = []string{"SET", key, op.Value}
				default:
					op.Kind, op.Key, op.Delta = check.Incr, ctr, 1
					args = []string{"INCR", ctr}
				}
				id := rec.Invoke(op)
				v, err := c.do(args...)
				if op.Kind == check.Get {
					switch {
					case err == nil && v.Kind == resp.Bulk:
						rec.Complete(id, check.Result{Found: true, Value: string(v.Str), Node: -1})
					case err == nil && v.Kind == resp.Null:
						rec.Complete(id, check.Result{Found: false, Node: -1})
					default:
						rec.Fail(id) // a failed read has no effect
					}
					continue
				}
				writes.Add(1)
				var outcome string
				switch {
				case err == nil && v.Kind != resp.Error:
					res := check.Result{Node: -1}
					if op.Kind == check.Incr {
						res.Value = strconv.FormatInt(v.Int, 10)
					}
					rec.Complete(id, res)
					outcome = "ok"
				case err == nil && strings.Contains(string(v.Str), "was not applied"):
					rec.Fail(id)
					notApplied.Add(1)
					outcome = "not applied"
				default:
					rec.Unknown(id)
					unknown.Add(1)
					msg := fmt.Sprint(err)
					if err == nil {
						msg = string(v.Str)
					}
					mu.Lock()
					unknownErrs = append(unknownErrs, msg)
					mu.Unlock()
					outcome = "unknown"
				}
				if op.Kind == check.Incr {
					mu.Lock()
					switch outcome {
					case "ok":
						incrs[cid].ok++
					case "unknown":
						incrs[cid].unknown++
					default:
						incrs[cid].notApplied++
					}
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(time.Second)
	g.nodes[l].Kill()
	rec.Crash(l)
	nl := g.leader(l)
	t.Logf("killed leader %s; %s took over", g.nodes[l].ID, g.nodes[nl].ID)
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()

	var retries float64
	for _, f := range followers {
		retries += forwardRetries(t, g.nodes[f].HTTPAddr)
	}
	t.Logf("%d writes through followers: %d not applied, %d unknown; %v forwarded requests retried",
		writes.Load(), notApplied.Load(), unknown.Load(), retries)
	if n := unknown.Load(); n > 0 {
		t.Errorf("%d writes through a follower got no outcome; first: %s", n, unknownErrs[0])
	}
	if retries == 0 {
		t.Error("no forwarded request was retried: the kill caught none in flight")
	}
	// Every counter holds exactly its acknowledged INCRs (plus at most its
	// unknown ones): none reported "not applied" was.
	nc := &respConn{addr: g.nodes[nl].ClientAddr}
	for cid, ta := range incrs {
		v, err := nc.do("GET", "ctr-"+strconv.Itoa(cid))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		if v.Kind == resp.Bulk {
			got, _ = strconv.Atoi(string(v.Str))
		}
		if got < ta.ok || got > ta.ok+ta.unknown {
			t.Errorf("ctr-%d = %d: %d INCRs acknowledged, %d unknown, %d not applied", cid, got, ta.ok, ta.unknown, ta.notApplied)
		}
	}
	h := rec.History()
	verdict := check.Linearizable(h, check.LinOptions{Timeout: 30 * time.Second, Strict: true})
	if !verdict.OK {
		t.Fatalf("history of %d ops is not linearizable: %+v", len(h.Ops), verdict)
	}
	t.Logf("linearizable: %d ops checked", verdict.Checked)
}

// forwardRetries reads kefir_forward_retries_total from a node's /metrics.
func forwardRetries(t *testing.T, httpAddr string) float64 {
	t.Helper()
	return metricValue(t, httpAddr, "kefir_forward_retries_total")
}

// metricValue reads an unlabelled metric from a node's /metrics (0 if it
// is not there).
func metricValue(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	hc := http.Client{Timeout: 5 * time.Second}
	r, err := hc.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	_, _ = io.Copy(io.Discard, r.Body)
	return 0
}
