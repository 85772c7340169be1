package main

import (
	"bufio"
	"context"
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/server"
	"github.com/kefirdb/kefir/internal/vrshard"
)

// How `up` supervises its nodes. A node that exits is restarted after
// restartFirst, doubling (up to restartMax) for each further exit in a row
// that came within quickExit of its start. A node that exits before it ever
// served its admin port as its own process failed to start — bad flags,
// damaged data — and starting it again cannot help: after maxFailedStarts of
// those in a row `up` stops restarting it, says why, and keeps the rest of the
// group running. A node that did serve is always restarted (an operator may
// kill the same node again and again to watch failovers).
const (
	upReadyTimeout = 45 * time.Second
	upStopTimeout  = 15 * time.Second
	// settleFor: how long the nodes must agree on the view and its leader
	// before `up` calls the cluster up. A fresh group's followers start in
	// view 0 under its leader before they have heard it, and one that then
	// does not hear it within the view-change timeout (300 ms) starts a view
	// change; after settleFor any such follower has done so.
	settleFor       = 500 * time.Millisecond
	restartFirst    = 500 * time.Millisecond
	restartMax      = 8 * time.Second
	quickExit       = 3 * time.Second
	maxFailedStarts = 4
)

// runUp starts a local cluster: each node is a child `kefir server` process on
// loopback, in its own process group so that Ctrl-C reaches only `up`, which then
// stops the nodes with one SIGTERM each (a second signal to a node forces it).
// A node that exits while the cluster runs is reported and restarted; the
// others keep serving (a group of N tolerates (N-1)/2 of them down).
func runUp(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodes := fs.Int("nodes", 3, "number of nodes: 1 runs a single node; an odd number ≥ 3 runs one VR replica group (tolerates (N-1)/2 failed nodes); with --engine chain any number ≥ 2 (a chain of N)")
	dir := fs.String("dir", "kefir-data", "data directory; node i keeps its data in DIR/n<i>")
	basePort := fs.Int("base-port", 6380, "client port of node 1; node i uses base+i-1, its peer port base+1000+i-1, its HTTP port base+2000+i-1")
	durability := fs.String("durability", "sync", "default write durability of the nodes: sync, cad or async")
	logLevel := fs.String("log-level", "info", "log level of the nodes")
	nilext := fs.Bool("nilext", false, "EXPERIMENTAL: run the group with the Skyros nilext fast path (kefir server --nilext on every node); needs --nodes ≥ 3")
	followerReads := fs.Bool("follower-reads", false, "followers serve cross-client-monotonic reads under active-set leases (kefir server --follower-reads on every node); needs --nodes ≥ 3 and one group")
	crossGroupTx := fs.Bool("cross-group-tx", true, "with --groups: KEFIR.TX transactions (and the Go client's Txn) may span slots and groups, committed in two phases (on by default; false: -CROSSSLOT; passed to every node's kefir server; docs/design/transactions.md)")
	groups := fs.Int("groups", 1, "number of replica groups (docs/cluster.md): more than 1 splits the 16384 Redis Cluster slots into that many contiguous ranges, one per 3-replica group, every node hosting a replica of each group (needs --nodes 3 or more; nilext off). 1: one group of all nodes")
	engine := fs.String("engine", "vr", "replication engine of the group: vr, or chain (chain replication, docs/chain.md: n1 is the head, writes are answered once every node logged them; the chain's master is hosted by a metadata group on n1-n3; on an existing data directory the whole chain restarts from its data). With --groups > 1: vr, chain (every group a chain) or mixed (the even-numbered groups chains, the others VR)")
	chainMode := fs.String("chain-mode", "su", "with --engine chain: the chain's update mode, su, ausi or au (kefir server --chain-mode on every node; docs/chain.md, \"Update modes\")")
	chainStores := fs.String("chain-stores", "", "with --engine chain: each node's datastore, comma-separated in node order (n1 is the head), e.g. m,d,d: log (d), buffered (b) or memory (m) (kefir server --chain-store; docs/chain.md, \"Datastores\"); empty: every node a log")
	zonesFlag := fs.String("zones", "", "with --groups > 1: the nodes' failure domains, comma-separated, given round-robin (a,b,c: n1 a, n2 b, n3 c, n4 a, ...) as each node's kefir server --zone; placement then puts a group's replicas in distinct zones (docs/cluster.md, Failure domains). Empty: no zones")
	ioModel := fs.String("io-model", "", "how the nodes serve client connections: epoll or goroutine (kefir server --io-model); empty: each node's own default (KEFIR_IO_MODEL, else epoll on Linux)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: kefir up [options]

Starts a local Kefir cluster on loopback as child processes, prints its addresses,
streams the nodes' logs prefixed by node id, and stops everything on Ctrl-C.

A node that exits (kill -9 <pid>, kill <pid>) is reported and restarted with
backoff while the others keep serving; one that fails to start %d times in a
row (exits before it serves) is left down (kill -USR1 <pid of kefir up> retries).
To keep a node down for a while, pause it: kill -STOP <pid>, later kill -CONT <pid>.

Options:
`, maxFailedStarts)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if *nodes < 1 || (*nodes > 1 && *nodes%2 == 0 && *engine != "chain" && *groups == 1) {
		return usageError{fmt.Errorf("--nodes %d: want 1 (single node) or an odd number ≥ 3 (a replica group of 2f+1; --engine chain takes any number from 2; with --groups any number from 3)", *nodes)}
	}
	if *nilext && *nodes == 1 {
		return usageError{errors.New("--nilext needs a replica group (--nodes 3 or more)")}
	}
	if *groups < 1 || *groups > 64 {
		return usageError{fmt.Errorf("--groups %d: want 1 to 64", *groups)}
	}
	if *groups > 1 && (*nodes < 3 || *nilext) {
		return usageError{errors.New("--groups > 1 needs --nodes 3 or more, and no --nilext (the fast path does not span groups yet)")}
	}
	var zones []string
	if *zonesFlag != "" {
		if *groups < 2 {
			return usageError{errors.New("--zones needs --groups 2 or more (zones guide placement in a cluster of several groups)")}
		}
		zones = strings.Split(*zonesFlag, ",")
		for _, z := range zones {
			err := kv.ValidZone(z)
			if z == "" {
				// ValidZone takes "" (no zone); here it is a stray comma,
				// which has no error of its own to quote.
				err = errors.New("an empty zone")
			}
			if err != nil {
				return usageError{fmt.Errorf("--zones %q: each zone a short printable label (got %q: %v)", *zonesFlag, z, err)}
			}
		}
	}
	if *groups > 1 && *followerReads {
		return usageError{errors.New("--groups > 1 and --follower-reads: in a cluster of several groups, cross-client-monotonic reads are served by each group's leader (sequential consistency across groups; docs/cluster.md)")}
	}
	switch *engine {
	case "vr":
	case "chain", "mixed":
		if *engine == "mixed" && *groups < 2 {
			return usageError{errors.New("--engine mixed needs --groups 2 or more (the even-numbered groups chains, the others VR)")}
		}
		if *nodes < 2 || *nilext || *followerReads {
			return usageError{fmt.Errorf("--engine %s needs --nodes 2 or more, and neither --nilext nor --follower-reads (VR's)", *engine)}
		}
	default:
		return usageError{fmt.Errorf("--engine %q: want vr, chain or mixed", *engine)}
	}
	stores, err := parseChainStores(*chainStores, *nodes, *engine)
	if err != nil {
		return usageError{err}
	}
	mode, err := chain.ParseMode(*chainMode)
	if err != nil {
		return usageError{err}
	}
	if mode != chain.SU && *engine != "chain" {
		return usageError{errors.New("--chain-mode needs --engine chain")}
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
	if *basePort < 1 || *basePort+2000+*nodes-1 > 65535 {
		return usageError{fmt.Errorf("--base-port %d: the ports base … base+2000+%d must lie in 1–65535", *basePort, *nodes-1)}
	}
	u := &upCluster{stderr: stderr, dir: *dir}
	for i := 1; i <= *nodes; i++ {
		id := "n" + strconv.Itoa(i)
		u.nodes = append(u.nodes, &upNode{
			id:     id,
			client: net.JoinHostPort("127.0.0.1", strconv.Itoa(*basePort+i-1)),
			peer:   net.JoinHostPort("127.0.0.1", strconv.Itoa(*basePort+1000+i-1)),
			http:   net.JoinHostPort("127.0.0.1", strconv.Itoa(*basePort+2000+i-1)),
		})
	}
	// Before anything is written or started: a port another process holds
	// would make a node fail to bind — and its readiness probe be answered by
	// whoever holds it.
	if err := checkPorts(u.nodes); err != nil {
		return err
	}
	grp, err := prepareGroup(*dir, upLayout{Nodes: *nodes, Groups: *groups, Engine: *engine}, *basePort)
	if err != nil {
		return err
	}
	u.grp = grp
	if stores != nil {
		letters := make([]string, len(stores))
		for i, st := range stores {
			letters[i] = st.Letter()
		}
		u.stores = strings.Join(letters, "-")
	}
	var chainArgs []string
	if *engine == "chain" && *groups == 1 {
		args, err := upChainArgs(grp)
		if err != nil {
			return err
		}
		chainArgs = append(args, "--chain-mode", strings.ToLower(mode.String()))
		grp.chain = true
	}
	groupsFlag := ""
	if *groups > 1 {
		ids := make([]uint64, grp.founders)
		for i := range ids {
			ids[i] = uint64(i + 1)
		}
		groupsFlag = cluster.FormatGroups(cluster.EvenGroups(*groups, ids, 3))
		grp.groups = *groups
		// Chain groups of the cluster (kefir server --chain-groups): their
		// masters at the metadata group (n1-n3).
		var chains []string
		for g := 1; g <= *groups; g++ {
			if *engine == "chain" || *engine == "mixed" && g%2 == 0 {
				chains = append(chains, strconv.Itoa(g))
			}
		}
		if len(chains) > 0 {
			chainArgs = []string{"--chain-groups", strings.Join(chains, ",")}
			grp.chainGroups = strings.Join(chains, ",")
		}
	}
	if u.self, err = os.Executable(); err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	for i, n := range u.nodes {
		n.args = []string{"server",
			"--node-id", n.id,
			"--dir", filepath.Join(*dir, n.id),
			"--client-addr", n.client,
			"--peer-addr", n.peer,
			"--http-addr", n.http,
			"--durability", *durability,
			"--log-level", *logLevel}
		if *ioModel != "" {
			n.args = append(n.args, "--io-model", *ioModel)
		}
		if len(zones) > 0 {
			n.args = append(n.args, "--zone", zones[i%len(zones)])
		}
		if grp != nil && i >= grp.founders {
			// A node added to the cluster (more --nodes than it was
			// founded with): it starts empty, joins through the founders
			// and waits for the map to name it, which the loop below
			// records (add-node) once the cluster is up; restarted, its
			// directory's join record knows the cluster (a directory
			// without one, the node stopped before it was named, joins
			// again).
			n.replica, n.joining = uint64(i+1), true
			n.args = append(n.args, "--replica-id", strconv.Itoa(i+1), "--cross-group-tx", strconv.FormatBool(*crossGroupTx))
			if !server.Joined(nodeDir(*dir, i+1)) {
				var seeds []string
				for _, f := range u.nodes[:grp.founders] {
					seeds = append(seeds, f.client)
				}
				n.args = append(n.args, "--join", strings.Join(seeds, ","))
			}
			n.env = append(os.Environ(), "KEFIR_CLUSTER_SECRET="+grp.secret)
		} else if grp != nil {
			n.replica = uint64(i + 1)
			n.args = append(n.args,
				"--members", grp.members,
				"--replica-id", strconv.Itoa(i+1),
				"--cluster-id", strconv.FormatUint(grp.clusterID, 10),
				"--bootstrap", strconv.FormatBool(grp.bootstrap),
				"--nilext", strconv.FormatBool(*nilext),
				"--follower-reads", strconv.FormatBool(*followerReads))
			if groupsFlag != "" {
				n.args = append(n.args, "--groups", groupsFlag, "--cross-group-tx", strconv.FormatBool(*crossGroupTx))
			}
			n.args = append(n.args, chainArgs...)
			if stores != nil {
				n.args = append(n.args, "--chain-store", stores[i].String(),
					"--chain-log-member", strconv.FormatBool(upChainLogMember(stores, *groups)))
			}
			// The secret goes through the environment: flags show in ps.
			n.env = append(os.Environ(), "KEFIR_CLUSTER_SECRET="+grp.secret)
		}
	}
	// Every node exits or restarts only through the loop below, which alone
	// touches the nodes' state; each node's goroutines report to it.
	u.events = make(chan upEvent, 4*len(u.nodes))
	u.done = make(chan struct{})
	defer close(u.done)
	u.restartc = make(chan *upNode, len(u.nodes))
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	defer signal.Stop(sigs)

	// A node whose replica left the group (kefir cluster remove-node or
	// replace-node retired it) refuses to start, and must not: the group
	// runs without it. Left down, and said so, rather than failing the
	// cluster's start.
	live := u.nodes[:0]
	for _, n := range u.nodes {
		if err := server.CheckRetired(filepath.Join(*dir, n.id)); errors.Is(err, server.ErrRetired) {
			u.say("%s is not started: %v", n.id, err)
			continue
		}
		live = append(live, n)
	}
	if len(live) == 0 {
		return fmt.Errorf("every node in %s left its group: nothing to start", *dir)
	}
	u.nodes = live
	for _, n := range u.nodes {
		if err := u.start(n); err != nil {
			u.stopAll(sigs)
			return err
		}
	}
	if err := u.waitUp(sigs); err != nil {
		if errors.Is(err, errInterrupted) {
			return nil
		}
		return err
	}
	if err := u.recordJoined(); err != nil {
		u.stopAll(sigs)
		return err
	}
	if len(u.joined) > 0 {
		if err := u.waitUp(sigs); err != nil { // the new nodes serving too
			if errors.Is(err, errInterrupted) {
				return nil
			}
			return err
		}
	}
	u.banner(stdout)
	return u.supervise(sigs)
}

// recordJoined records the nodes added to the cluster (more --nodes than
// it was founded with) in the metadata group's map, as kefir cluster
// add-node does: each then serves as a node of the cluster that hosts no
// replica until a group is placed on it (kefir cluster add-group, or a
// replacement). Recording a node the map has is a no-op, so a restart
// records nothing new.
func (u *upCluster) recordJoined() error {
	var seeds []string
	for _, n := range u.nodes {
		if !n.joining {
			seeds = append(seeds, n.client)
		}
	}
	u.recorded = true
	if len(seeds) == len(u.nodes) {
		return nil
	}
	mv := &cluster.Mover{Seeds: seeds, Password: os.Getenv("KEFIR_PASSWORD"), RetryFor: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return fmt.Errorf("the new nodes could not be recorded in the cluster's map: %w", err)
	}
	for _, n := range u.nodes {
		if !n.joining || slices.Contains(cm.NodeIDs(), n.replica) {
			continue
		}
		epoch, err := mv.AddNode(ctx, n.replica, n.client, n.peer, "")
		if err != nil {
			return fmt.Errorf("%s could not be recorded in the cluster's map: %w", n.id, err)
		}
		u.joined = append(u.joined, n.id)
		u.say("%s is a node of the cluster (map epoch %d); it hosts no replica until a group is placed on it", n.id, epoch)
	}
	return nil
}

// errInterrupted: a signal stopped `up` before the cluster was up.
var errInterrupted = errors.New("interrupted")

// upCluster is a running `kefir up`.
type upCluster struct {
	stores   string // --chain-stores as letters, head first (M-M-D); empty: every node a log
	stderr   io.Writer
	outMu    sync.Mutex // log lines from several nodes must not interleave mid-line
	dir      string
	self     string
	grp      *upGroup
	nodes    []*upNode
	joined   []string // nodes recordJoined put in the map this run (the banner names them)
	recorded bool     // recordJoined ran: every joining node is in the map, and may be probed
	events   chan upEvent
	restartc chan *upNode
	done     chan struct{} // closed when runUp returns
}

// upNode is one node of an `up` cluster. Its fields other than the fixed
// ones (id … env) belong to the supervising loop.
type upNode struct {
	id                 string
	replica            uint64 // 0 for a single node
	joining            bool   // added after the cluster's first start (upGroup.founders)
	client, peer, http string
	args, env          []string

	cmd     *exec.Cmd
	gen     int // which start of this node cmd is
	pid     int
	started time.Time
	running bool
	ready   bool // its admin port answered as this process since its start
	fails   int  // failed starts in a row: exits before it served (see maxFailedStarts)
	quick   int  // exits in a row within quickExit of a start (for the backoff)
	givenUp bool
	timer   *time.Timer   // pending restart
	dead    chan struct{} // closed when this start's process has exited
}

// upEvent is a node's report to the loop: its process (start number gen)
// exited with err, or (ready) it serves its admin port as itself.
type upEvent struct {
	n     *upNode
	gen   int
	ready bool
	err   error
}

func (u *upCluster) say(format string, args ...any) {
	u.outMu.Lock()
	defer u.outMu.Unlock()
	fmt.Fprintf(u.stderr, "up: "+format+"\n", args...)
}

// start starts n's process, streams its output prefixed by its id, and
// reports its exit as an event.
func (u *upCluster) start(n *upNode) error {
	cmd := exec.Command(u.self, n.args...)
	cmd.Env = n.env
	cmd.SysProcAttr = nodeProcAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("start %s: %w", n.id, err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", n.id, err)
	}
	n.gen++
	n.cmd, n.pid, n.started, n.running, n.ready = cmd, cmd.Process.Pid, time.Now(), true, false
	n.dead = make(chan struct{})
	id, gen, dead := n.id, n.gen, n.dead
	go func() {
		u.copyLines(out, id)
		err := cmd.Wait()
		close(dead)
		select {
		case u.events <- upEvent{n: n, gen: gen, err: err}:
		case <-u.done:
		}
	}()
	return nil
}

// copyLines copies a node's output to up's stderr, each line prefixed by
// the node's id, to its end whatever it holds: a reader that stopped (a line
// over the scanner's limit) would leave the pipe full and the node blocked on
// its next log line — hung, not exited, so never restarted.
func (u *upCluster) copyLines(out io.Reader, id string) {
	for {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), maxOutputLine)
		for sc.Scan() {
			u.outMu.Lock()
			fmt.Fprintf(u.stderr, "%s | %s\n", id, sc.Text())
			u.outMu.Unlock()
		}
		if sc.Err() == nil {
			return
		}
		u.say("%s: an output line over %d bytes was cut (%v)", id, maxOutputLine, sc.Err())
	}
}

// maxOutputLine is the longest node output line copied whole.
const maxOutputLine = 1 << 20

// nodeStatus is what `up` reads of a node's /status.
type nodeStatus struct {
	PID         int    `json:"pid"`
	NodeID      string `json:"node_id"`
	Role        string `json:"role"`
	Replication *struct {
		ReplicaID uint64 `json:"replica_id"`
		ClusterID uint64 `json:"cluster_id"`
		Status    string `json:"status"`
		View      uint64 `json:"view"`
		Leader    uint64 `json:"leader"`
	} `json:"replication"`
	// Groups: a node of several groups' replicas, one per group of the
	// slot map (Role empty: not hosted here).
	Groups []struct {
		ID     uint64 `json:"id"`
		Leader uint64 `json:"leader"`
		Engine string `json:"engine"`
		Role   string `json:"role"`
		Normal bool   `json:"normal"`
		View   uint64 `json:"view"`
	} `json:"groups"`
}

var probeClient = http.Client{Timeout: time.Second}

// probe reads n's /status and checks that the process answering is the one
// `up` started as n (its pid, node id, and for a group its replica and
// cluster ids): a port answered by anyone else says nothing about n.
func (u *upCluster) probe(n *upNode, pid int) (*nodeStatus, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+n.http+"/status", nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.id, err)
	}
	// A password (KEFIR_PASSWORD reaches the nodes through the environment)
	// guards the admin port too: HTTP basic auth, any user name.
	if pw := os.Getenv("KEFIR_PASSWORD"); pw != "" {
		req.SetBasicAuth("kefir", pw)
	}
	r, err := probeClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: admin port %s does not answer yet", n.id, n.http)
	}
	defer r.Body.Close()
	var st nodeStatus
	if err := json.NewDecoder(r.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("%s: admin port %s: %s /status: %w", n.id, n.http, r.Status, err)
	}
	if st.PID != pid || st.NodeID != n.id {
		return nil, fmt.Errorf("%s: admin port %s is answered by another process (node %q, pid %d), not by %s (pid %d)", n.id, n.http, st.NodeID, st.PID, n.id, pid)
	}
	if u.grp != nil {
		if st.Replication == nil || st.Replication.ReplicaID != n.replica || st.Replication.ClusterID != u.grp.clusterID {
			return nil, fmt.Errorf("%s: admin port %s answers for another group", n.id, n.http)
		}
	}
	return &st, nil
}

// settled reports whether every node answers as itself and, for a group,
// every node is in the same normal view and knows its leader, which leads:
// then a write sent to any node right away is served (or forwarded to the
// leader) instead of refused with "no leader". With several groups the
// same holds of each group's replicas (groupsSettled). Otherwise it says
// why not.
func (u *upCluster) settled() (bool, string) {
	var view, leader uint64
	var sts []*nodeStatus
	for i, n := range u.nodes {
		if n.joining && !u.recorded {
			// Not in the map yet (recordJoined, once the rest is up): it
			// waits to be named before it serves.
			sts = append(sts, &nodeStatus{})
			continue
		}
		st, err := u.probe(n, n.pid)
		if err != nil {
			return false, err.Error()
		}
		sts = append(sts, st)
		if u.grp == nil || len(st.Groups) > 0 || n.joining {
			// A joining node hosts nothing until the map names it
			// (recordJoined): answering as itself is all it can do.
			continue
		}
		rep := st.Replication
		if rep.Status != "normal" || rep.Leader == 0 {
			return false, fmt.Sprintf("%s is %s in view %d", n.id, st.Role, rep.View)
		}
		if u.grp.chain {
			// A chain member's view is its configuration epoch (the head's:
			// the one it became the head at), which joins move on one
			// member at a time: only the head must agree.
			rep.View = 0
		}
		if i == 0 {
			view, leader = rep.View, rep.Leader
		} else if rep.View != view || rep.Leader != leader {
			return false, fmt.Sprintf("%s is in view %d (leader n%d), n1 in view %d (leader n%d)", n.id, rep.View, rep.Leader, view, leader)
		}
		if rep.Leader == n.replica && st.Role != "leader" {
			return false, fmt.Sprintf("%s, the leader of view %d, is %s", n.id, view, st.Role)
		}
	}
	if u.grp != nil {
		return u.groupsSettled(sts)
	}
	return true, ""
}

// groupsSettled is settled's rule per group at nodes of several groups,
// whose replicas of different groups have their own views and leaders (a
// node's top-level view is one of its groups': comparing those across
// nodes that host different groups never agrees). For every group, each
// node hosting a replica of it is in a normal view and knows the leader,
// all of them the same view and leader (a chain's members only the head),
// and the leader's replica leads.
func (u *upCluster) groupsSettled(sts []*nodeStatus) (bool, string) {
	type seen struct {
		view, leader uint64
		at           string
	}
	first := map[uint64]seen{}
	for i, st := range sts {
		n := u.nodes[i]
		for _, g := range st.Groups {
			if g.Role == "" {
				continue // not hosted here
			}
			if !g.Normal || g.Leader == 0 {
				return false, fmt.Sprintf("%s's replica of group %d is %s in view %d", n.id, g.ID, g.Role, g.View)
			}
			if g.Engine == "chain" {
				g.View = 0 // as above: only the head must agree
			}
			f, ok := first[g.ID]
			if !ok {
				first[g.ID] = seen{g.View, g.Leader, n.id}
			} else if g.View != f.view || g.Leader != f.leader {
				return false, fmt.Sprintf("%s's replica of group %d is in view %d (leader n%d), %s's in view %d (leader n%d)", n.id, g.ID, g.View, g.Leader, f.at, f.view, f.leader)
			}
			if g.Leader == n.replica && g.Role != "leader" {
				return false, fmt.Sprintf("%s, the leader of group %d, is %s there", n.id, g.ID, g.Role)
			}
		}
	}
	return true, ""
}

// waitUp waits until the cluster is settled. A node that exits first fails
// the start (with the reason in its log above), as does a signal.
func (u *upCluster) waitUp(sigs chan os.Signal) error {
	deadline := time.NewTimer(upReadyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	why := "no node answers yet"
	var since time.Time // since when the cluster has been settled
	for {
		select {
		case ev := <-u.events:
			if ev.ready || ev.gen != ev.n.gen {
				continue
			}
			ev.n.running = false
			u.stopAll(sigs)
			return fmt.Errorf("%s exited before the cluster was up: %v (see its log above)", ev.n.id, ev.err)
		case sig := <-sigs:
			if sig == syscall.SIGUSR1 {
				continue
			}
			u.say("%v: stopping the cluster", sig)
			u.stopAll(sigs)
			return errInterrupted
		case <-deadline.C:
			u.stopAll(sigs)
			return fmt.Errorf("the cluster was not up within %v: %s (see the nodes' logs above)", upReadyTimeout, why)
		case <-tick.C:
			ok, w := u.settled()
			if !ok {
				why, since = w, time.Time{}
				continue
			}
			if since.IsZero() {
				since = time.Now()
			}
			if time.Since(since) >= settleFor {
				for _, n := range u.nodes {
					n.ready = true
				}
				return nil
			}
		}
	}
}

// watchReady reports when n's start number gen serves its admin port as
// itself, so that its next exit is not counted as a failed start.
func (u *upCluster) watchReady(n *upNode, gen, pid int, dead <-chan struct{}) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-dead:
			return
		case <-u.done:
			return
		case <-tick.C:
		}
		if _, err := u.probe(n, pid); err == nil {
			select {
			case u.events <- upEvent{n: n, gen: gen, ready: true}:
			case <-u.done:
			}
			return
		}
	}
}

// supervise runs the cluster until a signal stops it: it reports each node
// that exits and restarts it with backoff (see restartFirst), gives up on one
// that keeps failing at once, and restarts those on SIGUSR1.
func (u *upCluster) supervise(sigs chan os.Signal) error {
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGUSR1 {
				u.retryGivenUp()
				continue
			}
			u.say("%v: stopping the cluster", sig)
			u.stopAll(sigs)
			return nil
		case ev := <-u.events:
			n := ev.n
			if ev.gen != n.gen || !n.running {
				continue
			}
			if ev.ready {
				if !n.ready {
					n.ready = true
					u.say("%s is back (pid %d)", n.id, n.pid)
				}
				continue
			}
			u.exited(n, ev.err)
			if u.allDown() {
				return errors.New("every node has failed and none is restarted (see the logs above)")
			}
		case n := <-u.restartc:
			n.timer = nil
			if n.running || n.givenUp {
				continue
			}
			u.restart(n)
		}
	}
}

// exited handles the exit of n's process: report it, and restart n after a
// backoff or give up on it.
func (u *upCluster) exited(n *upNode, err error) {
	n.running = false
	up := time.Since(n.started)
	status := "exited"
	if err != nil {
		status = err.Error()
	}
	if n.ready {
		n.fails = 0
	} else {
		n.fails++
	}
	if up < quickExit {
		n.quick++
	} else {
		n.quick = 0
	}
	running := u.running()
	u.say("%s (pid %d) stopped after %v: %s; %d of %d nodes running", n.id, n.pid, up.Round(time.Millisecond), status, running, len(u.nodes))
	if u.grp != nil && running < len(u.nodes)/2+1 {
		u.say("WARNING: a majority of the group is down: writes and linearizable reads wait until enough nodes are back")
	}
	if rerr := server.CheckRetired(filepath.Join(u.dir, n.id)); errors.Is(rerr, server.ErrRetired) {
		// It left the group (and exited 0 on its own): starting it again
		// would only be refused.
		n.givenUp = true
		u.say("%s left the group: not restarting it (%v)", n.id, rerr)
		return
	}
	if n.fails >= maxFailedStarts {
		n.givenUp = true
		u.say("%s failed to start %d times in a row (it exited before it served): not restarting it again (its log above says why, e.g. a damaged %s). The other nodes keep running; fix it and send kill -USR1 %d to retry, or restart kefir up",
			n.id, n.fails, filepath.Join(u.dir, n.id), os.Getpid())
		return
	}
	delay := restartMax
	if n.quick < 8 {
		delay = min(restartFirst<<max(n.quick-1, 0), restartMax)
	}
	u.say("restarting %s in %v", n.id, delay)
	n.timer = time.AfterFunc(delay, func() { u.restartc <- n })
}

func (u *upCluster) restart(n *upNode) {
	if err := u.start(n); err != nil {
		// As if it had exited at once: the same backoff and limit.
		n.started, n.ready = time.Now(), false
		u.exited(n, err)
		return
	}
	u.say("%s restarted (pid %d)", n.id, n.pid)
	go u.watchReady(n, n.gen, n.pid, n.dead)
}

// retryGivenUp restarts the nodes `up` gave up on (SIGUSR1).
func (u *upCluster) retryGivenUp() {
	found := false
	for _, n := range u.nodes {
		if n.givenUp {
			found = true
			n.givenUp, n.fails, n.quick = false, 0, 0
			u.say("SIGUSR1: restarting %s", n.id)
			u.restart(n)
		}
	}
	if !found {
		u.say("SIGUSR1: no node to restart (every node runs or waits for its restart)")
	}
}

// running counts the nodes whose process runs.
func (u *upCluster) running() int {
	k := 0
	for _, n := range u.nodes {
		if n.running {
			k++
		}
	}
	return k
}

// allDown reports whether no node runs and none will be restarted.
func (u *upCluster) allDown() bool {
	for _, n := range u.nodes {
		if n.running || n.timer != nil {
			return false
		}
	}
	return true
}

// stopAll stops every running node with one SIGTERM each and waits for them;
// a node that does not stop within upStopTimeout, or every node on a second
// signal, is killed. Pending restarts are cancelled.
func (u *upCluster) stopAll(sigs chan os.Signal) {
	for _, n := range u.nodes {
		if n.timer != nil {
			n.timer.Stop()
			n.timer = nil
		}
		n.givenUp = true // no restart from here on
		if n.running {
			_ = n.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	killAll := func() {
		for _, n := range u.nodes {
			if n.running {
				_ = n.cmd.Process.Kill()
			}
		}
	}
	timeout := time.NewTimer(upStopTimeout)
	defer timeout.Stop()
	for {
		if u.running() == 0 {
			return
		}
		select {
		case ev := <-u.events:
			if !ev.ready && ev.gen == ev.n.gen {
				ev.n.running = false
			}
		case sig := <-sigs:
			if sig != syscall.SIGUSR1 {
				u.say("second signal: killing the nodes")
				killAll()
			}
		case <-timeout.C:
			for _, n := range u.nodes {
				if n.running {
					u.say("%s did not stop in %v; killing it", n.id, upStopTimeout)
				}
			}
			killAll()
		}
	}
}

func (u *upCluster) banner(stdout io.Writer) {
	u.outMu.Lock()
	defer u.outMu.Unlock()
	if u.grp != nil {
		how := "restarted from its data"
		if u.grp.bootstrap {
			how = "new group bootstrapped"
		}
		switch {
		case u.grp.chain:
			// The metadata group is the first three nodes, or one below three
			// (an odd size: cluster.MetaMembers). A restarted chain's head is
			// the member that held the longest history, not necessarily n1.
			meta, head := "n1-n3", "n1 the head"
			if len(u.nodes) < 3 {
				meta = "n1"
			}
			if !u.grp.bootstrap {
				head = "its head the member holding the longest history"
			}
			fmt.Fprintf(stdout, "\nKefir is up: a chain of %d nodes, %s (cluster %d, %s; its master runs at the metadata group on %s), data in %s\n", len(u.nodes), head, u.grp.clusterID, how, meta, u.dir)
			if u.stores != "" {
				fmt.Fprintf(stdout, "Datastores, head first: %s (docs/chain.md, \"Datastores\": what a crash of them loses)\n", u.stores)
			}
		case u.grp.groups > 1:
			fmt.Fprintf(stdout, "\nKefir is up: %d nodes hosting %d 3-replica groups on 16384 slots (cluster %d, %s), data in %s\n", len(u.nodes), u.grp.groups, u.grp.clusterID, how, u.dir)
			if u.grp.chainGroups != "" {
				fmt.Fprintf(stdout, "Chain groups (their masters at the metadata group on n1-n3): %s; the others VR\n", u.grp.chainGroups)
			}
		default:
			fmt.Fprintf(stdout, "\nKefir is up: a %d-replica group (cluster %d, %s), data in %s\n", len(u.nodes), u.grp.clusterID, how, u.dir)
		}
	} else {
		fmt.Fprintf(stdout, "\nKefir is up: 1 node, data in %s\n", u.dir)
	}
	for _, n := range u.nodes {
		fmt.Fprintf(stdout, "  %s  client (RESP) %s   admin http://%s/   peer %s   pid %d\n", n.id, n.client, n.http, n.peer, n.pid)
	}
	if len(u.joined) > 0 {
		fmt.Fprintf(stdout, "\nAdded to the cluster, hosting no replica yet: %s. Give them some with\n  kefir cluster add-group --addr %s --members A,B,C   (then kefir cluster rebalance --addr %s)\n(docs/cluster.md, \"Growing a cluster\").\n", strings.Join(u.joined, ", "), u.nodes[0].client, u.nodes[0].client)
	}
	if u.grp != nil && u.grp.groups > 1 {
		fmt.Fprintf(stdout, "\nRedis Cluster clients (redis-cli -c, go-redis ClusterClient, redis-py RedisCluster) take any node\nand follow -MOVED; plain clients are forwarded (docs/cluster.md).\n")
	}
	if u.grp != nil {
		fmt.Fprintf(stdout, "\nPoint redis-cli (or any Redis client) at ANY node: followers forward writes and\nlinearizable reads to the leader. The Go client takes all addresses and finds the leader.\n")
		fmt.Fprintf(stdout, "Try a failover: kill -9 a node's pid; the others keep serving and kefir up\nrestarts it (docs/operations.md, \"A node of kefir up\").\n")
	}
	host, port, _ := net.SplitHostPort(u.nodes[0].client)
	fmt.Fprintf(stdout, "\nTry:  redis-cli -h %s -p %s set hello world\n      redis-cli -h %s -p %s get hello\n      kefir get hello --addr %s\n\nCtrl-C stops the cluster.\n\n",
		host, port, host, port, u.nodes[0].client)
}

// checkPorts fails when a port of a node is taken, naming the port, the node
// it is for, and (where the system tells) the process that holds it.
func checkPorts(nodes []*upNode) error {
	for _, n := range nodes {
		for _, p := range [...]struct{ what, addr string }{{"client", n.client}, {"peer", n.peer}, {"admin", n.http}} {
			ln, err := net.Listen("tcp", p.addr)
			if err == nil {
				ln.Close()
				continue
			}
			holder := ""
			if h := portHolder(p.addr); h != "" {
				holder = " by " + h
			}
			return fmt.Errorf("%s's %s port %s is taken%s (%v): is another kefir up or kefir server running there? Stop it, or pick free ports with --base-port", n.id, p.what, p.addr, holder, errors.Unwrap(err))
		}
	}
	return nil
}

// upGroup is what the nodes of a local replica group share.
type upGroup struct {
	members   string // the founders' --members
	founders  int    // nodes n1..nFounders founded the cluster; later ones joined it
	clusterID uint64
	secret    string
	bootstrap bool
	groups    int  // replica groups on the nodes (1: the nodes are one group)
	chain     bool // the group is a chain (--engine chain)
	// chainGroups: with groups > 1, the chain groups' ids (--engine chain
	// or mixed), comma-separated.
	chainGroups string
}

// upLayout is what a cluster's first `kefir up` was asked for, kept in
// DIR/cluster.json: the founding nodes' flags (--members, --groups) are
// derived from it, and must stay the same at every restart (a node refuses
// a --members its data directory does not record).
type upLayout struct {
	Nodes  int    // --nodes of the first start: n1..nNodes found the cluster
	Groups int    // --groups
	Engine string // --engine
}

// prepareGroup returns the group settings for the cluster in dir, asked
// to run want.Nodes > 1 nodes (nil for one).
//
// Bootstrap is decided here, once for the whole group: only when NO node has a
// data directory yet is this the group's first start. If some node directories
// exist, every node starts without bootstrap; a node whose directory is missing
// (deleted by hand) then rejoins by VR recovery from the others instead of
// founding a second, empty group. The cluster id, the peer secret and the
// layout are drawn or taken at the first start and kept in DIR/cluster.json
// (mode 0600), so a restart of the same directory finds the same group.
//
// A cluster of several groups grows: asked for more nodes than it was
// founded with, the extra ones are new nodes (upGroup.founders says where
// they begin) that join the map empty. Anything else that differs from the
// layout is refused here, before a node starts and refuses its flags.
func prepareGroup(dir string, want upLayout, basePort int) (*upGroup, error) {
	if want.Nodes == 1 {
		return nil, nil
	}
	// The node directories there are (n1, n2, ...: nodeDir).
	fresh, highest := true, 0
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		if i, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "n")); err == nil && e.IsDir() && i > 0 && e.Name() == "n"+strconv.Itoa(i) {
			fresh, highest = false, max(highest, i)
		}
	}
	var saved struct {
		ClusterID uint64 `json:"cluster_id"`
		Secret    string `json:"cluster_secret"`
		Nodes     int    `json:"nodes,omitempty"`
		Groups    int    `json:"groups,omitempty"`
		Engine    string `json:"engine,omitempty"`
		// BasePort: the cluster's --base-port (0: written before it was
		// kept). A cluster of groups records its nodes' addresses in its
		// map (and a joined node in its join record), so it runs on the
		// ports it was founded on.
		BasePort int `json:"base_port,omitempty"`
	}
	path := filepath.Join(dir, "cluster.json")
	b, err := os.ReadFile(path)
	write := false
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &saved); err != nil || saved.ClusterID == 0 || saved.Secret == "" {
			return nil, fmt.Errorf("%s is corrupt (%v); remove %s to start a new cluster", path, err, dir)
		}
		if saved.Nodes == 0 {
			// Written before the layout was kept, when --nodes could not
			// change: one group's founders are the nodes asked for; a
			// cluster of groups' the nodes it has, so more are new ones.
			saved.Nodes, saved.Groups, saved.Engine = want.Nodes, want.Groups, want.Engine
			if want.Groups > 1 && highest > 0 {
				saved.Nodes = highest
			}
			write = true
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
		saved.Nodes, saved.Groups, saved.Engine = want.Nodes, want.Groups, want.Engine
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
		write = true
	default:
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	was := upLayout{saved.Nodes, saved.Groups, saved.Engine}
	if err := checkLayout(dir, was, want, highest); err != nil {
		return nil, err
	}
	switch {
	case saved.BasePort == 0:
		saved.BasePort, write = basePort, true
	case saved.BasePort != basePort && was.Groups > 1:
		return nil, fmt.Errorf("%s holds a cluster of groups on --base-port %d, not %d: its map records its nodes at their addresses; run kefir up --dir %s --base-port %d --nodes %d --groups %d",
			dir, saved.BasePort, basePort, dir, saved.BasePort, max(want.Nodes, highest), was.Groups)
	}
	if write {
		b, _ := json.Marshal(saved)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
	}
	var ms []server.Member
	for i := 1; i <= was.Nodes; i++ {
		ms = append(ms, server.Member{
			ID:         uint64(i),
			PeerAddr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(basePort+1000+i-1)),
			ClientAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(basePort+i-1)),
		})
	}
	return &upGroup{members: server.FormatMembers(ms), founders: was.Nodes,
		clusterID: saved.ClusterID, secret: saved.Secret, bootstrap: fresh}, nil
}

// checkLayout refuses a restart of the cluster in dir (founded as was, its
// node directories up to n<highest>) asked to run as want, unless want is
// the same cluster, or (several groups) the same with more nodes.
func checkLayout(dir string, was, want upLayout, highest int) error {
	again := fmt.Sprintf("kefir up --dir %s --nodes %d", dir, max(was.Nodes, highest))
	if was.Groups > 1 {
		again += fmt.Sprintf(" --groups %d", was.Groups)
	}
	if was.Engine != "" && was.Engine != "vr" {
		again += " --engine " + was.Engine
	}
	switch {
	case was.Groups != want.Groups:
		if was.Groups > 1 {
			return fmt.Errorf("%s holds a cluster started with --groups %d, not %d: a running cluster gains and loses groups with kefir cluster add-group and remove-group (docs/cluster.md); run %s", dir, was.Groups, want.Groups, again)
		}
		return fmt.Errorf("%s holds one replica group, started without --groups: a group does not become a cluster of several; run %s, or use another --dir", dir, again)
	case was.Engine != "" && was.Engine != want.Engine:
		return fmt.Errorf("%s holds a cluster started with --engine %s, not %s; run %s", dir, was.Engine, want.Engine, again)
	case want.Nodes < highest:
		return fmt.Errorf("%s has node directories up to n%d, so --nodes %d would leave nodes out (a node leaves the cluster with kefir cluster remove-node, docs/cluster.md); run %s", dir, highest, want.Nodes, again)
	case want.Nodes < was.Nodes:
		return fmt.Errorf("%s holds a cluster of %d nodes, not %d; run %s", dir, was.Nodes, want.Nodes, again)
	case want.Nodes > was.Nodes && was.Groups <= 1:
		return fmt.Errorf("%s holds one group of %d nodes: kefir up adds nodes only to a cluster of several groups (--groups); a group grows by kefir cluster add-members (docs/cluster.md, \"Growing a group\"); run %s", dir, was.Nodes, again)
	}
	return nil
}

func nodeDir(dir string, i int) string { return filepath.Join(dir, "n"+strconv.Itoa(i)) }

// parseChainStores reads --chain-stores: one store per node, in node order
// (nil when empty: every node the default, a log).
func parseChainStores(v string, nodes int, engine string) ([]vrshard.ChainStore, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	if engine != "chain" && engine != "mixed" {
		return nil, errors.New("--chain-stores needs --engine chain (or mixed)")
	}
	parts := strings.Split(v, ",")
	if len(parts) != nodes {
		return nil, fmt.Errorf("--chain-stores %q: %d stores for %d nodes (one per node, n1 first)", v, len(parts), nodes)
	}
	stores := make([]vrshard.ChainStore, len(parts))
	for i, p := range parts {
		st, err := vrshard.ParseChainStore(p)
		if err != nil {
			return nil, fmt.Errorf("--chain-stores: n%d: %w", i+1, err)
		}
		stores[i] = st
	}
	return stores, nil
}

// upChainLogMember is kefir server's --chain-log-member for kefir up's
// nodes, stores their --chain-stores: whether every chain the nodes' members
// run in has a log member by configuration. One chain of all the nodes: it
// has one if some node is a log. A cluster of several groups: the flag is
// the node's, for every chain group it hosts, and a chain group is three of
// the nodes (EvenGroups), later moved by placement (add-node, replace-node,
// add-group): a group of memory and buffered nodes only (m,m,m,d: group 1
// on n1-n3) must not be told it has one — its sync writes, the default,
// would fail forever with ErrNotDurable. So a cluster says so only when
// every node is a log (where the flag changes nothing); with a memory or
// buffered node its chain groups learn it from messages, as before.
func upChainLogMember(stores []vrshard.ChainStore, groups int) bool {
	if groups > 1 {
		return !slices.ContainsFunc(stores, func(s vrshard.ChainStore) bool { return s != vrshard.ChainLog })
	}
	return slices.Contains(stores, vrshard.ChainLog)
}

// upChainArgs are the nodes' flags of kefir up --engine chain: the chain's
// master is hosted by the metadata group on n1-n3 (kefir server --engine
// chain without --chain-master), so nothing runs beside the nodes. On an
// existing data directory every member comes back waiting to be joined and
// the master restarts the chain from the one holding the longest durable
// history (docs/chain.md, "Restarting a whole chain").
func upChainArgs(*upGroup) ([]string, error) {
	return []string{"--engine", "chain"}, nil
}
