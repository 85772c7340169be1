package drivers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kefirdb/kefir/internal/ycsb"
)

// RedisConfig configures the Redis driver.
type RedisConfig struct {
	Addr     string
	Password string
	// PoolSize is the connection pool size; set it to the client count so no client
	// waits for a connection.
	PoolSize int
	// Index maintains a sorted set of all keys so Scan can read key ranges (Redis has no
	// ordered key space). Turn it on only for workloads that scan: it costs inserts a
	// second command (pipelined in the same round trip).
	Index bool
	// WaitReplicas > 0 follows every write with WAIT <n> <WaitTimeout>, for the
	// "primary with replicas" comparison (durability by replication, like Kefir's cad).
	WaitReplicas int
	WaitTimeout  time.Duration
}

// indexKey is the sorted set the driver keeps for scans: every member has score 0, so
// ZRANGE ... BYLEX walks keys in byte order, which is what a range scan means.
const indexKey = "ycsb:index"

// Redis is a driver whose clients share one go-redis pool.
type Redis struct {
	c   *redis.Client
	cfg RedisConfig
}

// NewRedis connects to a Redis-protocol server and checks it answers PING.
func NewRedis(ctx context.Context, cfg RedisConfig) (*Redis, error) {
	c := redis.NewClient(&redis.Options{
		Addr:            cfg.Addr,
		Password:        cfg.Password,
		PoolSize:        max(cfg.PoolSize, 1),
		MinIdleConns:    max(cfg.PoolSize, 1),
		Protocol:        2,
		DisableIdentity: true, // no CLIENT SETINFO: keep the connection handshake minimal
		ReadTimeout:     10 * time.Second,
		WriteTimeout:    10 * time.Second,
	})
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis %s: %w", cfg.Addr, err)
	}
	return &Redis{c: c, cfg: cfg}, nil
}

// NewDB implements ycsb.NewDB: every client shares the pool.
func (r *Redis) NewDB(int) (ycsb.DB, error) { return redisDB{r}, nil }

// Close closes the pool.
func (r *Redis) Close() error { return r.c.Close() }

// FlushAll empties the server (before a load phase).
func (r *Redis) FlushAll(ctx context.Context) error { return r.c.FlushAll(ctx).Err() }

type redisDB struct{ r *Redis }

func (d redisDB) Read(ctx context.Context, key string) ([]byte, error) {
	v, err := d.r.c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, ycsb.ErrNotFound
	}
	return v, err
}

func (d redisDB) write(ctx context.Context, key string, value []byte, index bool) error {
	if !index && d.r.cfg.WaitReplicas == 0 {
		return d.r.c.Set(ctx, key, value, 0).Err()
	}
	p := d.r.c.Pipeline()
	set := p.Set(ctx, key, value, 0)
	if index {
		p.ZAdd(ctx, indexKey, redis.Z{Member: key})
	}
	var wait *redis.Cmd
	if n := d.r.cfg.WaitReplicas; n > 0 {
		wait = p.Do(ctx, "WAIT", n, d.r.cfg.WaitTimeout.Milliseconds())
	}
	if _, err := p.Exec(ctx); err != nil {
		return err
	}
	if err := set.Err(); err != nil {
		return err
	}
	if wait != nil {
		n, err := wait.Int64()
		if err != nil {
			return fmt.Errorf("WAIT: %w", err)
		}
		if n < int64(d.r.cfg.WaitReplicas) {
			return fmt.Errorf("WAIT: %d of %d replicas acknowledged", n, d.r.cfg.WaitReplicas)
		}
	}
	return nil
}

func (d redisDB) Update(ctx context.Context, key string, value []byte) error {
	return d.write(ctx, key, value, false)
}

func (d redisDB) Insert(ctx context.Context, key string, value []byte) error {
	return d.write(ctx, key, value, d.r.cfg.Index)
}

func (d redisDB) Scan(ctx context.Context, start string, count int) (int, error) {
	if !d.r.cfg.Index {
		return 0, errors.New("redis driver: scans need RedisConfig.Index")
	}
	keys, err := d.r.c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: indexKey, Start: "[" + start, Stop: "+", ByLex: true, Count: int64(count)}).Result()
	if err != nil || len(keys) == 0 {
		return 0, err
	}
	vals, err := d.r.c.MGet(ctx, keys...).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, v := range vals {
		if v != nil {
			n++
		}
	}
	return n, nil
}

func (redisDB) Close() error { return nil }
