package redis

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testenv"
)

// validReplies are RESP2 and RESP3 replies of each type, nested.
var validReplies = []string{
	"+OK\r\n", "-ERR no\r\n", ":-12\r\n", "$5\r\nhello\r\n", "$-1\r\n", "*-1\r\n", "$0\r\n\r\n", "*0\r\n",
	"*3\r\n:1\r\n$2\r\nab\r\n*2\r\n+x\r\n_\r\n", "%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n*1\r\n:2\r\n",
	",1.5\r\n", "#t\r\n", "(123\r\n", "=7\r\ntxt:abc\r\n", "!3\r\nerr\r\n", "~2\r\n:1\r\n:2\r\n",
	">3\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n:0\r\n", "|1\r\n+key\r\n+val\r\n:5\r\n",
	"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n",
}

// TestReplyGuardValid: every valid reply passes, whole or split at any
// byte, and the guard ends each reply where it began.
func TestReplyGuardValid(t *testing.T) {
	all := strings.Join(validReplies, "")
	for step := 1; step <= len(all); step++ {
		g := replyGuard{limit: 1 << 20}
		for i := 0; i < len(all); i += step {
			if err := g.scan([]byte(all[i:min(i+step, len(all))])); err != nil {
				t.Fatalf("step %d, at %d: %v", step, i, err)
			}
		}
		if g.state != atType || len(g.todo) != 0 || g.used != 0 {
			t.Fatalf("step %d: the guard ended in state %d, %v open, %d used", step, g.state, g.todo, g.used)
		}
	}
}

// TestReplyGuardRefuses: a header that announces more than the limit
// allows is refused when it arrives, before the payload; so are malformed
// and streamed replies.
func TestReplyGuardRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"2^31-1 elements", "*2147483647\r\n"},
		{"a map of 2^31-1 pairs", "%2147483647\r\n"},
		{"nested", "*2\r\n:1\r\n*100000\r\n"},
		{"a blob of 1 GB", "$1000000000\r\n"},
		{"blobs past the limit", "*3\r\n$600\r\n" + strings.Repeat("x", 600) + "\r\n$600\r\n"},
		{"a simple string past the limit", "+" + strings.Repeat("x", 2000)},
		{"a header too long", "*" + strings.Repeat("0", 40) + "1\r\n"},
		{"not a number", "*1x\r\n"},
		{"streamed", "*?\r\n"},
		{"unknown type", "@1\r\n"},
	} {
		g := replyGuard{limit: 1024}
		if err := g.scan([]byte(tc.in)); !errors.Is(err, ErrReplyTooLarge) {
			t.Errorf("%s: %v, want ErrReplyTooLarge", tc.name, err)
		}
	}
}

// FuzzReplyGuard: on any bytes, split anywhere, the guard neither panics
// nor decides otherwise than on the bytes whole.
func FuzzReplyGuard(f *testing.F) {
	for _, r := range validReplies {
		f.Add([]byte(r), uint8(1))
	}
	f.Add([]byte("*2147483647\r\n"), uint8(3))
	f.Fuzz(func(t *testing.T, in []byte, cut uint8) {
		whole := replyGuard{limit: 4096}
		werr := whole.scan(in)
		split := replyGuard{limit: 4096}
		i := min(int(cut), len(in))
		serr := split.scan(in[:i])
		if serr == nil {
			serr = split.scan(in[i:])
		}
		if (werr == nil) != (serr == nil) {
			t.Fatalf("whole: %v, split at %d: %v", werr, i, serr)
		}
	})
}

// TestMaxReply: over a real Redis, a store with MaxReply decides as any
// store does; a reply over it (an HGETALL of 200 KB) fails with
// ErrReplyTooLarge, and the store goes on deciding on a new connection.
func TestMaxReply(t *testing.T) {
	cfg := testConfig(nil)
	cfg.MaxReply = 64 << 10
	s := open(t, "redis://"+testenv.RedisAddr(t)+"/0", cfg)
	ctx := context.Background()
	l := sluice.Limit{Rate: 10, Period: time.Minute}
	if d, err := sluice.Take(ctx, s, "k", l, 1); err != nil || !d.Allowed {
		t.Fatalf("take: %+v, %v", d, err)
	}
	c := s.Client()
	big := cfg.KeyPrefix + "big"
	defer c.Do(ctx, c.B().Del().Key(big).Build())
	cmd := c.B().Hset().Key(big).FieldValue()
	for i := range 2000 {
		cmd = cmd.FieldValue(strconv.Itoa(i), strings.Repeat("v", 100))
	}
	if err := c.Do(ctx, cmd.Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, c.B().Hgetall().Key(big).Build()).Error(); !errors.Is(err, ErrReplyTooLarge) {
		t.Fatalf("HGETALL of 200 KB: %v, want ErrReplyTooLarge", err)
	}
	waitFor(t, hangBound, "a decision on a new connection", func() bool {
		d, err := sluice.Take(ctx, s, "k", l, 1)
		return err == nil && d.Allowed
	})
}

// TestMaxReplyHostile: a server that answers every command with a header
// of 2^31−1 elements (as a hostile peer region's "Redis" may) costs the
// store an error per call, not its memory: before, the client allocated
// for the header and the process died out of memory.
func TestMaxReplyHostile(t *testing.T) {
	fake := testenv.StartFakeRedis(t, testenv.HeaderBomb)
	cfg := testConfig(nil)
	cfg.MaxReply = 1 << 20
	s := open(t, "redis://"+fake.Addr, cfg)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 20 {
		if _, err := sluice.Take(context.Background(), s, "k", sluice.Limit{Rate: 10, Period: time.Minute}, 1); !errors.Is(err, ErrReplyTooLarge) {
			t.Fatalf("take: %v, want ErrReplyTooLarge", err)
		}
	}
	runtime.ReadMemStats(&after)
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<20 {
		t.Errorf("20 hostile replies allocated %d MB", grown>>20)
	}
}
