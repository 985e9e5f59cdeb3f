// Package xds takes rules from an xDS management server as Envoy Gateway
// serves them to Envoy's ratelimit: a Subscription holds a
// state-of-the-world ADS stream for the resources of TypeURL
// (ratelimit.config.ratelimit.v3.RateLimitConfig), builds each response
// into a rules.Set with the validation of rules files and the store's veto,
// swaps it in and acknowledges it (ACK), or keeps the Set in force and
// refuses the response with its mistakes (NACK). When the stream ends it
// subscribes again, after a backoff, asking for the version it
// acknowledged last.
//
// Use: Subscribe, then Current for the rules in force (no domains until
// the first response), Ready to know whether one came, State for what the
// server last said, Close to stop. Bound: a response above
// Config.MaxMessageBytes (4 MiB) is refused by gRPC before it is decoded,
// and the rules of a response are capped as rules documents are
// (rules.Loader).
package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// TypeURL is the type of the resources a Subscription asks for: Envoy
// ratelimit's rules.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Defaults of Config, Envoy ratelimit's where it has one.
const (
	// DefaultNode is the node id sent when Config.Node is empty: Envoy
	// ratelimit's CONFIG_GRPC_XDS_NODE_ID default.
	DefaultNode = "default"
	// DefaultRetryInitial is the first wait before subscribing again:
	// Envoy ratelimit's CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL, 3s.
	DefaultRetryInitial = 3 * time.Second
	// DefaultRetryMax is the longest wait: Envoy ratelimit's
	// XDS_CLIENT_BACKOFF_MAX_INTERVAL, 60s.
	DefaultRetryMax = 60 * time.Second
	// DefaultRetryJitter is the share of a wait drawn at random, either
	// way: Envoy ratelimit's XDS_CLIENT_BACKOFF_RANDOM_FACTOR, 0.5.
	DefaultRetryJitter = 0.5
	// DefaultMaxMessageBytes is the largest response read: gRPC's default
	// receive size, which Envoy ratelimit keeps when
	// XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES is unset, 4 MiB.
	DefaultMaxMessageBytes = 4 << 20
	// maxDetailBytes caps the error detail of a NACK (the mistakes of a
	// response): 16 KiB.
	maxDetailBytes = 16 << 10
)

// Config configures a Subscription. A zero field means its default.
type Config struct {
	// Server is the management server's address, host:port (or a gRPC
	// target such as dns:///host:port). Required.
	Server string
	// Node is the node id sent; "" means DefaultNode. Envoy Gateway
	// serves its snapshot to the node id it gave the Deployment.
	Node string
	// Metadata is the node's metadata, sent with the node id (string
	// values). Default: none.
	Metadata map[string]string
	// Headers are sent as gRPC metadata on the stream. Default: none.
	Headers map[string]string
	// TLS, if not nil, dials the server with TLS. Default: plaintext.
	TLS *TLSFiles
	// RetryInitial is the wait before subscribing again after the stream
	// failed or ended; it doubles at each failure in a row up to RetryMax
	// and starts again once a response came. Default DefaultRetryInitial.
	RetryInitial time.Duration
	// RetryMax is the longest wait. Default DefaultRetryMax.
	RetryMax time.Duration
	// RetryJitter is the share of each wait drawn at random either way, in
	// [0, 1]; negative: none. Default DefaultRetryJitter.
	RetryJitter float64
	// MaxMessageBytes is the largest response read. Default
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// WarnAfter is how long a stream may stay open without a first
	// response before a warning says so (the server may serve another
	// node id). Default 30s.
	WarnAfter time.Duration
	// Loader reads the rules as it reads rules documents; its caps and
	// MergeDomains apply, and domains are named as Envoy's ratelimit takes
	// them (EnvoyDomainNames).
	Loader rules.Loader
	// Check is the store's veto on limits: a response with a limit it
	// refuses is refused. Nil accepts every limit.
	Check func(sluice.Limit) error
	// OnUpdate, if not nil, is told of each response of rules: the Set put
	// in force and the version acknowledged, or a nil Set, the version
	// refused and why. It is called from the Subscription's goroutine, one
	// call at a time, and must not call Close.
	OnUpdate func(set *rules.Set, version string, err error)
	// Logger receives what happens to the stream. Default slog.Default().
	Logger *slog.Logger
}

// TLSFiles are the PEM files of TLS to the management server. They are
// read at each connection, so that a rotated certificate is used from the
// next one on (a connection in use keeps its own).
type TLSFiles struct {
	// Cert and Key are a client certificate and its key, for a server
	// that asks for one (mutual TLS); "" for none.
	Cert, Key string
	// CA is a bundle of the CAs that sign the server's certificate; "":
	// the system's.
	CA string
	// ServerName is the name checked in the server's certificate; "": the
	// host of Server.
	ServerName string
}

// State is what the management server last said.
type State struct {
	Server    string    `json:"server"`
	Node      string    `json:"node"`
	Connected bool      `json:"connected"`         // the stream is open
	Version   string    `json:"version,omitempty"` // acknowledged last; "" before the first
	Resources []string  `json:"resources,omitempty"`
	Applied   time.Time `json:"applied,omitzero"`  // when Version was put in force
	Refused   string    `json:"refused,omitempty"` // the last version refused, since Version
	Error     string    `json:"error,omitempty"`   // why Refused was
}

// Subscription keeps a node's rules in step with an xDS management
// server. Current never blocks. It is safe for concurrent use.
type Subscription struct {
	c     Config
	log   *slog.Logger
	cur   atomic.Pointer[rules.Set]
	ready chan struct{} // closed at the first Set put in force

	mu    sync.Mutex // guards state
	state State

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Subscribe checks c and starts subscribing in the background until
// Close; it does not wait for the server (see Ready).
func Subscribe(c Config) (*Subscription, error) {
	if c.Server == "" {
		return nil, errors.New("xds: Config.Server is required")
	}
	if c.Node == "" {
		c.Node = DefaultNode
	}
	if c.RetryInitial <= 0 {
		c.RetryInitial = DefaultRetryInitial
	}
	if c.RetryMax <= 0 {
		c.RetryMax = DefaultRetryMax
	}
	c.RetryMax = max(c.RetryMax, c.RetryInitial)
	switch {
	case c.RetryJitter == 0:
		c.RetryJitter = DefaultRetryJitter
	case c.RetryJitter < 0:
		c.RetryJitter = 0
	case c.RetryJitter > 1:
		return nil, fmt.Errorf("xds: RetryJitter %g: want at most 1", c.RetryJitter)
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.WarnAfter <= 0 {
		c.WarnAfter = 30 * time.Second // a server answers at once when it has rules for the node
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Loader.EnvoyDomainNames = true // Envoy Gateway's are namespace/gateway/listener
	if c.TLS != nil {
		if _, err := c.TLS.config(); err != nil { // a mistake in the files is the operator's, at the start
			return nil, err
		}
	}
	if _, err := c.node(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscription{c: c, log: c.Logger.With("xds_server", c.Server, "xds_node", c.Node), ready: make(chan struct{}),
		cancel: cancel, done: make(chan struct{})}
	s.cur.Store(&rules.Set{})
	s.state = State{Server: c.Server, Node: c.Node}
	go s.run(ctx)
	return s, nil
}

// Current returns the Set in force: the last response put in force, or a
// Set without domains before the first.
func (s *Subscription) Current() *rules.Set { return s.cur.Load() }

// Ready returns a channel closed once a first response is in force.
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// State returns what the server last said.
func (s *Subscription) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state
	st.Resources = append([]string(nil), st.Resources...)
	return st
}

// Close ends the stream and waits for the Subscription's goroutine; the
// Set in force stays readable. It is safe to call more than once.
func (s *Subscription) Close() error {
	s.once.Do(s.cancel)
	<-s.done
	return nil
}

// run subscribes until ctx ends, again after each failure.
func (s *Subscription) run(ctx context.Context) {
	defer close(s.done)
	failures := 0
	for {
		got, err := s.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		s.state.Connected = false
		s.mu.Unlock()
		if got {
			failures = 0
		}
		wait := s.c.backoff(failures, rand.Float64())
		failures++
		s.log.Warn("xDS stream ended; the rules in force stay until it is back", "err", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// backoff returns the wait after failures failures in a row (0 for the
// first), r being a random number in [0, 1).
func (c Config) backoff(failures int, r float64) time.Duration {
	d := c.RetryInitial
	for i := 0; i < failures && d < c.RetryMax; i++ {
		d *= 2
	}
	d = min(d, c.RetryMax)
	return time.Duration(float64(d) * (1 + c.RetryJitter*(2*r-1)))
}

// stream subscribes once: it dials, asks for the rules and answers each
// response until the stream fails. got says whether a response came.
func (s *Subscription) stream(ctx context.Context) (got bool, err error) {
	creds := insecure.NewCredentials()
	if s.c.TLS != nil {
		tc, err := s.c.TLS.config() // read again: a rotated certificate is used from now on
		if err != nil {
			return false, err
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(s.c.Server, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(s.c.MaxMessageBytes)))
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", s.c.Server, err)
	}
	defer conn.Close() //nolint:errcheck // nothing to do about it
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(s.c.Headers) > 0 {
		sctx = metadata.NewOutgoingContext(sctx, metadata.New(s.c.Headers))
	}
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	node, _ := s.c.node() // checked by Subscribe
	s.mu.Lock()
	first := &discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: s.state.Version}
	s.mu.Unlock()
	if err := st.Send(first); err != nil {
		return false, err
	}
	s.mu.Lock()
	s.state.Connected = true // the stream opened: the transport is up
	s.mu.Unlock()
	warn := time.AfterFunc(s.c.WarnAfter, func() {
		s.log.Warn("xDS stream open, and no rules for this node yet: does the server serve this node id?", "waited", s.c.WarnAfter)
	})
	defer warn.Stop()
	for {
		resp, err := st.Recv()
		if err != nil {
			return got, err
		}
		if !got {
			got = true
			warn.Stop()
			s.log.Info("xDS stream up", "type", TypeURL)
		}
		req, again := s.answer(node, resp)
		if again {
			// go-control-plane's cache answers a NACK, which names the
			// version in force, with the version refused again at once:
			// a refusal repeated is sent after RetryInitial, not in a
			// busy loop (a new version comes after it).
			t := time.NewTimer(s.c.RetryInitial)
			select {
			case <-ctx.Done():
				t.Stop()
				return got, ctx.Err()
			case <-t.C:
			}
		}
		if err := st.Send(req); err != nil {
			return got, err
		}
	}
}

// answer puts resp's rules in force and returns the ACK, or returns the
// NACK that says why not; again says that the version was refused last
// time already (then it is neither logged at Error nor reported again).
func (s *Subscription) answer(node *core.Node, resp *discovery.DiscoveryResponse) (_ *discovery.DiscoveryRequest, again bool) {
	var set *rules.Set
	names, err := resourceNames(resp)
	if err == nil {
		set, err = s.c.build(resp.GetResources())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state.Connected = true
	req := &discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
	if err != nil {
		again = s.state.Refused == resp.GetVersionInfo() && s.state.Error == err.Error()
		s.state.Refused, s.state.Error = resp.GetVersionInfo(), err.Error()
		req.VersionInfo = s.state.Version
		detail := err.Error()
		if len(detail) > maxDetailBytes {
			detail = detail[:maxDetailBytes] + "..."
		}
		req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: detail}
		if again {
			s.log.Debug("xDS rules refused again", "version", resp.GetVersionInfo())
			return req, true
		}
		s.log.Error("xDS rules refused; the rules in force stay", "version", resp.GetVersionInfo(),
			"resources", names, "acknowledged", s.state.Version, "err", err)
		if s.c.OnUpdate != nil {
			s.c.OnUpdate(nil, resp.GetVersionInfo(), err)
		}
		return req, false
	}
	set = set.WithOrigin(rules.Origin{Source: "xds://" + s.c.Server, Version: resp.GetVersionInfo()})
	s.cur.Store(set)
	s.state.Version, s.state.Resources, s.state.Applied = resp.GetVersionInfo(), names, time.Now()
	s.state.Refused, s.state.Error = "", ""
	req.VersionInfo = s.state.Version
	select {
	case <-s.ready:
	default:
		close(s.ready)
	}
	s.log.Info("xDS rules in force", "version", resp.GetVersionInfo(), "resources", names, "domains", set.Domains())
	if s.c.OnUpdate != nil {
		s.c.OnUpdate(set, resp.GetVersionInfo(), nil)
	}
	return req, false
}

// resourceNames returns the names of resp's resources, sorted, or why
// resp is not of TypeURL.
func resourceNames(resp *discovery.DiscoveryResponse) ([]string, error) {
	if resp.GetTypeUrl() != TypeURL {
		return nil, fmt.Errorf("a response of type %q: want %s", resp.GetTypeUrl(), TypeURL)
	}
	names := make([]string, 0, len(resp.GetResources()))
	for _, a := range resp.GetResources() {
		var rc rlconf.RateLimitConfig
		if err := a.UnmarshalTo(&rc); err == nil {
			names = append(names, resourceName(&rc))
		}
	}
	sort.Strings(names)
	return names, nil
}

// resourceName is how a resource is named in logs and errors: its name,
// or its domain when it has none.
func resourceName(rc *rlconf.RateLimitConfig) string {
	if rc.GetName() != "" {
		return rc.GetName()
	}
	return rc.GetDomain()
}

// build returns the Set of a response's resources, each a domain's
// rules, checked as rules documents are and by c.Check. A mistake names
// its resource.
func (c Config) build(res []*anypb.Any) (*rules.Set, error) {
	rcs := make([]*rlconf.RateLimitConfig, len(res))
	for i, a := range res {
		rcs[i] = &rlconf.RateLimitConfig{}
		if a.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("resource %d: type %q: want %s", i, a.GetTypeUrl(), TypeURL)
		}
		if err := a.UnmarshalTo(rcs[i]); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
	}
	// A server sends its resources in any order (go-control-plane's from a
	// map): by name, the same resources make the same Set and version.
	sort.SliceStable(rcs, func(i, j int) bool { return resourceName(rcs[i]) < resourceName(rcs[j]) })
	specs := make([]rules.DomainSpec, 0, len(res))
	byDomain := make(map[string]string, len(res)) // domain -> resource
	for _, rc := range rcs {
		spec := DomainSpec(rc)
		if _, err := c.Loader.NewSet(spec); err != nil {
			return nil, fmt.Errorf("resource %q: %w", resourceName(rc), err)
		}
		if first, ok := byDomain[rc.GetDomain()]; ok && !c.Loader.MergeDomains {
			return nil, fmt.Errorf("resources %q and %q: both of domain %q", first, resourceName(rc), rc.GetDomain())
		}
		byDomain[rc.GetDomain()] = resourceName(rc)
		specs = append(specs, spec)
	}
	set, err := c.Loader.NewSet(specs...) // across resources: one domain twice, say
	if err != nil {
		return nil, err
	}
	if err := set.Check(c.Check); err != nil {
		return nil, err
	}
	return set, nil
}

// DomainSpec returns the rules of rc, as Envoy ratelimit reads them: a
// limit's unit by its name (an unknown unit is refused by the rules'
// validation, as Envoy's refuses it).
func DomainSpec(rc *rlconf.RateLimitConfig) rules.DomainSpec {
	return rules.DomainSpec{Domain: rc.GetDomain(), Descriptors: descriptorSpecs(rc.GetDescriptors())}
}

func descriptorSpecs(ds []*rlconf.RateLimitDescriptor) []rules.DescriptorSpec {
	if len(ds) == 0 {
		return nil
	}
	out := make([]rules.DescriptorSpec, 0, len(ds))
	for _, d := range ds {
		out = append(out, rules.DescriptorSpec{
			Key: d.GetKey(), Value: d.GetValue(), RateLimit: limitSpec(d.GetRateLimit()),
			Descriptors: descriptorSpecs(d.GetDescriptors()), ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric(),
		})
	}
	return out
}

func limitSpec(p *rlconf.RateLimitPolicy) *rules.RateLimitSpec {
	if p == nil {
		return nil
	}
	l := &rules.RateLimitSpec{RequestsPerUnit: int64(p.GetRequestsPerUnit()), Unlimited: p.GetUnlimited(), Name: p.GetName()}
	if p.GetUnit() != rlconf.RateLimitUnit_UNKNOWN || !p.GetUnlimited() {
		l.Unit = strings.ToLower(p.GetUnit().String())
	}
	for _, r := range p.GetReplaces() {
		l.Replaces = append(l.Replaces, rules.ReplaceSpec{Name: r.GetName()})
	}
	return l
}

// node returns the node c sends.
func (c Config) node() (*core.Node, error) {
	n := &core.Node{Id: c.Node, UserAgentName: "sluice"}
	if len(c.Metadata) > 0 {
		m := make(map[string]any, len(c.Metadata))
		for k, v := range c.Metadata {
			m[k] = v
		}
		st, err := structpb.NewStruct(m)
		if err != nil {
			return nil, fmt.Errorf("xds: node metadata: %w", err)
		}
		n.Metadata = st
	}
	return n, nil
}

// config reads the files into a client tls.Config.
func (f *TLSFiles) config() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.Cert != "" || f.Key != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("xds: client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("xds: server CA: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xds: server CA %s: no PEM certificate in it", f.CA)
		}
	}
	return c, nil
}
