package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// grpcCaller returns the caller of Envoy's gRPC API at c.GRPCAddr, over
// c.Conns connections, and how to close them.
func grpcCaller(c Config) (caller, func(), error) {
	conns := make([]*grpc.ClientConn, c.Conns)
	cleanup := func() {
		for _, cc := range conns {
			if cc != nil {
				cc.Close()
			}
		}
	}
	for i := range conns {
		cc, err := grpc.NewClient(c.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("dial %s: %w", c.GRPCAddr, err)
		}
		conns[i] = cc
	}
	// The requests are encoded once, and of each answer only the overall
	// code is read, so that the load generator leaves the CPU it shares
	// with the server to the server, as wrk does for HTTP. The first call
	// is decoded in full to check that the server answers.
	encoded := make([][]byte, c.Users)
	for u, req := range requests(c) {
		b, err := proto.Marshal(req)
		if err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("encode request: %w", err)
		}
		encoded[u] = b
	}
	first := true // bench makes the first call before the callers start
	opt := grpc.ForceCodecV2(leanCodec{})
	return func(ctx context.Context, u int) (bool, error) {
		cc := conns[u%len(conns)]
		if first {
			first = false
			req := &rlsv3.RateLimitRequest{}
			if err := proto.Unmarshal(encoded[u], req); err != nil {
				return false, err
			}
			resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req)
			if err != nil {
				return false, err
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN || len(resp.GetStatuses()) != 1 {
				return false, fmt.Errorf("unexpected answer %v", resp)
			}
			return resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT, nil
		}
		var code overallCode
		if err := cc.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, rawMessage(encoded[u]), &code, opt); err != nil {
			return false, err
		}
		if code == 0 {
			return false, errors.New("answer without an overall code")
		}
		return code == overallCode(rlsv3.RateLimitResponse_OVER_LIMIT), nil
	}, cleanup, nil
}

// rawMessage is a request already in protobuf's wire format.
type rawMessage []byte

// overallCode is the overall_code of a RateLimitResponse.
type overallCode int32

// leanCodec sends rawMessages as they are and reads only the overall code
// of answers: field 1, which protobuf encoders write first.
type leanCodec struct{}

func (leanCodec) Name() string { return "proto" }

func (leanCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(rawMessage)
	if !ok {
		return nil, fmt.Errorf("lean codec: cannot send %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m)}, nil
}

func (leanCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c, ok := v.(*overallCode)
	if !ok {
		return fmt.Errorf("lean codec: cannot read into %T", v)
	}
	*c = 0
	if len(data) == 0 {
		return nil
	}
	b := data[0].ReadOnlyData()
	// Tag 0x08 is field 1 as a varint; the codes fit in one byte.
	if len(b) >= 2 && b[0] == 0x08 && b[1] < 0x80 {
		*c = overallCode(b[1])
	}
	return nil
}

// httpCaller returns the caller of POST /v1/decide at c.HTTPURL, and how
// to close its idle connections.
func httpCaller(c Config) (caller, func(), error) {
	url := strings.TrimSuffix(c.HTTPURL, "/") + "/v1/decide"
	bodies := make([][]byte, c.Users)
	for u, req := range requests(c) {
		b, err := protojson.Marshal(req)
		if err != nil {
			return nil, nil, fmt.Errorf("encode request: %w", err)
		}
		bodies[u] = b
	}
	tr := &http.Transport{MaxIdleConns: c.Concurrency, MaxIdleConnsPerHost: c.Concurrency, DisableCompression: true}
	client := &http.Client{Transport: tr}
	overLimit := []byte(`"overallCode":"OVER_LIMIT"`)
	return func(ctx context.Context, u int) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bodies[u]))
		if err != nil {
			return false, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return false, err
		}
		if resp.StatusCode != http.StatusOK {
			return false, errors.New(resp.Status + ": " + strings.TrimSpace(string(body)))
		}
		return bytes.Contains(body, overLimit), nil
	}, tr.CloseIdleConnections, nil
}
