package redisstore

import (
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rule"
)

// A layer beside synced counters (redis.syncInterval) that they do not
// lease (Limits.Unleased, which the configuration sets): a concurrency
// layer. Synced counting admits from points leased in batches, which a slot
// cannot be: a slot is held from a request's admission to its end, and
// every replica must see it at once. So on a synced store such a layer
// counts as exact mode counts it, with its own script calls (concurrency.go: the take,
// then the release after the response), and falls back to memory during an
// outage as exact mode does (owed.go), while the store's other layers stay
// synced. A request that both charge is taken in two parts, all or nothing,
// as the root's takeMixed does across stores: its synced layers first (from
// their leases, most often without a call), then its slots; a refusal of the
// slots gives the synced layers their charge back.

// exactBeside is the exact store of synced store rs (RedisStore.Exact):
// rs as New made it before its synced counters, sharing its backend, memory
// mirror, block list and debts; nil when no layer is unleased in Redis.
func exactBeside(rs *RedisStore, layers []*rule.Layer) *RedisStore {
	for _, l := range layers {
		if unleased(l) {
			exact := *rs
			return &exact
		}
	}

	return nil
}

// unleased reports whether l is counted in Redis by the script even on a
// synced store (Limits.Unleased).
func unleased(l *rule.Layer) bool {
	return l.Unleased && !l.Memory
}

// anyUnleased reports whether one of c's layers is unleased (unleased).
func anyUnleased(c *rule.Charge) bool {
	for _, l := range c.Layers {
		if l.Unleased && !l.Memory { // unleased's test, written out: a call each layer costs under Yaegi
			return true
		}
	}

	return false
}

// takeSynced is Take on a synced store.
func takeSynced(s *RedisStore, t *rule.Tally, c *rule.Charge) {
	if s.Exact == nil || !anyUnleased(c) {
		SyncTake(s.Synced, t, c)
		return
	}

	var synced, exact []int
	for i, l := range c.Layers {
		if unleased(l) {
			exact = append(exact, i)
		} else {
			synced = append(synced, i)
		}
	}

	if len(synced) == 0 {
		Take(s.Exact, t, c)
		return
	}

	takeBoth(s, t, c, synced, exact)
}

// takeBoth takes c's synced layers (at synced) from their counters, then,
// when they allow it, its unleased layers (at exact) with the script.
func takeBoth(s *RedisStore, t *rule.Tally, c *rule.Charge, synced, exact []int) {
	ts := rule.Tally{Cost: t.Cost}
	tx := rule.Tally{Cost: t.Cost}
	if t.Each != nil {
		ts.Each = rule.NewItems(len(synced))
		tx.Each = rule.NewItems(len(exact))
	}

	cs := rule.ChargeAt(c, synced)
	SyncTake(s.Synced, &ts, cs)

	if ts.Refused && !c.All {
		*t = rule.Tally{Cost: t.Cost, Shown: -1, Each: t.Each}
		rule.MergeTally(t, &ts, synced)

		return
	}

	Take(s.Exact, &tx, rule.ChargeAt(c, exact))

	if tx.Refused && !c.All {
		syncRefund(s.Synced, rule.ChargeWithout(cs, ts.Uncharged), rule.CostOf(t))
		*t = rule.Tally{Cost: t.Cost, Shown: -1, Each: t.Each}
		rule.MergeTally(t, &tx, exact)

		return
	}

	*t = rule.Tally{Cost: t.Cost, Shown: -1, Each: t.Each}
	rule.MergeTally(t, &ts, synced)
	rule.MergeTally(t, &tx, exact)
}

// giveBackUnleased is GiveBack's Redis part on a synced store for a charge
// c with unleased layers (GiveBack released or refunded c in memory, but a
// refund of those): the release of its slots (slots true), or the refund
// of cost to its synced counters and its unleased layers.
func giveBackUnleased(s *RedisStore, c *rule.Charge, cost int64, slots bool) {
	var synced, exact []int
	for i, l := range c.Layers {
		if unleased(l) {
			exact = append(exact, i)
		} else {
			synced = append(synced, i)
		}
	}

	part := rule.ChargeAt(c, exact)
	if !slots {
		syncRefund(s.Synced, rule.ChargeAt(c, synced), cost)
		memstore.Refund(s.Local, part, cost)
	}

	giveBackInRedis(s.Exact, part, cost, slots)
}
