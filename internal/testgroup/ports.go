package testgroup

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Ports. Nodes bind their ports only when they start, well after their member
// list was made (and again on every restart), so a port must stay theirs while
// nothing listens on it. A port the kernel handed out (a listener on port 0,
// closed again) does not: every port the kernel picks by itself — for a
// listener on port 0, like the fault proxies', or as the local port of an
// outgoing connection, like every client's and proxy's — comes from the
// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), and a port just
// closed is readily handed out again. A node then failed to start with "bind:
// address already in use": its port had gone to a fault proxy of the same test,
// to a connection, or to another package's test process.
//
// So FreeAddr takes ports from outside the ephemeral range, where the kernel
// never picks one, and keeps them from other test processes by holding an
// flock on a file per block of portBlock ports (in os.TempDir()/kefir-e2e-ports)
// for the life of the process (the kernel drops the locks when it exits). Within
// a process each port is handed out once, and only if a listener can bind it
// at that moment (nothing else on the machine holds it). Without a usable range
// (an ephemeral range that covers nearly every port) it falls back to the old
// way: a port the kernel picked, checked against the ones handed out before.
//
// KEFIR_TEST_PORTS=LO-HI confines a test process to the whole blocks of
// ports in [LO, HI] (a shared machine whose users each have a range, e.g.
// 23400-23499): the same blocks and locks, but no fallback — a process that
// needs more ports than the range has fails, saying so.
const (
	portBlock  = 100
	portLowest = 20000 // below: well-known services' ports
)

var ports struct {
	sync.Mutex
	once    sync.Once
	lo, hi  int          // [lo, hi): the range FreeAddr takes ports from; hi == 0: none
	next    int          // where the next search starts
	dir     string       // lock files; "" if they cannot be made (no cross-process locks)
	held    map[int]bool // blocks this process holds, by index
	locks   []*os.File   // their lock files, kept open (never closed: the locks last the process)
	foreign map[int]bool // blocks another process holds
	used    map[int]bool // ports handed out (also those of the fallback)
}

// portRange returns the largest range of ports outside the kernel's ephemeral
// range, from portLowest up, or 0, 0.
func portRange() (lo, hi int) {
	ephLo, ephHi := 32768, 60999 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			l, err1 := strconv.Atoi(f[0])
			h, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && l <= h {
				ephLo, ephHi = l, h
			}
		}
	}
	below := [2]int{portLowest, ephLo}
	above := [2]int{max(portLowest, ephHi+1), 65536}
	best := below
	if above[1]-above[0] > best[1]-best[0] {
		best = above
	}
	if best[1]-best[0] < 10*portBlock {
		return 0, 0
	}
	// Whole blocks only.
	best[1] = best[0] + (best[1]-best[0])/portBlock*portBlock
	return best[0], best[1]
}

func initPorts() {
	ports.lo, ports.hi = portRange()
	if lo, hi, ok := envPortRange(); ok {
		ports.lo, ports.hi = lo, hi
	}
	ports.held, ports.foreign, ports.used = map[int]bool{}, map[int]bool{}, map[int]bool{}
	if ports.hi == 0 {
		return
	}
	// Start at a random block so concurrent processes rarely try the same ones.
	nblocks := (ports.hi - ports.lo) / portBlock
	ports.next = ports.lo + (os.Getpid()+int(time.Now().UnixNano()/1000))%nblocks*portBlock
	dir := filepath.Join(os.TempDir(), "kefir-e2e-ports")
	if err := os.MkdirAll(dir, 0o777); err == nil {
		ports.dir = dir
	}
}

// envPortRange is KEFIR_TEST_PORTS's range, whole blocks only: [lo, hi).
func envPortRange() (lo, hi int, ok bool) {
	v := os.Getenv("KEFIR_TEST_PORTS")
	if v == "" {
		return 0, 0, false
	}
	a, b, found := strings.Cut(v, "-")
	l, err1 := strconv.Atoi(a)
	h, err2 := strconv.Atoi(b)
	if !found || err1 != nil || err2 != nil || l%portBlock != 0 || h+1-l < portBlock || h > 65535 {
		panic(fmt.Sprintf("testgroup: KEFIR_TEST_PORTS=%q: want LO-HI, LO a multiple of %d, at least one block of %d ports", v, portBlock, portBlock))
	}
	return l, l + (h+1-l)/portBlock*portBlock, true
}

// holdBlock reports whether this process holds the block of port p, taking it
// if no other process does.
func holdBlock(p int) bool {
	b := (p - ports.lo) / portBlock
	if ports.held[b] {
		return true
	}
	if ports.foreign[b] {
		return false
	}
	if ports.dir == "" {
		ports.held[b] = true // no lock files: held in this process only
		return true
	}
	f, err := os.OpenFile(filepath.Join(ports.dir, fmt.Sprintf("block-%d", ports.lo+b*portBlock)), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		// Say, another user's file: no lock, but still no port of the kernel's.
		ports.held[b] = true
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			ports.foreign[b] = true
			return false
		}
		ports.held[b] = true // no locks on this file system: as above
		return true
	}
	ports.held[b] = true
	ports.locks = append(ports.locks, f)
	return true
}

// available reports whether port p can be handed out now: in the range, not
// handed out before, in a block this process holds, and bindable.
func available(p int) bool {
	if p < ports.lo || p >= ports.hi || ports.used[p] || !holdBlock(p) {
		return false
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// FreePorts reserves the ports base+off for each offset (offsets >= 0) and
// returns base: none of them is handed out again in this process, taken by
// another test process using this package, or picked by the kernel for a
// listener on port 0 or an outgoing connection.
func FreePorts(t testing.TB, offsets ...int) int {
	t.Helper()
	ports.Lock()
	defer ports.Unlock()
	ports.once.Do(initPorts)
	if len(offsets) == 0 {
		offsets = []int{0}
	}
	if ports.hi == 0 {
		return freePortsFallback(t, offsets)
	}
	span := ports.hi - ports.lo
	for range span {
		base := ports.next
		ports.next++
		if ports.next >= ports.hi {
			ports.next = ports.lo
		}
		ok := true
		for _, off := range offsets {
			if !available(base + off) {
				ok = false
				break
			}
		}
		if ok {
			for _, off := range offsets {
				ports.used[base+off] = true
			}
			return base
		}
	}
	t.Fatalf("testgroup: no free ports in [%d, %d) for offsets %v", ports.lo, ports.hi, offsets)
	return 0
}

// freePortsFallback picks base among the ports the kernel hands out for port 0,
// skipping those handed out before.
func freePortsFallback(t testing.TB, offsets []int) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("testgroup: free port: %v", err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		ok := true
		for _, off := range offsets {
			p := base + off
			if p > 65535 || ports.used[p] {
				ok = false
				break
			}
			if off != 0 {
				l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
				if err != nil {
					ok = false
					break
				}
				l.Close()
			}
		}
		if ok {
			for _, off := range offsets {
				ports.used[base+off] = true
			}
			return base
		}
	}
	t.Fatal("testgroup: no port that was not handed out already in 100 tries")
	return 0
}

// loopbackAddr returns a loopback address with a port reserved by FreePorts.
func loopbackAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePorts(t)))
}
