package cluster

// Slots: a key hashes to one of 16384 slots exactly as Redis Cluster hashes it
// (CRC16-CCITT/XMODEM of the key, or of its hash tag, modulo 16384), so every
// Redis Cluster client computes the slot Kefir does and routes to the group
// that owns it (issue 28). The table is Redis's crc16.c table (polynomial
// 0x1021, initial value 0, no reflection).

// Slots is the number of hash slots keys map to: Redis Cluster's 16384, so
// that a cluster-aware Redis client computes the same slot as the node.
const Slots = 16384

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// crc16 is CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with;
// table-driven, as Redis's: every routed key is hashed.
func crc16(b []byte) uint16 {
	var c uint16
	for _, x := range b {
		c = c<<8 ^ crc16Table[byte(c>>8)^x]
	}
	return c
}

// HashTag returns the part of key that decides its slot: the bytes between the
// first '{' and the first '}' after it, if that is not empty, else the whole
// key (Redis Cluster's rule, so "{user1}.a" and "{user1}.b" share a slot while
// "{}.a" hashes whole).
func HashTag(key []byte) []byte {
	for i, b := range key {
		if b != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j == i+1 {
					return key
				}
				return key[i+1 : j]
			}
		}
		return key
	}
	return key
}

// Slot returns the hash slot of key: keys that share a hash tag share a slot,
// hence a group, so a multi-key command on them stays in one group.
func Slot(key []byte) uint16 { return crc16(HashTag(key)) & (Slots - 1) }
