package tierlimit

import (
	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/rule"
)

// A layer's store: memory (README: store on a layer) counts it in the
// Traefik process although its instance keeps the other layers in Redis:
// typically global, a per-replica backstop that would otherwise be one hot
// key every request of every replica writes, and on a Cluster a slot of its
// own (one more script call per request).

// mixedStore is the store of a Redis instance with a memory layer. A
// request is charged all or nothing across the two stores: its memory
// layers first (memory.take, which holds no round trip), then, when they
// allow it, its Redis layers; a refusal by Redis gives the memory layers
// their charge back (refund), and a refusal by memory calls no Redis.
// Between the charge and its refund, another request may see the memory
// layers' counts with this one in; the counts end exact.
type mixedStore struct {
	memory counterStore // the windowStore, or its blockingStore when a memory layer blocks
	redis  *redisStore
}

// newMixedStore makes the store of a Redis instance whose layers include
// memory ones.
func newMixedStore(memory *windowStore, rs *redisStore, layers []*layer) *mixedStore {
	m := &mixedStore{memory: memory, redis: rs}

	for _, l := range layers {
		if l.Memory && l.BlockDuration != 0 {
			m.memory = &blockingStore{memory}
		}
	}

	return m
}

// anyMemoryLayer reports whether a layer of a Redis instance is counted in
// memory.
func anyMemoryLayer(s *config.Settings) bool {
	if s.Store != config.StoreRedis {
		return false
	}

	for _, l := range config.Rules(s) {
		if l.Memory && l.On() {
			return true
		}
	}

	return false
}

// redisOf is the Redis store of an instance's store, or nil.
func redisOf(s counterStore) *redisStore {
	if rs, ok := s.(*redisStore); ok {
		return rs
	}

	if m, ok := s.(*mixedStore); ok {
		return m.redis
	}

	if m, ok := s.(*monthStore); ok {
		return redisOf(m.inner)
	}

	return nil
}

// splitLayers returns the memory layers and the Redis layers of layers, in
// order, with each one's index in layers.
func splitLayers(layers []*layer) (local, shared []*layer, li, si []int) {
	for i, l := range layers {
		if l.Memory {
			local = append(local, l)
			li = append(li, i)
		} else {
			shared = append(shared, l)
			si = append(si, i)
		}
	}

	return local, shared, li, si
}

func (m *mixedStore) Take(t *tally, c *charge) {
	local, shared, li, si := splitLayers(c.Layers)

	if len(local) == 0 {
		m.redis.Take(t, c)
		return
	}

	if len(shared) == 0 {
		m.memory.Take(t, c)
		return
	}

	tm := tally{Cost: t.Cost}
	cm := rule.ChargeAt(c, li)
	m.memory.Take(&tm, cm)

	if tm.Refused && !c.All {
		*t = tally{Cost: t.Cost, Shown: -1}
		mergeTally(t, &tm, li)

		return
	}

	tr := tally{Cost: t.Cost}
	m.redis.Take(&tr, rule.ChargeAt(c, si))

	if tr.Refused && !c.All {
		m.memory.Refund(rule.ChargeWithout(cm, tm.Uncharged), rule.CostOf(t))
		*t = tally{Cost: t.Cost, Shown: -1}
		mergeTally(t, &tr, si)

		return
	}

	*t = tally{Cost: t.Cost, Shown: -1}
	mergeTally(t, &tm, li)
	mergeTally(t, &tr, si)
}

func (m *mixedStore) Refund(c *charge, cost int64) {
	local, _, li, si := splitLayers(c.Layers)

	if len(local) > 0 {
		m.memory.Refund(rule.ChargeAt(c, li), cost)
	}

	m.redis.Refund(rule.ChargeAt(c, si), cost)
}

// mergeTally adds part, the tally of some of a request's layers (index[j]
// is the place of its layer j among them), to t: as one take of every layer
// would have reported it, the first refusing layer shown, else the one with
// the fewest requests left (the first of equals).
func mergeTally(t, part *tally, index []int) {
	for j, i := range index {
		if part.Firsts&(uint64(1)<<uint(j)) != 0 {
			t.Firsts |= uint64(1) << uint(i)
		}

		if part.Uncharged&(uint64(1)<<uint(j)) != 0 {
			t.Uncharged |= uint64(1) << uint(i)
		}
	}

	if part.Shown < 0 {
		return
	}

	i := index[part.Shown]

	take := t.Shown < 0
	switch {
	case take:
	case part.Refused != t.Refused:
		take = part.Refused
	case !part.Refused && part.Left != t.Left:
		take = part.Left < t.Left
	default:
		take = i < t.Shown
	}

	if take {
		t.Shown, t.Count, t.Reset, t.ResetH, t.Left, t.Refused = i, part.Count, part.Reset, part.ResetH, part.Left, part.Refused
	}
}
