// Package kefirdb is the YCSB runner's driver for Kefir: one client.Client shared by
// every YCSB client, with the consistency and durability of every call as parameters.
// `kefir bench` and the comparison harness (bench/ycsb) both use it, so the figures
// they print come from the same calls. It is apart from package ycsb because that
// package must not depend on the system it measures.
package kefirdb

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/ycsb"
)

// Config configures the driver. Zero levels mean the server's defaults.
type Config struct {
	Addrs    []string
	Password string
	// TLS, if set, connects with TLS.
	TLS         *tls.Config
	PoolSize    int
	Consistency client.Consistency
	Durability  client.Durability
	// RetryUnavailable lets calls retry through a leader change for up to this long
	// (client.WithRetryUnavailable), as an application would; the stall then shows as
	// latency. A write whose outcome the change left open still fails (and is counted).
	RetryUnavailable time.Duration
	// Cluster: "on" or "off" routes calls by slot or not whatever the
	// nodes are (client.WithCluster); "" (auto): by slot against a cluster
	// of several groups, as the client does by default.
	Cluster string
	// ChainReads spreads strong reads over every address too
	// (client.WithChainReads): a chain group's members.
	ChainReads bool
}

// Driver is a driver whose clients share one client.Client (it pipelines concurrent
// calls over its connection pool).
type Driver struct {
	c      *client.Client
	reads  []client.CallOption
	writes []client.CallOption
}

// New dials the cluster.
func New(ctx context.Context, cfg Config) (*Driver, error) {
	opts := []client.Option{client.WithPoolSize(max(cfg.PoolSize, 1))}
	if cfg.RetryUnavailable > 0 {
		opts = append(opts, client.WithRetryUnavailable(cfg.RetryUnavailable))
	}
	if cfg.ChainReads {
		opts = append(opts, client.WithChainReads(true))
	}
	if cfg.Password != "" {
		opts = append(opts, client.WithPassword(cfg.Password))
	}
	if cfg.TLS != nil {
		opts = append(opts, client.WithTLS(cfg.TLS))
	}
	switch cfg.Cluster {
	case "", "auto":
	case "on", "off":
		opts = append(opts, client.WithCluster(cfg.Cluster == "on"))
	default:
		return nil, fmt.Errorf("kefir: cluster routing %q: want auto, on or off", cfg.Cluster)
	}
	c, err := client.Dial(ctx, cfg.Addrs, opts...)
	if err != nil {
		return nil, fmt.Errorf("kefir %v: %w", cfg.Addrs, err)
	}
	k := &Driver{c: c}
	if !cfg.Consistency.IsZero() {
		k.reads = append(k.reads, client.WithConsistency(cfg.Consistency))
	}
	if !cfg.Durability.IsZero() {
		k.writes = append(k.writes, client.WithDurability(cfg.Durability))
	}
	return k, nil
}

// NewDB implements ycsb.NewDB. Each YCSB client is one goroutine, so its handle owns
// a ScanBuffer its scans reuse (client.ScanInto), as an application reading ranges in
// a loop would.
func (k *Driver) NewDB(int) (ycsb.DB, error) { return &kefirDB{k: k}, nil }

// Close closes the client.
func (k *Driver) Close() error { return k.c.Close() }

type kefirDB struct {
	k    *Driver
	scan client.ScanBuffer
}

func (d *kefirDB) Read(ctx context.Context, key string) ([]byte, error) {
	v, err := d.k.c.Get(ctx, key, d.k.reads...)
	if errors.Is(err, client.ErrNotFound) {
		return nil, ycsb.ErrNotFound
	}
	return v, err
}

func (d *kefirDB) Update(ctx context.Context, key string, value []byte) error {
	return d.k.c.Put(ctx, key, value, d.k.writes...)
}

func (d *kefirDB) Insert(ctx context.Context, key string, value []byte) error {
	return d.k.c.Put(ctx, key, value, d.k.writes...)
}

func (d *kefirDB) Scan(ctx context.Context, start string, count int) (int, error) {
	kvs, err := d.k.c.ScanInto(ctx, &d.scan, start, "", count, d.k.reads...)
	return len(kvs), err
}

func (*kefirDB) Close() error { return nil }
