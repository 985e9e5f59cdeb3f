package redis

import "github.com/redis/rueidis"

// Client returns the store's Redis client once it has connected, and nil
// before, for commands of a caller's own on the store's connections
// (store/envoykeys). The store owns it: callers must not close it.
func (s *Store) Client() rueidis.Client {
	if s.connected() != nil {
		return nil
	}
	return s.client
}
