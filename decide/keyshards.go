package decide

import (
	"hash/maphash"
	"sync"
)

// keyShards maps keys to V in ledgerShards shards, each under its own
// mutex, chosen by a hash of the key: the shape of the Service's per-key
// tables beside the ledger (flights, keySettles). Call init before use.
type keyShards[V any] struct {
	shards [ledgerShards]keyShard[V]
	hash   maphash.Seed
}

// keyShard is one shard of a keyShards; m is guarded by mu.
type keyShard[V any] struct {
	mu sync.Mutex
	m  map[string]V
}

// init seeds the hash and makes every shard's map.
func (k *keyShards[V]) init() {
	k.hash = maphash.MakeSeed()
	for i := range k.shards {
		k.shards[i].m = make(map[string]V)
	}
}

// shard returns the shard of key.
func (k *keyShards[V]) shard(key string) *keyShard[V] {
	return &k.shards[maphash.String(k.hash, key)&(ledgerShards-1)]
}
