package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"unsafe"

	"github.com/redis/rueidis"
)

// ErrReplyTooLarge is the error of a connection whose Redis sent a reply
// larger than Config.MaxReply (or a malformed one): the connection is
// closed before the client reads the reply, and the calls waiting on it
// fail with it.
var ErrReplyTooLarge = errors.New("redis reply over Config.MaxReply, or malformed")

// elementCost is what the client holds for each element of an aggregate
// reply, besides the element's own bytes: a header of n elements makes it
// allocate n of these at once.
const elementCost = int64(unsafe.Sizeof(rueidis.RedisMessage{}))

// maxLine bounds a RESP header line (a length or a count) in bytes.
const maxLine = 32

// boundDial returns dial, or rueidis's own dial when nil, with every
// connection it makes reading replies through a guard of limit bytes.
func boundDial(dial func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error), limit int64) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	return func(ctx context.Context, dst string, d *net.Dialer, t *tls.Config) (net.Conn, error) {
		var c net.Conn
		var err error
		switch {
		case dial != nil:
			c, err = dial(ctx, dst, d, t)
		case t != nil:
			c, err = (&tls.Dialer{NetDialer: d, Config: t}).DialContext(ctx, "tcp", dst)
		default:
			c, err = d.DialContext(ctx, "tcp", dst)
		}
		if err != nil {
			return nil, err
		}
		return &boundedConn{Conn: c, g: replyGuard{limit: limit}}, nil
	}
}

// boundedConn is a connection whose reads pass through a replyGuard: a
// reply over the limit fails the read, and the connection, before the
// client has seen a byte of it.
type boundedConn struct {
	net.Conn
	g   replyGuard
	err error
}

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if gerr := c.g.scan(p[:n]); gerr != nil {
		c.err = gerr
		_ = c.Conn.Close()
		return 0, gerr
	}
	return n, err
}

// replyGuard follows a stream of RESP2/RESP3 replies and refuses one
// whose size, counted as it arrives, would pass limit: its bytes, and
// elementCost for each element an aggregate header announces (checked
// when the header arrives, before the client allocates for it). It
// refuses streamed (chunked) types, which Redis does not send. The zero
// value is not usable; limit must be positive.
type replyGuard struct {
	limit int64
	used  int64   // what the reply in progress costs so far
	todo  []int64 // per open aggregate, the elements still to come
	state guardState
	kind  byte   // the type of the line being read
	line  []byte // a header line so far (without its type byte)
	blob  int64  // bytes of a blob's payload (and CRLF) still to come
}

type guardState uint8

const (
	atType guardState = iota // the next byte is a value's type
	inLine                   // reading a line up to '\n'
	inBlob                   // skipping a blob's payload
)

// scan follows p, the next bytes of the stream, and returns an
// ErrReplyTooLarge error at the first reply over the limit.
func (g *replyGuard) scan(p []byte) error {
	for len(p) > 0 {
		switch g.state {
		case atType:
			g.kind, g.line, g.state = p[0], g.line[:0], inLine
			p = p[1:]
			if err := g.charge(1); err != nil {
				return err
			}
		case inLine:
			i := 0
			for i < len(p) && p[i] != '\n' {
				i++
			}
			if err := g.charge(int64(min(i+1, len(p)))); err != nil {
				return err
			}
			if g.header() && len(g.line)+i > maxLine {
				return fmt.Errorf("%w: a header of over %d bytes", ErrReplyTooLarge, maxLine)
			}
			if g.header() {
				g.line = append(g.line, p[:i]...)
			}
			if i == len(p) {
				return nil
			}
			p = p[i+1:]
			if err := g.endLine(); err != nil {
				return err
			}
		case inBlob:
			n := min(int64(len(p)), g.blob)
			g.blob -= n
			p = p[n:]
			if g.blob == 0 {
				g.state = atType
				g.done()
			}
		}
	}
	return nil
}

// header reports whether the line being read is a length or a count.
func (g *replyGuard) header() bool {
	switch g.kind {
	case '$', '!', '=', '*', '~', '>', '%', '|':
		return true
	}
	return false
}

// charge adds n to the reply's cost.
func (g *replyGuard) charge(n int64) error {
	g.used += n
	if g.used > g.limit {
		return fmt.Errorf("%w: more than %d bytes", ErrReplyTooLarge, g.limit)
	}
	return nil
}

// endLine acts on a complete line: a simple value ends; a blob's payload
// or an aggregate's elements follow.
func (g *replyGuard) endLine() error {
	g.state = atType
	switch g.kind {
	case '+', '-', ':', ',', '(', '#', '_':
		g.done()
		return nil
	case '$', '!', '=', '*', '~', '>', '%', '|':
	default:
		return fmt.Errorf("%w: type %q", ErrReplyTooLarge, g.kind)
	}
	n, ok := parseCount(g.line)
	if !ok {
		return fmt.Errorf("%w: header %q", ErrReplyTooLarge, g.line)
	}
	if n < 0 { // a RESP2 null
		g.done()
		return nil
	}
	switch g.kind {
	case '$', '!', '=':
		if err := g.charge(n + 2); err != nil {
			return err
		}
		g.blob, g.state = n+2, inBlob
		return nil
	case '%':
		n *= 2
	case '|': // an attribute's pairs, then the value it is of: one value of the parent's
		n = n*2 + 1
	}
	if n > (g.limit-g.used)/elementCost {
		return fmt.Errorf("%w: %d elements", ErrReplyTooLarge, n)
	}
	if err := g.charge(n * elementCost); err != nil {
		return err
	}
	if n == 0 {
		g.done()
		return nil
	}
	g.todo = append(g.todo, n)
	return nil
}

// done ends a value: it counts against its aggregate, and a reply's end
// resets the cost.
func (g *replyGuard) done() {
	for len(g.todo) > 0 {
		top := len(g.todo) - 1
		if g.todo[top]--; g.todo[top] > 0 {
			return
		}
		g.todo = g.todo[:top]
	}
	g.used = 0
}

// parseCount parses a header's decimal count, ending in '\r'; -1 is a
// null, "?" (a streamed type) and anything else malformed.
func parseCount(b []byte) (int64, bool) {
	if len(b) < 2 || b[len(b)-1] != '\r' {
		return 0, false
	}
	b = b[:len(b)-1]
	if string(b) == "-1" {
		return -1, true
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' || n > 1<<50 {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
