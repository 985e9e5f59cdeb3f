package main

import (
	"time"

	"github.com/peterbourgon/ff/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// connAgeFlags bound how long a gRPC connection lives, so that the calls
// of a long-lived client (Envoy) spread over replicas added since it
// connected: Envoy ratelimit's GRPC_MAX_CONNECTION_AGE and _GRACE.
type connAgeFlags struct {
	age, grace time.Duration
}

func (c *connAgeFlags) register(fs *ff.FlagSet) {
	fs.DurationVar(&c.age, 0, "grpc-max-connection-age", 0, withEnv("grpc-max-connection-age",
		"close gRPC connections this old, gracefully, so that clients reconnect and spread over replicas (0: never)"))
	fs.DurationVar(&c.grace, 0, "grpc-max-connection-age-grace", 0, withEnv("grpc-max-connection-age-grace",
		"how long calls on a connection past --grpc-max-connection-age may take to finish (0: no bound)"))
}

// options returns the gRPC server options of the flags.
func (c connAgeFlags) options() []grpc.ServerOption {
	if c.age <= 0 {
		return nil
	}
	// A zero grace is gRPC's default: no bound.
	return []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: c.age, MaxConnectionAgeGrace: max(c.grace, 0)})}
}
