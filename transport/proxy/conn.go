package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// upstreamTransport is an http.RoundTripper for a plain-HTTP/1.1 upstream
// that does each round trip in the calling goroutine on a pooled
// connection: no reader and writer goroutines per connection as
// http.Transport has, which halves the proxy's CPU per request on small
// requests. Requests it does not handle (https, protocol upgrades) go to
// fallback.
//
// A connection goes back to the pool only when its response body was read
// to the end and the upstream did not ask to close it. A pooled connection
// the upstream closed in the meantime fails its next request before any
// response byte; such a request is retried once on a new connection when it
// has no body. Connections idle longer than idleTimeout are not reused.
type upstreamTransport struct {
	dialer        *net.Dialer
	headerTimeout time.Duration
	idleTimeout   time.Duration
	maxIdle       int
	fallback      *http.Transport

	mu   sync.Mutex
	idle []*upstreamConn // most recently used last
}

type upstreamConn struct {
	c        net.Conn
	br       *bufio.Reader // reads through the conn's Read, which counts
	bw       *bufio.Writer
	read     int64 // bytes read from c so far
	lastUsed time.Time
}

// Read reads from the connection, counting the bytes.
func (uc *upstreamConn) Read(p []byte) (int, error) {
	n, err := uc.c.Read(p)
	uc.read += int64(n)
	return n, err
}

var _ http.RoundTripper = (*upstreamTransport)(nil)

// RoundTrip sends req and returns the response, whose body the caller must
// close.
func (t *upstreamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.Header.Get("Upgrade") != "" {
		return t.fallback.RoundTrip(req)
	}
	for attempt := 0; ; attempt++ {
		uc, reused, err := t.conn(req.Context(), req.URL.Host)
		if err != nil {
			return nil, err
		}
		before := uc.read
		resp, err := t.roundTrip(uc, req)
		if err == nil {
			return resp, nil
		}
		uc.c.Close()
		if reused && attempt == 0 && uc.read == before && stale(err) && (req.Body == nil || req.Body == http.NoBody) && req.Context().Err() == nil {
			continue
		}
		return nil, err
	}
}

// stale reports whether err, met before any response byte, is what a
// request on a connection the upstream had closed meets.
func stale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// conn returns a pooled connection to addr, or a new one.
func (t *upstreamTransport) conn(ctx context.Context, addr string) (*upstreamConn, bool, error) {
	now := time.Now()
	t.mu.Lock()
	for len(t.idle) > 0 {
		uc := t.idle[len(t.idle)-1]
		t.idle = t.idle[:len(t.idle)-1]
		if now.Sub(uc.lastUsed) < t.idleTimeout {
			t.mu.Unlock()
			return uc, true, nil
		}
		uc.c.Close()
	}
	t.mu.Unlock()
	c, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	uc := &upstreamConn{c: c, bw: bufio.NewWriterSize(c, 4096)}
	uc.br = bufio.NewReaderSize(uc, 4096)
	return uc, false, nil
}

// put returns uc to the pool.
func (t *upstreamTransport) put(uc *upstreamConn) {
	uc.lastUsed = time.Now()
	t.mu.Lock()
	if len(t.idle) < t.maxIdle {
		t.idle = append(t.idle, uc)
		uc = nil
	}
	t.mu.Unlock()
	if uc != nil {
		uc.c.Close()
	}
}

// CloseIdleConnections closes the pooled connections.
func (t *upstreamTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, uc := range idle {
		uc.c.Close()
	}
	t.fallback.CloseIdleConnections()
}

var longAgo = time.Unix(1, 0)

func (t *upstreamTransport) roundTrip(uc *upstreamConn, req *http.Request) (*http.Response, error) {
	// A client that leaves unblocks the connection's reads and writes.
	stop := context.AfterFunc(req.Context(), func() { _ = uc.c.SetDeadline(longAgo) })
	fail := func(err error) (*http.Response, error) {
		stop()
		if cerr := req.Context().Err(); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	if err := req.Write(uc.bw); err != nil {
		return fail(err)
	}
	if err := uc.bw.Flush(); err != nil {
		return fail(err)
	}
	if t.headerTimeout > 0 {
		if err := uc.c.SetReadDeadline(time.Now().Add(t.headerTimeout)); err != nil {
			return fail(err)
		}
	}
	var resp *http.Response
	for {
		var err error
		resp, err = http.ReadResponse(uc.br, req)
		if err != nil {
			return fail(err)
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		resp.Body.Close() // 1xx: no body; the final response follows
	}
	if t.headerTimeout > 0 {
		if err := uc.c.SetReadDeadline(time.Time{}); err != nil {
			resp.Body.Close()
			return fail(err)
		}
	}
	b := &upstreamBody{rc: resp.Body, uc: uc, t: t, stop: stop, keep: !resp.Close}
	if resp.Body == http.NoBody {
		b.done = true
	}
	resp.Body = b
	return resp, nil
}

// upstreamBody returns its connection to the pool when read to the end and
// closed.
type upstreamBody struct {
	rc     io.ReadCloser
	uc     *upstreamConn
	t      *upstreamTransport
	stop   func() bool
	keep   bool
	done   bool
	closed bool
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.done = true
	}
	return n, err
}

func (b *upstreamBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	err := b.rc.Close()
	if b.stop() && b.done && b.keep && err == nil {
		b.t.put(b.uc)
		return nil
	}
	b.uc.c.Close()
	return err
}
