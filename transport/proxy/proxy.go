// Package proxy is sluice's reverse proxy: it decides each request before
// forwarding it to one upstream (respond.Guard, the step every HTTP way in
// takes) and answers 429 with the rate limit fields when it is over a limit.
// In queue mode (MaxDelay above zero) a request that a leaky_bucket limit
// admits with a turn ahead (sluice.Decision.Wait) is held until its turn
// and then forwarded, at most MaxWaiting at once; a request whose turn is
// further than MaxDelay, or that finds MaxWaiting held, is answered 429 at
// once, and so is a request over its limit: the proxy never holds a request
// it may then refuse. A leaky bucket's queue is burst / rate long, so a
// MaxDelay of at least that serves every request the bucket admits. Bodies
// stream through untouched; upstream failures give 502 and upstream
// timeouts 504.
package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/shed"
	"github.com/sluicehq/sluice/transport/respond"
)

// Config configures a Proxy. Start from DefaultConfig.
type Config struct {
	// Upstream is where allowed requests go: scheme, host and an optional
	// path prefix. Required.
	Upstream *url.URL
	// Identity turns requests into descriptors. Required.
	Identity *identity.Identity
	// Decider decides; *decide.Service is one. Required.
	Decider respond.Decider
	// Respond writes the rate limit fields and 429s. Nil:
	// respond.New(respond.Config{}), every field and 1 s of jitter.
	Respond *respond.Writer
	// MaxDelay is the longest a request a leaky_bucket admits is held for
	// its turn; a request whose turn is further is answered 429 at once.
	// Zero disables queueing: leaky_bucket turns are not waited for.
	// Default 0.
	MaxDelay time.Duration
	// MaxWaiting bounds the requests held at once; past it, 429. Zero or
	// negative means the default, 1024.
	MaxWaiting int
	// DialTimeout bounds connecting to the upstream (then 502). Default 5s.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for the upstream's response
	// headers once the request is sent (then 504). Bodies stream without a
	// time limit as long as they move. Default 30s.
	ResponseHeaderTimeout time.Duration
	// BodyIdleTimeout bounds the wait for the next bytes of a client's
	// request body, whether the proxy streams it upstream or never reads it
	// (a 429): a client that trickles or stalls its body is cut off then
	// and its connection closed. Default 30s.
	BodyIdleTimeout time.Duration
	// MaxIdleConns is how many idle connections to the upstream are kept
	// for reuse. Default 512.
	MaxIdleConns int
	// PreserveHost sends the client's Host header upstream instead of the
	// upstream's host.
	PreserveHost bool
	// Transport carries requests upstream. Nil: an http.Transport built
	// from the timeouts above; Close releases its idle connections.
	Transport http.RoundTripper
	// FailClosed answers 503 when the Decider returns an error; by default
	// the request is forwarded.
	FailClosed bool
	// Shed is the load shedder in front of the upstream: it measures the
	// upstream, keeps an adaptive limit on its concurrency and, when it is
	// saturated, sheds by the rules' priority (503 with Retry-After);
	// waiting requests are served first in, first out within a priority.
	// Elastic limits let a client past its own limit only while it has
	// room (shed.Gate.HasRoom). Nil: no shedding.
	Shed *shed.Gate
	// Logger receives upstream and Decider errors. Default slog.Default().
	Logger *slog.Logger
	// Sleep waits d or until ctx is done, returning ctx's error then: the
	// clock of queue mode. Default: a timer. Tests pass a fake.
	Sleep func(ctx context.Context, d time.Duration) error
}

// DefaultConfig returns a Config with every default filled in and no
// Upstream, Identity or Decider.
func DefaultConfig() Config {
	return Config{
		MaxDelay:              0,                // reject over-limit requests at once
		MaxWaiting:            1024,             // requests held at once in queue mode
		DialTimeout:           5 * time.Second,  // connect to the upstream, else 502
		ResponseHeaderTimeout: 30 * time.Second, // upstream response headers, else 504
		BodyIdleTimeout:       30 * time.Second, // between reads of a client's request body
		MaxIdleConns:          512,              // kept-alive upstream connections
		Logger:                slog.Default(),
		Sleep:                 sleep,
	}
}

// Proxy is an http.Handler that limits and forwards requests. It is safe
// for concurrent use and starts no goroutines of its own beyond those of
// its http.Transport.
type Proxy struct {
	guard      *respond.Guard
	maxDelay   time.Duration
	maxWaiting int64
	bodyIdle   time.Duration
	log        *slog.Logger
	sleep      func(context.Context, time.Duration) error
	rp         *httputil.ReverseProxy
	fw         *forwarder      // GET and HEAD without a body; nil when the Transport was given or the upstream is https
	own        *http.Transport // nil when the Transport was given
	waiting    atomic.Int64
	shed       *shed.Gate
}

var _ http.Handler = (*Proxy)(nil)

// New returns a Proxy for cfg; zero fields take DefaultConfig's values.
func New(cfg Config) (*Proxy, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	g, err := respond.NewGuard("proxy", respond.GuardConfig{
		Identity: cfg.Identity, Decider: cfg.Decider, Respond: cfg.Respond,
		FailClosed: cfg.FailClosed, Logger: cfg.Logger, Shed: cfg.Shed,
	})
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		guard:      g,
		maxDelay:   cfg.MaxDelay,
		maxWaiting: int64(cfg.MaxWaiting),
		bodyIdle:   cfg.BodyIdleTimeout,
		log:        cfg.Logger,
		sleep:      cfg.Sleep,
		shed:       cfg.Shed,
	}
	rt := cfg.Transport
	pool := &bufferPool{}
	if rt == nil {
		rt = p.ownTransport(cfg, pool)
	}
	p.rp = p.reverseProxy(cfg, rt, pool)
	return p, nil
}

// withDefaults returns cfg with every zero field set to its default, and
// refuses an upstream that is not an http or https URL with a host and a
// negative MaxDelay.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Upstream == nil || cfg.Upstream.Host == "" || (cfg.Upstream.Scheme != "http" && cfg.Upstream.Scheme != "https") {
		return cfg, fmt.Errorf("proxy: upstream %v: want an http or https URL with a host", cfg.Upstream)
	}
	if cfg.MaxDelay < 0 {
		return cfg, fmt.Errorf("proxy: MaxDelay %v is negative", cfg.MaxDelay)
	}
	def := DefaultConfig()
	if cfg.MaxWaiting <= 0 {
		cfg.MaxWaiting = def.MaxWaiting
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = def.DialTimeout
	}
	if cfg.ResponseHeaderTimeout <= 0 {
		cfg.ResponseHeaderTimeout = def.ResponseHeaderTimeout
	}
	if cfg.BodyIdleTimeout <= 0 {
		cfg.BodyIdleTimeout = def.BodyIdleTimeout
	}
	if cfg.MaxIdleConns <= 0 {
		cfg.MaxIdleConns = def.MaxIdleConns
	}
	if cfg.Logger == nil {
		cfg.Logger = def.Logger
	}
	if cfg.Sleep == nil {
		cfg.Sleep = def.Sleep
	}
	return cfg, nil
}

// ownTransport makes the Proxy's own transport to the upstream (p.own),
// and for an http:// upstream its forwarder (p.fw), which share pool, and
// returns the transport.
func (p *Proxy) ownTransport(cfg Config, pool *bufferPool) http.RoundTripper {
	d := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	p.own = &http.Transport{
		Proxy:                 nil, // the upstream is reached directly
		DialContext:           d.DialContext,
		MaxIdleConns:          cfg.MaxIdleConns,
		MaxIdleConnsPerHost:   cfg.MaxIdleConns,
		IdleConnTimeout:       idleConnTimeout,
		TLSHandshakeTimeout:   cfg.DialTimeout,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // bodies pass as they are
	}
	if cfg.Upstream.Scheme == "http" {
		p.fw = &forwarder{
			addr:       hostPort(cfg.Upstream),
			host:       cfg.Upstream.Host,
			upstream:   cfg.Upstream,
			preserve:   cfg.PreserveHost,
			dial:       d.DialContext,
			headerWait: cfg.ResponseHeaderTimeout,
			idleLife:   idleConnTimeout,
			maxIdle:    cfg.MaxIdleConns,
			bufs:       pool,
			failed:     p.upstreamError,
		}
	}
	return p.own
}

// reverseProxy returns the ReverseProxy that sends requests upstream
// through rt, for what the forwarder does not send.
func (p *Proxy) reverseProxy(cfg Config, rt http.RoundTripper, pool *bufferPool) *httputil.ReverseProxy {
	upstream, preserve := cfg.Upstream, cfg.PreserveHost
	return &httputil.ReverseProxy{
		// Rewrite takes the same URL and X-Forwarded fields as the
		// forwarder; ReverseProxy has removed the hop-by-hop fields and the
		// client's Forwarded and X-Forwarded fields from pr.Out.
		Rewrite: func(pr *httputil.ProxyRequest) {
			u := outURL(upstream, pr.In.URL)
			pr.Out.URL = &u
			pr.Out.Host = ""
			if preserve {
				pr.Out.Host = pr.In.Host
			}
			forwarded(pr.In, pr.Out.Header.Set)
		},
		Transport: rt,
		// An upstream's status below 100 is a 502, not a panic in
		// WriteHeader.
		ModifyResponse: checkStatus,
		// FlushInterval 0: ReverseProxy itself flushes every write of a
		// streamed response (no Content-Length, or text/event-stream) at
		// once, and lets responses of known length go out whole; -1 would
		// also flush their headers on their own, one more write per
		// response (a quarter of the proxy's CPU in the benchmark).
		FlushInterval: 0,
		BufferPool:    pool,
		ErrorHandler:  p.upstreamError,
		ErrorLog:      slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
}

// Close closes the idle upstream connections of the Proxy's own transport.
// Requests in flight finish; the Proxy stays usable, though without
// keeping connections to the upstream idle for its GET and HEAD requests.
func (p *Proxy) Close() error {
	if p.own != nil {
		p.own.CloseIdleConnections()
	}
	if p.fw != nil {
		p.fw.close()
	}
	return nil
}

// Waiting returns how many requests are held for their turn right now.
func (p *Proxy) Waiting() int { return int(p.waiting.Load()) }

// ServeHTTP decides r and forwards it, holds it for its turn and then
// forwards it, or answers 429.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody {
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(p.bodyIdle)) == nil {
			r.Body = &idleBody{ReadCloser: r.Body, rc: rc, idle: p.bodyIdle}
		}
	}
	resp, pass := p.guard.Hold(w, r)
	if !pass {
		return // answered, or the client is gone
	}
	// Concurrency slots come back when the response ends, whether it
	// ended well, the upstream failed, the client left or a handler
	// panicked (ReverseProxy aborts with http.ErrAbortHandler).
	defer resp.Done(context.WithoutCancel(r.Context()))
	if resp == nil || p.maxDelay == 0 {
		p.forward(w, r, resp)
		return
	}
	wait := queueWait(resp)
	if wait == 0 {
		p.forward(w, r, resp)
		return
	}
	// Admitted by a leaky_bucket with a turn ahead: hold it until then, or
	// refuse it now if its turn is too far or the queue is full.
	if wait > p.maxDelay {
		p.tooFar(w, resp)
		return
	}
	if n := p.waiting.Add(1); n > p.maxWaiting {
		p.waiting.Add(-1)
		p.tooFar(w, resp)
		return
	}
	err := p.sleep(r.Context(), wait)
	p.waiting.Add(-1)
	if err != nil {
		return // the client gave up waiting
	}
	p.forward(w, r, resp)
}

// forward sends r upstream behind the load shedder, if any (see send).
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, resp *decide.Response) {
	if p.shed == nil {
		p.send(w, r)
		return
	}
	p.guard.Writer().Gated(p.shed, respond.Priority(resp), w, r, http.HandlerFunc(p.send))
}

// Shed returns the Proxy's load shedder, nil without one.
func (p *Proxy) Shed() *shed.Gate { return p.shed }

// send sends r upstream and its response back: GET and HEAD without a
// body through the forwarder, the others (bodies, upgrades, an https
// upstream or a Transport of the Config) through httputil.ReverseProxy.
func (p *Proxy) send(w http.ResponseWriter, r *http.Request) {
	if p.fw != nil && eligible(r) {
		p.fw.ServeHTTP(w, r)
		return
	}
	p.rp.ServeHTTP(w, r)
}

// idleConnTimeout is how long a connection to the upstream is kept idle
// for reuse.
const idleConnTimeout = 90 * time.Second

// hostPort returns the address to dial for u: its host, with the scheme's
// port when it names none.
func hostPort(u *url.URL) string {
	if port := u.Port(); port != "" {
		return net.JoinHostPort(u.Hostname(), port)
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// tooFar answers 429 for a request a leaky_bucket admitted with a turn the
// proxy will not wait for: it is told to retry after its turn.
func (p *Proxy) tooFar(w http.ResponseWriter, resp *decide.Response) {
	st := make([]decide.Status, len(resp.Statuses))
	copy(st, resp.Statuses)
	for i := range st {
		if st[i].Decision.Wait > 0 && !st[i].Shadow {
			st[i].Code = decide.OverLimit
			st[i].Decision.RetryAfter = st[i].Decision.Wait
		}
	}
	p.guard.Writer().Deny(w, &decide.Response{Overall: decide.OverLimit, Statuses: st})
}

// idleBody is a client's request body that must keep moving: each read
// has idle to bring bytes, and once the body is read the deadline is
// lifted, so that the server's watch for a closed connection does not
// cancel a request whose upstream answers slowly.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
}

func (b *idleBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.idle)) // supported: New checked
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// queueWait returns the longest Wait of resp's enforced limits: how long a
// leaky_bucket asks an admitted request to wait for its turn.
func queueWait(resp *decide.Response) time.Duration {
	var d time.Duration
	for i := range resp.Statuses {
		if st := &resp.Statuses[i]; !st.Shadow {
			d = max(d, st.Decision.Wait)
		}
	}
	return d
}

// upstreamError answers for a request the upstream did not answer: 504
// when it timed out, 502 otherwise.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client is gone: nobody to answer
	}
	status := http.StatusBadGateway
	if isTimeout(err) {
		status = http.StatusGatewayTimeout
	}
	p.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream failed",
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", status), slog.String("error", err.Error()))
	http.Error(w, http.StatusText(status), status)
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// bufferPool recycles the 32 KiB copy buffers of the reverse proxy. It
// keeps array pointers, which a buffer converts back to without an
// allocation (a *[]byte would cost one per Put).
type bufferPool struct{ p sync.Pool }

const bufferSize = 32 << 10

func (b *bufferPool) Get() []byte {
	if a, ok := b.p.Get().(*[bufferSize]byte); ok {
		return a[:]
	}
	return make([]byte, bufferSize)
}

func (b *bufferPool) Put(buf []byte) {
	if len(buf) == bufferSize {
		b.p.Put((*[bufferSize]byte)(buf))
	}
}
