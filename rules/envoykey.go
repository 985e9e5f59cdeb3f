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

// EnvoyDescriptor returns the descriptor under which Envoy's ratelimit
// counts a request with entries that Match resolved to r: r's domain and
// the entries as they are, but that a level of r that shares its threshold
// has its pattern for a value, as Envoy's does. store/envoykeys names the
// counter from it. It allocates only for a rule with such a level.
func (r *Rule) EnvoyDescriptor(entries []Entry) sluice.Descriptor {
	d := sluice.Descriptor{Domain: r.Domain, Entries: entries}
	copied := false
	for i := range entries {
		if i < len(r.path) && r.path[i].ShareThreshold {
			if !copied {
				d.Entries, copied = append([]Entry(nil), entries...), true
			}
			d.Entries[i].Value = r.path[i].Value
		}
	}
	return d
}
