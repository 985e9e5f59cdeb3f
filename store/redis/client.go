package redis

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// Client returns the store's Redis client once it has connected, and nil
// before, for commands of a caller's own on the store's connections
// (store/envoykeys). The store owns it: callers must not close it.
func (s *Store) Client() rueidis.Client {
	if s.connected() != nil {
		return nil
	}
	return s.client
}

// Conn returns the store's Redis client once it has connected; before,
// nil and ErrConnecting wrapping the last attempt's error (ErrClosed after
// Close), which names why (a refused connection, a wrong password, a TLS
// handshake). It does no I/O. The store owns the client: callers must not
// close it.
func (s *Store) Conn() (rueidis.Client, error) {
	if err := s.connected(); err != nil {
		return nil, err
	}
	return s.client, nil
}

// Ping asks Redis whether it answers within ctx (one node of a Cluster):
// nil when it does; ErrConnecting, wrapping the last attempt's error,
// before the store has connected; ErrClosed after Close. It is what a
// server's readiness probe calls while it decides without the store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.connected(); err != nil {
		return fmt.Errorf("redis store %s: %w", Redact(s.url), err)
	}
	if err := s.client.Do(ctx, s.client.B().Ping().Build()).Error(); err != nil {
		return fmt.Errorf("redis store %s: ping: %w", Redact(s.url), err)
	}
	return nil
}
