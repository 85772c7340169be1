package vrshard

import (
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/vfs"
)

// TestParkedReplyKeepsItsResult: under AUSI a sync write's reply waits,
// parked, for the log members' fsyncs (parkDurable; the disks here take
// 50 ms more per fsync, so the replies park), and a parked reply carries
// the write's own outcome — an INCRBY's new value and the version it wrote
// — not a zero result (the parked closure's copies in handle).
func TestParkedReplyKeepsItsResult(t *testing.T) {
	g := newModeChain(t, chain.AUSI, func(i int, o *Options) { o.FS = vfs.SlowSync(vfs.OS{}, 50*time.Millisecond) })
	g.write(0, set("warm", "w"), shard.ReqID{Client: 5, Seq: 1}) // the lease, the links
	last := uint64(0)
	for n := int64(1); n <= 3; n++ {
		res := g.write(0, kv.Op{Kind: kv.KindIncrBy, Key: []byte("n"), Delta: 10}, shard.ReqID{Client: 5, Seq: uint64(n + 1)})
		if res.Int != 10*n || res.Version <= last {
			t.Fatalf("INCRBY %d: answered %+v, want %d at a version after %d", n, res, 10*n, last)
		}
		last = res.Version
	}
}
