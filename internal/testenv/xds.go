package testenv

import (
	"context"
	"net"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// XDS is an xDS management server built as Envoy Gateway's is: go-control-plane's
// state-of-the-world server over its snapshot cache, on a real gRPC
// listener, serving Envoy ratelimit's RateLimitConfig resources.
type XDS struct {
	t     testing.TB
	Addr  string // host:port
	Cache cachev3.SnapshotCache
	GRPC  *grpc.Server
	// Reqs receives every request the server gets (those it has no room
	// for are dropped); MD the metadata of each stream opened.
	Reqs chan *discovery.DiscoveryRequest
	MD   chan metadata.MD
}

// NewXDS starts a management server on a free loopback port (addr "") or
// on addr, stopped when the test ends.
func NewXDS(t testing.TB, addr string, opts ...grpc.ServerOption) *XDS {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	x := &XDS{t: t, Addr: lis.Addr().String(), Cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		Reqs: make(chan *discovery.DiscoveryRequest, 1024), MD: make(chan metadata.MD, 16)}
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			select {
			case x.MD <- md:
			default:
			}
			return nil
		},
		StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
			select {
			case x.Reqs <- r:
			default: // a test that does not read them
			}
			return nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	x.GRPC = grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(x.GRPC, serverv3.NewServer(ctx, x.Cache, cb))
	go x.GRPC.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(func() { x.GRPC.Stop(); cancel() })
	return x
}

// Push serves version with rcs to node.
func (x *XDS) Push(node, version string, rcs ...*rlconf.RateLimitConfig) {
	x.t.Helper()
	res := make([]types.Resource, len(rcs))
	for i, rc := range rcs {
		res[i] = rc
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		x.t.Fatal(err)
	}
	if err := x.Cache.SetSnapshot(context.Background(), node, snap); err != nil {
		x.t.Fatal(err)
	}
}

// RateLimitConfig is a RateLimitConfig of one domain, named as it, whose
// descriptor key has limit requests a unit.
func RateLimitConfig(domain, key string, limit uint32, unit rlconf.RateLimitUnit) *rlconf.RateLimitConfig {
	return &rlconf.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlconf.RateLimitDescriptor{
		{Key: key, RateLimit: &rlconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: limit}},
	}}
}
