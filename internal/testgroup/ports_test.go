package testgroup

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// The ports FreeAddr hands out stay free for the node that binds them later:
// listeners on port 0 (a fault proxy's, say), opened after them and all held at
// once, never get one, and each can still be bound afterwards. With ports that
// the kernel handed out and took back (the old FreeAddr), some of these
// listeners got them: a node then failed with "address already in use".
func TestFreeAddrPortsAreNotHandedOutByTheKernel(t *testing.T) {
	reserved := map[int]bool{}
	for range 50 {
		_, p, _ := net.SplitHostPort(loopbackAddr(t))
		n, _ := strconv.Atoi(p)
		if reserved[n] {
			t.Fatalf("port %d handed out twice", n)
		}
		reserved[n] = true
	}
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range 2000 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		if p := ln.Addr().(*net.TCPAddr).Port; reserved[p] {
			t.Fatalf("a listener on port 0 got port %d, which FreeAddr handed out", p)
		}
	}
	for p := range reserved {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("reserved port %d cannot be bound: %v", p, err)
		}
		ln.Close()
	}
}

// Another test process using this package (another package's tests, another
// checkout's) gets none of this process's ports while it holds them.
func TestFreeAddrPortsAreExclusiveAcrossProcesses(t *testing.T) {
	if os.Getenv("KEFIR_TESTGROUP_PORTS_CHILD") != "" {
		for range 300 {
			_, p, _ := net.SplitHostPort(loopbackAddr(t))
			os.Stdout.WriteString(p + "\n")
		}
		return
	}
	if ports.once.Do(initPorts); ports.hi == 0 || ports.dir == "" {
		t.Skip("no port range outside the ephemeral one, or no lock directory")
	}
	mine := map[int]bool{}
	for range 150 {
		_, p, _ := net.SplitHostPort(loopbackAddr(t))
		n, _ := strconv.Atoi(p)
		mine[n] = true
	}
	ports.Lock()
	held := map[int]bool{}
	for b := range ports.held {
		held[b] = true
	}
	ports.Unlock()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreeAddrPortsAreExclusiveAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KEFIR_TESTGROUP_PORTS_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	n := 0
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		p, err := strconv.Atoi(sc.Text())
		if err != nil {
			continue // the test framework's own lines
		}
		n++
		if mine[p] || held[(p-ports.lo)/portBlock] {
			t.Fatalf("the child process got port %d, in a block this process holds", p)
		}
	}
	if n != 300 {
		t.Fatalf("child printed %d ports, want 300:\n%s", n, out)
	}
}
