// Package keyslot is Redis Cluster's key-to-slot function — CRC16-XMODEM of
// the key, or of its {hash tag}, modulo 16384 — in one copy for the state
// machine (internal/kv, which fences slots by it), the Go client (which
// tells a transaction of several slots by it) and the benchmarks. Every
// Redis Cluster client computes the same, so it must never change.
//
// It imports nothing of Kefir and nothing but the language: a leaf that a
// deterministic core and a client library can both import.
package keyslot

// N is the number of hash slots.
const N = 16384

// Key is a string or a byte slice: the client hashes strings, the server
// byte slices, neither converting.
type Key interface{ ~string | ~[]byte }

// Of is key's slot.
func Of[K Key](key K) uint16 { return crc16(HashTag(key)) & (N - 1) }

// HashTag returns the part of key that decides its slot: the bytes between
// the first '{' and the first '}' after it, if that is not empty, else the
// whole key (Redis Cluster's rule).
func HashTag[K Key](key K) K {
	i := index(key, 0, '{')
	if i < 0 {
		return key
	}
	j := index(key, i+1, '}')
	if j <= i+1 {
		return key
	}
	return key[i+1 : j]
}

func index[K Key](key K, from int, c byte) int {
	for i := from; i < len(key); i++ {
		if key[i] == c {
			return i
		}
	}
	return -1
}

var table = func() (t [256]uint16) {
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

// crc16 is CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no
// reflection; table-driven, as Redis's crc16.c: every routed key is hashed.
func crc16[K Key](b K) uint16 {
	var c uint16
	for i := 0; i < len(b); i++ {
		c = c<<8 ^ table[byte(c>>8)^b[i]]
	}
	return c
}
