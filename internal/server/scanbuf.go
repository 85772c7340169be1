package server

import "sync"

// scanBufs lends a scan the buffer its values are read into (kv.Op.ScanBuf,
// storage.DB.ScanInto) for as long as the reply takes to encode: once
// writeResult has copied the values into the connection's output, nothing
// refers to them and the next scan — on this connection or another — reuses
// the buffer. Under YCSB-E a scan's values were 86 % of the bytes the server
// allocated (a fresh ~53 KB buffer per scan, garbage as soon as the reply was
// encoded; docs/design/scans.md). A pool rather than a buffer per connection:
// connections come and go by the thousand, and one that scanned once would
// keep its buffer.
var scanBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledScanBuf is the largest buffer returned to scanBufs: a rare huge
// scan (up to kv.MaxScanBytes) must not leave the pool holding megabytes.
const maxPooledScanBuf = 1 << 20

// lendScanBuf returns an empty buffer for a scan's values; give it back with
// returnScanBuf once the reply is encoded.
func lendScanBuf() *[]byte {
	bp := scanBufs.Get().(*[]byte)
	*bp = (*bp)[:0]
	return bp
}

// returnScanBuf puts bp back in the pool. The caller no longer refers to any
// value read into it.
func returnScanBuf(bp *[]byte) {
	if cap(*bp) > maxPooledScanBuf {
		return
	}
	scanBufs.Put(bp)
}
