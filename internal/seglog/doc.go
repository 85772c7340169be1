// Package seglog is the mechanism Kefir's two segmented logs share: the storage
// engine's log (internal/storage) and the replication log (internal/vrshard wal.go).
// Before it existed each log had its own copy of this code, and fixes landed in one
// copy only (docs/design/one-house.md, "One segmented log").
//
// What is here, and used by both:
//
//   - Zero-filled segments (docs/design/zero-filled-logs.md): a Filler writes the next
//     segment's file full of zeros and fsyncs it ahead of need, so the log's writes
//     overwrite allocated, written blocks and an fdatasync commits no metadata.
//     A roll takes it with TakeOpen. WriteAtEnd writes a batch at the
//     log's logical end: in place over the zeros, or appended once they are used up;
//     UndoWrite takes a failed write back.
//   - The durable point: SyncedFile is a segment whose Sync records the logical end it
//     covered, the "synced up to" mark the replication log stamps into every record.
//   - Recovery's end of the log: ScanPastEnd finds a valid record after the first bad
//     one whose synced mark says the bad one lay below a completed fsync (damage in the
//     middle of the log, not a torn tail); EndTail makes the first bad record the end
//     (every non-zero block after it zeroed, or the file cut where it cannot be written
//     in place), so no stale record can be resurrected.
//   - Leftover temporary files: RemoveLeftover removes a ".tmp" file recovery found,
//     treating one that is already gone as removed.
//   - CRCTable, the CRC-32C table both record formats use.
//
// What stays with each log: its record format (the two differ, and both are on disk
// in existing directories), the segment naming and the rules that say which segments
// make up the log (the storage log concatenates segments into one position space,
// seals them by cutting them to their end and keeps them; every replication-log
// segment starts with a snapshot and supersedes the ones before it), and how large the
// next zero-filled segment is. Those are the logs' own semantics; a log plugs the
// mechanism in by giving ScanPastEnd a parser for its records.
//
// Every file operation goes through internal/vfs, so the logs' power-cut tests on
// vfs.Mem cover this package.
package seglog
