package tierlimit

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/lifetime"

	"github.com/tierlimit/tierlimit/limit"

	"github.com/tierlimit/tierlimit/redisresp"
)

// redis.syncInterval: counters synced with Redis in batches.
//
// Each Traefik process decides a synced layer's request against the total
// Redis gave it at the last sync (remote) plus what it charged since
// (pending), under one lock and without a round trip. Every interval, one
// goroutine per middleware sends every live key's pending points in one
// script call (syncScript) per chunk of keys (per slot on a Cluster), and
// each reply's total replaces remote. A process therefore admits at most
// points minus the others' charges it has not seen yet: over a fleet, a key
// can go over its points by what the other replicas charged it during one
// interval (plus one round trip), never more, since every charge reaches
// Redis at the next sync that works.
//
// Windows are fixed windows aligned to the epoch (a multiple of the
// duration, or the calendar period), and the key names its window's start,
// so that every replica agrees on the window without comparing TTLs and a
// new window starts from nothing in Redis and in memory. Only fixed windows
// are synced: a sliding window or a token bucket with syncInterval is a
// configuration error (config/sync.go, checkSync).
//
// Failure: a sync that fails keeps its points pending, to be sent by the next
// sync that works (so a charge is never lost; a call that failed after Redis
// applied it may be counted twice, never zero times), and requests go on being
// decided against the last totals plus every local charge: never fail open.
// The failure goes through the backend's outage (redisBackend.failed and
// succeeded: one REDIS_UNAVAILABLE and one REDIS_RECOVERED per outage, the
// back-off spacing the syncs that probe).

// syncBatch bounds the keys of one script call: a script blocks Redis while it
// runs, so a large table is sent in several calls of one round trip each.
const syncBatch = 500

// syncKeyGrace is how long a synced key outlives its window in Redis, for the
// clocks of replicas that are a little behind.
const syncKeyGrace = int64(2 * time.Second)

// syncScript adds each key's pending points and returns the totals.
//
// KEYS: the keys. ARGV[2i-1], ARGV[2i] of KEYS[i]: the points to add (0
// reads the total without creating the key) and the key's TTL in
// milliseconds, set when the key is new. A key of another kind, or holding
// something that is not an integer, is started afresh.
// Returns the totals, in order.
const syncScript = `
local out = {}
for i = 1, #KEYS do
  local k, add, ttl = KEYS[i], tonumber(ARGV[2 * i - 1]), ARGV[2 * i]
  local c
  if add == 0 then
    c = redis.pcall('GET', k)
    if type(c) ~= 'string' then c = 0 else c = tonumber(c) or 0 end
  else
    c = redis.pcall('INCRBY', k, add)
    if type(c) == 'table' and c.err then
      if not (string.find(c.err, 'WRONGTYPE', 1, true) or string.find(c.err, 'not an integer', 1, true)) then
        error(c)
      end
      redis.call('SET', k, add, 'PX', ttl)
      c = add
    elseif c == add then
      redis.call('PEXPIRE', k, ttl)
    end
  end
  out[i] = c
end
return out
`

var syncRedis = redisresp.NewScript(syncScript)

// errSyncSkipped is a sync that did not call Redis: the back-off is running.
var errSyncSkipped = errors.New("redis is in back-off")

// syncCounter is one key of one window: the total Redis returned at the last
// sync, the points charged locally since, and those of the sync in flight.
type syncCounter struct {
	key      string // the Redis key, naming the window's start
	layer    string // the layer's name and the bucket key, for resets
	bucket   string
	slot     int // the key's Cluster slot
	remote   int64
	pending  int64
	inflight int64
	points   int64 // the layer's points at the last request: a key at them needs no refresh
	end      int64 // the window's end, Unix nanoseconds
	// allowed and refused count decisions under the state's lock, added to
	// stats at each sync: an atomic add on the request path costs more.
	allowed  int64
	refused  int64
	stats    *layerStats
	resetH   []string // X-RateLimit-Reset of the window
	resetSec int64    // its second
	logged   bool     // a refusal of this window was reported
	touched  bool     // a request asked since the last sync: its total is to be refreshed
}

// syncState is a middleware's synced counters, kept across reloads by
// syncRegistry, with the goroutine that syncs them.
type syncState struct {
	mu       sync.Mutex
	byLayer  map[string]map[string]*syncCounter // by layer name, then bucket key: the current window's
	size     int                                // counters in byLayer
	max      int                                // maxTracked: counters kept at most
	backend  *redisBackend
	interval time.Duration
	started  bool
	syncing  bool
	stop     chan struct{}
	// listen subscribes the middleware to the resets of other replicas
	// (listenResets), at the first refusal: a reset matters only then.
	listen func()
	// now is the goroutine's clock; tests drive syncNow directly.
	now func() time.Time
}

func newSyncState() *syncState {
	return &syncState{byLayer: map[string]map[string]*syncCounter{}, now: time.Now}
}

// syncRegistry holds one syncState per middleware name while a configuration
// uses it (lifetime.go); a released one stops its goroutine and sends what
// it charged since its last sync.
var syncRegistry = lifetime.NewHeldRegistry(stopSync)

// stopSync stops a released state's goroutine, then sends its pending
// points (a sync interval longer than the release grace, or charges made
// after the last sync): its counts that matter are Redis's.
func stopSync(v interface{}) {
	st, ok := v.(*syncState)
	if !ok {
		return
	}

	st.mu.Lock()
	if st.started {
		close(st.stop)
		st.started = false
	}
	st.mu.Unlock()

	safeSync(st)
}

// flushSyncsOn sends the pending points of the synced states that use b,
// before b's pool closes: a state released at the same grace as its
// backend, but after it, could not send them any more (stopSync).
func flushSyncsOn(b *redisBackend) {
	var states []*syncState

	syncRegistry.Mu.Lock()
	for _, e := range syncRegistry.Entries {
		if st, ok := e.Value.(*syncState); ok {
			states = append(states, st)
		}
	}
	syncRegistry.Mu.Unlock()

	for _, st := range states {
		st.mu.Lock()
		mine := st.backend == b
		st.mu.Unlock()

		if mine {
			safeSync(st)
		}
	}
}

// syncStateFor returns the synced counters of the middleware called name,
// held until ctx is cancelled, set to use backend every interval. It does no
// I/O: the goroutine starts at the first request (syncTake).
func syncStateFor(ctx context.Context, name string, backend *redisBackend, interval time.Duration, capacity int, listen func()) *syncState {
	v := syncRegistry.Take(ctx, name, func() interface{} {
		return newSyncState()
	})

	st, _ := v.(*syncState)

	st.mu.Lock()
	st.backend, st.interval, st.max, st.listen = backend, interval, capacity, listen
	st.mu.Unlock()

	return st
}

// syncWindow returns l's window at now: its start and end, aligned to the
// epoch or the calendar, so that every replica computes the same.
func syncWindow(l *layer, now int64) (int64, int64) {
	if l.Calendar != 0 {
		return limit.Period(now, l.Calendar, l.UtcOffset)
	}

	start := now - now%l.Duration

	return start, start + l.Duration
}

// syncKey is the Redis key of bucket in l's window that starts at start:
// on a Cluster with the bucket in a hash tag.
func syncKey(l *layer, bucket string, cluster bool, start int64) string {
	if cluster {
		return l.RedisKey + "{" + bucket + "}:" + formatInt(start/int64(time.Millisecond))
	}

	return l.RedisKey + bucket + ":" + formatInt(start/int64(time.Millisecond))
}

// syncCounterFor returns the counter of l's key bucket at now, made when
// missing or of an ended window. Called with st.mu held.
func syncCounterFor(st *syncState, l *layer, bucket string, now int64) *syncCounter {
	c := st.byLayer[l.Name][bucket]
	if c == nil || c.end <= now {
		c = syncRestart(st, l, bucket, now)
	}

	return c
}

// syncRestart makes the counter of bucket in l's window at now, replacing
// one of an ended window, and starts the sync goroutine at the first
// request. Kept out of the request path's common case (doc.go: frames).
// Called with st.mu held.
func syncRestart(st *syncState, l *layer, bucket string, now int64) *syncCounter {
	if !st.started {
		startSync(st)
	}

	m := st.byLayer[l.Name]
	if m == nil {
		m = map[string]*syncCounter{}
		st.byLayer[l.Name] = m
	}

	old := m[bucket]
	if old != nil {
		flushStats(old)
	} else {
		if st.size >= st.max {
			purgeCounters(st, now)
		}

		st.size++
	}

	start, end := syncWindow(l, now)
	key := syncKey(l, bucket, st.backend != nil && st.backend.cluster != nil, start)

	c := &syncCounter{key: key, layer: l.Name, bucket: bucket, points: l.Points, end: end, stats: l.Stats,
		resetSec: limit.CeilSeconds(end)}
	c.resetH = []string{formatInt(c.resetSec)}
	if st.backend != nil && st.backend.cluster != nil {
		c.slot = redisresp.Slot(key)
	}

	m[bucket] = c

	return c
}

// flushStats adds a counter's decisions to its layer's stats. Called with
// st.mu held.
func flushStats(c *syncCounter) {
	if c.allowed != 0 {
		atomic.AddInt64(&c.stats.RedisAllowed, c.allowed)
		c.allowed = 0
	}

	if c.refused != 0 {
		atomic.AddInt64(&c.stats.RedisRefused, c.refused)
		c.refused = 0
	}
}

// dropCounter removes c from m. Called with st.mu held.
func dropCounter(st *syncState, m map[string]*syncCounter, c *syncCounter) {
	flushStats(c)
	delete(m, c.bucket)
	st.size--
}

// purgeCounters drops the counters whose window ended, and at the cap the
// ones with nothing to send and below their points, whose totals come back
// at their next sync. Called with st.mu held.
func purgeCounters(st *syncState, now int64) {
	for _, m := range st.byLayer {
		for _, c := range m {
			if c.end <= now {
				dropCounter(st, m, c)
			}
		}
	}

	for _, m := range st.byLayer {
		for _, c := range m {
			if st.size < st.max {
				return
			}

			if c.pending == 0 && c.inflight == 0 && !c.logged && c.remote < c.points {
				dropCounter(st, m, c)
			}
		}
	}
}

// syncTake decides a request's synced layers locally: all or nothing, as
// the other stores (counterStore). It starts the sync goroutine at the
// first request.
func syncTake(st *syncState, t *tally, ch *charge) {
	t.Shown = -1
	layers, now, all := ch.Layers, ch.Now, ch.All
	if len(layers) == 0 {
		return
	}

	cost := costOf(t)

	st.mu.Lock()

	var one [4]*syncCounter
	counters := one[:0]
	refused := false

	for i, l := range layers {
		c := syncCounterFor(st, l, ch.Keys[i], now)
		c.points = l.Points
		c.touched = true
		counters = append(counters, c)

		count := c.remote + c.inflight + c.pending + cost
		if count <= l.Points {
			if l.CheckOnly {
				count -= cost
			}

			t.Allow(i, l, count, c.end, c.resetH)

			continue
		}

		first := !c.logged
		c.logged = true

		if t.RefuseAs(i, l, count, c.end, c.resetH, first) {
			c.refused++
			refused = true
			if !all {
				break
			}
		}
	}

	chargeSynced(t, counters, layers, cost, all || !refused)

	listen := refused && t.Firsts != 0 && st.listen != nil
	st.mu.Unlock()

	if listen {
		st.listen()
	}
}

// chargeSynced charges cost to the counters of a request's layers when
// charge is set (no layer refused, or a dry run), and counts the decisions.
// Called with st.mu held.
func chargeSynced(t *tally, counters []*syncCounter, layers []*layer, cost int64, charge bool) {
	for i, c := range counters {
		if layers[i].CheckOnly {
			continue
		}

		if charge {
			c.pending += cost
		}

		if !t.Refused || i < t.Shown {
			c.allowed++
		}
	}
}

// syncForget drops the counters of bucket in the layer called layer, every
// window's, and reports whether one counted something: a reset (reset.go,
// or another replica's through resetsub.go).
func syncForget(st *syncState, layer, bucket string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()

	m := st.byLayer[layer]

	c := m[bucket]
	if c == nil {
		return false
	}

	dropCounter(st, m, c)

	return c.remote+c.pending+c.inflight > 0
}

// syncRefund gives cost back to the charge's counters: a later refusal of
// the request voided their charge (counterStore.refund).
func syncRefund(st *syncState, ch *charge, cost int64) {
	st.mu.Lock()

	for i, l := range ch.Layers {
		c := syncCounterFor(st, l, ch.Keys[i], ch.Now)
		c.pending -= cost
	}

	st.mu.Unlock()
}

// startSync starts the goroutine that syncs st every interval, until the
// registry releases st. Called with st.mu held.
func startSync(st *syncState) {
	st.started = true
	st.stop = make(chan struct{})

	go runSync(st, st.stop)
}

// runSync syncs st every interval until stop is closed. A panic ends one
// sync, not the loop (safeSync): a goroutine's panic would end the whole
// process. One outside a sync ends the loop, and the next request starts
// another.
func runSync(st *syncState, stop chan struct{}) {
	defer func() {
		if r := recover(); r != nil {
			st.mu.Lock()
			if st.stop == stop {
				st.started = false
			}
			st.mu.Unlock()
		}
	}()

	for {
		st.mu.Lock()
		interval := st.interval
		st.mu.Unlock()

		timer := time.NewTimer(interval)

		select {
		case <-stop:
			timer.Stop()
			return
		case <-timer.C:
		}

		safeSync(st)
	}
}

// safeSync is one sync that recovers from a panic, giving the points of a
// sync cut short back to pending.
func safeSync(st *syncState) {
	defer func() {
		if r := recover(); r != nil {
			unsend(st, nil)
		}
	}()

	_ = syncNow(st, st.now().UnixNano())
}

// syncNow sends every live counter's pending points to Redis and replaces
// their remote totals with the replies; it drops the counters whose window
// ended at now. On an error the points stay pending. One sync runs at a
// time: a call while one is in flight returns at once.
func syncNow(st *syncState, now int64) error {
	batch, backend := collectSync(st, now)
	if batch == nil {
		return nil
	}

	probe := false

	if backend.down.Load() {
		use := false
		if use, probe = backend.usable(now); !use {
			unsend(st, batch)
			return errSyncSkipped
		}
	}

	totals, err := sendSync(backend, batch, now)
	if err != nil {
		unsend(st, batch)

		if !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) {
			backend.failed(now, probe, err)
		}

		return err
	}

	applySync(st, batch, totals)

	if probe {
		backend.succeeded(now)
	}

	return nil
}

// collectSync moves every live counter's pending points in flight and
// returns those counters, sorted by slot, and the backend to send them to;
// nil when there is nothing to sync or a sync is under way.
func collectSync(st *syncState, now int64) ([]*syncCounter, *redisBackend) {
	st.mu.Lock()
	defer st.mu.Unlock()

	if st.syncing || st.backend == nil {
		return nil, nil
	}

	var batch []*syncCounter

	for _, m := range st.byLayer {
		batch = collectLayer(st, m, batch, now)
	}

	if len(batch) == 0 {
		return nil, nil
	}

	sort.Slice(batch, func(i, j int) bool { return batch[i].slot < batch[j].slot })
	st.syncing = true

	return batch, st.backend
}

// collectLayer is collectSync for one layer's counters, appended to batch.
func collectLayer(st *syncState, m map[string]*syncCounter, batch []*syncCounter, now int64) []*syncCounter {
	for _, c := range m {
		if c.end <= now {
			dropCounter(st, m, c)
			continue
		}

		flushStats(c)

		// A key no request asked for since the last sync keeps its total,
		// a lower bound of Redis's (they only grow but by a refund), until
		// one does; a key Redis counts at its points refuses every request
		// until its window ends. Neither needs a call.
		if c.pending == 0 && (!c.touched || c.remote >= c.points && c.points > 0) {
			continue
		}

		c.touched = false

		c.inflight = c.pending
		c.pending = 0
		batch = append(batch, c)
	}

	return batch
}

// unsend puts the points of a sync that did not happen back to pending; nil
// does so for every counter (a sync cut short by a panic).
func unsend(st *syncState, batch []*syncCounter) {
	st.mu.Lock()
	defer st.mu.Unlock()

	if batch == nil {
		for _, m := range st.byLayer {
			for _, c := range m {
				batch = append(batch, c)
			}
		}
	}

	for _, c := range batch {
		c.pending += c.inflight
		c.inflight = 0
	}

	st.syncing = false
}

// applySync replaces the counters' remote totals with Redis's.
func applySync(st *syncState, batch []*syncCounter, totals []int64) {
	st.mu.Lock()
	defer st.mu.Unlock()

	for i, c := range batch {
		total := totals[i]
		if total < 0 {
			total = 0
		}

		c.remote, c.inflight = total, 0
	}

	st.syncing = false
}

// sendSync runs syncScript for batch: chunks of syncBatch keys, one call
// each, or on a Cluster one call per slot, sent together. It returns the
// totals in batch's order.
func sendSync(b *redisBackend, batch []*syncCounter, now int64) ([]int64, error) {
	var calls []redisresp.ClusterCall
	var bounds []int

	for i := 0; i < len(batch); {
		j := i + 1
		for j < len(batch) && j-i < syncBatch && (b.cluster == nil || batch[j].slot == batch[i].slot) {
			j++
		}

		calls = append(calls, redisresp.ClusterCall{Slot: batch[i].slot, Call: syncRedis.Call(j-i, 3*(j-i)), Encoded: encodeSync(batch[i:j], now)})
		bounds = append(bounds, i)
		i = j
	}

	totals := make([]int64, 0, len(batch))

	if b.cluster != nil {
		replies, err := b.cluster.RunInts(calls)
		if err != nil {
			return nil, fmt.Errorf("syncing counters: %w", err)
		}

		for k, r := range replies {
			if err := checkSyncReply(r.Ints, r.ServerErr, nil, batch, bounds, k); err != nil {
				return nil, err
			}

			totals = append(totals, r.Ints...)
		}

		return totals, nil
	}

	for k, call := range calls {
		ints, serverErr, err := call.Call.RunIntsOn(b.pool, call.Encoded)
		if err := checkSyncReply(ints, serverErr, err, batch, bounds, k); err != nil {
			return nil, err
		}

		totals = append(totals, ints...)
	}

	return totals, nil
}

// checkSyncReply checks the reply of call k: one total per key sent.
func checkSyncReply(ints []int64, serverErr string, err error, batch []*syncCounter, bounds []int, k int) error {
	if err != nil {
		return fmt.Errorf("syncing counters: %w", err)
	}

	if serverErr != "" {
		return fmt.Errorf("running the sync script: %s", serverErr)
	}

	end := len(batch)
	if k+1 < len(bounds) {
		end = bounds[k+1]
	}

	if len(ints) != end-bounds[k] {
		return fmt.Errorf("%w: %d totals for %d keys", errBadReply, len(ints), end-bounds[k])
	}

	return nil
}

// encodeSync encodes syncScript's keys and arguments for counters.
func encodeSync(counters []*syncCounter, now int64) string {
	keys, args := "", ""

	for _, c := range counters {
		ttl := (c.end - now + syncKeyGrace) / int64(time.Millisecond)

		keys += redisresp.Bulk(c.key)
		args += redisresp.Bulk(formatInt(c.inflight)) + redisresp.Bulk(formatInt(ttl))
	}

	return keys + args
}
