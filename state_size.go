package sluice

import "unsafe"

// HeapBytes returns how many bytes of heap s holds beyond its own fields:
// the log of a sliding_log state (its header and the capacity of its
// slice, 16 bytes a request), else 0. A store that bounds its memory in
// bytes adds it to what a key costs.
func (s State) HeapBytes() int64 {
	if s.log == nil {
		return 0
	}
	return int64(unsafe.Sizeof(hitLog{})) + int64(cap(s.log.hits))*int64(unsafe.Sizeof(hit{}))
}
