package shard

import (
	"encoding/binary"
	"fmt"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// Versions are never handed out twice, so a session token stays meaningful across
// a crash. An async or cad write is acknowledged (and its version put in the
// client's token) before it is durable; a crash may lose it. If the restarted node
// then reused that version for another write, a session read carrying the lost
// version would pass the "have I applied it?" check and silently return state
// without the session's own write. So:
//
//   - The shard reserves versions in chunks: before a batch whose versions reach
//     past the reservation becomes visible, a record naming a new bound H is
//     appended and fsynced ("every version handed out is < H"). One extra fsync
//     per versionChunk versions.
//   - On open, versions in (last recovered, H) may have been handed out and lost:
//     that range is recorded (durably) as a hole and new versions start at H.
//     Versions inside a hole recorded by an earlier open are spent too: the next
//     version is above every recorded hole, not just above the last recovered
//     version. Otherwise a second crash with no write in between (the recovered
//     version unchanged) would record a hole at the same start again: the same
//     reserved key at the same engine version, which the engine refuses, so the
//     directory could never be opened again.
//   - A session read whose token names a version in a hole fails with
//     ErrSessionLost instead of being served; a clean Close reserves exactly up
//     to the next version, so a clean restart leaves no hole.
//
// Both kinds of record use a fresh reserved key each time (a reservation's
// sequence number, a hole's start; big-endian), so they never collide with the
// engine's per-key version order, and they carry the engine's last version so
// they never raise it. The reservation in force is the one with the highest
// sequence number (a clean Close lowers the bound, so it is not the highest bound).

// versionChunk is how many versions one reservation covers.
var versionChunk uint64 = 1 << 20 // a variable so tests can cross reservations quickly

var (
	reservePrefix = kv.ReservedKey("vres/")
	holePrefix    = kv.ReservedKey("hole/")
)

// hole is a range of versions [lo, hi) that may have been acknowledged before a
// crash and were lost in it.
type hole struct{ lo, hi uint64 }

func reservedKey(prefix []byte, v uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte(nil), prefix...), v)
}

// scanReserved calls fn with every record under prefix, whose keys are prefix
// plus a big-endian uint64 (reservedKey), in key order.
func (s *Shard) scanReserved(prefix []byte, fn func(k []byte, v storage.Value) error) error {
	end := append(append([]byte(nil), prefix...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	var ferr error
	err := s.db.Scan(prefix, end, 0, 0, func(k []byte, v storage.Value) bool {
		ferr = fn(k, v)
		return ferr == nil
	})
	if err != nil {
		return err
	}
	return ferr
}

// reservedSuffix returns the uint64 a reservedKey under prefix carries.
func reservedSuffix(prefix, k []byte) (uint64, error) {
	if len(k) != len(prefix)+8 {
		return 0, fmt.Errorf("reserved key %q: bad length", k)
	}
	return binary.BigEndian.Uint64(k[len(prefix):]), nil
}

// openVersions loads the reservation and the holes, records a new hole if the
// last life handed out versions its disk did not keep, and reserves the next
// chunk. Called by Open before anything is served.
func (s *Shard) openVersions() error {
	var bound uint64
	if err := s.scanReserved(reservePrefix, func(k []byte, v storage.Value) error {
		seq, err := reservedSuffix(reservePrefix, k)
		if err != nil {
			return err
		}
		val := v.Data
		if len(val) != 8 {
			return fmt.Errorf("reservation %d: bad value length %d", seq, len(val))
		}
		if seq >= s.reserveSeq { // keys arrive in order; be explicit anyway
			s.reserveSeq, bound = seq, binary.BigEndian.Uint64(val)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("load version reservation: %w", err)
	}
	if err := s.scanReserved(holePrefix, func(k []byte, v storage.Value) error {
		lo, err := reservedSuffix(holePrefix, k)
		if err != nil {
			return err
		}
		val := v.Data
		if len(val) != 8 {
			return fmt.Errorf("hole at %d: bad value length %d", lo, len(val))
		}
		s.addHole(hole{lo: lo, hi: binary.BigEndian.Uint64(val)})
		return nil
	}); err != nil {
		return fmt.Errorf("load version holes: %w", err)
	}
	// Every version below a recorded hole's end was handed out or lost already:
	// continue above them all. Hole starts then only grow, so each new hole gets
	// a key of its own.
	for _, h := range s.holes {
		s.next = max(s.next, h.hi)
	}
	var recs []storage.Record
	ts := s.opts.Now().UnixNano()
	last := s.db.LastVersion()
	if bound > s.next {
		h := hole{lo: s.next, hi: bound}
		s.addHole(h)
		recs = append(recs, storage.Record{Key: reservedKey(holePrefix, h.lo),
			Value: binary.BigEndian.AppendUint64(nil, h.hi), Version: last, Timestamp: ts})
		s.next = bound
		s.log.Warn("versions handed out before a crash were not on disk; sessions that saw them will get an error",
			"lost_from", h.lo, "lost_to", h.hi-1)
	}
	recs = append(recs, s.reservation(s.next+versionChunk, last, ts))
	if err := s.appendSynced(recs...); err != nil {
		return err
	}
	s.reserved = s.next + versionChunk
	return nil
}

// addHole records h in memory, merging it with the last hole when they touch:
// each write-less crash adds a hole right after the previous one, and a session
// read checks every hole, so a node that crashed many times must not make every
// read walk one hole per crash.
func (s *Shard) addHole(h hole) {
	if n := len(s.holes); n > 0 && s.holes[n-1].hi == h.lo {
		s.holes[n-1].hi = h.hi
		return
	}
	s.holes = append(s.holes, h)
}

// reserveFor makes sure every version below s.next is covered by a durable
// reservation before records carrying them are appended. Caller holds mu.
func (s *Shard) reserveFor() error {
	if s.next <= s.reserved {
		return nil
	}
	h := s.next + versionChunk
	if err := s.appendSynced(s.reservation(h, s.db.LastVersion(), s.opts.Now().UnixNano())); err != nil {
		return fmt.Errorf("reserve versions: %w", err)
	}
	s.reserved = h
	return nil
}

// closeVersions reserves exactly up to the next version, so a clean restart
// finds no hole. Caller holds mu; the caller's final sync makes it durable.
func (s *Shard) closeVersions() error {
	if s.next >= s.reserved {
		return nil
	}
	_, err := s.db.Append(s.reservation(s.next, s.db.LastVersion(), s.opts.Now().UnixNano()))
	if err == nil {
		s.reserved = s.next
	}
	return err
}

// reservation returns the record of a new reservation of versions below bound.
func (s *Shard) reservation(bound, version uint64, ts int64) storage.Record {
	s.reserveSeq++
	return storage.Record{Key: reservedKey(reservePrefix, s.reserveSeq),
		Value: binary.BigEndian.AppendUint64(nil, bound), Version: version, Timestamp: ts}
}

func (s *Shard) appendSynced(recs ...storage.Record) error {
	pos, err := s.db.Append(recs...)
	if err != nil {
		return err
	}
	_, err = s.db.Sync(pos)
	return err
}

// checkLost fails a session that saw a version lost in a crash.
func (s *Shard) checkLost(sess Session) error {
	for _, h := range s.holes {
		for _, v := range [2]uint64{sess.LastWrite, sess.MaxRead} {
			if v >= h.lo && v < h.hi {
				return fmt.Errorf("%w: it saw version %d, and versions %d to %d were lost in a crash before this node restarted; start a new session",
					ErrSessionLost, v, h.lo, h.hi-1)
			}
		}
	}
	return nil
}
