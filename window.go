package tierlimit

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/tierlimit/tierlimit/limit"
)

// windowStore holds fixed-window counters in memory: one counter per layer and
// key, starting at the key's first hit and reset duration later. It is safe for
// concurrent use; every method takes the time from its caller, so tests move a
// clock instead of sleeping.
//
// Memory is bounded by max counters. Counters of the same duration expire in the
// order they started, so each duration keeps its counters in a list ordered by
// start: expired counters are found at the list heads in O(1), without a
// goroutine or a scan. Each new key purges a few expired counters; at the cap
// all expired counters go, then the oldest live one that is not over its
// limit (a key over its limit goes last, so that other clients filling the
// table do not let it back in).
//
// Each layer has its own map keyed by the bucket key: under Yaegi a map with a
// string key is one compiled operation, a struct key is not.
type windowStore struct {
	mu        sync.Mutex
	max       int
	size      int
	takes     int64                         // requests charged so far: window.taken of the current one
	evictions int64                         // live counters dropped at the cap (status page, metrics)
	maps      map[string]map[string]*window // by layer name
	blocks    map[string]map[string]int64   // by layer name: the end of each blocked key's block (block.go)
	blockHits map[string]map[string]int64   // by layer name: the requests each running block refused (block.go)
	lists     []*windowList
	stats     map[string]*layerStats // by layer name
}

// layerStats counts a layer's decisions since the process started: requests
// it let through and requests it refused. The memory store counts under its
// lock, with plain increments (doc.go: an atomic call costs allocations);
// the Redis store, which takes no lock, counts in the atomic fields.
type layerStats struct {
	allowed, refused           int64 // under windowStore.mu
	redisAllowed, redisRefused int64 // atomic
}

// countRedis records one decision of the Redis store.
func (st *layerStats) countRedis(refused bool) {
	if refused {
		atomic.AddInt64(&st.redisRefused, 1)
		return
	}

	atomic.AddInt64(&st.redisAllowed, 1)
}

// totals returns a layer's allowed and refused counts, both stores together.
func (s *windowStore) totals(st *layerStats) (allowed, refused int64) {
	s.mu.Lock()
	allowed, refused = st.allowed, st.refused
	s.mu.Unlock()

	return allowed + atomic.LoadInt64(&st.redisAllowed), refused + atomic.LoadInt64(&st.redisRefused)
}

// window is one counter. Times are Unix nanoseconds.
type window struct {
	layer  string
	key    string
	count  int64 // points spent in the window: never above the layer's points but in dry run
	start  int64
	reset  int64
	expire int64 // when the counter may be dropped: reset, or reset + duration for a sliding window
	// prevCount is a sliding window's count of the window before; resetSec
	// is the second resetH shows.
	prevCount int64
	resetSec  int64
	refused   int64    // requests this window refused (status page)
	logged    bool     // a refusal of this window was reported (see tally.firsts)
	taken     int64    // windowStore.takes of the last request that charged it: never evicted by that request
	resetH    []string // X-RateLimit-Reset value, formatted once per window
	list      *windowList
	prev      *window
	next      *window
}

// windowList links the counters of one duration and algorithm, oldest start
// first. A sliding window's counter outlives its window by one duration (its
// count weighs on the next window), so it keeps a list of its own.
type windowList struct {
	duration int64
	span     int64 // how long a counter lives from its start: duration, or 2x when sliding; 0 for token buckets
	// calendar and utcOffset are those of the list's layers: a calendar
	// window lives to its period's end (alignCalendar).
	calendar  int
	utcOffset int64
	head      *window
	tail      *window
}

// purgePerInsert is how many expired counters each new key removes, so memory
// follows the number of live keys even below the cap.
const purgePerInsert = 2

func newWindowStore(capacity int) *windowStore {
	return &windowStore{max: capacity, maps: map[string]map[string]*window{}, blocks: map[string]map[string]int64{}, stats: map[string]*layerStats{}}
}

// evicted returns the live counters dropped at the cap so far.
func (s *windowStore) evicted() int64 {
	s.mu.Lock()
	n := s.evictions
	s.mu.Unlock()

	return n
}

// setMax changes the cap; a lower cap takes effect as keys are added.
func (s *windowStore) setMax(capacity int) {
	s.mu.Lock()
	s.max = capacity
	s.mu.Unlock()
}

// attach gives a layer its map and its duration's list in this store. Layers
// resolve both once, in New, so the request path does no lookup.
func (s *windowStore) attach(l *layer) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if s.maps[l.name] == nil {
		s.maps[l.name] = map[string]*window{}
	}

	l.entries = s.maps[l.name]

	if s.blocks[l.name] == nil {
		s.blocks[l.name] = map[string]int64{}
	}

	l.blocks = s.blocks[l.name]

	if s.stats[l.name] == nil {
		s.stats[l.name] = &layerStats{}
	}

	l.stats = s.stats[l.name]

	span := l.duration
	if l.sliding {
		span = 2 * l.duration
	}

	if l.interval != 0 {
		span = 0 // token buckets: ordered by last request (tokenbucket.go)
	}

	for _, wl := range s.lists {
		if wl.duration == l.duration && wl.span == span && wl.calendar == l.calendar && wl.utcOffset == l.utcOffset {
			l.list = wl
			return
		}
	}

	l.list = &windowList{duration: l.duration, span: span, calendar: l.calendar, utcOffset: l.utcOffset}
	s.lists = append(s.lists, l.list)
}

// tally is what a store reports of one request's layers. cost is the
// caller's: the points the request spends in every layer (0 counts as 1).
type tally struct {
	cost    int64
	shown   int   // the layer for the headers: the refusing one, else the one with the fewest left; -1 if none
	count   int64 // its count after this request (a refusing layer: the count it would have reached)
	reset   int64 // its reset, Unix nanoseconds
	resetH  []string
	left    int64 // its requests left
	refused bool  // a layer's count would exceed its points
	firsts  uint64
	// firsts has bit i set when layers[i] refused for the first time in its
	// window, so a refusal is reported once per layer, key and window.
	// uncharged has bit i set when layers[i], in dry run, would have
	// refused and took nothing (a sliding window, a token bucket): a later
	// refusal has nothing to give back to it (giveBack).
	uncharged uint64
}

// refuse records that layers[i] refused with this count and reset; first
// says it is the window's first refusal. The first refusing layer is the one
// shown.
func (t *tally) refuse(i int, count, reset int64, resetH []string, first bool) {
	if first {
		t.firsts |= uint64(1) << uint(i)
	}

	if !t.refused {
		t.refused, t.shown, t.count, t.reset, t.resetH, t.left = true, i, count, reset, resetH, 0
	}
}

// refuseAs records that layers[i], l, would refuse with this count and
// reset, and reports whether the request is refused: as refuse, unless l is
// in dry run. A dry-run layer refuses nothing: its refusal is reported
// (first) and, unless it is quiet (layer.quiet), the headers may show it
// with nothing left, while the other layers decide the request.
func (t *tally) refuseAs(i int, l *layer, count, reset int64, resetH []string, first bool) bool {
	if !l.dryRun {
		t.refuse(i, count, reset, resetH, first)
		return true
	}

	if first {
		t.firsts |= uint64(1) << uint(i)
	}

	if l.sliding || l.interval != 0 {
		t.uncharged |= uint64(1) << uint(i)
	}

	t.allow(i, l, l.points, reset, resetH)

	return false
}

// chargeFixed charges cost points to the fixed window w of layers[i] under
// the store's lock, unless they do not fit: then the layer refuses
// (refuseFixed). It reports whether the layer refused the request.
func chargeFixed(t *tally, i int, l *layer, w *window, cost int64, all bool) bool {
	if w.count+cost > l.points {
		return refuseFixed(t, i, l, w, cost, all)
	}

	w.count += cost
	l.stats.allowed++
	t.allow(i, l, w.count, w.reset, w.resetH)

	return false
}

// refuseFixed records that the fixed window w of layers[i] cannot take cost
// points; the window is charged only in dry run (all, or the layer's own).
// Kept out of chargeFixed, whose frame every charge allocates (doc.go:
// frames). It reports whether the request is refused.
func refuseFixed(t *tally, i int, l *layer, w *window, cost int64, all bool) bool {
	l.stats.refused++
	w.refused++
	first := !w.logged
	w.logged = true
	refused := t.refuseAs(i, l, w.count+cost, w.reset, w.resetH, first)

	if all || l.dryRun {
		w.count += cost
	}

	return refused
}

// restart starts a new, empty window for key in l: the expired w (or one
// whose layer changed duration at a reload), or a new counter, held by the
// current request (windowStore.takes) so that its own later layers cannot
// evict it. Kept out of the paths that charge so that their common case
// stays small (doc.go: frames).
// restart starts a new window for key in l: the expired w (or one whose layer
// changed duration at a reload), or a new counter, charged by the current
// request (windowStore.takes). Kept out of take so that the common path stays
// small (doc.go: frames).
func (s *windowStore) restart(now int64, l *layer, w *window, key string) *window {
	if w != nil {
		w.list.unlink(w)
	} else {
		s.makeRoom(now, l.list)

		w = &window{layer: l.name, key: key}
		l.entries[key] = w
		s.size++
	}

	w.count = 0
	w.prevCount = 0
	w.refused = 0
	w.start = now
	w.reset = now + l.list.duration
	w.expire = now + l.list.span
	if l.calendar != 0 {
		alignCalendar(now, l, w)
	}
	w.resetSec = limit.CeilSeconds(w.reset)
	w.resetH = []string{formatInt(w.resetSec)}
	w.logged = false
	w.taken = s.takes
	l.list.push(w)

	return w
}

// makeRoom purges a few expired counters and, at the cap, all expired ones and
// then the oldest live ones that are not over their limit (oldestEvictable),
// until one more fits. It never evicts a counter
// the current request charged: with the cap at least the number of layers
// (config/check.go), another one is always there to evict, so the layers of one
// request cannot evict each other's counters.
func (s *windowStore) makeRoom(now int64, l *windowList) {
	for n := 0; n < purgePerInsert && l.head != nil && l.head.expire <= now; n++ {
		s.remove(l.head)
	}

	if s.size < s.max {
		return
	}

	for _, other := range s.lists {
		for other.head != nil && other.head.expire <= now {
			s.remove(other.head)
		}
	}

	for s.size >= s.max {
		oldest := s.oldestEvictable(false)
		if oldest == nil {
			oldest = s.oldestEvictable(true)
		}

		if oldest == nil {
			return
		}

		s.remove(oldest)
		s.evictions++
	}
}

// maxEvictionScan bounds how many counters of each list an eviction looks
// at for one that is not over its limit, so that a table full of limited
// keys costs each new key a bounded walk.
const maxEvictionScan = 256

// oldestEvictable returns the counter to evict at the cap: the oldest one,
// of any list, that the current request did not charge and, unless limited
// is set, that is not over its limit (refused in its window, w.logged): a
// limited client must not get back in because other clients filled the
// table. nil when there is none.
func (s *windowStore) oldestEvictable(limited bool) *window {
	var oldest *window

	for _, other := range s.lists {
		w := other.head
		for n := 0; w != nil && n < maxEvictionScan && (w.taken == s.takes || w.logged && !limited); n++ {
			w = w.next
		}

		if w != nil && w.taken != s.takes && (limited || !w.logged) && (oldest == nil || w.start < oldest.start) {
			oldest = w
		}
	}

	return oldest
}

func (s *windowStore) remove(w *window) {
	w.list.unlink(w)
	delete(s.maps[w.layer], w.key)
	s.size--
}

func (l *windowList) push(w *window) {
	w.list = l
	w.prev = l.tail
	w.next = nil

	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}

	l.tail = w
}

func (l *windowList) unlink(w *window) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}

	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}

	w.prev = nil
	w.next = nil
	w.list = nil
}

// registry holds one windowStore per middleware name, and for the redis
// store one blockList, while some instance of the middleware uses them or
// they hold counts that still matter (lifetime.go, keep.go). Traefik keeps
// one interpreter per plugin, so this survives configuration reloads and is
// shared by every router that uses the middleware.
var registry = &storeRegistry{stores: newKeepingRegistry(storeLive), blocked: newKeepingRegistry(blockListLive)}

type storeRegistry struct {
	stores  *heldRegistry // *windowStore by middleware name
	blocked *heldRegistry // *blockList by middleware name: keys known over their limit
}

// get returns the store of the middleware called name, held until ctx is
// cancelled, creating it with the cap capacity or applying capacity to the
// existing one.
func (r *storeRegistry) get(ctx context.Context, name string, capacity int) *windowStore {
	v := r.stores.take(ctx, name, func() interface{} { return newWindowStore(capacity) })

	s, _ := v.(*windowStore)
	s.setMax(capacity)

	return s
}

// blockListFor returns the list of keys known over their limit for the
// middleware called name (redis store), held until ctx is cancelled.
func (r *storeRegistry) blockListFor(ctx context.Context, name string, capacity int) *blockList {
	v := r.blocked.take(ctx, name, func() interface{} { return newBlockList(capacity) })

	b, _ := v.(*blockList)

	return b
}
