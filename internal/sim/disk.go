package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	mrand "math/rand"
	"time"

	"github.com/kefirdb/kefir/internal/vfs"
)

// A replica's log is one append-only file on its vfs.Mem disk, a sequence of
// frames: 4-byte little-endian length, 4-byte CRC-32C of the payload, payload.
// Recovery keeps the longest prefix of intact frames, so a torn last write
// loses that write and nothing before it.

var crcTable = crc32.MakeTable(crc32.Castagnoli)

const frameHeader = 8

func appendFrame(buf, rec []byte) []byte {
	var h [frameHeader]byte
	binary.LittleEndian.PutUint32(h[:4], uint32(len(rec)))
	binary.LittleEndian.PutUint32(h[4:], crc32.Checksum(rec, crcTable))
	return append(append(buf, h[:]...), rec...)
}

// parseFrames returns the intact records of data and the length they cover.
func parseFrames(data []byte) (recs [][]byte, valid int) {
	for off := 0; ; {
		if len(data)-off < frameHeader {
			return recs, off
		}
		n := int(binary.LittleEndian.Uint32(data[off:]))
		sum := binary.LittleEndian.Uint32(data[off+4:])
		end := off + frameHeader + n
		if n < 0 || end > len(data) || end < off {
			return recs, off
		}
		rec := data[off+frameHeader : end]
		if crc32.Checksum(rec, crcTable) != sum {
			return recs, off
		}
		recs = append(recs, append([]byte(nil), rec...))
		off = end
	}
}

// startReplica (re)creates replica a from its disk.
func (s *Sim) startReplica(a Addr, _ [][]byte) {
	r := s.replicas[a]
	recs, err := s.recoverLog(r)
	if err != nil {
		panic(fmt.Sprintf("sim: replica %d recovery: %v", a, err))
	}
	r.logLen = len(recs)
	r.diskBusy = s.now
	if s.o.NewReplicaBoot != nil {
		r.node = s.o.NewReplicaBoot(a, Boot{Config: s.cfg, Recovered: recs, FS: r.disk})
	} else {
		r.node = s.o.NewReplica(a, s.cfg, recs)
	}
	r.up = true
	if s.trace != nil {
		s.tracef("start %d recovered=%d records", a, len(recs))
	}
	s.schedule(item{at: s.now + s.rng.Int64N(int64(s.o.Tick)), kind: itTick, node: a, inc: r.inc})
}

// recoverLog opens (or creates) the log, drops any torn tail and makes the
// remaining prefix durable before the replica sees it: a replica acts on what
// it recovered, so that must not vanish in the next crash.
func (s *Sim) recoverLog(r *replica) ([][]byte, error) {
	f, err := r.disk.OpenRW(walName)
	if errors.Is(err, fs.ErrNotExist) {
		if f, err = r.disk.Create(walName); err != nil {
			return nil, fmt.Errorf("create log: %w", err)
		}
		if err := r.disk.SyncDir("/"); err != nil {
			return nil, fmt.Errorf("sync dir: %w", err)
		}
		r.wal = f
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	size, err := f.Size()
	if err != nil {
		return nil, fmt.Errorf("log size: %w", err)
	}
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil && size > 0 {
		return nil, fmt.Errorf("read log: %w", err)
	}
	recs, valid := parseFrames(data)
	if int64(valid) != size {
		if s.trace != nil {
			s.tracef("log: dropping %d torn bytes after %d records", size-int64(valid), len(recs))
		}
		if err := f.Truncate(int64(valid)); err != nil {
			return nil, fmt.Errorf("truncate torn tail: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("sync recovered log: %w", err)
	}
	r.wal = f
	return recs, nil
}

// persist performs a Ready's disk actions for replica a. It reports false if
// the write failed, in which case the replica has crashed.
func (s *Sim) persist(a Addr, rd *Ready) bool {
	r := s.replicas[a]
	if len(rd.Persist) > 0 {
		r.buf = r.buf[:0]
		for _, rec := range rd.Persist {
			r.buf = appendFrame(r.buf, rec)
		}
		// One write per batch, as a real driver would: a crash may tear it.
		if _, err := r.wal.Write(r.buf); err != nil {
			if s.trace != nil {
				s.tracef("replica %d write failed (%v): crashing it", a, err)
			}
			s.Crash(int(a))
			return false
		}
		r.logLen += len(rd.Persist)
	}
	if rd.Sync {
		// One disk per replica: fsyncs complete in order.
		at := max(s.now, r.diskBusy) + s.o.Sync.sample(s.rng)
		r.diskBusy = at
		s.schedule(item{at: at, kind: itSync, node: a, inc: r.inc, n: r.logLen})
	}
	return true
}

// Crash kills replica i: its volatile state is gone, pending fsyncs never
// complete, messages to it are dropped, and its disk keeps only what was
// synced (with Options.Torn, plus a random prefix of the rest, possibly torn).
func (s *Sim) Crash(i int) {
	r := s.replicas[i]
	if !r.up {
		return
	}
	if s.trace != nil {
		s.tracef("crash %d", i)
	}
	s.stats.Crashes++
	r.up = false
	r.inc++
	r.node = nil
	r.wal = nil
	var rng *mrand.Rand
	if s.o.Torn {
		rng = mrand.New(mrand.NewSource(int64(s.rng.Uint64())))
	}
	r.disk.Crash(rng)
	s.rec.Crash(i)
}

// CrashAll crashes every replica at once (a power failure of the cluster).
func (s *Sim) CrashAll() {
	for i := range s.replicas {
		s.Crash(i)
	}
}

// PowerCuts schedules power failures of the whole cluster: every 100–400 ms
// (drawn from the run's generator) every replica crashes at once (CrashAll)
// and all restart 20 ms later from their disks, the last cut at or before
// time last.
func (s *Sim) PowerCuts(last time.Duration) {
	var cut func()
	cut = func() {
		if s.Now() > last {
			return
		}
		s.cuts = append(s.cuts, s.Now())
		s.CrashAll()
		s.After(20*time.Millisecond, func() {
			for i := range s.replicas {
				s.Restart(i)
			}
		})
		s.After(time.Duration(100+s.Rand().IntN(300))*time.Millisecond, cut)
	}
	s.After(time.Duration(100+s.Rand().IntN(300))*time.Millisecond, cut)
}

// Cuts are the times of the power cuts PowerCuts made so far.
func (s *Sim) Cuts() []time.Duration { return s.cuts }

// Restart brings replica i back from its disk.
func (s *Sim) Restart(i int) {
	if s.replicas[i].up {
		return
	}
	s.stats.Restarts++
	s.startReplica(Addr(i), nil)
}

// Wipe replaces crashed replica i's disk with an empty one: a replaced
// machine, which must come back through its protocol's recovery path (it
// restarts with no records).
func (s *Sim) Wipe(i int) {
	r := s.replicas[i]
	if r.up {
		panic(fmt.Sprintf("sim: wipe of running replica %d (crash it first)", i))
	}
	if s.trace != nil {
		s.tracef("wipe %d", i)
	}
	r.disk = vfs.NewMem()
}
