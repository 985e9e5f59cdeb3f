package redis

import "github.com/redis/rueidis"

// Client returns the store's Redis client, for commands of a caller's own
// on the store's connections (store/envoykeys). The store owns it: callers
// must not close it.
func (s *Store) Client() rueidis.Client { return s.client }

// Client returns the Redis client of the store once it is connected, and
// nil before. The store owns it: callers must not close it.
func (b *Background) Client() rueidis.Client {
	if s := b.store.Load(); s != nil {
		return s.client
	}
	return nil
}
