package shard

import (
	"bytes"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/storage"
)

// The client table is kv's (kv.ClientTable, under its idle rule here: see
// expireClients) and is persisted as kv's rows (kv.ClientRowKey,
// kv.AppendClientRow), one per client id, written in the same Append as the
// write it describes, so a sync write and its row become durable together: a
// retry after a crash and restart is answered from the table instead of
// executing twice. A row's version is the write's (or, for a write that
// changed nothing, a version of its own), its timestamp the time of the
// client's latest write (the idle rule's clock). Only successful writes are
// cached: a write that failed may be retried and execute.

// loadClients rebuilds the table from the engine's rows. Rows in the format a
// single node wrote before issue 26 (kv.LegacyClientRowPrefix) are loaded too
// and kept in s.legacy for migrateClients; where a client has both, the
// current row wins: it was written by the migration or by a later write (a
// legacy row survives next to it only if a crash lost its tombstone).
func (s *Shard) loadClients() error {
	if err := s.scanReserved(kv.ClientRowPrefix, func(k []byte, v storage.Value) error {
		e, err := kv.DecodeClientRow(k, bytes.Clone(v.Data), v.Version, v.Timestamp)
		if err != nil {
			return err
		}
		s.clients.Put(e)
		return nil
	}); err != nil {
		return err
	}
	return s.scanReserved(kv.LegacyClientRowPrefix, func(k []byte, v storage.Value) error {
		e, err := kv.DecodeLegacyClientRow(k, v.Data, v.Version, v.Timestamp)
		if err != nil {
			return err
		}
		row := legacyRow{client: e.Client}
		if s.clients.Get(e.Client) == nil {
			s.clients.Put(e)
			row.rewrite = true
		}
		s.legacy = append(s.legacy, row)
		return nil
	})
}

// legacyRow is a row in the pre-issue-26 format: its client, and whether the
// table's entry came from it (rewrite) or from a current row.
type legacyRow struct {
	client  uint64
	rewrite bool
}

// migrateClients rewrites the legacy rows loadClients found in today's format
// and deletes them, durably, before the shard serves anything: from then on
// one row format exists in the engine. Each client's new row precedes the
// legacy row's tombstone in the append, so a crash that keeps a prefix of it
// never loses an entry (the next open finds both rows and finishes). A new
// row keeps the legacy row's timestamp: the client's idle time goes on.
func (s *Shard) migrateClients() error {
	if len(s.legacy) == 0 {
		return nil
	}
	now := s.opts.Now().UnixNano()
	for len(s.legacy) > 0 {
		n := min(len(s.legacy), chunk/2)
		v := s.next
		s.next++
		recs := make([]storage.Record, 0, 2*n)
		for _, old := range s.legacy[:n] {
			if e := s.clients.Get(old.client); old.rewrite && e != nil {
				recs = append(recs, storage.Record{Key: kv.ClientRowKey(e.Client), Value: e.RowValue(), Version: v, Timestamp: e.Touched})
				e.Op = v
			}
			recs = append(recs, storage.Record{Key: reservedKey(kv.LegacyClientRowPrefix, old.client), Version: v, Timestamp: now, Tombstone: true})
		}
		if err := s.reserveFor(); err != nil {
			return err
		}
		if err := s.appendSynced(recs...); err != nil {
			return err
		}
		s.legacy = s.legacy[n:]
	}
	s.legacy = nil
	s.log.Info("client table: rewrote rows written before issue 26 in today's format")
	return nil
}
