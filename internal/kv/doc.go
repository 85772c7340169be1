// Package kv is Kefir's one key-value state machine: the command vocabulary
// (Op, Result and their codec), the evaluation of a write against the state
// it finds (Apply: version + op → records + result), and the evaluation of a
// read (Read, ScanUser). Every place that executes commands runs this code:
// the single node (internal/shard), every replicated engine's applier and
// read path (internal/vrshard), and the deterministic simulators' replicas
// (internal/vr's core simulator over internal/simkv's in-memory store;
// vrshard's host simulator over the real engine), so what the simulators
// check is what production runs. Transactions hook in here; key expiry does (expiry.go).
//
// It is pure: deterministic, no goroutines, clocks, randomness or I/O (a
// record timestamp is the caller's, and expiry is decided with the op's Now,
// the proposer's clock; internal/purity enforces it). It reads
// state only through the narrow functions callers hand it (Getter, Scanner)
// and hands the records a write produces to the caller (Emit) instead of
// writing them, so it must not import a
// storage engine (internal/storage), a replication protocol (internal/vr),
// a host (internal/shard, internal/vrshard) or net, os, time.
//
// What differs between engines stays with the caller, as parameters: which
// version an op's records carry (a single node hands out versions and
// consumes one only for an op that wrote; a VR replica uses the op number,
// so versions agree on every replica), what state a read-modify-write sees
// (the caller's Getter: the engine, behind the records it staged earlier in
// the batch; for a replayed op, the state as of the op before it).
package kv
