// Command rlsfloor is Envoy's gRPC rate limit service at its cheapest: it
// answers every ShouldRateLimit with OK and one OK status without reading the
// request, so that its CPU per call is grpc-go's own (the floor that
// scripts/sidebyside.sh sets sluice serve against).
//
//	go run ./internal/rlsfloor --addr 127.0.0.1:9081
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9081", "address to listen on")
	flag.Parse()
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv, err := newServer()
	if err != nil {
		log.Fatal(err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-sig; srv.Stop() }()
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
}

// newServer returns a gRPC server that answers every call of every method
// with an encoded RateLimitResponse{OK, [OK]}, the request left unread.
func newServer() (*grpc.Server, error) {
	ok, err := proto.Marshal(&rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}},
	})
	if err != nil {
		return nil, fmt.Errorf("encode the answer: %w", err)
	}
	answer := func(_ any, stream grpc.ServerStream) error {
		if err := stream.RecvMsg(&unread{}); err != nil {
			return err
		}
		return stream.SendMsg(encoded(ok))
	}
	return grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}), grpc.UnknownServiceHandler(answer)), nil
}

// unread is a request whose bytes are received and never decoded.
type unread struct{}

// encoded is an answer already in protobuf's wire format.
type encoded []byte

// rawCodec sends encoded answers as they are and decodes no request.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(encoded)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot send %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (rawCodec) Unmarshal(_ mem.BufferSlice, v any) error {
	if _, ok := v.(*unread); !ok {
		return fmt.Errorf("raw codec: cannot read into %T", v)
	}
	return nil
}
