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

// blockingStore is the memory store of an instance with a blockDuration
// layer: it checks the blocks before windowStore.take and starts one after a
// refusal, so that take, shared by every instance, costs layers without a
// block nothing more (doc.go: frames). It is the Redis store's memory
// fallback too (redisStore.takeLocal): during an outage the block list
// refuses the keys Redis blocked, and a refusal in memory starts a block.
type blockingStore struct {
	*windowStore
}

// anyBlock reports whether one of the layers has a blockDuration.
func anyBlock(layers []*layer) bool {
	for _, l := range layers {
		if l.BlockDuration != 0 {
			return true
		}
	}

	return false
}

// take is windowStore.take with the layers' blocks: a request of a blocked
// key is refused, charged nowhere; a refusal of a layer with a
// blockDuration blocks its key. A dry run, which refuses nothing, neither
// honours nor starts blocks.
func (b *blockingStore) Take(t *tally, c *charge) {
	s := b.windowStore

	if !c.All && refuseAny(b, t, c) {
		return
	}

	s.Take(t, c)

	if !t.Refused || c.All || t.Shown < 0 || c.Layers[t.Shown].BlockDuration == 0 {
		return
	}

	s.Mu.Lock()
	s.StartBlock(t, t.Shown, c.Now, c.Layers[t.Shown], c.Keys[t.Shown])
	s.Mu.Unlock()
}

// refuseAny refuses the request when one of its keys is blocked, and
// reports whether it did. The blocked layer refuses in its turn, as in
// Redis: a layer before it that refuses is the one shown, and the layers
// before it that allow are charged and given back (between the two holds of
// the lock another request may see that charge; the counts end exact).
func refuseAny(b *blockingStore, t *tally, c *charge) bool {
	s := b.windowStore
	i := firstBlocked(b, c)

	if i < 0 {
		return false
	}

	cost := rule.CostOf(t)

	if i > 0 {
		s.Take(t, rule.ChargePrefix(c, i))
		if t.Refused {
			return true
		}
	}

	s.Mu.Lock()
	memstore.GiveBack(c, i, cost, t.Uncharged)
	*t = tally{Cost: t.Cost}

	if !memstore.RefuseBlockedAt(s, t, c, i) {
		t.Shown = -1 // the block ended meanwhile: decided afresh
		s.Mu.Unlock()

		return false
	}

	s.Mu.Unlock()

	return true
}

// firstBlocked returns the index of the first of c's layers whose key is
// blocked at c.now, or -1. A dry-run layer refuses nothing: a block it
// started before a reload to dry run is not honoured.
func firstBlocked(b *blockingStore, c *charge) int {
	s := b.windowStore

	s.Mu.Lock()
	defer s.Mu.Unlock()

	for i, l := range c.Layers {
		if l.BlockDuration == 0 || l.DryRun {
			continue
		}

		if until := l.Blocks[c.Keys[i]]; until > c.Now {
			return i
		}
	}

	return -1
}

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

// A layer's calendar (README: calendar, utcOffset) replaces its duration
// with fixed windows aligned to the calendar: days from 00:00, weeks from
// Monday 00:00, months from the 1st, in UTC or at a fixed offset. Such a
// layer is served on the general path (chooseMode). In memory a window
// starts at its period's start and resets at the next boundary
// (alignCalendar); in Redis its key names the period's start in Unix
// seconds, so every replica counts in the same key and an old period's key
// expires, and the window sent to the script is what is left of the period
// (calendarCall).
const (
	calDay   = config.CalDay
	calWeek  = config.CalWeek
	calMonth = config.CalMonth
)

// A month layer's RateLimit-Policy w is the current month's length, where
// every other layer's is a constant of its header table. All the keys of a
// calendar layer share one period, so the value changes only at the
// layer's month boundary: monthPolicy keeps it for the period it was made
// for. The shared request path pays nothing for it (doc.go: frames):
// an instance with a month layer takes its store through monthStore, which
// marks the tally when a month layer is shown (monthPolicyBit in
// tally.firsts), and verdict, whose report branch runs after the headers
// are set, corrects the header there (reportTally).

// monthPolicyBit marks, in tally.firsts, a tally that shows a month layer;
// the lower bits are the layers' first refusals (report reads those only).
const monthPolicyBit = uint64(1) << 63

// anyMonth reports whether one of the layers has calendar: month.
func anyMonth(layers []*layer) bool {
	for _, l := range layers {
		if l.Calendar == calMonth {
			return true
		}
	}

	return false
}

// monthStore is the store of an instance with a month layer: it marks
// the tallies that show one (monthPolicyBit).
type monthStore struct {
	inner counterStore
}

func (m *monthStore) Take(t *tally, c *charge) {
	m.inner.Take(t, c)

	if t.Shown >= 0 && c.Layers[t.Shown].Month != nil {
		t.Firsts |= monthPolicyBit
	}
}

func (m *monthStore) Refund(c *charge, cost int64) {
	m.inner.Refund(c, cost)
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

	return now + int64(releaseGrace)
}

// registry holds one windowStore per middleware name, and for the redis
// store one blockList, while some instance of the middleware uses them or
// they hold counts that still matter (lifetime/lifetime.go, stores.go). Traefik keeps
// one interpreter per plugin, so this survives configuration reloads and is
// shared by every router that uses the middleware.
var registry = &storeRegistry{stores: lifetime.NewKeepingRegistry(memstore.Live), blocked: lifetime.NewKeepingRegistry(redisstore.BlockListLive)}

type storeRegistry struct {
	stores  *heldRegistry // *windowStore by middleware name
	blocked *heldRegistry // *blockList by middleware name: keys known over their limit
}

// get returns the store of the middleware called name, held until ctx is
// cancelled, creating it with the cap capacity or applying capacity to the
// existing one.
func (r *storeRegistry) get(ctx context.Context, name string, capacity int) *windowStore {
	v := r.stores.Take(ctx, name, func() interface{} { return memstore.NewWindowStore(capacity) })

	s, _ := v.(*windowStore)
	s.SetMax(capacity)

	return s
}

// blockListFor returns the list of keys known over their limit for the
// middleware called name (redis store), held until ctx is cancelled.
func (r *storeRegistry) blockListFor(ctx context.Context, name string, capacity int) *blockList {
	v := r.blocked.Take(ctx, name, func() interface{} { return redisstore.NewBlockList(capacity) })

	b, _ := v.(*blockList)

	return b
}
