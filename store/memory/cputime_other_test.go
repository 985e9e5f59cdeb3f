//go:build !linux

package memory

import "time"

// threadCPU reports that this system does not tell a thread's CPU time.
func threadCPU() (time.Duration, bool) { return 0, false }
