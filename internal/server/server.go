// Package server is the Kefir node process: it opens the storage engine and the
// shard, and runs the node's front doors — the RESP client port, the peer port and
// the HTTP admin port — with their limits, authentication, metrics, structured logs
// and graceful shutdown.
//
// The RESP front door executes every command already buffered on a connection before
// it answers: pipelined writes are applied as one batch, made durable with one fsync,
// and answered with one write system call.
//
// A node is either a single-node shard (no --members) or one replica of a
// group, opened by the engine the binary wires in (Config.OpenReplica;
// kefir server: internal/vrshard, VR). A replica's peer port is served by the
// node's peer transport; the router (internal/cluster) says where the
// group's leader is, and a follower forwards the writes and strong reads it
// cannot serve there, or answers -MOVED when the request asked for
// redirects.
//
// It must not import cmd/kefir or the client package; commands are classified only
// by internal/command, and state is reached only through the shard.Replica
// interface and the replica's cluster.Group. It imports no replication engine
// or protocol core (internal/purity's TestFrontDoorImportsNoEngine).
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/transport"
)

// Version is the node's version string (set by the linker in releases).
var Version = "0.1.0-dev"

var pid = os.Getpid()

// Server is one node.
type Server struct {
	cfg Config
	// txPushStop ends the push sweep of cross-group transactions (xgtx.go).
	txPushStop context.CancelFunc
	log        *slog.Logger
	db         *storage.DB
	// emptyDB is db at a node that started with no group (openGroups: an
	// empty engine in memory), closed at Shutdown.
	emptyDB *storage.DB
	// emptiedByRemoval: a group of this node was removed from the map
	// and that left it with no data group (noteEmpty, or openGroups found
	// such a record), so it stays up, empty, also once its metadata
	// replica retires (retireMeta). Set by openGroups before the groups'
	// watcher starts, then only by the watcher.
	emptiedByRemoval bool
	// scripts is the node's script cache (SCRIPT LOAD, EVALSHA: script.go).
	scripts scriptCache
	// shard is reached only through the Replica interface, so a replicated shard
	// replaces the single-node one without changes here.
	shard shard.Replica
	// reads are the shard's read paths besides Read, asked once (setShard)
	// rather than per read: ReadKey for a single node's GET, ReadDeferred
	// for a replica that can hold a read's reply, TryRead for one that can
	// serve a read without waiting, on an event loop. inlineReads counts the
	// reads served so, and the KEFIR.TX commands a loop serves (txInline;
	// tests).
	reads       shard.ReadPaths
	inlineReads atomic.Uint64
	// fields is the shard's one-field HGET path where it has one and
	// reads.Key says key reads pay (fieldReader); nil otherwise.
	fields fieldReader
	// grp is the replication side of the replica when the node is a member
	// of a replicated group; nil on a single node. router says where the
	// group's leader is and forwards what a follower cannot serve there.
	grp    cluster.Group
	router *cluster.Router
	// multi is the node's replicas of several groups on a slot map
	// (Config.Groups; nil otherwise): shard and grp are it. clusterOn is
	// multi != nil, read per command (CROSSSLOT).
	multi     *cluster.Multi
	clusterOn bool
	m         *metrics
	limiter   *authLimiter
	// fsyncs times every fsync of the engine's log and the replication log;
	// it exists before either is opened, which is when they take its observers.
	fsyncs  *prometheus.HistogramVec
	started time.Time

	// lock is held on the data directory from New to the end of Shutdown
	// (nil with Config.FS, an in-memory file system).
	lock *DirLock

	clientLn net.Listener
	peerLn   net.Listener
	// peerTr is the node's peer transport (replicated nodes): the replica
	// of each group this node hosts has an endpoint on it.
	peerTr  *transport.Transport
	httpLn  net.Listener
	httpSrv *http.Server

	mu     sync.Mutex
	conns  map[*conn]struct{}
	nextID atomic.Int64
	// closing is set once shutdown starts: connections stop reading new commands
	// after their current batch.
	closing atomic.Bool
	connWG  sync.WaitGroup
	// panics counts connections that ended in a recovered panic (always a bug;
	// the fuzz test asserts it stays zero).
	panics atomic.Int64
	done   chan struct{}
	// stopping ends when shutdown starts: what a connection holds open
	// waiting (a map poll) answers then rather than delaying the shutdown.
	stopping context.Context
	stop     context.CancelFunc
	// expiry is the active expiry cycle (expiry.go; nil: off).
	expiry *activeExpiry
	// metaStop stops the metadata group's follower (meta.go; nil: none).
	metaStop func()
	// mem is the group's membership as this node follows it
	// (membership.go; nil: a node that does not reconfigure).
	mem *memberState
	// groups is a node of several groups' membership (groupmembers.go;
	// nil otherwise).
	groups *groupsState
}

// New validates cfg, locks the data directory (LockDataDir) and opens the
// node's storage. Start opens the ports; Shutdown releases the lock.
func New(cfg Config) (_ *Server, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.IOModel != "" {
		SetIOModel(cfg.IOModel)
	}
	setIOLoops(cfg.IOLoops)
	setLoopSpin(cfg.effectiveLoopSpin())
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger.With("node", cfg.NodeID),
		conns:   make(map[*conn]struct{}),
		limiter: newAuthLimiter(),
		done:    make(chan struct{}),
		fsyncs:  newFsyncHistogram(),
	}
	s.stopping, s.stop = context.WithCancel(context.Background())
	if cfg.FS == nil {
		if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("server: create data dir: %w", err)
		}
		// Before anything in the directory is read: a second node on it must
		// fail here, not after recovering it as if this one had crashed.
		if s.lock, err = LockDataDir(cfg.DataDir); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				_ = s.lock.Unlock()
			}
		}()
	}
	if cfg.Replicated() {
		h, err := s.openReplica()
		if err != nil {
			return nil, err
		}
		s.grp, s.db, s.peerTr = h.Group, h.Engine, h.Transport
		s.clusterOn = s.multi != nil
		s.setShard(h.Replica)
		s.newRouter()
		if s.multi != nil {
			// Keyspace scans read the groups this node cannot serve at
			// their leaders, over the router's connections (scanacross.go).
			s.multi.SetGroupScanAsker(s.router)
		}
		s.initMembership()
		s.m = newMetrics(s)
		return s, nil
	}
	s.newRouter()
	if cfg.FS == nil {
		if err := checkMode(cfg.DataDir, false); err != nil {
			return nil, err
		}
	}
	opts := s.storageOptions()
	opts.Devices = []storage.Device{{Dir: filepath.Join(cfg.DataDir, "storage")}}
	opts.FS = cfg.diskFS()
	opts.Logger = s.log.With("component", "storage")
	db, err := storage.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("server: open storage in %s: %w", cfg.DataDir, err)
	}
	s.db = db
	sh, err := shard.Open(db, shard.Options{
		Durability:            cfg.Durability,
		NoReadDurabilityCheck: false,
		ClientTTL:             cfg.ClientTTL,
		Logger:                s.log.With("component", "shard"),
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("server: open shard: %w", err)
	}
	s.setShard(sh)
	s.m = newMetrics(s)
	return s, nil
}

// setShard makes sh the node's shard and asks its read paths.
func (s *Server) setShard(sh shard.Replica) {
	s.shard = sh
	s.reads = sh.ReadPaths()
	s.fields = nil
	if fr, ok := sh.(fieldReader); ok && s.reads.Key {
		s.fields = fr
	}
}

// newRouter makes the node's router: its group's members and, on a replica,
// the replica that knows the leader.
func (s *Server) newRouter() {
	s.router = cluster.NewRouter(cluster.RouterConfig{
		Members: s.cfg.Members, Local: s.grp,
		Password: s.cfg.Password, TLSCert: s.cfg.TLSCert, TLSKey: s.cfg.TLSKey,
		Stopping: s.draining, // a shutdown does not wait out a forward's retries
	})
}

// Start opens the client, peer and HTTP ports and serves them in the background.
func (s *Server) Start() error {
	s.started = time.Now()
	ln, err := net.Listen("tcp", s.cfg.ClientAddr)
	if err != nil {
		return fmt.Errorf("server: client port: %w", err)
	}
	if s.cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(s.cfg.TLSCert, s.cfg.TLSKey)
		if err != nil {
			ln.Close()
			return fmt.Errorf("server: load TLS key pair: %w", err)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}
	s.clientLn = ln
	if s.cfg.PeerAddr != "" {
		if s.peerLn, err = net.Listen("tcp", s.cfg.PeerAddr); err != nil {
			s.clientLn.Close()
			return fmt.Errorf("server: peer port: %w", err)
		}
		go s.servePeers()
	}
	if s.cfg.HTTPAddr != "" {
		if s.httpLn, err = net.Listen("tcp", s.cfg.HTTPAddr); err != nil {
			s.clientLn.Close()
			if s.peerLn != nil {
				s.peerLn.Close()
			}
			return fmt.Errorf("server: http port: %w", err)
		}
		s.httpSrv = &http.Server{Handler: s.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := s.httpSrv.Serve(s.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("http admin stopped", "err", err)
			}
		}()
	}
	go s.acceptClients()
	s.startActiveExpiry()
	s.startMetaFollower()
	s.startMemberWatch()
	s.startGroupsWatch()
	txCtx, txStop := context.WithCancel(context.Background())
	s.txPushStop = txStop
	s.startTxPush(txCtx)
	s.log.Info("node started", "client", s.ClientAddr().String(), "peer", addrString(s.peerLn),
		"http", addrString(s.httpLn), "data", s.cfg.DataDir, "tls", s.cfg.TLSCert != "",
		"auth", s.cfg.Password != "", "durability", s.cfg.Durability.String(),
		"consistency", s.cfg.Consistency.String(), "role", s.roleName())
	if s.grp != nil {
		s.log.Info("replica of a group", "replica_id", s.cfg.ReplicaID, "cluster_id", s.cfg.ClusterID,
			"members", FormatMembers(s.cfg.Members), "bootstrap", s.cfg.Bootstrap)
	}
	return nil
}

func addrString(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// ClientAddr is the RESP port's bound address.
func (s *Server) ClientAddr() net.Addr { return s.clientLn.Addr() }

// HTTPAddr is the admin port's bound address, or nil.
func (s *Server) HTTPAddr() net.Addr {
	if s.httpLn == nil {
		return nil
	}
	return s.httpLn.Addr()
}

// PeerAddr is the peer port's bound address, or nil.
func (s *Server) PeerAddr() net.Addr {
	if s.peerLn == nil {
		return nil
	}
	return s.peerLn.Addr()
}

func portOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	_, p, _ := net.SplitHostPort(a.String())
	return p
}

func (s *Server) draining() bool { return s.closing.Load() }

func (s *Server) acceptClients() {
	var delay time.Duration
	for {
		nc, err := s.clientLn.Accept()
		if err != nil {
			if s.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failures (EMFILE): back off instead of spinning.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed", "err", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		s.m.total.Add(1)
		s.m.connsTotal.Inc()
		if int(s.m.connected.Load()) >= s.cfg.MaxClients {
			s.m.rejected.Inc()
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = nc.Write([]byte("-ERR max number of clients reached\r\n"))
			nc.Close()
			continue
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		c := s.newConn(nc, s.nextID.Add(1))
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.connWG.Add(1)
		s.mu.Unlock()
		s.m.connected.Add(1)
		s.m.conns.Inc()
		go func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				s.m.connected.Add(-1)
				s.m.conns.Dec()
				s.connWG.Done()
			}()
			c.serve()
			c.releaseBuffers()
		}()
	}
}

// Shutdown stops accepting, lets connections finish the commands they are
// executing (their replies are sent), syncs and closes storage. If ctx ends first,
// remaining connections are cut and Shutdown still syncs and closes.
func (s *Server) Shutdown(ctx context.Context) error {
	if !s.closing.CompareAndSwap(false, true) {
		<-s.done
		return nil
	}
	defer close(s.done)
	if s.stop != nil { // nil for a Server a test built by hand
		s.stop()
	}
	s.log.Info("shutting down: no new connections")
	if s.clientLn != nil { // nil if Start failed or never ran
		s.clientLn.Close()
	}
	if s.peerLn != nil {
		s.peerLn.Close()
	}
	// Wake connections blocked reading so they see closing; ones mid-command finish
	// it, release their replies, and exit.
	s.mu.Lock()
	for c := range s.conns {
		_ = c.nc.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	finished := make(chan struct{})
	go func() { s.connWG.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
		s.log.Warn("shutdown deadline: closing remaining connections")
		s.mu.Lock()
		for c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		<-finished
	}
	if s.httpSrv != nil {
		hctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.httpSrv.Shutdown(hctx)
		cancel()
	}
	s.stopActiveExpiry()
	s.stopMetaFollower()
	if s.txPushStop != nil {
		s.txPushStop()
	}
	s.stopMemberWatch()
	s.stopGroupsWatch()
	var errs []error
	if err := s.shard.Close(); err != nil {
		errs = append(errs, err)
	}
	s.closeRetiredGroups()
	if s.peerTr != nil { // after the replica, which sends on it until it stops
		s.peerTr.Close()
	}
	s.router.Close()
	if s.grp == nil { // the replica closed its own engine
		if err := s.db.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close storage: %w", err))
		}
	}
	if s.emptyDB != nil {
		if err := s.emptyDB.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close the empty node's engine: %w", err))
		}
	}
	// Last: the directory is free for another node only once nothing writes it.
	if err := s.lock.Unlock(); err != nil {
		errs = append(errs, fmt.Errorf("release data dir lock: %w", err))
	}
	if len(errs) > 0 {
		err := errors.Join(errs...)
		s.log.Error("shutdown finished with errors", "err", err)
		return err
	}
	s.log.Info("shutdown complete: storage synced and closed")
	return nil
}

// Close is Shutdown with the configured timeout.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	return s.Shutdown(ctx)
}

// authLimiter slows down password guessing: after failures from a host, further
// attempts from it are refused for a window that doubles with each failure (capped)
// — on the RESP port only on connections that have failed themselves
// (checkAuth), so the user who knows the password is not locked out with the
// guesser.
// It keys by host, so every process on one machine shares a record: a success
// clears it, and a record with no failure for authForget is forgotten, so a few
// typos by one local user do not keep locking out the others.
type authLimiter struct {
	mu    sync.Mutex
	hosts map[string]*authState
	// max bounds hosts; swept is when fail last scanned for forgotten records.
	max   int
	swept time.Time
	now   func() time.Time // time.Now; tests move it
}

type authState struct {
	fails int
	last  time.Time // the latest failure
	until time.Time // attempts before this are refused
}

const (
	// authForget is how long a host's failures are remembered: longer than the
	// longest penalty (10s), so a guesser cannot wait the penalty out and
	// start again with free attempts.
	authForget = time.Minute
	// authMaxHosts bounds the records under a spray of source addresses.
	authMaxHosts = 10000
)

func newAuthLimiter() *authLimiter {
	return &authLimiter{hosts: make(map[string]*authState), max: authMaxHosts, now: time.Now}
}

func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

func (st *authState) forgotten(now time.Time) bool { return now.Sub(st.last) >= authForget }

// allow reports whether addr may try a password now.
func (l *authLimiter) allow(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.hosts[hostOf(addr)]
	return st == nil || !l.now().Before(st.until)
}

// succeed forgets addr's host's failures: whoever there knows the password,
// and the next typo starts from the free attempts again.
func (l *authLimiter) succeed(addr string) {
	h := hostOf(addr)
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.hosts, h)
}

// fail records a failure: the first few are free (typos), then the host waits
// 100ms, 200ms, ... up to 10s between attempts.
func (l *authLimiter) fail(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	h := hostOf(addr)
	st := l.hosts[h]
	if st == nil || st.forgotten(now) {
		if st == nil && len(l.hosts) >= l.max {
			l.makeRoom(now)
		}
		st = &authState{}
		l.hosts[h] = st
	}
	st.fails++
	st.last = now
	if st.fails > 3 {
		d := min(100*time.Millisecond<<min(st.fails-4, 10), 10*time.Second)
		st.until = now.Add(d)
	}
}

// makeRoom frees one record or more. Forgotten records go first; the scan
// runs at most once a second so a spray of new addresses does not make every
// failure walk the whole map. If none is forgotten, one record is evicted,
// preferably one not serving a penalty, so a spray can at worst reset some
// hosts' free attempts but rarely lift a running penalty.
func (l *authLimiter) makeRoom(now time.Time) {
	if now.Sub(l.swept) >= time.Second {
		l.swept = now
		for h, st := range l.hosts {
			if st.forgotten(now) {
				delete(l.hosts, h)
			}
		}
		if len(l.hosts) < l.max {
			return
		}
	}
	victim, probes := "", 0
	for h, st := range l.hosts { // map order is randomized
		idle := !now.Before(st.until)
		if victim == "" || idle {
			victim = h
		}
		probes++
		if idle || probes == 16 {
			break
		}
	}
	delete(l.hosts, victim)
}
