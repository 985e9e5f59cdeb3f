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
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/transport/envoyrls"
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
	return func(ctx context.Context, u int) (answer, error) {
		cc := conns[u%len(conns)]
		if first {
			first = false
			req := &rlsv3.RateLimitRequest{}
			if err := proto.Unmarshal(encoded[u], req); err != nil {
				return answer{}, err
			}
			resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req)
			if err != nil {
				return answer{}, err
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN || len(resp.GetStatuses()) != 1 {
				return answer{}, fmt.Errorf("unexpected answer %v", resp)
			}
			mode := resp.GetDynamicMetadata().GetFields()[envoyrls.ModeKey].GetStringValue()
			return answer{over: resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT, mode: mode}, nil
		}
		var a leanAnswer
		if err := cc.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, rawMessage(encoded[u]), &a, opt); err != nil {
			return answer{}, err
		}
		if a.code == 0 {
			return answer{}, errors.New("answer without an overall code")
		}
		return answer{over: a.code == int32(rlsv3.RateLimitResponse_OVER_LIMIT), mode: a.mode}, nil
	}, cleanup, nil
}

// rawMessage is a request already in protobuf's wire format.
type rawMessage []byte

// leanAnswer is what leanCodec reads of a RateLimitResponse: its overall
// code, and the fail mode its dynamic_metadata names, if any.
type leanAnswer struct {
	code int32
	mode string
}

// The numbers of the RateLimitResponse fields leanCodec reads.
const (
	overallCodeField     = 1
	dynamicMetadataField = 6
)

// leanCodec sends rawMessages as they are and reads only the overall code
// of answers and their dynamic_metadata, skipping the other fields
// undecoded.
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
	a, ok := v.(*leanAnswer)
	if !ok {
		return fmt.Errorf("lean codec: cannot read into %T", v)
	}
	*a = leanAnswer{}
	var b []byte
	switch len(data) {
	case 0:
		return nil
	case 1:
		b = data[0].ReadOnlyData()
	default:
		b = data.Materialize()
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == overallCodeField && typ == protowire.VarintType:
			var c uint64
			c, n = protowire.ConsumeVarint(b)
			a.code = int32(c)
		case num == dynamicMetadataField && typ == protowire.BytesType:
			var md []byte
			if md, n = protowire.ConsumeBytes(b); n >= 0 {
				st := &structpb.Struct{}
				if err := proto.Unmarshal(md, st); err != nil {
					return fmt.Errorf("lean codec: dynamic_metadata: %w", err)
				}
				a.mode = st.GetFields()[envoyrls.ModeKey].GetStringValue()
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
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
	modeKey := []byte(`"` + envoyrls.ModeKey + `":"`)
	return func(ctx context.Context, u int) (answer, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bodies[u]))
		if err != nil {
			return answer{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return answer{}, err
		}
		if resp.StatusCode != http.StatusOK {
			return answer{}, errors.New(resp.Status + ": " + strings.TrimSpace(string(body)))
		}
		a := answer{over: bytes.Contains(body, overLimit)}
		if _, rest, ok := bytes.Cut(body, modeKey); ok {
			if mode, _, ok := bytes.Cut(rest, []byte(`"`)); ok {
				a.mode = string(mode)
			}
		}
		return a, nil
	}, tr.CloseIdleConnections, nil
}
