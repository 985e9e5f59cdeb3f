// Package redisconf reads sizes as redis.conf writes them, for the tests
// that check the shipped Redis settings.
package redisconf

import (
	"strconv"
	"strings"
)

// Bytes parses a size as redis.conf reads it: 1k is 1000 bytes, 1kb
// 1024, and so on for m(b) and g(b).
func Bytes(s string) (int64, error) {
	s = strings.ToLower(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"gb", 1 << 30}, {"mb", 1 << 20}, {"kb", 1 << 10}, {"g", 1e9}, {"m", 1e6}, {"k", 1e3}, {"b", 1}}
	mult := int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}
