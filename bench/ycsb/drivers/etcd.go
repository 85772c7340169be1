package drivers

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kefirdb/kefir/internal/ycsb"
)

// EtcdConfig configures the etcd driver.
type EtcdConfig struct {
	Endpoints []string
	// Serializable makes reads serializable (served by any member from its local state,
	// possibly stale) instead of etcd's default linearizable reads (a ReadIndex round
	// through the leader) — the etcd counterpart of Kefir's weaker consistency levels.
	Serializable bool
}

// Etcd is a driver whose clients share one clientv3.Client (one gRPC connection,
// multiplexed). Writes are etcd Puts: acknowledged once committed by a majority, each
// member having fsynced its WAL — the counterpart of Kefir's sync durability.
type Etcd struct {
	c     *clientv3.Client
	reads []clientv3.OpOption
}

// NewEtcd connects to the cluster and checks it answers.
func NewEtcd(ctx context.Context, cfg EtcdConfig) (*Etcd, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", cfg.Endpoints, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Get(ctx, "ycsb-ping"); err != nil {
		c.Close()
		return nil, fmt.Errorf("etcd %v: %w", cfg.Endpoints, err)
	}
	e := &Etcd{c: c}
	if cfg.Serializable {
		e.reads = append(e.reads, clientv3.WithSerializable())
	}
	return e, nil
}

// NewDB implements ycsb.NewDB.
func (e *Etcd) NewDB(int) (ycsb.DB, error) { return etcdDB{e}, nil }

// Close closes the client.
func (e *Etcd) Close() error { return e.c.Close() }

// DeleteAll removes every key (before a load phase).
func (e *Etcd) DeleteAll(ctx context.Context) error {
	_, err := e.c.Delete(ctx, "\x00", clientv3.WithFromKey())
	return err
}

type etcdDB struct{ e *Etcd }

func (d etcdDB) Read(ctx context.Context, key string) ([]byte, error) {
	resp, err := d.e.c.Get(ctx, key, d.e.reads...)
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, ycsb.ErrNotFound
	}
	return resp.Kvs[0].Value, nil
}

func (d etcdDB) Update(ctx context.Context, key string, value []byte) error {
	_, err := d.e.c.Put(ctx, key, string(value))
	return err
}

func (d etcdDB) Insert(ctx context.Context, key string, value []byte) error {
	return d.Update(ctx, key, value)
}

func (d etcdDB) Scan(ctx context.Context, start string, count int) (int, error) {
	opts := append([]clientv3.OpOption{clientv3.WithFromKey(), clientv3.WithLimit(int64(count))}, d.e.reads...)
	resp, err := d.e.c.Get(ctx, start, opts...)
	if err != nil {
		return 0, err
	}
	return len(resp.Kvs), nil
}

func (etcdDB) Close() error { return nil }
