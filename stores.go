package tierlimit

import (
	"context"
	"net/http"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
)

// anyBlock reports whether one of the layers has a blockDuration.
func anyBlock(layers []*layer) bool {
	for _, l := range layers {
		if l.BlockDuration != 0 {
			return true
		}
	}

	return false
}

// stores is where an instance counts, as data made once in New
// (buildStore): the memory store; the Redis store, or nil when memory
// counts every layer; and what applies on top. take and refund read it;
// nothing wraps a store in another.
type stores struct {
	memory *memstore.WindowStore
	redis  *redisstore.RedisStore
	// blocks: a layer counted in memory has a blockDuration, so memory
	// checks and starts blocks (memstore.TakeWithBlocks); Redis blocks in its
	// script.
	blocks bool
	// mixed: a layer of a Redis instance counts in memory (layer.Memory):
	// typically global, a per-replica backstop that would otherwise be one
	// hot key every request of every replica writes, and on a Cluster a
	// slot of its own. Such a request is charged all or nothing across the
	// two stores (takeMixed).
	mixed bool
	// month: a layer is a calendar month, whose RateLimit-Policy changes
	// with the month: a tally that shows one is marked (monthPolicyBit).
	month bool
	// plain: none of the above, the memory store alone (take's first case,
	// which keeps its frame small: doc.go frames).
	plain bool
}

// take charges c's layers t.Cost points each (0: 1), all or nothing, where
// each counts, and writes the outcome to t. A dry run (c.All) charges and
// evaluates every layer.
func take(st *stores, t *tally, c *charge) {
	if st.plain {
		memstore.Take(st.memory, t, c)
		return
	}

	takeComposed(st, t, c)
}

// takeComposed is take where more than the memory store's Take applies.
func takeComposed(st *stores, t *tally, c *charge) {
	switch {
	case st.redis == nil:
		memstore.TakeWithBlocks(st.memory, st.blocks, t, c)
	case st.mixed:
		takeMixed(st, t, c)
	default:
		redisstore.Take(st.redis, t, c)
	}

	if st.month && t.Shown >= 0 && c.Layers[t.Shown].Month != nil {
		t.Firsts |= monthPolicyBit
	}
}

// refund gives cost points back to c's layers, which an earlier take
// charged, for a request a later, deferred charge refused (after.go
// settle), or a countStatus route's check.
func refund(st *stores, c *charge, cost int64) {
	switch {
	case st.redis == nil:
		memstore.Refund(st.memory, c, cost)
	case st.mixed:
		refundMixed(st, c, cost)
	default:
		redisstore.Refund(st.redis, c, cost)
	}
}

// spend charges cost to c's layers whatever their points, where each
// counts: what a response reported beyond its request's reservation
// (meter.go).
func spend(st *stores, c *charge, cost int64) {
	switch {
	case st.redis == nil:
		memstore.Spend(st.memory, c, cost)
	case st.mixed:
		local, shared, li, si := splitLayers(c.Layers)
		if len(local) > 0 {
			memstore.Spend(st.memory, rule.ChargeAt(c, li), cost)
		}

		if len(shared) > 0 {
			redisstore.Spend(st.redis, rule.ChargeAt(c, si), cost)
		}
	default:
		redisstore.Spend(st.redis, c, cost)
	}
}

// takeMixed is take on a Redis instance with memory layers: its memory
// layers first (no round trip), then, when they allow it, its Redis layers;
// a refusal by Redis gives the memory layers their charge back, and a
// refusal by memory calls no Redis. Between the charge and its refund,
// another request may see the memory layers' counts with this one in; the
// counts end exact.
func takeMixed(st *stores, t *tally, c *charge) {
	local, shared, li, si := splitLayers(c.Layers)

	if len(local) == 0 {
		redisstore.Take(st.redis, t, c)
		return
	}

	if len(shared) == 0 {
		memstore.TakeWithBlocks(st.memory, st.blocks, t, c)
		return
	}

	tm := tally{Cost: t.Cost}
	tr := tally{Cost: t.Cost}
	if t.Each != nil {
		tm.Each = rule.NewItems(len(li))
		tr.Each = rule.NewItems(len(si))
	}
	cm := rule.ChargeAt(c, li)
	memstore.TakeWithBlocks(st.memory, st.blocks, &tm, cm)

	if tm.Refused && !c.All {
		*t = tally{Cost: t.Cost, Shown: -1, Each: t.Each}
		rule.MergeTally(t, &tm, li)

		return
	}

	redisstore.Take(st.redis, &tr, rule.ChargeAt(c, si))

	if tr.Refused && !c.All {
		memstore.Refund(st.memory, rule.ChargeWithout(cm, tm.Uncharged), rule.CostOf(t))
		*t = tally{Cost: t.Cost, Shown: -1, Each: t.Each}
		rule.MergeTally(t, &tr, si)

		return
	}

	*t = tally{Cost: t.Cost, Shown: -1, Each: t.Each}
	rule.MergeTally(t, &tm, li)
	rule.MergeTally(t, &tr, si)
}

// refundMixed is refund on a Redis instance with memory layers.
func refundMixed(st *stores, c *charge, cost int64) {
	local, _, li, si := splitLayers(c.Layers)

	if len(local) > 0 {
		memstore.Refund(st.memory, rule.ChargeAt(c, li), cost)
	}

	redisstore.Refund(st.redis, rule.ChargeAt(c, si), cost)
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

// A month layer's RateLimit-Policy w is the current month's length, where
// every other layer's is a constant of its header table. All the keys of a
// calendar layer share one period, so the value changes only at the
// layer's month boundary: monthPolicy keeps it for the period it was made
// for. The shared request path pays nothing for it (doc.go: frames):
// in an instance with a month layer, take (stores.month) marks the tally
// when a month layer is shown (monthPolicyBit in tally.Firsts), and verdict, whose report branch runs after the headers
// are set, corrects the header there (reportTally).

// monthPolicyBit marks, in tally.Firsts, a tally that shows a month layer;
// the lower bits are the layers' first refusals (report reads those only).
const monthPolicyBit = uint64(1) << 63

// anyMonth reports whether one of the layers has calendar: month.
func anyMonth(layers []*layer) bool {
	for _, l := range layers {
		if l.Calendar == limit.Month {
			return true
		}
	}

	return false
}

// setMonthPolicy writes month layer l's RateLimit-Policy for the month that
// holds now, when h shows l's header table (headers on, l shown).
func setMonthPolicy(h http.Header, l *layer, now int64) {
	v := h["Ratelimit-Policy"]
	if len(v) != 1 || v[0] != l.PolicyHdr[0] {
		return
	}

	h["Ratelimit-Policy"] = monthPolicyAt(l, now)
}

// monthPolicyAt is l's RateLimit-Policy value at now, made again when now
// leaves the period it was made for.
func monthPolicyAt(l *layer, now int64) []string {
	m := l.Month

	m.Mu.Lock()
	defer m.Mu.Unlock()

	if m.Hdr == nil || now < m.Start || now >= m.End {
		start, end := limit.Period(now, l.Calendar, l.UtcOffset)
		m.Start = start
		m.End = end
		m.Hdr = []string{`"` + l.Name + `";q=` + l.Limit + ";w=" + formatInt(limit.CeilSeconds(end-start))}
	}

	return m.Hdr
}

// monthPolicyOf is setMonthPolicy where the headers were set for l without
// a tally's mark (the ip charge of an invalid credential, after.go).
func monthPolicyOf(h http.Header, l *layer, now int64) {
	if l.Month != nil {
		setMonthPolicy(h, l, now)
	}
}

// What an unheld registry entry still holds that matters (lifetime/lifetime.go): the
// live functions of the registries that hold counts. Each returns until when
// (Unix nanoseconds) its value holds something that can still change a
// decision at now, or 0. They run when an entry nobody holds reaches its
// grace or the end they last reported, never on the request path.

// connLive is the WebSocket connection counter's: while connections it
// counted are open, they end when their clients go, at no known time, so it
// is checked again a grace later.
func connLive(v interface{}, now int64) int64 {
	c, ok := v.(*connCounter)
	if !ok {
		return 0
	}

	c.mu.Lock()
	open := len(c.byIP)
	c.mu.Unlock()

	if open == 0 {
		return 0
	}

	return now + int64(lifetime.ReleaseGrace)
}

// registry holds one windowStore per middleware name, and for the redis
// store one blockList, while some instance of the middleware uses them or
// they hold counts that still matter (lifetime/lifetime.go, stores.go). Traefik keeps
// one interpreter per plugin, so this survives configuration reloads and is
// shared by every router that uses the middleware.
var registry = &storeRegistry{stores: lifetime.NewKeepingRegistry(memstore.Live), blocked: lifetime.NewKeepingRegistry(redisstore.BlockListLive)}

type storeRegistry struct {
	stores  *lifetime.HeldRegistry // *windowStore by middleware name
	blocked *lifetime.HeldRegistry // *blockList by middleware name: keys known over their limit
}

// get returns the store of the middleware called name, held until ctx is
// cancelled, creating it with the cap capacity or applying capacity to the
// existing one.
func (r *storeRegistry) get(ctx context.Context, name string, capacity int) *memstore.WindowStore {
	v := r.stores.Take(ctx, name, func() interface{} { return memstore.NewWindowStore(capacity) })

	s, _ := v.(*memstore.WindowStore)
	s.SetMax(capacity)

	return s
}

// blockListFor returns the list of keys known over their limit for the
// middleware called name (redis store), held until ctx is cancelled.
func (r *storeRegistry) blockListFor(ctx context.Context, name string, capacity int) *redisstore.BlockList {
	v := r.blocked.Take(ctx, name, func() interface{} { return redisstore.NewBlockList(capacity) })

	b, _ := v.(*redisstore.BlockList)

	return b
}
