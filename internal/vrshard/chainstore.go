package vrshard

import (
	"fmt"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/vfs"
)

// ChainStore is a chain member's datastore on the host (Flex-KV, digest 002
// §4.6; docs/design/chain.md, "Datastores on the host"). The core's rule
// decides what a member's acknowledgement means (chain.Member.ackBound):
// under SU a log member passes on and acknowledges an update only once it is
// on its disk; a buffered or memory member as soon as it holds it.
type ChainStore uint8

const (
	// ChainLog (the zero value, the default): the member's log is fsynced
	// batch by batch and nothing is acknowledged before its fsync (D).
	ChainLog ChainStore = iota
	// ChainBuffered: the log is written to the OS with every batch and
	// fsynced every ChainOptions.Flush (Mb): a process crash loses nothing
	// the OS took, a power cut the last interval.
	ChainBuffered
	// ChainMemory: the member keeps its log and state in memory only (M):
	// its replica runs on an in-memory file system (vfs.RAM), so whatever
	// it held dies with its process and a restart comes back empty.
	ChainMemory
)

// ChainStoreOptions is a member's store as a process's opener takes it
// (kefir server --chain-store, --chain-flush).
type ChainStoreOptions struct {
	Store ChainStore
	Flush time.Duration // 0: DefaultChainFlush
	// NoLogMember: no member of the chain is a log
	// (ChainOptions.NoLogMember; kefir server --chain-log-member=false).
	NoLogMember bool
	// PrecopyRate paces the member's pre-copy when it joins
	// (ChainOptions.PrecopyRate; 0: DefaultPrecopyRate, negative: none).
	PrecopyRate int64
	// Mode is the chain's update mode (ChainOptions.Mode; kefir server
	// --chain-mode), the same on every member.
	Mode chain.Mode
}

// DefaultChainFlush is a buffered member's fsync interval.
const DefaultChainFlush = 100 * time.Millisecond

func (s ChainStore) String() string {
	switch s {
	case ChainLog:
		return "log"
	case ChainBuffered:
		return "buffered"
	case ChainMemory:
		return "memory"
	}
	return fmt.Sprintf("ChainStore(%d)", uint8(s))
}

// Letter is the store's name in the design's tables: D, Mb, M.
func (s ChainStore) Letter() string { return s.core().String() }

// ParseChainStore reads a --chain-store value: log (or d), buffered (b, mb)
// or memory (m).
func ParseChainStore(v string) (ChainStore, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "log", "d", "disk":
		return ChainLog, nil
	case "buffered", "b", "mb":
		return ChainBuffered, nil
	case "memory", "m", "mem":
		return ChainMemory, nil
	}
	return 0, fmt.Errorf("chain store %q: want log (d), buffered (b) or memory (m)", v)
}

// core is the store as the chain core models it.
func (s ChainStore) core() chain.Store {
	switch s {
	case ChainBuffered:
		return chain.Buffered
	case ChainMemory:
		return chain.Memory
	}
	return chain.Log
}

// applyChainStore sets up o's file system and fsync schedule for the
// member's store. A memory member runs the ordinary replica (log, engine,
// checkpoints) on a fresh in-memory file system (vfs.RAM): one code path for
// every store, its memory use is what the thesis's M costs (the data in the
// process, not the page cache), and a restart of its process finds nothing,
// which is what M promises (a temporary directory on disk would survive a
// kill -9 in the page cache and have to be wiped by hand). Its log's "fsyncs"
// do nothing on vfs.RAM, but each is a hand-off to the syncer goroutine, so
// they are batched on the flush interval as a buffered member's are.
// Neither waits for a flush: the core acknowledges at once (SU over M, Mb).
//
// Bootstrap is for the chain's first start only, but an in-memory disk is
// empty at every start, which Bootstrap would take for a new chain: an
// active member holding nothing, while its chain holds history. So a memory
// member leaves a mark in its real directory (memoryMark) at its first
// start, and every later start ignores Bootstrap: it comes back as a node
// that lost its disk, and joins the chain as a new member.
func applyChainStore(o *Options) error {
	if o.Chain == nil || o.Chain.Store == ChainLog {
		return nil
	}
	co := *o.Chain // the caller's options stay as given
	o.Chain = &co
	if co.Flush <= 0 {
		co.Flush = DefaultChainFlush
	}
	if co.Store != ChainMemory {
		return nil
	}
	disk := o.FS
	if disk == nil {
		disk = vfs.Default
	}
	mark := vfs.Join(o.Dir, memoryMark)
	if _, err := disk.Stat(mark); err == nil {
		o.Bootstrap = false // started before: what it held is gone
	} else if err := writeMemoryMark(disk, o.Dir, mark); err != nil {
		return fmt.Errorf("vrshard: memory chain member in %s: %w", o.Dir, err)
	}
	fs := vfs.NewRAM()
	o.FS, o.Storage.FS, o.Storage.Devices = fs, fs, nil
	return nil
}

// memoryMark is the file a memory member keeps in its real directory: it
// has started before (applyChainStore).
const memoryMark = "chain-memory-member"

func writeMemoryMark(disk vfs.FS, dir, mark string) error {
	if err := disk.MkdirAll(dir); err != nil {
		return err
	}
	f, err := disk.Create(mark)
	if err != nil {
		return err
	}
	if _, err := f.Write([]byte("this chain member keeps its data in memory only (kefir server --chain-store memory)\n")); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return disk.SyncDir(dir)
}

// chainUnsynced reports whether this replica is a chain member whose
// acknowledgements wait for no fsync (a buffered or memory store): its log
// batches are held for the flush interval (holdable), whatever waits at
// the replica, since nothing there waits for a flush.
func (r *Replica) chainUnsynced() bool {
	return r.opts.Chain != nil && r.opts.Chain.Store != ChainLog
}
