// Package admin is sluice's admin API: the rules of each domain read,
// written, validated, rolled back and their history, and the overrides
// set, read and deleted, over HTTP on a listener of its own, every call
// authenticated by a bearer token of a tokens file. It changes rules
// through a Backend (control.Editor for a rules database), which checks
// every change as the nodes will.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/control"
	"github.com/sluicehq/sluice/rules"
)

// Backend is what the admin API needs of the rules it changes;
// *control.Editor is one.
type Backend interface {
	Domains(ctx context.Context) ([]control.Doc, int64, error)
	Domain(ctx context.Context, domain string) (control.Doc, error)
	History(ctx context.Context, domain string) ([]control.HistoryEntry, error)
	PutDomain(ctx context.Context, author, domain string, text []byte, ifMatch string, dry bool) (control.Result, error)
	Validate(ctx context.Context, author string, text []byte) (control.Result, error)
	DeleteDomain(ctx context.Context, author, domain, ifMatch string, dry bool) (control.Result, error)
	Rollback(ctx context.Context, author, domain string, version int64, ifMatch string, dry bool) (control.Result, error)
	Overrides(ctx context.Context) ([]control.OverrideRecord, error)
	Override(ctx context.Context, domain string, entries []rules.Entry) (control.OverrideRecord, error)
	SetOverride(ctx context.Context, author string, o rules.Override, dry bool) (control.OverrideRecord, error)
	DeleteOverride(ctx context.Context, author, domain string, entries []rules.Entry, dry bool) (control.OverrideRecord, error)
}

var _ Backend = (*control.Editor)(nil)

// DefaultMaxBodyBytes caps a request's body: 4 MiB, a large generated
// rules document (the rules' own cap on a file, 16 MiB, is for files).
const DefaultMaxBodyBytes = 4 << 20

// Config configures the admin API. A zero field means its default.
type Config struct {
	Backend Backend     // required
	Tokens  TokenLookup // required: *Tokens, or a *TokensFile read again when it changes
	// ReadOnly refuses every change with 403 (a GitOps setup, whose rules
	// change only by their repository); dry runs still answer.
	ReadOnly bool
	// MaxBodyBytes caps a request's body (413 above it); zero means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BodyTimeout bounds how long a request's body may take to arrive;
	// zero means 30 seconds.
	BodyTimeout time.Duration
	// Now is the clock that an override's ttl counts from; nil means
	// time.Now.
	Now func() time.Time
	// Log receives a line for each refused call; nil means slog.Default().
	Log *slog.Logger
	// Registerer, if not nil, gets sluice_admin_requests_total by token
	// and HTTP status.
	Registerer prometheus.Registerer
}

// DefaultConfig returns the default configuration: what every zero field
// of a Config means. Backend and Tokens have none: they are required.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes: DefaultMaxBodyBytes, // a rules document and then some
		BodyTimeout:  30 * time.Second,    // a rules document over a slow link
		Now:          time.Now,
		Log:          slog.Default(),
		// ReadOnly: off; Registerer: nil, no metrics
	}
}

// Handler serves the admin API under /v1/admin/. It is safe for
// concurrent use.
type Handler struct {
	c     Config
	mux   *http.ServeMux
	calls *prometheus.CounterVec
}

// New returns the admin API's handler.
func New(c Config) (*Handler, error) {
	if c.Backend == nil || c.Tokens == nil {
		return nil, errors.New("admin: Config.Backend and Config.Tokens are required")
	}
	d := DefaultConfig()
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = d.MaxBodyBytes
	}
	if c.Now == nil {
		c.Now = d.Now
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = d.BodyTimeout
	}
	if c.Log == nil {
		c.Log = d.Log
	}
	h := &Handler{c: c, mux: http.NewServeMux()}
	h.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_admin_requests_total",
		Help: "Calls to the admin API by token name (\"\" without a valid token) and HTTP status code.",
	}, []string{"token", "code"})
	if c.Registerer != nil {
		if err := c.Registerer.Register(h.calls); err != nil {
			return nil, fmt.Errorf("admin metrics: %w", err)
		}
	}
	for _, rt := range h.routes() {
		h.mux.Handle(rt.pattern, h.auth(rt.write, rt.f))
	}
	return h, nil
}

// route is one route of the API: its pattern, whether it changes
// anything (its dry run does not), and its handler.
type route struct {
	pattern string
	write   bool
	f       func(w http.ResponseWriter, r *http.Request, c call) error
}

// routes are the API's routes.
func (h *Handler) routes() []route {
	return []route{
		{"GET /v1/admin/domains", false, h.listDomains},
		{"GET /v1/admin/domains/{domain}", false, h.getDomain},
		{"PUT /v1/admin/domains/{domain}", true, h.putDomain},
		{"DELETE /v1/admin/domains/{domain}", true, h.deleteDomain},
		{"GET /v1/admin/domains/{domain}/history", false, h.history},
		{"POST /v1/admin/domains/{domain}/rollback", true, h.rollback},
		{"POST /v1/admin/validate", false, h.validate},
		{"GET /v1/admin/overrides", false, h.listOverrides},
		{"PUT /v1/admin/overrides", true, h.setOverride},
		{"GET /v1/admin/overrides/{id}", false, h.getOverride},
		{"DELETE /v1/admin/overrides/{id}", true, h.deleteOverride},
	}
}

// call is what auth hands a route: the caller's token, whether the call
// is a dry run, and the backend to use, which for a dry run writes
// nothing whatever it is asked (dryBackend).
type call struct {
	token Token
	dry   bool
	b     Backend
}

// ServeHTTP serves the admin API.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// statusWriter remembers the status written, for the metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

// Unwrap lets http.ResponseController reach the connection.
func (sw *statusWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }

func (sw *statusWriter) WriteHeader(code int) {
	sw.code = code
	sw.ResponseWriter.WriteHeader(code)
}

// auth checks the bearer token, the dry_run parameter and the role, then
// calls f and maps its error to a status. A write route is called without
// a dry run only for a write token on a server that is not read-only; a
// dry run is called with a backend that cannot write.
func (h *Handler) auth(write bool, f func(http.ResponseWriter, *http.Request, call) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		var t Token
		defer func() { h.calls.WithLabelValues(t.Name, strconv.Itoa(sw.code)).Inc() }()
		secret, ok := bearer(r.Header.Get("Authorization"))
		if ok {
			t, ok = h.c.Tokens.Lookup(secret)
		}
		if !ok {
			sw.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
			writeError(sw, http.StatusUnauthorized, "a valid bearer token is required (Authorization: Bearer SECRET)", nil)
			return
		}
		dry, err := dryRun(r)
		if err != nil {
			h.fail(sw, r, t, err)
			return
		}
		if write && !dry && t.Role != RoleWrite {
			writeError(sw, http.StatusForbidden, fmt.Sprintf("token %q is read-only", t.Name), nil)
			return
		}
		if write && !dry && h.c.ReadOnly {
			writeError(sw, http.StatusForbidden, "the admin API is read-only (--admin-read-only): change the rules where they are kept", nil)
			return
		}
		// A body arrives within BodyTimeout (recorders in tests have no
		// deadline to set).
		_ = http.NewResponseController(sw).SetReadDeadline(time.Now().Add(h.c.BodyTimeout))
		r.Body = http.MaxBytesReader(sw, r.Body, h.c.MaxBodyBytes)
		c := call{token: t, dry: dry, b: h.c.Backend}
		if dry || !write || t.Role != RoleWrite || h.c.ReadOnly {
			c.dry, c.b = true, dryBackend{h.c.Backend}
		}
		if err := f(sw, r, c); err != nil {
			h.fail(sw, r, t, err)
		}
	})
}

// bearer returns the secret of an Authorization header of the Bearer
// scheme (case-insensitive, as RFC 9110 has it).
func bearer(v string) (string, bool) {
	scheme, secret, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	secret = strings.TrimSpace(secret)
	return secret, secret != ""
}

// errorBody is every error's JSON.
type errorBody struct {
	Error string `json:"error"`
	// Errors are the mistakes in a rules document, each with the line of
	// the submitted document ("request" is its name) or a path.
	Errors []mistake `json:"errors,omitempty"`
}

type mistake struct {
	Line    int    `json:"line,omitempty"`
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
	Text    string `json:"text"` // the whole "file:line: message"
}

func writeError(w http.ResponseWriter, code int, msg string, ms []mistake) {
	writeJSON(w, code, errorBody{Error: msg, Errors: ms})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// fail answers err with its status: 400 for mistakes (each with its line),
// 404, 412, 413, 503, else 500. A 5xx is logged whole and answered with
// what failed but not its error, which may hold the server's paths and
// addresses.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, t Token, err error) {
	var es rules.Errors
	var tooLarge *http.MaxBytesError
	code := http.StatusInternalServerError
	switch {
	case errors.As(err, &tooLarge):
		code = http.StatusRequestEntityTooLarge
		err = fmt.Errorf("the body is above the cap of %d bytes", tooLarge.Limit)
	case errors.As(err, &es), errors.Is(err, control.ErrInvalid), errors.Is(err, errBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, control.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, control.ErrConflict):
		code = http.StatusPreconditionFailed
	case errors.Is(err, control.ErrUnavailable):
		code = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	var ms []mistake
	for _, e := range es {
		ms = append(ms, mistake{Line: e.Line, Path: e.Path, Message: e.Msg, Text: e.Error()})
	}
	msg := err.Error()
	if code >= 500 {
		h.c.Log.Warn("admin call failed", "method", r.Method, "path", r.URL.Path, "token", t.Name, "code", code, "err", err)
		msg = "internal error: the server's log says why"
		if code == http.StatusServiceUnavailable {
			msg = "the rules database is unavailable: the server's log says why"
		}
	}
	writeError(w, code, msg, ms)
}

// errBadRequest marks a request the API cannot read.
var errBadRequest = errors.New("bad request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

// readBody reads the capped body.
func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, err
		}
		return nil, badRequest("read the body: %v", err)
	}
	return b, nil
}

// wantsJSON reports whether the client asks for JSON rather than the
// document's text.
func wantsJSON(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == "application/json" {
			return true
		}
	}
	return r.URL.Query().Get("format") == "json"
}

func (h *Handler) listDomains(w http.ResponseWriter, r *http.Request, c call) error {
	docs, gen, err := c.b.Domains(r.Context())
	if err != nil {
		return err
	}
	if docs == nil {
		docs = []control.Doc{}
	}
	writeJSON(w, http.StatusOK, struct {
		Generation int64         `json:"generation"`
		Domains    []control.Doc `json:"domains"`
	}{gen, docs})
	return nil
}

func (h *Handler) getDomain(w http.ResponseWriter, r *http.Request, c call) error {
	d, err := c.b.Domain(r.Context(), r.PathValue("domain"))
	if err != nil {
		return err
	}
	w.Header().Set("ETag", d.ETag())
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, d)
		return nil
	}
	ct := "application/yaml; charset=utf-8"
	if strings.HasPrefix(strings.TrimSpace(d.Text), "{") {
		ct = "application/json" // stored as submitted
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("X-Sluice-Author", d.Author)
	w.Header().Set("Last-Modified", d.Time.UTC().Format(http.TimeFormat))
	io.WriteString(w, d.Text)
	return nil
}

func (h *Handler) answer(w http.ResponseWriter, res control.Result, created bool) {
	w.Header().Set("ETag", res.Doc.ETag())
	code := http.StatusOK
	if created && !res.DryRun {
		code = http.StatusCreated
	}
	writeJSON(w, code, res)
}

func (h *Handler) putDomain(w http.ResponseWriter, r *http.Request, c call) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	res, err := c.b.PutDomain(r.Context(), c.token.Name, r.PathValue("domain"), body, r.Header.Get("If-Match"), c.dry)
	if err != nil {
		return err
	}
	h.answer(w, res, res.Doc.Version == 1)
	return nil
}

// dryRun reads the dry_run parameter: "true" or "false" (or none), once;
// anything else is refused rather than read as a write.
func dryRun(r *http.Request) (bool, error) {
	vs, ok := r.URL.Query()["dry_run"]
	if !ok {
		return false, nil
	}
	if len(vs) == 1 && (vs[0] == "true" || vs[0] == "false") {
		return vs[0] == "true", nil
	}
	return false, badRequest("dry_run: %q; want true or false, once", vs)
}

// dryBackend is a Backend whose changes are all dry runs: what a call
// that may not write is given.
type dryBackend struct{ Backend }

func (d dryBackend) PutDomain(ctx context.Context, author, domain string, text []byte, ifMatch string, _ bool) (control.Result, error) {
	return d.Backend.PutDomain(ctx, author, domain, text, ifMatch, true)
}

func (d dryBackend) DeleteDomain(ctx context.Context, author, domain, ifMatch string, _ bool) (control.Result, error) {
	return d.Backend.DeleteDomain(ctx, author, domain, ifMatch, true)
}

func (d dryBackend) Rollback(ctx context.Context, author, domain string, version int64, ifMatch string, _ bool) (control.Result, error) {
	return d.Backend.Rollback(ctx, author, domain, version, ifMatch, true)
}

func (d dryBackend) SetOverride(ctx context.Context, author string, o rules.Override, _ bool) (control.OverrideRecord, error) {
	return d.Backend.SetOverride(ctx, author, o, true)
}

func (d dryBackend) DeleteOverride(ctx context.Context, author, domain string, entries []rules.Entry, _ bool) (control.OverrideRecord, error) {
	return d.Backend.DeleteOverride(ctx, author, domain, entries, true)
}

func (h *Handler) deleteDomain(w http.ResponseWriter, r *http.Request, c call) error {
	res, err := c.b.DeleteDomain(r.Context(), c.token.Name, r.PathValue("domain"), r.Header.Get("If-Match"), c.dry)
	if err != nil {
		return err
	}
	h.answer(w, res, false)
	return nil
}

func (h *Handler) history(w http.ResponseWriter, r *http.Request, c call) error {
	hist, err := c.b.History(r.Context(), r.PathValue("domain"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, struct {
		Versions []control.HistoryEntry `json:"versions"`
	}{hist})
	return nil
}

// RollbackRequest is the body of POST .../rollback.
type RollbackRequest struct {
	Version int64 `json:"version"`
}

func (h *Handler) rollback(w http.ResponseWriter, r *http.Request, c call) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req RollbackRequest
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	if req.Version <= 0 {
		return badRequest("version: %d; want an earlier version's number", req.Version)
	}
	res, err := c.b.Rollback(r.Context(), c.token.Name, r.PathValue("domain"), req.Version, r.Header.Get("If-Match"), c.dry)
	if err != nil {
		return err
	}
	h.answer(w, res, false)
	return nil
}

func (h *Handler) validate(w http.ResponseWriter, r *http.Request, c call) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	res, err := c.b.Validate(r.Context(), c.token.Name, body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// overrideJSON is an override as the API shows it: the record with its
// id, and whether it is the answer of a dry run (nothing was written).
type overrideJSON struct {
	ID string `json:"id"`
	control.OverrideRecord
	DryRun bool `json:"dry_run,omitempty"`
}

func withID(o control.OverrideRecord, dry bool) overrideJSON {
	return overrideJSON{ID: control.OverrideID(o.Domain, o.Entries), OverrideRecord: o, DryRun: dry}
}

func (h *Handler) listOverrides(w http.ResponseWriter, r *http.Request, c call) error {
	ovs, err := c.b.Overrides(r.Context())
	if err != nil {
		return err
	}
	out := make([]overrideJSON, len(ovs))
	for i, o := range ovs {
		out[i] = withID(o, false)
	}
	writeJSON(w, http.StatusOK, struct {
		Overrides []overrideJSON `json:"overrides"`
	}{out})
	return nil
}

func (h *Handler) getOverride(w http.ResponseWriter, r *http.Request, c call) error {
	domain, entries, err := control.ParseOverrideID(r.PathValue("id"))
	if err != nil {
		return err
	}
	o, err := c.b.Override(r.Context(), domain, entries)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, withID(o, false))
	return nil
}

// OverrideRequest is the body of PUT /v1/admin/overrides: an override,
// ending at Expires or after TTL (from the server's clock), or never.
type OverrideRequest struct {
	rules.Override
	TTL string `json:"ttl,omitempty"` // a Go duration such as "1h"; not with expires
}

// DecodeOverride reads an OverrideRequest strictly (unknown fields, a
// second value and a wrong type are refused) into the override it asks
// for at now.
func DecodeOverride(body []byte, now time.Time) (rules.Override, error) {
	var req OverrideRequest
	if err := decodeStrict(body, &req); err != nil {
		return rules.Override{}, err
	}
	o := req.Override
	if req.TTL != "" {
		if !o.Expires.IsZero() {
			return o, badRequest("ttl and expires: give one")
		}
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 || d > control.MaxOverrideTTL {
			return o, badRequest("ttl %q: want a duration such as 30m or 1h, above 0 and at most %v", req.TTL, control.MaxOverrideTTL)
		}
		o.Expires = now.Add(d).UTC()
	}
	if o.Domain == "" || len(o.Entries) == 0 || len(o.Limits) == 0 {
		return o, badRequest("domain, entries and rate_limits are required")
	}
	return o, nil
}

// decodeStrict decodes one JSON value into v, refusing unknown fields and
// anything after it.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("the body: %v", err)
	}
	if dec.More() {
		return badRequest("the body: more than one JSON value")
	}
	return nil
}

func (h *Handler) setOverride(w http.ResponseWriter, r *http.Request, c call) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	o, err := DecodeOverride(body, h.c.Now())
	if err != nil {
		return err
	}
	rec, err := c.b.SetOverride(r.Context(), c.token.Name, o, c.dry)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, withID(rec, c.dry))
	return nil
}

func (h *Handler) deleteOverride(w http.ResponseWriter, r *http.Request, c call) error {
	domain, entries, err := control.ParseOverrideID(r.PathValue("id"))
	if err != nil {
		return err
	}
	rec, err := c.b.DeleteOverride(r.Context(), c.token.Name, domain, entries, c.dry)
	if err != nil {
		return err
	}
	if c.dry {
		writeJSON(w, http.StatusOK, withID(rec, true)) // what would be deleted
		return nil
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
