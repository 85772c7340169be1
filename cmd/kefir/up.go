package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// runUp starts a local cluster: each node is a child `kefir server` process on
// loopback, in its own process group so that Ctrl-C reaches only `up`, which then
// stops the nodes with one SIGTERM each (a second signal to a node forces it).
func runUp(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kefir up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodes := fs.Int("nodes", 1, "number of nodes (1 until replication lands; then the default becomes 3)")
	dir := fs.String("dir", "kefir-data", "data directory; node i keeps its data in DIR/n<i>")
	basePort := fs.Int("base-port", 6380, "client port of node 1; node i uses base+i-1, its peer port base+1000+i-1, its HTTP port base+2000+i-1")
	durability := fs.String("durability", "sync", "default write durability of the nodes: sync, cad or async")
	logLevel := fs.String("log-level", "info", "log level of the nodes")
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
	if *nodes != 1 {
		return usageError{fmt.Errorf("--nodes %d: this build runs single-node shards only (replication is not in yet); use --nodes 1", *nodes)}
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
		c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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
	outMu.Lock()
	fmt.Fprintf(stdout, "\nKefir is up: %d node(s), data in %s\n", len(children), *dir)
	for _, c := range children {
		fmt.Fprintf(stdout, "  %s  client (RESP) %s   admin http://%s/   peer %s\n", c.id, c.client, c.http, c.peer)
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
			if string(buf[:n]) == "+PONG\r\n" {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no PONG from %s within %v", addr, timeout)
}
