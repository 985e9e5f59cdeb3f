// Command grpc-client asks a sluice server (or any Envoy rate limit
// service) for a decision over gRPC, as Envoy does, and prints the answer.
//
//	go run ./examples/grpc-client -addr 127.0.0.1:8081 -domain api -d user=alice,path=/login
//
// Each -d is one descriptor: comma-separated key=value entries, in order.
// Several -d flags send several descriptors in one request. The exit status
// is 0 for OK, 2 for OVER_LIMIT and 1 for an error.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

// errOverLimit reports an OVER_LIMIT answer.
var errOverLimit = errors.New("over the limit")

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout)
	switch {
	case errors.Is(err, errOverLimit):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "grpc-client:", err)
		os.Exit(1)
	}
}

// descriptors is a repeatable -d flag.
type descriptors []*ratelimitv3.RateLimitDescriptor

func (d *descriptors) String() string { return fmt.Sprint(len(*d), " descriptors") }

// Set parses "key=value,key=value" into one descriptor.
func (d *descriptors) Set(s string) error {
	desc := &ratelimitv3.RateLimitDescriptor{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("entry %q: want key=value", kv)
		}
		desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	*d = append(*d, desc)
	return nil
}

// run sends one ShouldRateLimit call as the flags in args describe and
// prints the answer to stdout as JSON.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("grpc-client", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8081", "address of the rate limit service")
	domain := fs.String("domain", "api", "the request's domain")
	hits := fs.Uint("hits", 0, "hits_addend of the request (0 counts as 1)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	var descs descriptors
	fs.Var(&descs, "d", "a descriptor as key=value[,key=value...]; repeat for more")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(descs) == 0 {
		return errors.New("give at least one descriptor with -d key=value")
	}
	if *hits > 1<<32-1 {
		return fmt.Errorf("-hits %d is more than 2^32-1", *hits)
	}

	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial %s: %w", *addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:      *domain,
		Descriptors: descs,
		HitsAddend:  uint32(*hits),
	})
	if err != nil {
		return fmt.Errorf("ShouldRateLimit: %w", err)
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		return fmt.Errorf("print answer: %w", err)
	}
	// protojson varies its whitespace between builds; indent it the same
	// way every time.
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, out, "", "  "); err != nil {
		return fmt.Errorf("print answer: %w", err)
	}
	fmt.Fprintln(stdout, pretty.String())
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		return errOverLimit
	}
	return nil
}
