// Package resp is Kefir's RESP2/RESP3 codec, shared by the server's front door and
// the Go client.
//
// The server side reads commands with [Reader.ReadCommand] (multibulk or inline),
// which reuses one buffer and returns argument slices that alias it, so the steady
// state allocates nothing; it answers with a buffered [Writer] whose protocol version
// (2 or 3, set after HELLO) decides how nulls, maps, booleans and doubles are spelled.
// The client side builds commands with [AppendCommand] and reads replies of every
// RESP2/RESP3 type with [Reader.ReadValue].
//
// Malformed input yields a *[ProtocolError], distinct from I/O errors, so the server
// can answer "-ERR Protocol error: ..." and close only that connection. Declared
// lengths are checked against configurable limits and never used to size an
// allocation: buffers grow as bytes actually arrive, so a peer cannot make the reader
// allocate memory it has not sent.
//
// It must not import any other Kefir package: both the server and the client depend
// on it, and it knows nothing about commands, levels or storage.
package resp
