package cluster

import (
	"strconv"

	"github.com/kefirdb/kefir/internal/kv"
)

// Slots: a key hashes to one of 16384 slots exactly as Redis Cluster hashes it
// (CRC16-CCITT/XMODEM of the key, or of its hash tag, modulo 16384), so every
// Redis Cluster client computes the slot Kefir does and routes to the group
// that owns it (issue 28). The hash is internal/kv's (kv.KeySlot): a group's
// state machine fences writes by slot with the same function.

// Slots is the number of hash slots keys map to: Redis Cluster's 16384, so
// that a cluster-aware Redis client computes the same slot as the node.
const Slots = kv.NumSlots

// HashTag returns the part of key that decides its slot (kv.HashTag).
func HashTag(key []byte) []byte { return kv.HashTag(key) }

// Slot returns the hash slot of key: keys that share a hash tag share a slot,
// hence a group, so a multi-key command on them stays in one group.
func Slot(key []byte) uint16 { return kv.KeySlot(key) }

// maxKeyTries bounds KeyWhere's search (a predicate that holds for one slot
// in 16384 needs ~16384 tries on average).
const maxKeyTries = 1 << 20

// KeyWhere returns the first of prefix0, prefix1, ... whose slot ok
// accepts, nil if none within maxKeyTries: a key to route a keyless
// request by (a group's FLUSHALL part, the rebalance's probe).
func KeyWhere(prefix string, ok func(slot uint16) bool) []byte {
	k := []byte(prefix)
	for i := 0; i < maxKeyTries; i++ {
		k = strconv.AppendInt(k[:len(prefix)], int64(i), 10)
		if ok(Slot(k)) {
			return k
		}
	}
	return nil
}
