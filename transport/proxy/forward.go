package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"time"
)

// forwarder carries the requests most traffic is made of, GET and HEAD
// without a body or an upgrade to a plain-http upstream, over its own pool
// of kept-alive connections, writing the request and reading the response
// in the handler's goroutine. http.Transport, which the other requests take
// (through httputil.ReverseProxy), hands each request to a writing and a
// reading goroutine per connection and arms a timer and a cancellable
// context for it: about 40 allocations and a quarter of the proxy's CPU per
// request that a bodyless request does not need. A request without a body
// is idempotent and has nothing to stream upstream, so a connection the
// upstream closed while idle is redialed once, as http.Transport does.
//
// It is safe for concurrent use.
type forwarder struct {
	addr       string // host:port dialed
	host       string // Host sent unless preserveHost
	upstream   *url.URL
	preserve   bool
	dial       func(ctx context.Context, network, addr string) (net.Conn, error)
	headerWait time.Duration // ResponseHeaderTimeout
	idleLife   time.Duration // an idle connection older is closed, not reused
	maxIdle    int
	bufs       *bufferPool
	failed     func(w http.ResponseWriter, r *http.Request, err error)

	mu     sync.Mutex
	idle   []*upConn // most recently used last
	closed bool
}

// upConn is a connection to the upstream with its buffers.
type upConn struct {
	net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	since     time.Time // idle since, on the idle list
	interrupt func()    // sets the deadlines in the past: the client left
}

// longAgo is a deadline in the past: it interrupts blocked reads and writes.
var longAgo = time.Unix(1, 0)

// eligible reports whether r takes the forwarder: a GET or HEAD with no
// body that asks for no protocol upgrade.
func eligible(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if r.Body != nil && r.Body != http.NoBody || r.ContentLength != 0 {
		return false
	}
	_, upgrade := r.Header["Upgrade"]
	return !upgrade
}

// ServeHTTP forwards r and copies the upstream's response to w; upstream
// failures go to f.failed (502 or 504). A client that leaves interrupts
// the exchange.
func (f *forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	c, reused := f.get()
	for {
		if c == nil {
			var err error
			if c, err = f.connect(ctx); err != nil {
				f.failed(w, r, err)
				return
			}
		}
		stop := context.AfterFunc(ctx, c.interrupt)
		resp, err := f.roundTrip(ctx, c, r)
		if err != nil {
			stop()
			c.Close()
			c = nil
			if !reused || ctx.Err() != nil || isTimeout(err) {
				f.failed(w, r, err)
				return
			}
			reused = false // the upstream closed an idle connection: dial once
			continue
		}
		whole := f.copyResponse(w, resp)
		if stop() && whole && !resp.Close && c.br.Buffered() == 0 {
			f.put(c)
		} else {
			c.Close()
		}
		if !whole {
			// The response is cut short: abort the client's connection so
			// that it does not take a truncated body for a whole one.
			panic(http.ErrAbortHandler)
		}
		return
	}
}

// roundTrip writes r on c and reads the response's headers, within
// f.headerWait of sending. The caller has c's deadline set in the past
// once ctx is done.
func (f *forwarder) roundTrip(ctx context.Context, c *upConn, r *http.Request) (*http.Response, error) {
	if err := setReadDeadline(ctx, c, time.Now().Add(f.headerWait)); err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	if err := f.writeRequest(c.bw, r); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	if _, err := c.br.Peek(1); err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	// At most 5 informational (1xx) responses before the final one, as
	// http.Transport; they are not passed on.
	for range 6 {
		resp, err := http.ReadResponse(c.br, r)
		if err != nil {
			return nil, fmt.Errorf("read response: %w", err)
		}
		if err := checkStatus(resp); err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("read response: %w", err)
		}
		if resp.StatusCode >= 200 {
			return resp, setReadDeadline(ctx, c, time.Time{})
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, errors.New("read response: 101 Switching Protocols to a request that asked for no upgrade")
		}
	}
	return nil, errors.New("read response: more than 5 informational responses")
}

// setReadDeadline sets c's read deadline to t, unless ctx is done: then
// the deadline stays in the past where the client's leaving set it, even
// if it did so just before.
func setReadDeadline(ctx context.Context, c *upConn, t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return c.SetDeadline(longAgo) // the context's error is set before its AfterFunc runs
	}
	return nil
}

// writeRequest writes r to bw as the upstream is to receive it: the
// upstream's path prefix and query joined to r's (outURL), the Host of the
// upstream (or r's with PreserveHost), r's end-to-end headers and the
// X-Forwarded fields (forwarded), then flushes.
func (f *forwarder) writeRequest(bw *bufio.Writer, r *http.Request) error {
	u := outURL(f.upstream, r.URL)
	host := f.host
	if f.preserve {
		host = r.Host
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(u.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	conn := r.Header["Connection"]
	for k, vv := range r.Header {
		if hopByHop(k, conn) || forwardedField(k) || k == "Content-Length" {
			continue
		}
		for _, v := range vv {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if teTrailers(r.Header["Te"]) {
		bw.WriteString("Te: trailers\r\n") // hop-by-hop, but gRPC needs it passed on
	}
	forwarded(r, func(k, v string) {
		bw.WriteString(k)
		bw.WriteString(": ")
		bw.WriteString(v)
		bw.WriteString("\r\n")
	})
	bw.WriteString("\r\n")
	return bw.Flush()
}

// copyResponse writes resp's status, end-to-end headers, body and trailers
// to w, flushing each read of a body of unknown length or of an event
// stream as it arrives. It reports whether the body was copied whole.
func (f *forwarder) copyResponse(w http.ResponseWriter, resp *http.Response) bool {
	defer resp.Body.Close()
	h := w.Header()
	conn := resp.Header["Connection"]
	for k, vv := range resp.Header {
		if hopByHop(k, conn) {
			continue
		}
		if old, ok := h[k]; ok {
			h[k] = append(old, vv...)
		} else {
			h[k] = vv
		}
	}
	w.WriteHeader(resp.StatusCode)
	if resp.Body == http.NoBody {
		return true
	}
	var flush func() error
	if resp.ContentLength < 0 || isEventStream(resp.Header) {
		flush = http.NewResponseController(w).Flush
	}
	buf := f.bufs.Get()
	defer f.bufs.Put(buf)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return false
			}
			if flush != nil {
				if err := flush(); err != nil {
					return false
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return false
		}
	}
	for k, vv := range resp.Trailer {
		h[http.TrailerPrefix+k] = vv
	}
	return true
}

// connect dials the upstream.
func (f *forwarder) connect(ctx context.Context) (*upConn, error) {
	nc, err := f.dial(ctx, "tcp", f.addr)
	if err != nil {
		return nil, err
	}
	c := &upConn{Conn: nc, br: bufio.NewReaderSize(nc, 4<<10), bw: bufio.NewWriterSize(nc, 4<<10)}
	c.interrupt = func() { _ = nc.SetDeadline(longAgo) }
	return c, nil
}

// get takes the most recently used idle connection, closing those idle
// longer than f.idleLife; reused is false when there is none.
func (f *forwarder) get() (c *upConn, reused bool) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for n := len(f.idle); n > 0; n = len(f.idle) {
		c = f.idle[n-1]
		f.idle[n-1] = nil
		f.idle = f.idle[:n-1]
		if now.Sub(c.since) < f.idleLife {
			return c, true
		}
		c.Close()
	}
	return nil, false
}

// put keeps c for reuse, or closes it when f.maxIdle are idle already or f
// is closed. The oldest idle connection is closed if it has outlived
// f.idleLife, so that connections left idle do not stay open for ever.
func (f *forwarder) put(c *upConn) {
	c.since = time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.idle) > 0 && c.since.Sub(f.idle[0].since) >= f.idleLife {
		f.idle[0].Close()
		f.idle = append(f.idle[:0], f.idle[1:]...)
	}
	if f.closed || len(f.idle) >= f.maxIdle {
		c.Close()
		return
	}
	f.idle = append(f.idle, c)
}

// close closes the idle connections; connections in use are closed when
// their request ends.
func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.idle {
		c.Close()
	}
	f.idle, f.closed = nil, true
}

// hopByHop reports whether the header field k (canonical) concerns only
// one connection (RFC 9110 section 7.6.1): Connection itself, the fields
// it names (conn, the Connection field's values) and the fields RFC 9110
// and RFC 9112 define as such.
func hopByHop(k string, conn []string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	for _, v := range conn {
		for name := range strings.SplitSeq(v, ",") {
			if name = textproto.TrimString(name); name != "" && strings.EqualFold(name, k) {
				return true
			}
		}
	}
	return false
}

// teTrailers reports whether a TE field's values name trailers.
func teTrailers(te []string) bool {
	for _, v := range te {
		for t := range strings.SplitSeq(v, ",") {
			if i := strings.IndexByte(t, ';'); i >= 0 {
				t = t[:i]
			}
			if strings.EqualFold(textproto.TrimString(t), "trailers") {
				return true
			}
		}
	}
	return false
}

// forwardedField reports whether k is one of the fields forwarded sets:
// a client's own are replaced, never passed on as they came.
func forwardedField(k string) bool {
	switch k {
	case "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	}
	return false
}

// forwarded calls set with the X-Forwarded fields the upstream receives
// for r, on either way to it: X-Forwarded-For is the client's own value
// (its list of proxies, which the identity file's trusted_proxies decide
// whether to believe) with the address of the peer appended, as nginx's
// $proxy_add_x_forwarded_for; X-Forwarded-Host is the Host the client
// asked for and X-Forwarded-Proto its scheme. A Forwarded field (RFC 7239)
// is dropped, as httputil.ReverseProxy's Rewrite does.
func forwarded(r *http.Request, set func(k, v string)) {
	if peer, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := r.Header["X-Forwarded-For"]; len(prior) > 0 {
			peer = strings.Join(prior, ", ") + ", " + peer
		}
		set("X-Forwarded-For", peer)
	}
	if r.Host != "" {
		set("X-Forwarded-Host", r.Host)
	}
	if r.TLS != nil {
		set("X-Forwarded-Proto", "https")
	} else {
		set("X-Forwarded-Proto", "http")
	}
}

// outURL returns the URL in's request takes upstream: up's scheme and
// host, up's path with in's joined to it by one slash, and both queries.
func outURL(up, in *url.URL) url.URL {
	out := url.URL{Scheme: up.Scheme, Host: up.Host, Path: joinPath(up.Path, in.Path)}
	if up.RawPath != "" || in.RawPath != "" {
		out.RawPath = joinPath(up.EscapedPath(), in.EscapedPath())
	}
	switch {
	case up.RawQuery == "":
		out.RawQuery = in.RawQuery
	case in.RawQuery == "":
		out.RawQuery = up.RawQuery
	default:
		out.RawQuery = up.RawQuery + "&" + in.RawQuery
	}
	return out
}

// joinPath joins a and b with exactly one slash between them.
func joinPath(a, b string) string {
	if a == "" {
		if b == "" {
			return "/"
		}
		return b
	}
	as, bs := strings.HasSuffix(a, "/"), strings.HasPrefix(b, "/")
	switch {
	case as && bs:
		return a + b[1:]
	case !as && !bs && b != "":
		return a + "/" + b
	}
	return a + b
}

// checkStatus refuses a response whose status net/http reads but cannot
// write: 000 to 099.
func checkStatus(resp *http.Response) error {
	if resp.StatusCode < 100 {
		return fmt.Errorf("status %03d", resp.StatusCode)
	}
	return nil
}

// isEventStream reports whether h's Content-Type is text/event-stream.
func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// isTimeout reports whether err is a timeout: the upstream was too slow.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
