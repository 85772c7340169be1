// Package cluster runs real `kefir server` processes for end-to-end tests: it builds
// the binary once, starts nodes on free loopback ports with their own data
// directories, and stops, kills (SIGKILL), pauses (SIGSTOP) and resumes (SIGCONT)
// them, keeping each node's log for the test's failure output.
//
// It is test support: it may import testing, and must not be imported by
// non-test code. It talks to nodes only through processes, sockets and files.
package cluster

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/testgroup"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary builds cmd/kefir once per test process and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "kefir-e2e-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "kefir")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/kefir")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/kefir: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("cluster: %v", buildErr)
	}
	return buildPath
}

// Main runs a test package that uses Binary and then deletes what Binary
// built: each test process builds into a directory of its own, which
// nothing else removes (a run left ~30 MB in /tmp each time). A package's
// TestMain is Main(m).
func Main(m *testing.M) {
	code := m.Run()
	if buildPath != "" {
		os.RemoveAll(filepath.Dir(buildPath))
	}
	os.Exit(code)
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the kefir module")
	}
	// The kefir module's root holds cmd/kefir; a test of the bench module
	// (../bench, which replaces kefir with its parent) builds the parent's.
	for dir := filepath.Dir(mod); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "cmd", "kefir")); err == nil {
			return dir, nil
		}
		if dir == filepath.Dir(dir) {
			return "", fmt.Errorf("no cmd/kefir above %s", mod)
		}
	}
}

// FreePorts reserves ports as testgroup.FreePorts does (outside the kernel's
// ephemeral range, exclusive across test processes); the allocator lives there
// so in-process groups (testgroup.LoopbackAddrs) share it.
func FreePorts(t testing.TB, offsets ...int) int {
	t.Helper()
	return testgroup.FreePorts(t, offsets...)
}

// FreeAddr returns a loopback address with a port reserved as FreePorts does.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePorts(t)))
}

// Node is one `kefir server` process. Its ports and directory stay the same
// across restarts.
type Node struct {
	ID         string
	Dir        string
	ClientAddr string
	HTTPAddr   string
	PeerAddr   string
	// Args are extra flags for `kefir server` (e.g. "--durability", "cad").
	Args []string

	t   testing.TB
	bin string

	mu     sync.Mutex
	cmd    *exec.Cmd
	logs   bytes.Buffer
	exited chan struct{}
	state  *os.ProcessState
}

// NewNode describes a node with fresh ports and a data directory under the test's
// temporary directory; Start runs it.
func NewNode(t testing.TB, id string, args ...string) *Node {
	t.Helper()
	n := &Node{
		ID: id, Dir: filepath.Join(t.TempDir(), id),
		ClientAddr: FreeAddr(t), HTTPAddr: FreeAddr(t), PeerAddr: FreeAddr(t),
		Args: args, t: t, bin: Binary(t),
	}
	t.Cleanup(func() {
		n.Kill()
		if t.Failed() {
			t.Logf("log of node %s:\n%s", n.ID, n.Logs())
		}
	})
	return n
}

// Start starts the process and waits until it answers PING.
func (n *Node) Start() {
	n.t.Helper()
	if err := n.StartNoWait(); err != nil {
		n.t.Fatal(err)
	}
	if err := n.WaitReady(20 * time.Second); err != nil {
		n.t.Fatalf("cluster: %s not ready: %v\n%s", n.ID, err, n.Logs())
	}
}

// StartNoWait starts the process without waiting for it to serve (for nodes
// expected to refuse to start; Wait returns their exit code).
func (n *Node) StartNoWait() error {
	args := append([]string{"server",
		"--node-id", n.ID, "--dir", n.Dir,
		"--client-addr", n.ClientAddr, "--http-addr", n.HTTPAddr, "--peer-addr", n.PeerAddr,
	}, n.Args...)
	cmd := exec.Command(n.bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cluster: start %s: %w", n.ID, err)
	}
	exited := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.exited, n.state = cmd, exited, nil
	fmt.Fprintf(&n.logs, "---- start pid %d: %s\n", cmd.Process.Pid, strings.Join(args, " "))
	n.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			n.mu.Lock()
			n.logs.WriteString(sc.Text())
			n.logs.WriteByte('\n')
			n.mu.Unlock()
		}
		_ = cmd.Wait()
		n.mu.Lock()
		n.state = cmd.ProcessState
		n.mu.Unlock()
		close(exited)
	}()
	return nil
}

// WaitReady polls the client port until the node answers PING.
func (n *Node) WaitReady(timeout time.Duration) error {
	var err error
	testgroup.Until(timeout, 20*time.Millisecond, func() bool {
		if !n.Running() {
			err = fmt.Errorf("process exited")
			return true
		}
		err = Ping(n.ClientAddr)
		return err == nil
	})
	return err
}

// Ping sends an inline PING and expects +PONG.
func Ping(addr string) error {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := nc.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(nc, buf); err != nil {
		return err
	}
	// A node with a password answers NOAUTH before AUTH: it is serving.
	if string(buf) != "+PONG\r\n" && string(buf) != "-NOAUTH" {
		return fmt.Errorf("PING answered %q", buf)
	}
	return nil
}

// Running reports whether the process is alive (a stopped process is alive).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.exited == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

func (n *Node) signal(sig syscall.Signal) {
	n.mu.Lock()
	cmd := n.cmd
	n.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// Wait waits for the process to exit and returns its exit code (-1 if killed by
// a signal), failing the test after timeout.
func (n *Node) Wait(timeout time.Duration) int {
	n.t.Helper()
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	if exited == nil {
		return 0
	}
	select {
	case <-exited:
	case <-time.After(timeout):
		n.t.Fatalf("cluster: %s did not exit within %v", n.ID, timeout)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state.ExitCode()
}

// Kill sends SIGKILL (a crash: nothing is flushed or synced) and waits for exit.
func (n *Node) Kill() {
	if !n.Running() {
		return
	}
	n.signal(syscall.SIGCONT) // a stopped process dies on SIGKILL too, but be explicit
	n.signal(syscall.SIGKILL)
	n.Wait(10 * time.Second)
}

// Stop sends SIGTERM (graceful shutdown) and returns the exit code.
func (n *Node) Stop() int {
	n.t.Helper()
	if !n.Running() {
		return 0
	}
	n.signal(syscall.SIGTERM)
	return n.Wait(30 * time.Second)
}

// Pause freezes the process (SIGSTOP) and returns once the kernel reports it
// stopped: signal delivery is asynchronous, and a request sent right after kill(2)
// could otherwise still be served.
func (n *Node) Pause() {
	n.t.Helper()
	n.signal(syscall.SIGSTOP)
	n.waitState(true)
}

// Resume thaws a paused process (SIGCONT) and returns once it runs again.
func (n *Node) Resume() {
	n.t.Helper()
	n.signal(syscall.SIGCONT)
	n.waitState(false)
}

// waitState polls /proc/<pid>/stat until the process is (or is no longer) in
// state T (stopped).
func (n *Node) waitState(stopped bool) {
	n.t.Helper()
	pid := n.Pid()
	if testgroup.Until(5*time.Second, time.Millisecond, func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true // exited; callers find out on their next operation
		}
		// Format: pid (comm) state ...; comm may contain spaces, so split after ')'.
		i := bytes.LastIndexByte(b, ')')
		return i >= 0 && i+2 < len(b) && (b[i+2] == 'T') == stopped
	}) {
		return
	}
	n.t.Fatalf("cluster: %s did not become stopped=%v", n.ID, stopped)
}

// Restart kills the node if it runs and starts it again on the same ports and
// directory.
func (n *Node) Restart() {
	n.t.Helper()
	n.Kill()
	n.Start()
}

// Logs returns everything the node's processes printed so far.
func (n *Node) Logs() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.logs.String()
}

// Pid returns the current process id (0 if never started).
func (n *Node) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Port returns the client port number.
func (n *Node) Port() string {
	_, p, _ := net.SplitHostPort(n.ClientAddr)
	return p
}

// PortInt returns the client port as an int.
func (n *Node) PortInt() int {
	p, _ := strconv.Atoi(n.Port())
	return p
}
