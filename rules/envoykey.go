package rules

import "github.com/sluicehq/sluice"

// EnvoyKeyed reports whether limit l of r is one whose counter Envoy's
// ratelimit could share: a fixed_window limit of one unit (unit_multiplier
// 1), the only fixed_window limit of r. Envoy's counter key names no period
// but the window's start, so two fixed windows of one descriptor would
// share a counter at every start they have in common; sluice keeps its own
// keys for those.
func (r *Rule) EnvoyKeyed(l *Limit) bool {
	if l.Unlimited || l.Block || l.Limit.Algorithm != sluice.FixedWindow || l.UnitMultiplier != 1 {
		return false
	}
	for _, o := range r.Limits {
		if o != l && o.Limit.Algorithm == sluice.FixedWindow && !o.Unlimited && !o.Block {
			return false
		}
	}
	return true
}

// AppendEnvoyKey appends to dst the counter key Envoy's ratelimit gives a
// descriptor with entries that Match resolved to r, without its cache key
// prefix and its window: the domain, "_", then for each entry its key,
// "_", its value and "_", where a level of r that shares its threshold
// contributes its pattern instead of the value, as Envoy's does. The window
// start in seconds, which the store appends, completes the key:
//
//	api_user_alice_path_/login_1763856000
//
// Keys and values are joined as they are, so that a=b_c and a_b=c share a
// key, as they share a counter in Envoy's ratelimit. AppendEnvoyKey
// allocates nothing when dst has room.
func (r *Rule) AppendEnvoyKey(dst []byte, entries []Entry) []byte {
	dst = append(dst, r.Domain...)
	dst = append(dst, '_')
	for i := range entries {
		dst = append(dst, entries[i].Key...)
		dst = append(dst, '_')
		if i < len(r.path) && r.path[i].ShareThreshold {
			dst = append(dst, r.path[i].Value...)
		} else {
			dst = append(dst, entries[i].Value...)
		}
		dst = append(dst, '_')
	}
	return dst
}
