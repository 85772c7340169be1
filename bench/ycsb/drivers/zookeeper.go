package drivers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/kefirdb/kefir/internal/ycsb"
)

// ZooKeeperConfig configures the ZooKeeper driver.
type ZooKeeperConfig struct {
	Servers []string
	// Root is the znode under which every record is a child znode (default /ycsb).
	Root string
	// Sessions is how many ZooKeeper sessions (TCP connections) the clients share; each
	// pipelines its callers' requests. Default 4.
	Sessions int
	// SyncReads issues sync(root) before every read, so a read sees every write
	// committed before it started (ZooKeeper's reads are otherwise served from the
	// local server's state: sequentially consistent, possibly stale). It costs a
	// round trip to the leader per read, like Kefir's linearizable level.
	SyncReads bool
}

// ZooKeeper is a driver over go-zookeeper/zk. A record is a znode ROOT/KEY holding the
// value: read = getData, update = setData with version -1 (unconditional), insert =
// create (falling back to setData when the znode exists, so a re-run's inserts
// overwrite like every other system's). Every write is a quorum commit; whether the
// servers fsync before acknowledging is the ensemble's forceSync setting
// (bench/peers/zookeeper.sh), not the client's. Scans are not supported: ZooKeeper has
// no ordered range read (getChildren returns all of a znode's children, unordered),
// so workload E is reported as unsupported rather than emulated.
type ZooKeeper struct {
	conns []*zk.Conn
	root  string
	cfg   ZooKeeperConfig
}

// ErrScanUnsupported is what a driver's Scan returns when the system has no range read.
var ErrScanUnsupported = errors.New("scan not supported by this system")

// silent drops go-zookeeper's log lines (it logs every connect and state change).
type silent struct{}

func (silent) Printf(string, ...any) {}

// NewZooKeeper opens the sessions, checks the ensemble answers and creates the root.
func NewZooKeeper(ctx context.Context, cfg ZooKeeperConfig) (*ZooKeeper, error) {
	if cfg.Root == "" {
		cfg.Root = "/ycsb"
	}
	if !strings.HasPrefix(cfg.Root, "/") || strings.HasSuffix(cfg.Root, "/") {
		return nil, fmt.Errorf("zookeeper root %q: want an absolute path without a trailing slash", cfg.Root)
	}
	n := cfg.Sessions
	if n <= 0 {
		n = 4
	}
	z := &ZooKeeper{root: cfg.Root, cfg: cfg}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for range n {
		c, _, err := zk.Connect(cfg.Servers, 10*time.Second, zk.WithLogger(silent{}), zk.WithLogInfo(false))
		if err != nil {
			z.Close()
			return nil, fmt.Errorf("zookeeper %v: %w", cfg.Servers, err)
		}
		z.conns = append(z.conns, c)
		// go-zookeeper connects in the background and fails calls queued before a
		// session exists; its calls take no context. Wait for the session here, so a
		// starting ensemble is waited for and an absent one fails at ctx's deadline.
		if err := awaitSession(ctx, c); err != nil {
			z.Close()
			return nil, fmt.Errorf("zookeeper %v: %w", cfg.Servers, err)
		}
	}
	if _, err := z.conns[0].Create(cfg.Root, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		z.Close()
		return nil, fmt.Errorf("zookeeper %v: create %s: %w", cfg.Servers, cfg.Root, err)
	}
	return z, nil
}

// awaitSession polls the connection's state: a server that is still starting refuses
// sessions (go-zookeeper then reports an expiry and retries), so the events on the
// way are no verdict; only ctx's deadline is.
func awaitSession(ctx context.Context, c *zk.Conn) error {
	for c.State() != zk.StateHasSession {
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("no session (state %v): %w", c.State(), ctx.Err())
		}
	}
	return nil
}

// NewDB implements ycsb.NewDB: client i uses session i mod Sessions.
func (z *ZooKeeper) NewDB(i int) (ycsb.DB, error) {
	return zkDB{z: z, c: z.conns[i%len(z.conns)]}, nil
}

// Close closes every session.
func (z *ZooKeeper) Close() error {
	for _, c := range z.conns {
		c.Close()
	}
	return nil
}

// DeleteAll removes every record (before a load phase), in multi-op batches.
func (z *ZooKeeper) DeleteAll(context.Context) error {
	c := z.conns[0]
	kids, _, err := c.Children(z.root)
	if err != nil {
		return fmt.Errorf("zookeeper: list %s: %w", z.root, err)
	}
	const batch = 500 // a multi is one request: keep it well under jute.maxbuffer
	for i := 0; i < len(kids); i += batch {
		var ops []any
		for _, k := range kids[i:min(i+batch, len(kids))] {
			ops = append(ops, &zk.DeleteRequest{Path: z.root + "/" + k, Version: -1})
		}
		if _, err := c.Multi(ops...); err != nil {
			return fmt.Errorf("zookeeper: delete under %s: %w", z.root, err)
		}
	}
	return nil
}

type zkDB struct {
	z *ZooKeeper
	c *zk.Conn
}

func (d zkDB) path(key string) string { return d.z.root + "/" + key }

func (d zkDB) Read(_ context.Context, key string) ([]byte, error) {
	if d.z.cfg.SyncReads {
		if _, err := d.c.Sync(d.z.root); err != nil {
			return nil, fmt.Errorf("sync: %w", err)
		}
	}
	v, _, err := d.c.Get(d.path(key))
	if errors.Is(err, zk.ErrNoNode) {
		return nil, ycsb.ErrNotFound
	}
	return v, err
}

func (d zkDB) Update(_ context.Context, key string, value []byte) error {
	_, err := d.c.Set(d.path(key), value, -1)
	if errors.Is(err, zk.ErrNoNode) {
		return ycsb.ErrNotFound
	}
	return err
}

func (d zkDB) Insert(_ context.Context, key string, value []byte) error {
	_, err := d.c.Create(d.path(key), value, 0, zk.WorldACL(zk.PermAll))
	if errors.Is(err, zk.ErrNodeExists) {
		_, err = d.c.Set(d.path(key), value, -1)
	}
	return err
}

func (zkDB) Scan(context.Context, string, int) (int, error) { return 0, ErrScanUnsupported }

func (zkDB) Close() error { return nil }
