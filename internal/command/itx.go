package command

// itxTable is issue 29's interactive transactions (KEFIR.TX;
// docs/design/transactions.md, "Interactive transactions"), appended to table
// at init (kept apart to ease merging).
//
// KEFIR.TX is a connection command (admin): BEGIN, the snapshot reads, the
// buffered writes and ABORT touch only the connection's state; COMMIT sends
// one KEFIR.TXAPPLY through the connection's write path. KEFIR.TXAPPLY is
// that commit op (its one argument is the op's encoding): an ordered update
// whose reply (the committed version or -TXABORT) depends on the state it
// validated against, never nilext. Its keys are inside the encoding
// (FirstKey 0); a node of several groups routes it by them.
var itxTable = []Spec{
	{Name: "KEFIR.TX", Arity: -2, Class: Admin, Summary: "interactive transaction: KEFIR.TX BEGIN [SI|SERIALIZABLE] [THEN subcommand handle ...] | GET|MGET|EXISTS|SET|DEL|INCRBY handle ... | COMMIT handle | ABORT handle... [THEN ...] | FEATURES"},
	{Name: "KEFIR.TXAPPLY", Arity: 2, Class: NonNilextUpdate, Summary: "a transaction's commit op (sent by KEFIR.TX COMMIT and forwarded to the leader)"},
}
