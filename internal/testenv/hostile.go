package testenv

import (
	"strconv"
	"strings"
	"time"
)

// The answers of a hostile peer region's "Redis", for FakeRedis: each
// is a reply the regions layer must refuse before it reads it whole
// (store/stack's TestRegionsHostilePeer, deploy/image's
// TestRegionsHostilePeerContainer through internal/fakeredis).

// HeaderBomb answers every command with a RESP array header of 2^31−1
// elements, and sends none of them.
func HeaderBomb([]string) []byte { return []byte("*2147483647\r\n") }

// BigBoard returns the answers of a region whose board holds 1,000
// records of 60 KB (60 MB a read): TIME and the counts (EVALSHA) as Redis
// would answer them, the board to every other command.
func BigBoard() func(cmd []string) []byte {
	board := []byte("%1000\r\n")
	rec := strings.Repeat("x", 60_000)
	for i := range 1000 {
		f := "n:" + strconv.Itoa(i)
		board = append(board, "$"+strconv.Itoa(len(f))+"\r\n"+f+"\r\n$"+strconv.Itoa(len(rec))+"\r\n"+rec+"\r\n"...)
	}
	return func(cmd []string) []byte {
		switch cmd[0] {
		case "TIME":
			return redisTime(time.Now())
		case "EVALSHA":
			return zeroCounts(cmd)
		}
		return board
	}
}

// BadClock answers TIME with a clock that is not one (−1 s), the counts
// (EVALSHA) as Redis would, and every other command with an empty board.
func BadClock(cmd []string) []byte {
	switch cmd[0] {
	case "TIME":
		return []byte("*2\r\n$2\r\n-1\r\n$1\r\n0\r\n")
	case "EVALSHA":
		return zeroCounts(cmd)
	}
	return []byte("%0\r\n")
}

// HostileAnswer returns the answers named: "header" (HeaderBomb),
// "board" (BigBoard), "clock" (BadClock); nil for another name.
func HostileAnswer(name string) func(cmd []string) []byte {
	switch name {
	case "header":
		return HeaderBomb
	case "board":
		return BigBoard()
	case "clock":
		return BadClock
	}
	return nil
}

// redisTime is Redis's answer to TIME at t: seconds and microseconds.
func redisTime(t time.Time) []byte {
	us := t.UnixMicro()
	s, u := strconv.FormatInt(us/1e6, 10), strconv.FormatInt(us%1e6, 10)
	return []byte("*2\r\n$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n$" + strconv.Itoa(len(u)) + "\r\n" + u + "\r\n")
}

// zeroCounts answers the regions layer's read of counts (EVALSHA sha
// numkeys keys...): the time in µs, then a count of 0 per key.
func zeroCounts(cmd []string) []byte {
	n := 0
	if len(cmd) > 2 {
		n, _ = strconv.Atoi(cmd[2])
	}
	n = max(min(n, len(cmd)-3), 0)
	out := []byte("*" + strconv.Itoa(n+1) + "\r\n:" + strconv.FormatInt(time.Now().UnixMicro(), 10) + "\r\n")
	for range n {
		out = append(out, ":0\r\n"...)
	}
	return out
}
