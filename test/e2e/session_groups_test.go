package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// sessConn is a plain RESP connection that sends KEFIR.CALL ... SESSION.
type sessConn struct {
	nc net.Conn
	rd *resp.Reader
}

func dialSess(t *testing.T, addr string) *sessConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &sessConn{nc: nc, rd: resp.NewReader(nc, 0)}
}

// call runs cmd within the session tok at level session and returns the
// advanced token and the command's reply; a TRYAGAIN (a node whose replica
// of a move's destination has not applied the take-over yet) is retried, as
// clients do, for a few seconds.
func (c *sessConn) call(tok string, cmd ...string) (string, resp.Value, error) {
	args := [][]byte{[]byte("KEFIR.CALL"), []byte("CONSISTENCY"), []byte("session"), []byte("SESSION"), []byte(tok), []byte("CMD")}
	for _, a := range cmd {
		args = append(args, []byte(a))
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_ = c.nc.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := c.nc.Write(resp.AppendCommand(nil, args...)); err != nil {
			return tok, resp.Value{}, err
		}
		v, err := c.rd.ReadValue()
		if err != nil {
			return tok, resp.Value{}, err
		}
		if v.Kind == resp.Error {
			if strings.HasPrefix(string(v.Str), "TRYAGAIN") && time.Now().Before(deadline) {
				continue
			}
			return tok, v, fmt.Errorf("%s: %s", strings.Join(cmd, " "), v.Str)
		}
		if v.Kind != resp.Array || len(v.Elems) != 2 {
			return tok, v, fmt.Errorf("%s: reply %s, want [token, reply]", strings.Join(cmd, " "), v)
		}
		if r := v.Elems[1]; r.Kind == resp.Error {
			if strings.HasPrefix(string(r.Str), "TRYAGAIN") && time.Now().Before(deadline) {
				continue
			}
			return tok, r, fmt.Errorf("%s: %s", strings.Join(cmd, " "), r.Str)
		}
		return string(v.Elems[0].Str), v.Elems[1], nil
	}
}

// One session (a token carried from call to call, as the Go client carries
// it) across three real nodes of two groups while a quarter of the slots
// moves from group 1 to group 2: each write goes to one node (forwarded to
// its group's leader), the read of it back to the next node and the read of
// another key of the session to the third, all at level session, before,
// during and after the move. Every read returns the session's last write of
// its key (read-your-writes; only this session writes these keys, so that is
// also monotonic reads): a key that moved is served by the destination only
// once its replica applied the take-over, which follows the final copy of
// every write the source acknowledged, so the token needs nothing of group
// 1's part to read it at group 2 (docs/design/cluster.md §5).
func TestGroupsSessionAcrossLiveSlotMove(t *testing.T) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	rs := []kv.SlotRange{{Start: 0, End: 4095}}
	var keys []string
	var moving, stay1, grp2 int
	for i := 0; moving < 8 || stay1 < 4 || grp2 < 4; i++ {
		k := "s" + strconv.Itoa(i)
		switch s := kv.KeySlot([]byte(k)); {
		case s <= 4095 && moving < 8:
			moving++
		case s > 4095 && s <= 8191 && stay1 < 4:
			stay1++
		case s > 8191 && grp2 < 4:
			grp2++
		default:
			continue
		}
		keys = append(keys, k)
	}
	conns := make([]*sessConn, len(g.Nodes))
	for i, n := range g.Nodes {
		conns[i] = dialSess(t, n.ClientAddr)
	}
	var stop atomic.Bool
	type outcome struct {
		ops, afterMove int
		tok            string
		err            error
	}
	var moved atomic.Bool
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		tok := ""
		last := map[string]string{}
		for i := 0; !stop.Load(); i++ {
			k, v := keys[i%len(keys)], "v"+strconv.Itoa(i)
			var r resp.Value
			var err error
			if tok, r, err = conns[i%3].call(tok, "SET", k, v); err != nil || string(r.Str) != "OK" {
				o.err = fmt.Errorf("op %d: SET %s %s at node %d = %s %v", i, k, v, i%3+1, r, err)
				break
			}
			last[k] = v
			if tok, r, err = conns[(i+1)%3].call(tok, "GET", k); err != nil || string(r.Str) != v {
				o.err = fmt.Errorf("op %d: GET %s at node %d = %q %v, want its session's write %q (token %s)", i, k, (i+1)%3+1, r.Str, err, v, tok)
				break
			}
			other := keys[(i*7+3)%len(keys)]
			if want, ok := last[other]; ok {
				if tok, r, err = conns[(i+2)%3].call(tok, "GET", other); err != nil || string(r.Str) != want {
					o.err = fmt.Errorf("op %d: GET %s at node %d = %q %v, want its session's write %q (token %s)", i, other, (i+2)%3+1, r.Str, err, want, tok)
					break
				}
			}
			o.ops++
			if moved.Load() {
				o.afterMove++
			}
		}
		o.tok = tok
		done <- o
	}()
	time.Sleep(800 * time.Millisecond)
	mv := pausedMover(t, g.Addrs(), 400*time.Millisecond, 200*time.Millisecond)
	res, err := mv.Move(context.Background(), 1, 2, rs)
	if err != nil {
		stop.Store(true)
		t.Fatalf("move: %v (session: %+v)", err, <-done)
	}
	moved.Store(true)
	t.Logf("move: %+v", res)
	time.Sleep(1500 * time.Millisecond)
	stop.Store(true)
	o := <-done
	if o.err != nil {
		t.Fatalf("after %d session rounds: %v", o.ops, o.err)
	}
	if o.afterMove == 0 {
		t.Fatalf("no session round after the move (%d in all)", o.ops)
	}
	if !strings.HasPrefix(o.tok, "v3.") || !strings.Contains(o.tok, "1:") || !strings.Contains(o.tok, ",2:") {
		t.Fatalf("session token %q, want a v3 token with parts of groups 1 and 2", o.tok)
	}
	t.Logf("%d session rounds (write, read back at another node, read of another key at the third), %d after the move; token %s", o.ops, o.afterMove, o.tok)
}
