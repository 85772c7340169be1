package cluster

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
)

// fakeLeader serves forwarded requests on a loopback port with answer, which
// sees each request's arguments and the connection's number and returns the
// reply to send, or "" to close the connection without one (a leader that
// died after reading the request).
func fakeLeader(t *testing.T, answer func(conn int, args []string) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(wg.Wait) // runs last: after the listener and connections are closed
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, nc := range open {
			nc.Close()
		}
		mu.Unlock()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, nc)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				rd := resp.NewReader(nc, 0)
				for {
					args, err := rd.ReadCommand(nil)
					if err != nil {
						return
					}
					var s []string
					for _, a := range args {
						s = append(s, string(a))
					}
					reply := answer(n, s)
					if reply == "" {
						return
					}
					if _, err := nc.Write([]byte(reply)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// reqID is the REQID a forwarded KEFIR.CALL carries, "" if none.
func reqID(args []string) string {
	for i, a := range args {
		if a == "REQID" && i+2 < len(args) {
			return args[i+1] + " " + args[i+2]
		}
	}
	return ""
}

// A forwarded write whose leader reads it and dies is sent again, with the
// same request id, until a leader answers; the answer is the outcome (issue
// 25 item 12).
func TestForwarderRetriesWithTheSameRequestID(t *testing.T) {
	var mu sync.Mutex
	var ids []string
	addr := fakeLeader(t, func(conn int, args []string) string {
		mu.Lock()
		ids = append(ids, reqID(args))
		mu.Unlock()
		if conn < 2 {
			return "" // read it, then died
		}
		return "*2\r\n$1\r\n0\r\n:7\r\n" // [session, 7]
	})
	f := newForwarder("", "", "")
	defer f.close()
	fc := &Call{Args: [][]byte{[]byte("INCR"), []byte("k")}, Dur: level.Sync}
	f.forward(addr, []*Call{fc}, func() (string, bool) { return addr, true })
	if fc.Err != nil || fc.Reply.Kind != resp.Int || fc.Reply.Int != 7 {
		t.Fatalf("outcome %v, reply %v; want the third attempt's :7", fc.Err, fc.Reply)
	}
	if len(ids) != 3 || ids[0] == "" || ids[1] != ids[0] || ids[2] != ids[0] {
		t.Fatalf("request ids of the attempts: %q; want one id, three times", ids)
	}
}

// When the retries run out, a write that reached a leader which never
// answered is "outcome unknown"; one that never reached a node that could
// apply it is "not applied".
func TestForwarderSaysWhatItKnowsWhenRetriesRunOut(t *testing.T) {
	f := newForwarder("", "", "")
	f.retryFor = 300 * time.Millisecond
	defer f.close()

	died := fakeLeader(t, func(int, []string) string { return "" })
	fc := &Call{Args: [][]byte{[]byte("SET"), []byte("k"), []byte("v")}, Dur: level.Sync}
	f.forward(died, []*Call{fc}, func() (string, bool) { return "", false })
	if fc.Err == nil || !strings.Contains(fc.Err.Error(), "the write's outcome is unknown") {
		t.Errorf("sent, never answered: %v", fc.Err)
	}

	moved := fakeLeader(t, func(int, []string) string { return "-MOVED 127.0.0.1:1\r\n" })
	fc = &Call{Args: [][]byte{[]byte("SET"), []byte("k"), []byte("v")}, Dur: level.Sync}
	f.forward(moved, []*Call{fc}, func() (string, bool) { return "", false })
	if fc.Err == nil || !strings.Contains(fc.Err.Error(), "the write was not applied") {
		t.Errorf("refused with MOVED, then nobody listening: %v", fc.Err)
	}

	// Once a leader has read it without answering, a later MOVED from
	// another node does not make it "not applied".
	fc = &Call{Args: [][]byte{[]byte("SET"), []byte("k"), []byte("v")}, Dur: level.Sync}
	first := true
	f.forward(died, []*Call{fc}, func() (string, bool) {
		if first {
			first = false
			return moved, true
		}
		return "", false
	})
	if fc.Err == nil || !strings.Contains(fc.Err.Error(), "the write's outcome is unknown") {
		t.Errorf("sent to one that died, then MOVED: %v", fc.Err)
	}
}
