package redis

import "strings"

// slotCount is the number of hash slots of a Redis Cluster.
const slotCount = 16384

// crcTable is the CRC16-XMODEM table (polynomial 0x1021) that Redis
// Cluster hashes keys with. It is computed once and never written.
var crcTable = func() (t [256]uint16) {
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

// Slot returns the Redis Cluster hash slot of key: CRC16 of its hash tag
// (the part between the first '{' and the next '}', when not empty) or of
// the whole key, modulo 16384. Keys with the same hash tag share a slot, so
// one script may use them together.
func Slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^key[i]]
	}
	return crc % slotCount
}
