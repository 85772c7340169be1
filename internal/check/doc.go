// Package check records client histories and judges them against Kefir's
// consistency and durability promises (ARCHITECTURE §2, §9).
//
// A History is what clients observed: invoke and complete events with the
// operation, its arguments, its result and the consistency/durability levels it
// asked for; operations whose outcome is unknown (timeouts, crashes) are kept as
// such. Each checker is a pure function from a History to a Verdict that, when it
// fails, carries a small counter-example (the fewest operations that still show
// the violation) so a human can read it.
//
// Transactions have their own history (TxnHistory: micro-operations of
// list-append or rw-register workloads), judged by CheckTxns against an
// isolation model the way Elle does (docs/design/txn-checker.md).
//
// Checkers judge only what clients can see. They are shared by the deterministic
// simulator (internal/sim) and the real-process tests (test/e2e), so they must
// not import either, nor any replication core, server or storage package. Only
// internal/level and porcupine.
package check
