package tierlimit

import (
	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
)

// stores is where an instance counts, as data made once in New
// (buildStore): the memory store; the Redis store, or nil when memory
// counts every layer; and what applies on top. take and refund read it;
// nothing wraps a store in another.
type stores struct {
	memory *memstore.WindowStore
	redis  *redisstore.RedisStore
	// blocks: a layer of a memory instance has a blockDuration, so memory
	// checks and starts blocks (memstore.TakeWithBlocks); Redis blocks in its
	// script, and a Redis instance's memory layers by RedisStore.Blocks.
	blocks bool
	// mixed: a layer of a Redis instance counts in memory (layer.Memory):
	// such a request is charged all or nothing across the two stores
	// (redisstore.TakeMixed).
	mixed bool
	// month: a layer is a calendar month, whose RateLimit-Policy changes
	// with the month: a tally that shows one is marked (rule/month.go).
	month bool
	// plain: none of the above, the memory store alone (take's first case,
	// which keeps its frame small: doc.go frames).
	plain bool
	// items: a request that a costFrom route and a concurrency layer both
	// charge may show several RateLimit items (takeReserving, items.go).
	items bool
}

// take charges c's layers t.Cost points each (0: 1), all or nothing, where
// each counts, and writes the outcome to t. A dry run (c.All) charges and
// evaluates every layer.
func take(st *stores, t *rule.Tally, c *rule.Charge) {
	if st.plain {
		memstore.Take(st.memory, t, c)
		return
	}

	takeComposed(st, t, c)
}

// takeEach is take for a tally with items (tally.Each, items.go), which
// the memory store's TakeEach records, Take not; takeComposed's stores test
// t.Each themselves.
func takeEach(st *stores, t *rule.Tally, c *rule.Charge) {
	if st.plain {
		memstore.TakeEach(st.memory, t, c)
		return
	}

	takeComposed(st, t, c)
}

// takeComposed is take where more than the memory store's Take applies.
func takeComposed(st *stores, t *rule.Tally, c *rule.Charge) {
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

// takeMixed and refundMixed are take and refund on a Redis instance with
// memory layers (redisstore/mixed.go), apart so that their argument's
// selector is no temporary of every take's frame (doc.go: frames).
func takeMixed(st *stores, t *rule.Tally, c *rule.Charge) {
	redisstore.TakeMixed(st.redis, t, c)
}

func refundMixed(st *stores, c *rule.Charge, cost int64) {
	redisstore.RefundMixed(st.redis, c, cost)
}

// refund gives cost points back to c's layers, which an earlier take
// charged, for a request a later, deferred charge refused (after.go
// settle), or a countStatus route's check.
func refund(st *stores, c *rule.Charge, cost int64) {
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
func spend(st *stores, c *rule.Charge, cost int64) {
	switch {
	case st.redis == nil:
		memstore.Spend(st.memory, c, cost)
	case st.mixed:
		redisstore.SpendMixed(st.redis, c, cost)
	default:
		redisstore.Spend(st.redis, c, cost)
	}
}

// monthPolicyBit marks a tally that shows a month layer (rule/month.go).
const monthPolicyBit = rule.MonthPolicyBit

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
