package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// upStatus is what these tests read of a node's /status.
type upStatus struct {
	PID         int    `json:"pid"`
	Role        string `json:"role"`
	Replication *struct {
		View        uint64 `json:"view"`
		Leader      uint64 `json:"leader"`
		Status      string `json:"status"`
		ViewChanges uint64 `json:"view_changes"`
		ViewEvents  []struct {
			Time   time.Time `json:"time"`
			Kind   string    `json:"kind"`
			View   uint64    `json:"view"`
			Leader uint64    `json:"leader"`
			Reason string    `json:"reason"`
		} `json:"view_events"`
	} `json:"replication"`
}

func getStatus(httpAddr string) (upStatus, error) {
	var st upStatus
	hc := http.Client{Timeout: time.Second}
	r, err := hc.Get("http://" + httpAddr + "/status")
	if err != nil {
		return st, err
	}
	defer r.Body.Close()
	return st, json.NewDecoder(r.Body).Decode(&st)
}

// upCluster is the addresses of an `up` cluster on base.
type upAddrs struct{ client, http []string }

func upAddrsOf(base, nodes int) upAddrs {
	var a upAddrs
	for i := range nodes {
		a.client = append(a.client, fmt.Sprintf("127.0.0.1:%d", base+i))
		a.http = append(a.http, fmt.Sprintf("127.0.0.1:%d", base+2000+i))
	}
	return a
}

// setOnce sends one plain RESP SET (what redis-cli sends) on a new
// connection and returns the reply line, without retrying.
func setOnce(addr, k, v string) string {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(nc, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(k), k, len(v), v); err != nil {
		return "write: " + err.Error()
	}
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil {
		return "read: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// trials is how many times a repeated e2e scenario runs: a few in make test,
// more with KEFIR_UP_TRIALS=N for a measurement.
func trials(def int) int {
	if n, err := strconv.Atoi(os.Getenv("KEFIR_UP_TRIALS")); err == nil && n > 0 {
		return n
	}
	return def
}

// waitLog waits until `up`'s stderr matches re.
func (u *upProc) waitLog(t *testing.T, re string, timeout time.Duration) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	var m []string
	if testgroup.Until(timeout, 50*time.Millisecond, func() bool { m = rx.FindStringSubmatch(u.Logs()); return m != nil }) {
		return m
	}
	t.Fatalf("kefir up's output has no match for %q within %v:\n%s", re, timeout, u.Logs())
	return nil
}

// nodePid returns the pid of node n<i> (from 1) among `up`'s children.
func (u *upProc) nodePid(t *testing.T, i int) int {
	t.Helper()
	out, _ := exec.Command("ps", "-o", "pid=,args=", "--ppid", strconv.Itoa(u.cmd.Process.Pid)).Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.Contains(line, fmt.Sprintf(" --node-id n%d ", i)) {
			if pid, err := strconv.Atoi(f[0]); err == nil && pid > 1 {
				return pid
			}
		}
	}
	t.Fatalf("kefir up has no child n%d:\n%s", i, out)
	return 0
}

// alive reports whether `kefir up` still runs (a process that exited stays
// a zombie until stop reaps it).
func (u *upProc) alive() bool {
	st := procState(u.cmd.Process.Pid)
	return st != "" && !strings.HasPrefix(st, "Z")
}

// Issue 25 item 6: right after "Kefir is up" on a restart from existing data,
// a write through any node succeeds — `up` prints the banner only once every
// node is in the same normal view and knows its leader. (Before, `up` waited
// for any node to call itself leader, and a write through a follower still in
// the old view or in the view change failed with UNAVAILABLE no leader.)
func TestUpWritesSucceedRightAfterTheBanner(t *testing.T) {
	base := freeBase(t, 3)
	dir := t.TempDir()
	a := upAddrsOf(base, 3)
	failed, writes, unsettled := 0, 0, 0
	n := trials(3)
	for trial := range n + 1 { // the first start bootstraps; the others restart
		u := startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base))
		// What the banner promises: every node in the same normal view,
		// under the same leader.
		var views []string
		for _, h := range a.http {
			st, err := getStatus(h)
			if err != nil || st.Replication == nil {
				t.Fatalf("start %d: /status of %s: %v", trial, h, err)
			}
			views = append(views, fmt.Sprintf("%s view %d leader %d", st.Replication.Status, st.Replication.View, st.Replication.Leader))
		}
		if views[0] != views[1] || views[0] != views[2] || !strings.HasPrefix(views[0], "normal") {
			unsettled++
			t.Errorf("start %d: right after the banner the nodes are at %q", trial, views)
		}
		// Writes through every node in turn for the next second, each on a
		// new connection as redis-cli makes them.
		for j, t0 := 0, time.Now(); time.Since(t0) < time.Second; j++ {
			i := j % len(a.client)
			writes++
			if got := setOnce(a.client[i], fmt.Sprintf("t%d-%d", trial, j), "v"); got != "+OK" {
				failed++
				t.Errorf("start %d: SET through n%d %v after the banner: %s", trial, i+1, time.Since(t0).Round(time.Millisecond), got)
			}
		}
		u.stop(t)
	}
	t.Logf("%d starts (%d restarts from data): %d unsettled at the banner; %d of %d writes in the second after the banner failed", n+1, n, unsettled, failed, writes)
}

// Issue 25 item 3: a second `kefir up` on ports another cluster holds fails
// before it writes or starts anything, naming the port and the process that
// holds it, and never prints the banner.
func TestUpRefusesPortsAnotherClusterHolds(t *testing.T) {
	base := freeBase(t, 3)
	first := startUp(t, "--dir", t.TempDir(), "--base-port", strconv.Itoa(base))
	a := upAddrsOf(base, 3)
	st, err := getStatus(a.http[0])
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "second")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cluster.Binary(t), "up", "--dir", dir, "--base-port", strconv.Itoa(base)).CombinedOutput()
	if err == nil || strings.Contains(string(out), "Kefir is up") {
		t.Fatalf("a second kefir up on the first one's ports: err %v, output:\n%s", err, out)
	}
	for _, want := range []string{a.client[0], fmt.Sprintf("pid %d", st.PID)} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the error does not name %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("the refused kefir up created %s", dir)
	}
	// The first cluster is untouched.
	if got := setOnce(a.client[1], "k", "v"); got != "+OK" {
		t.Errorf("first cluster after the refused start: SET = %s", got)
	}
	first.stop(t)
}

// Issue 25 item 3: any of a node's three ports held by another process (here
// this test's own listener on n2's peer port) is named with its holder.
func TestUpNamesTheHolderOfATakenPort(t *testing.T) {
	base := freeBase(t, 3)
	peer := fmt.Sprintf("127.0.0.1:%d", base+1001)
	ln, err := net.Listen("tcp", peer)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cluster.Binary(t), "up", "--dir", t.TempDir(), "--base-port", strconv.Itoa(base)).CombinedOutput()
	if err == nil || strings.Contains(string(out), "Kefir is up") {
		t.Fatalf("kefir up with n2's peer port taken: err %v, output:\n%s", err, out)
	}
	want := fmt.Sprintf("n2's peer port %s is taken by pid %d", peer, os.Getpid())
	if !strings.Contains(string(out), want) {
		t.Errorf("the error does not say %q:\n%s", want, out)
	}
}

// Issue 25 items 4 and 7: killing any one node of an `up` group does not stop
// the cluster. The others keep serving writes, `up` reports the dead node and
// restarts it, and it rejoins; the survivors log the view change at the
// default level, count it in /metrics and list it on /status.
func TestUpRestartsAKilledNodeAndTheRestKeepServing(t *testing.T) {
	base := freeBase(t, 3)
	u := startUp(t, "--dir", t.TempDir(), "--base-port", strconv.Itoa(base))
	a := upAddrsOf(base, 3)
	c := dialGroup(t, a.client)
	ctx := context.Background()
	n := trials(3)
	restarted := 0
	var leaderGap, followerGap time.Duration // longest wait for the first write after a kill
	for trial := range n {
		// Even trials kill the leader, odd ones a follower.
		victim := -1
		for deadline := time.Now().Add(20 * time.Second); victim < 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			for i, h := range a.http {
				st, err := getStatus(h)
				if err == nil && (st.Role == "leader") == (trial%2 == 0) && (st.Role == "leader" || st.Role == "follower") {
					victim = i
					break
				}
			}
		}
		if victim < 0 {
			t.Fatalf("trial %d: no node to kill", trial)
		}
		st, err := getStatus(a.http[victim])
		if err != nil {
			t.Fatal(err)
		}
		role := st.Role
		st.PID = u.nodePid(t, victim+1)
		if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The others serve writes while it is down and while it comes back.
		killed := time.Now()
		for j := range 20 {
			if err := c.Put(ctx, fmt.Sprintf("t%d-%d", trial, j), []byte("v")); err != nil {
				t.Fatalf("trial %d: write %d after killing n%d (%s): %v\n%s", trial, j, victim+1, role, err, u.Logs())
			}
			if j == 0 {
				// The first write waits out the view change (the client
				// retries an unavailable group).
				d := time.Since(killed)
				if role == "leader" {
					leaderGap = max(leaderGap, d)
				} else {
					followerGap = max(followerGap, d)
				}
			}
		}
		if !u.alive() {
			t.Fatalf("trial %d: kefir up exited after n%d was killed:\n%s", trial, victim+1, u.Logs())
		}
		u.waitLog(t, fmt.Sprintf(`up: n%d \(pid %d\) stopped after .*: signal: killed`, victim+1, st.PID), 10*time.Second)
		m := u.waitLog(t, fmt.Sprintf(`up: n%d restarted \(pid (\d+)\)`, victim+1), 10*time.Second)
		u.waitLog(t, fmt.Sprintf(`up: n%d is back \(pid %s\)`, victim+1, m[1]), 20*time.Second)
		// It rejoins: a write through it succeeds (served or forwarded).
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			got := setOnce(a.client[victim], fmt.Sprintf("t%d-back", trial), "v")
			if got == "+OK" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("trial %d: n%d after its restart: SET = %s\n%s", trial, victim+1, got, u.Logs())
			}
		}
		restarted++
		// Clear the logs this trial matched, so the next one matches its own.
		u.mu.Lock()
		u.logs.Reset()
		u.mu.Unlock()
	}
	t.Logf("%d kills (leader and follower alternately): the rest served every write, %d restarted and rejoined; first write after a kill took at most %v (leader killed), %v (follower killed)",
		n, restarted, leaderGap.Round(time.Millisecond), followerGap.Round(time.Millisecond))

	// Item 7: the view changes the leader kills caused are visible (on the
	// nodes that saw them: counts and events are per process life, and a
	// follower restarted into the current view has none).
	var events int
	for i, h := range a.http {
		st, err := getStatus(h)
		if err != nil {
			t.Fatal(err)
		}
		if st.Replication.ViewChanges > 0 && len(st.Replication.ViewEvents) > 0 {
			events++
		}
		for _, e := range st.Replication.ViewEvents {
			if e.Reason == "" || e.Kind == "" || e.Time.IsZero() {
				t.Errorf("n%d: a view event without kind, reason or time: %+v", i+1, e)
			}
		}
		r, err := http.Get("http://" + h + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if !regexp.MustCompile(`(?m)^kefir_vr_view_changes_total [1-9]`).Match(b) && st.Replication.ViewChanges > 0 {
			t.Errorf("n%d: /status counts %d view changes, /metrics does not", i+1, st.Replication.ViewChanges)
		}
	}
	if events == 0 {
		t.Errorf("no node counts and lists a view change after %d kills", n)
	}
	// Ctrl-C still stops every node, the restarted ones included.
	u.stop(t)
	for _, addr := range a.client {
		if err := cluster.Ping(addr); err == nil {
			t.Errorf("%s still answers after kefir up stopped", addr)
		}
	}
}

// Issue 25 item 7: at the default log level, a view change and the new
// leader are logged with their reason.
func TestUpLogsViewChangesAtTheDefaultLevel(t *testing.T) {
	base := freeBase(t, 3)
	u := startUp(t, "--dir", t.TempDir(), "--base-port", strconv.Itoa(base))
	a := upAddrsOf(base, 3)
	leader := -1
	for i, h := range a.http {
		if st, err := getStatus(h); err == nil && st.Role == "leader" {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no leader after the banner")
	}
	if err := syscall.Kill(u.nodePid(t, leader+1), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	u.waitLog(t, `level=INFO msg="view change started" .*reason=`, 10*time.Second)
	u.waitLog(t, `level=INFO msg="new view" .*leader=\d`, 10*time.Second)
	// The human status page lists them.
	survivor := a.http[(leader+1)%3]
	r, err := http.Get("http://" + survivor + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(r.Body)
	r.Body.Close()
	// Its reason: its own timeout, or the other survivor's that came first.
	for _, want := range []string{"Last view events", "<td>view-change</td>", "<td>new-view</td>",
		"no word from leader n" + strconv.Itoa(leader+1) + "|started a view change to view"} {
		if !regexp.MustCompile(want).Match(page) {
			t.Errorf("status page of %s lacks %q:\n%s", survivor, want, page)
		}
	}
	u.stop(t)
}

// Issue 25 item 4: a node that fails again and again right after starting
// (here: its data directory belongs to another replica) is not restarted
// forever; `up` says so and the rest of the group keeps serving.
func TestUpGivesUpOnANodeThatCannotStart(t *testing.T) {
	base := freeBase(t, 3)
	dir := t.TempDir()
	u := startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base))
	a := upAddrsOf(base, 3)
	c := dialGroup(t, a.client)
	// Make n2's directory claim another replica id: every start refuses it.
	idf := filepath.Join(dir, "n2", "kefir-replica.json")
	b, err := os.ReadFile(idf)
	if err != nil {
		t.Fatal(err)
	}
	var id map[string]any
	if err := json.Unmarshal(b, &id); err != nil {
		t.Fatal(err)
	}
	id["replica_id"] = 7
	b, _ = json.Marshal(id)
	if err := os.WriteFile(idf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(u.nodePid(t, 2), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	u.waitLog(t, `up: n2 failed to start 4 times in a row .*not restarting it again`, 30*time.Second)
	if !u.alive() {
		t.Fatalf("kefir up exited:\n%s", u.Logs())
	}
	if err := c.Put(context.Background(), "after", []byte("v")); err != nil {
		t.Fatalf("write with n2 given up: %v", err)
	}
	time.Sleep(time.Second)
	// One restart after the kill, three after failed starts.
	if n := strings.Count(u.Logs(), "up: n2 restarted"); n != 4 {
		t.Errorf("want 4 restarts of n2 (the kill, then 4 failed starts), got %d:\n%s", n, u.Logs())
	}
	u.stop(t)
}

// A node of a `kefir up` cluster that kefir cluster replace-node retires
// exits on its own and stays down — up does not restart it into a refusal —
// and the next `kefir up` on the directory starts the others without it
// (before, its refusal failed the whole start), with the group, now with the
// replacement, serving writes.
func TestUpLeavesARetiredNodeDown(t *testing.T) {
	base := freeBase(t, 3)
	dir := t.TempDir()
	u := startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base))
	a := upAddrsOf(base, 3)
	var saved struct {
		Secret string `json:"cluster_secret"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cluster.json")); err != nil || json.Unmarshal(b, &saved) != nil || saved.Secret == "" {
		t.Fatalf("cluster.json: %v %s", err, b)
	}
	n4 := cluster.NewNode(t, "n4")
	n4.Args = []string{"--replica-id", "4", "--join", a.client[0] + "," + a.client[1], "--cluster-secret", saved.Secret}
	if err := n4.StartNoWait(); err != nil {
		t.Fatal(err)
	}
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(n4.Logs(), "does not name this node yet") }) {
		t.Fatalf("node 4 did not wait to be named:\n%s", n4.Logs())
	}
	if out, err := kefirCluster(t, "replace-node", "--addr", a.client[0], "--old", "3", "--new", fmt.Sprintf("4@%s/%s", n4.PeerAddr, n4.ClientAddr)); err != nil {
		t.Fatalf("replace-node: %v\n%s", err, out)
	}
	if err := n4.WaitReady(20 * time.Second); err != nil {
		t.Fatalf("node 4 did not start serving: %v\n%s", err, n4.Logs())
	}
	u.waitLog(t, `n3 left the group: not restarting it`, 30*time.Second)
	c := dialGroup(t, []string{a.client[0], a.client[1], n4.ClientAddr})
	if err := c.Put(context.Background(), "after-replace", []byte("v")); err != nil {
		t.Fatalf("write after the replacement: %v", err)
	}
	time.Sleep(2 * time.Second) // past up's first restart delay
	if strings.Contains(u.Logs(), "restarting n3") {
		t.Fatalf("kefir up restarts the retired n3:\n%s", u.Logs())
	}
	u.stop(t)

	u2 := startUp(t, "--dir", dir, "--base-port", strconv.Itoa(base))
	u2.waitLog(t, `n3 is not started: .*left its group`, 5*time.Second)
	if err := c.Put(context.Background(), "after-restart", []byte("v")); err != nil {
		t.Fatalf("write after kefir up restarted without n3: %v\n%s", err, u2.Logs())
	}
	u2.stop(t)
}
