package redisstore

import (
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rule"
)

// A layer of a Redis instance may count in memory (rule.Layer.Memory):
// typically global, a per-replica backstop that would otherwise be one hot
// key every request of every replica writes, and on a Cluster a slot of its
// own. A request is then charged all or nothing across the two stores: the
// memory layers in s.Local, the others here.

// TakeMixed is Take on a Redis instance with memory layers: its memory
// layers first (no round trip; with blocks, memstore.TakeWithBlocks, when
// a layer has a blockDuration: s.Blocks), then, when they allow it, its Redis layers; a
// refusal by Redis gives the memory layers their charge back, and a refusal
// by memory calls no Redis. Between the charge and its refund, another
// request may see the memory layers' counts with this one in; the counts
// end exact.
func TakeMixed(s *RedisStore, t *rule.Tally, c *rule.Charge) {
	local, shared, li, si := SplitLayers(c.Layers)

	if len(local) == 0 {
		Take(s, t, c)
		return
	}

	if len(shared) == 0 {
		memstore.TakeWithBlocks(s.Local, s.Blocks, t, c)
		return
	}

	tm := rule.Tally{Cost: t.Cost}
	tr := rule.Tally{Cost: t.Cost}
	if t.Each != nil {
		tm.Each = rule.NewItems(len(li))
		tr.Each = rule.NewItems(len(si))
	}
	cm := rule.ChargeAt(c, li)
	memstore.TakeWithBlocks(s.Local, s.Blocks, &tm, cm)

	if tm.Refused && !c.All {
		*t = rule.Tally{Cost: t.Cost, Shown: -1, Each: t.Each}
		rule.MergeTally(t, &tm, li)

		return
	}

	Take(s, &tr, rule.ChargeAt(c, si))

	if tr.Refused && !c.All {
		memstore.Refund(s.Local, rule.ChargeWithout(cm, tm.Uncharged), rule.CostOf(t))
		*t = rule.Tally{Cost: t.Cost, Shown: -1, Each: t.Each}
		rule.MergeTally(t, &tr, si)

		return
	}

	*t = rule.Tally{Cost: t.Cost, Shown: -1, Each: t.Each}
	rule.MergeTally(t, &tm, li)
	rule.MergeTally(t, &tr, si)
}

// RefundMixed is Refund on a Redis instance with memory layers.
func RefundMixed(s *RedisStore, c *rule.Charge, cost int64) {
	local, _, li, si := SplitLayers(c.Layers)

	if len(local) > 0 {
		memstore.Refund(s.Local, rule.ChargeAt(c, li), cost)
	}

	Refund(s, rule.ChargeAt(c, si), cost)
}

// SpendMixed is Spend on a Redis instance with memory layers.
func SpendMixed(s *RedisStore, c *rule.Charge, cost int64) {
	local, shared, li, si := SplitLayers(c.Layers)
	if len(local) > 0 {
		memstore.Spend(s.Local, rule.ChargeAt(c, li), cost)
	}

	if len(shared) > 0 {
		Spend(s, rule.ChargeAt(c, si), cost)
	}
}

// SplitLayers returns the memory layers and the Redis layers of layers, in
// order, with each one's index in layers.
func SplitLayers(layers []*rule.Layer) (local, shared []*rule.Layer, li, si []int) {
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
