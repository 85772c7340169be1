package main

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kefirdb/kefir/internal/server"
)

// runUp starts a local cluster: each node is a child `kefir server` process on
// loopback, in its own process group so that Ctrl-C reaches only `up`, which then
// stops the nodes with one SIGTERM each (a second signal to a node forces it).
func runUp(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodes := fs.Int("nodes", 3, "number of nodes: 1 runs a single node; an odd number ≥ 3 runs one VR replica group (tolerates (N-1)/2 failed nodes)")
	dir := fs.String("dir", "kefir-data", "data directory; node i keeps its data in DIR/n<i>")
	basePort := fs.Int("base-port", 6380, "client port of node 1; node i uses base+i-1, its peer port base+1000+i-1, its HTTP port base+2000+i-1")
	durability := fs.String("durability", "sync", "default write durability of the nodes: sync, cad or async")
	logLevel := fs.String("log-level", "info", "log level of the nodes")
	nilext := fs.Bool("nilext", false, "EXPERIMENTAL: run the group with the Skyros nilext fast path (kefir server --nilext on every node); needs --nodes ≥ 3")
	followerReads := fs.Bool("follower-reads", false, "followers serve cross-client-monotonic reads under active-set leases (kefir server --follower-reads on every node); needs --nodes ≥ 3")
	ioModel := fs.String("io-model", "", "how the nodes serve client connections: epoll or goroutine (kefir server --io-model); empty: each node's own default (KEFIR_IO_MODEL, else epoll on Linux)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kefir up [options]\n\nStarts a local Kefir cluster on loopback as child processes, prints its addresses,\nstreams the nodes' logs prefixed by node id, and stops everything on Ctrl-C.\n\nOptions:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if *nodes < 1 || (*nodes > 1 && *nodes%2 == 0) {
		return usageError{fmt.Errorf("--nodes %d: want 1 (single node) or an odd number ≥ 3 (a replica group of 2f+1)", *nodes)}
	}
	if *nilext && *nodes == 1 {
		return usageError{errors.New("--nilext needs a replica group (--nodes 3 or more)")}
	}
	if *followerReads && *nodes == 1 {
		return usageError{errors.New("--follower-reads needs a replica group (--nodes 3 or more)")}
	}
	if *ioModel != "" {
		// Refuse it here, once, rather than have every child exit with it.
		if _, err := server.ParseIOModel(*ioModel); err != nil {
			return usageError{fmt.Errorf("--io-model: %w", err)}
		}
	}
	grp, err := prepareGroup(*dir, *nodes, *basePort)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	type child struct {
		id         string
		cmd        *exec.Cmd
		client     string
		http, peer string
		exited     chan error
	}
	var children []*child
	var outMu sync.Mutex // log lines from several nodes must not interleave mid-line
	stopAll := func() {
		for _, c := range children {
			if c.cmd.Process != nil {
				_ = c.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		for _, c := range children {
			select {
			case <-c.exited:
			case <-time.After(15 * time.Second):
				fmt.Fprintf(stderr, "up: %s did not stop in 15s; killing it\n", c.id)
				_ = c.cmd.Process.Kill()
				<-c.exited
			}
		}
	}
	for i := 1; i <= *nodes; i++ {
		id := "n" + strconv.Itoa(i)
		c := &child{
			id:     id,
			client: net.JoinHostPort("127.0.0.1", strconv.Itoa(*basePort+i-1)),
			peer:   net.JoinHostPort("127.0.0.1", strconv.Itoa(*basePort+1000+i-1)),
			http:   net.JoinHostPort("127.0.0.1", strconv.Itoa(*basePort+2000+i-1)),
			exited: make(chan error, 1),
		}
		c.cmd = exec.Command(self, "server",
			"--node-id", id,
			"--dir", filepath.Join(*dir, id),
			"--client-addr", c.client,
			"--peer-addr", c.peer,
			"--http-addr", c.http,
			"--durability", *durability,
			"--log-level", *logLevel)
		if *ioModel != "" {
			c.cmd.Args = append(c.cmd.Args, "--io-model", *ioModel)
		}
		if grp != nil {
			c.cmd.Args = append(c.cmd.Args,
				"--members", grp.members,
				"--replica-id", strconv.Itoa(i),
				"--cluster-id", strconv.FormatUint(grp.clusterID, 10),
				"--bootstrap", strconv.FormatBool(grp.bootstrap),
				"--nilext", strconv.FormatBool(*nilext),
				"--follower-reads", strconv.FormatBool(*followerReads))
			// The secret goes through the environment: flags show in ps.
			c.cmd.Env = append(os.Environ(), "KEFIR_CLUSTER_SECRET="+grp.secret)
		}
		c.cmd.SysProcAttr = nodeProcAttr()
		c.cmd.Stdin = nil
		out, err := c.cmd.StdoutPipe()
		if err != nil {
			return err
		}
		c.cmd.Stderr = c.cmd.Stdout
		if err := c.cmd.Start(); err != nil {
			stopAll()
			return fmt.Errorf("start %s: %w", id, err)
		}
		children = append(children, c)
		go func() {
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				outMu.Lock()
				fmt.Fprintf(stderr, "%s | %s\n", id, sc.Text())
				outMu.Unlock()
			}
			c.exited <- c.cmd.Wait()
		}()
	}
	// Wait until every node answers PING, or one dies.
	for _, c := range children {
		if err := waitPing(c.client, 15*time.Second, c.exited); err != nil {
			stopAll()
			return fmt.Errorf("%s did not come up: %w", c.id, err)
		}
	}
	if grp != nil {
		// Serving PING is not serving writes: wait until the group has a
		// leader (on a restart, after the view change and recovery).
		var https []string
		for _, c := range children {
			https = append(https, c.http)
		}
		if err := waitLeader(https, 30*time.Second); err != nil {
			stopAll()
			return err
		}
	}
	outMu.Lock()
	if grp != nil {
		how := "restarted from its data"
		if grp.bootstrap {
			how = "new group bootstrapped"
		}
		fmt.Fprintf(stdout, "\nKefir is up: a %d-replica group (cluster %d, %s), data in %s\n", len(children), grp.clusterID, how, *dir)
	} else {
		fmt.Fprintf(stdout, "\nKefir is up: 1 node, data in %s\n", *dir)
	}
	for _, c := range children {
		fmt.Fprintf(stdout, "  %s  client (RESP) %s   admin http://%s/   peer %s\n", c.id, c.client, c.http, c.peer)
	}
	if grp != nil {
		fmt.Fprintf(stdout, "\nPoint redis-cli (or any Redis client) at ANY node: followers forward writes and\nlinearizable reads to the leader. The Go client takes all addresses and finds the leader.\n")
	}
	host, port, _ := net.SplitHostPort(children[0].client)
	fmt.Fprintf(stdout, "\nTry:  redis-cli -h %s -p %s set hello world\n      redis-cli -h %s -p %s get hello\n      kefir get hello --addr %s\n\nCtrl-C stops the cluster.\n\n",
		host, port, host, port, children[0].client)
	outMu.Unlock()

	exited := make(chan string, len(children))
	for _, c := range children {
		go func() {
			err := <-c.exited
			c.exited <- err // leave it for stopAll
			exited <- fmt.Sprintf("%s exited: %v", c.id, err)
		}()
	}
	select {
	case sig := <-sigs:
		fmt.Fprintf(stderr, "\nup: %v: stopping the cluster\n", sig)
		done := make(chan struct{})
		go func() { stopAll(); close(done) }()
		select {
		case <-done:
		case <-sigs:
			fmt.Fprintf(stderr, "up: second signal: killing the nodes\n")
			for _, c := range children {
				_ = c.cmd.Process.Kill()
			}
			<-done
		}
		return nil
	case msg := <-exited:
		stopAll()
		return errors.New(msg + " (stopped the cluster)")
	}
}

// waitPing polls addr until it answers PING.
func waitPing(addr string, timeout time.Duration, exited chan error) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("process exited: %v", err)
		default:
		}
		nc, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = nc.SetDeadline(time.Now().Add(time.Second))
			_, _ = nc.Write([]byte("PING\r\n"))
			buf := make([]byte, 7)
			n, _ := io.ReadFull(nc, buf)
			nc.Close()
			// A node with a password (KEFIR_PASSWORD reaches the nodes)
			// answers NOAUTH before AUTH, as Redis does: it is serving.
			if r := string(buf[:n]); r == "+PONG\r\n" || r == "-NOAUTH" {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no PONG from %s within %v", addr, timeout)
}

// upGroup is what the nodes of a local replica group share.
type upGroup struct {
	members   string
	clusterID uint64
	secret    string
	bootstrap bool
}

// prepareGroup returns the group settings for n > 1 nodes (nil for one).
//
// Bootstrap is decided here, once for the whole group: only when NO node has a
// data directory yet is this the group's first start. If some node directories
// exist, every node starts without bootstrap; a node whose directory is missing
// (deleted by hand) then rejoins by VR recovery from the others instead of
// founding a second, empty group. The cluster id and the peer secret are drawn
// at the first start and kept in DIR/cluster.json (mode 0600), so a restart of
// the same directory finds the same group.
func prepareGroup(dir string, n, basePort int) (*upGroup, error) {
	if n == 1 {
		return nil, nil
	}
	var ms []server.Member
	fresh := true
	for i := 1; i <= n; i++ {
		ms = append(ms, server.Member{
			ID:         uint64(i),
			PeerAddr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(basePort+1000+i-1)),
			ClientAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(basePort+i-1)),
		})
		if _, err := os.Stat(filepath.Join(dir, "n"+strconv.Itoa(i))); err == nil {
			fresh = false
		}
	}
	g := &upGroup{members: server.FormatMembers(ms)}
	var saved struct {
		ClusterID uint64 `json:"cluster_id"`
		Secret    string `json:"cluster_secret"`
	}
	path := filepath.Join(dir, "cluster.json")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &saved); err != nil || saved.ClusterID == 0 || saved.Secret == "" {
			return nil, fmt.Errorf("%s is corrupt (%v); remove %s to start a new cluster", path, err, dir)
		}
	case errors.Is(err, os.ErrNotExist):
		if !fresh {
			return nil, fmt.Errorf("%s has node directories but no cluster.json: it was made by a single-node `kefir up` or by hand; use --nodes 1 or another --dir", dir)
		}
		var rnd [24]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, err
		}
		saved.ClusterID = binary.LittleEndian.Uint64(rnd[:8])>>1 | 1
		saved.Secret = hex.EncodeToString(rnd[8:])
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
		b, _ := json.Marshal(saved)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
	default:
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	g.clusterID, g.secret, g.bootstrap = saved.ClusterID, saved.Secret, fresh
	return g, nil
}

// waitLeader polls the nodes' /status until one of them leads.
func waitLeader(httpAddrs []string, timeout time.Duration) error {
	hc := http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, a := range httpAddrs {
			r, err := hc.Get("http://" + a + "/status")
			if err != nil {
				continue
			}
			var st struct {
				Role string `json:"role"`
			}
			err = json.NewDecoder(r.Body).Decode(&st)
			r.Body.Close()
			if err == nil && st.Role == "leader" {
				return nil
			}
		}
	}
	return fmt.Errorf("the group elected no leader within %v (see the nodes' logs above)", timeout)
}
