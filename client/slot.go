package client

import "strings"

// keySlot is a key's Redis Cluster hash slot (CRC16-XMODEM of the key or
// of its {hash tag}, modulo 16384), as the server's kv.KeySlot: a
// transaction that names keys of several slots is committed by the server in
// two phases (Tx.cross).
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var c uint16
	for i := 0; i < len(key); i++ {
		c ^= uint16(key[i]) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
	}
	return c & 16383
}
