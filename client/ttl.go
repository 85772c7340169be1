package client

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// Key expiry in the Go client. The server keeps one absolute expiry per key
// (docs/design/expiry.md): a relative TTL given here becomes an absolute time
// at the node that takes the write, so a retried write (same request id) does
// not extend it. Durations are sent in milliseconds (PX, PEXPIRE, PTTL); a
// TTL below a millisecond is refused here rather than rounded to "no TTL".

// NoExpiry is what TTL returns for a key that exists and has no expiry.
const NoExpiry time.Duration = -1

// ErrInvalidTTL: a TTL that is not a positive whole number of milliseconds,
// or WithTTL on a call that cannot carry one (MultiPut: MSET has no expiry).
var ErrInvalidTTL = errors.New("kefir: invalid TTL")

// WithTTL makes Put set the key with an expiry ttl from now (SET … PX), as
// go-redis's Set(ctx, k, v, ttl). Put without it clears any TTL the key had,
// as SET does.
func WithTTL(ttl time.Duration) CallOption {
	return func(o *callOptions) { o.ttl, o.hasTTL = ttl, true }
}

// ttlMillis validates a TTL and returns it in whole milliseconds.
func ttlMillis(ttl time.Duration) (string, error) {
	if ttl < time.Millisecond || ttl%time.Millisecond != 0 {
		return "", errors.Join(ErrInvalidTTL, errors.New("kefir: a TTL must be a positive whole number of milliseconds, got "+ttl.String()))
	}
	return strconv.FormatInt(ttl.Milliseconds(), 10), nil
}

func (c *Client) expire(ctx context.Context, s *Session, key string, ttl time.Duration, opts []CallOption) (bool, error) {
	ms, err := ttlMillis(ttl)
	if err != nil {
		return false, err
	}
	r := newCall(replyInt, true, s, opts)
	r.cmd = append(r.cmd, arg{s: "PEXPIRE"}, arg{s: key}, arg{s: ms})
	n, err := c.integer(ctx, r)
	return n == 1, err
}

func (c *Client) persist(ctx context.Context, s *Session, key string, opts []CallOption) (bool, error) {
	r := newCall(replyInt, true, s, opts)
	r.cmd = append(r.cmd, arg{s: "PERSIST"}, arg{s: key})
	n, err := c.integer(ctx, r)
	return n == 1, err
}

func (c *Client) ttl(ctx context.Context, s *Session, key string, opts []CallOption) (time.Duration, error) {
	r := newCall(replyInt, false, s, opts)
	r.cmd = append(r.cmd, arg{s: "PTTL"}, arg{s: key})
	n, err := c.integer(ctx, r)
	switch {
	case err != nil:
		return 0, err
	case n == -2:
		return 0, ErrNotFound
	case n == -1:
		return NoExpiry, nil
	case n < 0:
		return 0, errors.New("kefir: PTTL answered " + strconv.FormatInt(n, 10))
	}
	return time.Duration(n) * time.Millisecond, nil
}

// Expire sets key's expiry to ttl from now and reports whether the key
// exists (PEXPIRE). A key already past its expiry does not exist.
func (c *Client) Expire(ctx context.Context, key string, ttl time.Duration, opts ...CallOption) (bool, error) {
	return c.expire(ctx, nil, key, ttl, opts)
}

// Persist removes key's expiry and reports whether it had one.
func (c *Client) Persist(ctx context.Context, key string, opts ...CallOption) (bool, error) {
	return c.persist(ctx, nil, key, opts)
}

// TTL returns the time key has left (millisecond resolution), NoExpiry for a
// key without an expiry, or ErrNotFound. Read at the call's consistency
// level; a follower judges expiry by its own clock and the group's clock-skew
// bound (docs/consistency.md, "Key expiry").
func (c *Client) TTL(ctx context.Context, key string, opts ...CallOption) (time.Duration, error) {
	return c.ttl(ctx, nil, key, opts)
}

// Expire is Client.Expire within the session.
func (s *Session) Expire(ctx context.Context, key string, ttl time.Duration, opts ...CallOption) (bool, error) {
	return s.c.expire(ctx, s, key, ttl, opts)
}

// Persist is Client.Persist within the session.
func (s *Session) Persist(ctx context.Context, key string, opts ...CallOption) (bool, error) {
	return s.c.persist(ctx, s, key, opts)
}

// TTL is Client.TTL within the session.
func (s *Session) TTL(ctx context.Context, key string, opts ...CallOption) (time.Duration, error) {
	return s.c.ttl(ctx, s, key, opts)
}

// putTTL reports the TTL a write's options carry, in milliseconds (ok false:
// none), or why it is invalid. It scans opts without building a request.
func putTTL(opts []CallOption) (ms string, ok bool, err error) {
	if len(opts) == 0 {
		return "", false, nil
	}
	var o callOptions
	for _, f := range opts {
		f(&o)
	}
	if !o.hasTTL {
		return "", false, nil
	}
	ms, err = ttlMillis(o.ttl)
	return ms, err == nil, err
}
