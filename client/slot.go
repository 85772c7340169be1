package client

import "github.com/kefirdb/kefir/internal/keyslot"

// keySlot is a key's Redis Cluster hash slot (internal/keyslot, the
// server's own): a transaction that names keys of several slots is
// committed by the server in two phases (Tx.crossSlots).
func keySlot(key string) uint16 { return keyslot.Of(key) }
