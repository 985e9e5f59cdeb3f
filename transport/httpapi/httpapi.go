// Package httpapi serves sluice over HTTP: the JSON decision API, whose
// bodies are Envoy's RateLimitRequest and RateLimitResponse in protobuf's
// canonical JSON (so HTTP and gRPC callers see the same answers), Envoy
// ratelimit's own /json endpoint, health and readiness, the rules in force,
// and Prometheus metrics. More handlers (forward-auth, say) are mounted with
// Handle.
//
// Routes:
//
//	POST /v1/decide    decide; 200 with the verdict in the body
//	POST /json         decide as Envoy's ratelimit does: 429 when over the limit
//	GET  /healthz      200 while the process serves
//	GET  /readyz       200 once rules are loaded, 503 before and while draining
//	GET  /healthcheck  Envoy ratelimit's health check: 200 "OK", 500 when not ready
//	GET  /v1/rules     the rules in force, as JSON
//	GET  /metrics      Prometheus metrics of the registry given
//
// Ops serves the same health, readiness and metrics alone, for a listener
// of their own.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/internal/httpjson"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/transport/respond"
)

// RateLimiter answers Envoy's rate limit requests; *envoyrls.Server is one.
// Errors are gRPC status errors: InvalidArgument for a bad request.
type RateLimiter interface {
	ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
}

// Config configures the HTTP API.
type Config struct {
	// RateLimiter decides. Required.
	RateLimiter RateLimiter
	// Rules returns the rules in force, or nil until they are loaded.
	// Required.
	Rules func() *rules.Set
	// Ops configures the operational endpoints the API serves beside its
	// own (/readyz, /metrics...); its Rules is Config.Rules.
	Ops OpsConfig
	// MaxBodyBytes bounds request bodies; larger ones get 413. Zero means
	// the default.
	MaxBodyBytes int64
	// BodyTimeout bounds the time a request's body may take to arrive, on
	// every route (forward-auth's mounted with Handle too): a client that
	// trickles a body is cut off then, and its connection closed, instead
	// of holding it for ever. Zero means the default.
	BodyTimeout time.Duration
}

// MaxHeaderBytes is the most request header bytes sluice's HTTP servers
// (sluice serve's API and forward-auth, sluice proxy) read
// (http.Server.MaxHeaderBytes): a request with more is answered 431
// before any of it is kept. Go's default is 1 MiB; a real request's
// headers are a few KiB.
const MaxHeaderBytes = 64 << 10

// DefaultConfig returns a Config with the defaults; RateLimiter and Rules
// remain to be set.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes: 1 << 20,          // 1 MiB: Envoy's requests are a few hundred bytes
		BodyTimeout:  10 * time.Second, // for a body of at most 1 MiB from a live client
	}
}

// Handler is the HTTP API. It is safe for concurrent use, including Handle
// while serving.
type Handler struct {
	cfg Config
	mux *http.ServeMux
	ops *Ops // health, readiness, /healthcheck and /metrics
}

// New returns the API's handler.
func New(cfg Config) (*Handler, error) {
	if cfg.RateLimiter == nil || cfg.Rules == nil {
		return nil, errors.New("httpapi: RateLimiter and Rules are required")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultConfig().MaxBodyBytes
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultConfig().BodyTimeout
	}
	cfg.Ops.Rules = cfg.Rules
	ops, err := NewOps(cfg.Ops)
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), ops: ops}
	h.mux.HandleFunc("POST /v1/decide", func(w http.ResponseWriter, r *http.Request) { h.decide(w, r, false) })
	h.mux.HandleFunc("POST /json", func(w http.ResponseWriter, r *http.Request) { h.decide(w, r, true) })
	h.mux.HandleFunc("GET /v1/rules", h.rules)
	ops.mount(h.mux)
	return h, nil
}

// Handle mounts handler at pattern, in http.ServeMux's syntax ("GET
// /v1/auth"). It returns an error for a pattern that is invalid or
// conflicts with a route already mounted.
func (h *Handler) Handle(pattern string, handler http.Handler) error {
	return handle(h.mux, pattern, handler)
}

// Drain makes /readyz answer 503 and /healthcheck 500 so that load
// balancers stop sending requests before the server shuts down. Other
// routes keep answering.
func (h *Handler) Drain() { h.ops.Drain() }

// ServeHTTP implements http.Handler. A request with a body gets a read
// deadline of BodyTimeout: past it, reading the body fails and the server
// closes the connection, whether the route reads the body or the server
// would discard it after the answer.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody {
		// A writer without deadlines (not a server connection) has
		// nothing to bound.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(h.cfg.BodyTimeout))
	}
	h.mux.ServeHTTP(w, r)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// decide answers POST /v1/decide and, with envoyStatus, POST /json: 429
// when over the limit, as Envoy's ratelimit service answers on /json.
func (h *Handler) decide(w http.ResponseWriter, r *http.Request, envoyStatus bool) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	body, err := readAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes), (*bp)[:0])
	*bp = body[:0]
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			httpjson.Error(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", mbe.Limit))
			return
		}
		httpjson.Error(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	req, err := decodeRequest(body)
	if err != nil {
		httpjson.Error(w, http.StatusBadRequest, err.Error())
		return
	}
	resp, err := h.cfg.RateLimiter.ShouldRateLimit(r.Context(), req)
	if err != nil {
		st := status.Convert(err)
		code := http.StatusInternalServerError
		switch st.Code() {
		case codes.InvalidArgument:
			code = http.StatusBadRequest
		case codes.DeadlineExceeded, codes.Canceled, codes.Unavailable:
			code = http.StatusServiceUnavailable
		}
		httpjson.Error(w, code, st.Message())
		return
	}
	ob := bufPool.Get().(*[]byte)
	defer bufPool.Put(ob)
	out, err := encodeResponse((*ob)[:0], resp)
	*ob = out[:0]
	if err != nil {
		httpjson.Error(w, http.StatusInternalServerError, err.Error())
		return
	}
	setHeaders(w.Header(), resp)
	w.Header()["Content-Type"] = []string{"application/json"}
	if envoyStatus && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out) //nolint:errcheck // the client went away; nothing to do
}

// setHeaders adds resp's response_headers_to_add to h: the rate limit
// headers travel as HTTP headers too.
func setHeaders(h http.Header, resp *rlsv3.RateLimitResponse) {
	hvs := resp.GetResponseHeadersToAdd()
	if len(hvs) == 0 {
		return
	}
	// One slice for all the values rather than one each.
	vals := make([]string, len(hvs))
	for i, hv := range hvs {
		k := respond.CanonicalKey(hv.GetKey())
		if old, ok := h[k]; ok {
			h[k] = append(old, hv.GetValue())
			continue
		}
		vals[i] = hv.GetValue()
		h[k] = vals[i : i+1 : i+1]
	}
}

// encodeResponse appends resp to b in protobuf's canonical JSON, compact.
func encodeResponse(b []byte, resp *rlsv3.RateLimitResponse) ([]byte, error) {
	if out, ok := appendResponse(b, resp); ok {
		return out, nil
	}
	// A field the fast encoder does not know: protojson, whose whitespace
	// varies from build to build on purpose, compacted so that callers get
	// the same bytes from every build.
	js, err := protojson.Marshal(resp)
	if err != nil {
		return b, fmt.Errorf("encode RateLimitResponse: %w", err)
	}
	buf := bytes.NewBuffer(b)
	if err := json.Compact(buf, js); err != nil {
		return b, fmt.Errorf("encode RateLimitResponse: %w", err)
	}
	return buf.Bytes(), nil
}

// readAll appends all of r to b, as io.ReadAll does, reusing b's capacity.
func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

func (h *Handler) rules(w http.ResponseWriter, _ *http.Request) {
	set := h.cfg.Rules()
	if set == nil {
		httpjson.Error(w, http.StatusServiceUnavailable, "rules not loaded")
		return
	}
	httpjson.Write(w, http.StatusOK, set)
}
