package storetest

import "github.com/sluicehq/sluice"

// model is the reference a store is checked against: for each key, the
// requests applied to it since it last changed algorithm. A key's state is
// those requests replayed on a fresh sluice.State, so that a copy is a
// true copy (a copied sluice.State shares its sliding log).
type model map[string]*history

// history is what a key of the model saw.
type history struct {
	alg sluice.Algorithm
	ops []op
}

// op is one request applied to a key at now (µs).
type op struct {
	l         sluice.Limit
	now, cost int64
}

// state replays the key's requests on a fresh state.
func (h *history) state() sluice.State {
	var s sluice.State
	for _, o := range h.ops {
		o.l.TakeMicros(&s, o.now, o.cost)
	}
	return s
}

// apply records a request; a request under another algorithm starts the
// key afresh.
func (h *history) apply(o op) {
	if o.l.Algorithm != h.alg {
		h.alg, h.ops = o.l.Algorithm, nil
	}
	h.ops = append(h.ops, o)
}

func (m model) history(key string) *history {
	h := m[key]
	if h == nil {
		h = &history{}
		m[key] = h
	}
	return h
}

// take is sluice.Take on the model.
func (m model) take(key string, l sluice.Limit, now, cost int64) sluice.Decision {
	return m.takeAll([]sluice.Request{{Key: key, Limit: l, Cost: cost}}, now)[0]
}

// takeAll is Store.TakeAll on the model: the requests decided in order on
// copies of the states, applied only if all pass.
func (m model) takeAll(reqs []sluice.Request, now int64) []sluice.Decision {
	type work struct {
		st  sluice.State
		alg sluice.Algorithm
	}
	copies := map[string]*work{}
	ds := make([]sluice.Decision, len(reqs))
	all := true
	for i, r := range reqs {
		w := copies[r.Key]
		if w == nil {
			h := m.history(r.Key)
			w = &work{st: h.state(), alg: h.alg}
			copies[r.Key] = w
		}
		if r.Limit.Algorithm != w.alg {
			w.st, w.alg = sluice.State{}, r.Limit.Algorithm
		}
		ds[i] = r.Limit.TakeMicros(&w.st, now, r.Cost)
		all = all && ds[i].Allowed
	}
	if all {
		for _, r := range reqs {
			m.history(r.Key).apply(op{r.Limit, now, r.Cost})
		}
	}
	return ds
}
