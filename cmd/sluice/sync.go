package main

import (
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/store/localfirst"
)

// ruleSyncs are the sync modes the limits of one rules set name, by
// limit ID.
type ruleSyncs struct {
	set *rules.Set
	ids map[string]localfirst.Sync
}

// syncOf returns the sync mode of the rule whose limit r takes, if it
// names one: r.Key is the limit's ID followed by r.Group (package
// decide's keys). It is localfirst.Config.SyncOf.
func (co *core) syncOf(r sluice.Request) (localfirst.Sync, bool) {
	if co.watcher == nil || len(r.Key) < len(r.Group) {
		return 0, false
	}
	set := co.watcher.Current()
	rs := co.syncs.Load()
	if rs == nil || rs.set != set {
		rs = syncsOf(set)
		co.syncs.Store(rs)
	}
	if len(rs.ids) == 0 {
		return 0, false
	}
	m, ok := rs.ids[r.Key[:len(r.Key)-len(r.Group)]]
	return m, ok
}

// syncsOf collects the sync modes that set's limits name.
func syncsOf(set *rules.Set) *ruleSyncs {
	rs := &ruleSyncs{set: set, ids: map[string]localfirst.Sync{}}
	var walk func([]*rules.Rule)
	walk = func(rr []*rules.Rule) {
		for _, r := range rr {
			for _, l := range r.Limits {
				if m, err := localfirst.ParseSync(l.Sync); err == nil && l.Sync != "" {
					rs.ids[l.ID] = m
				}
			}
			walk(r.Descriptors)
		}
	}
	if set != nil {
		for _, d := range set.Domains() {
			walk(set.Rules(d))
		}
	}
	return rs
}
