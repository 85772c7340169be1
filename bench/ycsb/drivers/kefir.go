package drivers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kefirdb/kefir/bench/ycsb/core"
	"github.com/kefirdb/kefir/client"
)

// KefirConfig configures the Kefir driver. Zero levels mean the server's defaults.
type KefirConfig struct {
	Addrs       []string
	Password    string
	PoolSize    int
	Consistency client.Consistency
	Durability  client.Durability
	// RetryUnavailable lets calls retry through a leader change for up to this long
	// (client.WithRetryUnavailable), as an application would; the stall then shows as
	// latency. A write whose outcome the change left open still fails (and is counted).
	RetryUnavailable time.Duration
}

// Kefir is a driver whose clients share one client.Client (it pipelines concurrent
// calls over its connection pool).
type Kefir struct {
	c      *client.Client
	reads  []client.CallOption
	writes []client.CallOption
}

// NewKefir dials the cluster.
func NewKefir(ctx context.Context, cfg KefirConfig) (*Kefir, error) {
	opts := []client.Option{client.WithPoolSize(max(cfg.PoolSize, 1))}
	if cfg.RetryUnavailable > 0 {
		opts = append(opts, client.WithRetryUnavailable(cfg.RetryUnavailable))
	}
	if cfg.Password != "" {
		opts = append(opts, client.WithPassword(cfg.Password))
	}
	c, err := client.Dial(ctx, cfg.Addrs, opts...)
	if err != nil {
		return nil, fmt.Errorf("kefir %v: %w", cfg.Addrs, err)
	}
	k := &Kefir{c: c}
	if !cfg.Consistency.IsZero() {
		k.reads = append(k.reads, client.WithConsistency(cfg.Consistency))
	}
	if !cfg.Durability.IsZero() {
		k.writes = append(k.writes, client.WithDurability(cfg.Durability))
	}
	return k, nil
}

// NewDB implements core.NewDB.
func (k *Kefir) NewDB(int) (core.DB, error) { return kefirDB{k}, nil }

// Close closes the client.
func (k *Kefir) Close() error { return k.c.Close() }

type kefirDB struct{ k *Kefir }

func (d kefirDB) Read(ctx context.Context, key string) ([]byte, error) {
	v, err := d.k.c.Get(ctx, key, d.k.reads...)
	if errors.Is(err, client.ErrNotFound) {
		return nil, core.ErrNotFound
	}
	return v, err
}

func (d kefirDB) Update(ctx context.Context, key string, value []byte) error {
	return d.k.c.Put(ctx, key, value, d.k.writes...)
}

func (d kefirDB) Insert(ctx context.Context, key string, value []byte) error {
	return d.k.c.Put(ctx, key, value, d.k.writes...)
}

func (d kefirDB) Scan(ctx context.Context, start string, count int) (int, error) {
	kvs, err := d.k.c.Scan(ctx, start, "", count, d.k.reads...)
	return len(kvs), err
}

func (kefirDB) Close() error { return nil }
