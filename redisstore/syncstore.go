package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
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

// ErrSyncSkipped is a sync that did not call Redis: the back-off is running.
var ErrSyncSkipped = errors.New("redis is in back-off")

// SyncCounter is one key of one window: the total Redis returned at the last
// sync, the points charged locally since, and those of the sync in flight.
type SyncCounter struct {
	Key      string // the Redis key, naming the window's start
	layer    string // the layer's name and the bucket key, for resets
	bucket   string
	slot     int // the key's Cluster slot
	Remote   int64
	Pending  int64
	Inflight int64
	points   int64 // the layer's points at the last request: a key at them needs no refresh
	End      int64 // the window's end, Unix nanoseconds
	// allowed and refused count decisions under the state's lock, added to
	// stats at each sync: an atomic add on the request path costs more.
	Allowed  int64
	Refused  int64
	stats    *layerStats
	ResetH   []string // X-RateLimit-Reset of the window
	ResetSec int64    // its second
	Logged   bool     // a refusal of this window was reported
	Touched  bool     // a request asked since the last sync: its total is to be refreshed
}

// SyncState is a middleware's synced counters, kept across reloads by
// syncRegistry, with the goroutine that syncs them.
type SyncState struct {
	Mu       sync.Mutex
	ByLayer  map[string]map[string]*SyncCounter // by layer name, then bucket key: the current window's
	Size     int                                // counters in byLayer
	Max      int                                // maxTracked: counters kept at most
	Backend  *RedisBackend
	Interval time.Duration
	Started  bool
	Syncing  bool
	Stop     chan struct{}
	// listen subscribes the middleware to the resets of other replicas
	// (listenResets), at the first refusal: a reset matters only then.
	listen func()
	// now is the goroutine's clock; tests drive syncNow directly.
	Now func() time.Time
}

func NewSyncState() *SyncState {
	return &SyncState{ByLayer: map[string]map[string]*SyncCounter{}, Now: time.Now}
}

// syncRegistry holds one syncState per middleware name while a configuration
// uses it (../lifetime/lifetime.go); a released one stops its goroutine and sends what
// it charged since its last sync.
var syncRegistry = lifetime.NewHeldRegistry(StopSync)

// StopSync stops a released state's goroutine, then sends its pending
// points (a sync interval longer than the release grace, or charges made
// after the last sync): its counts that matter are Redis's.
func StopSync(v interface{}) {
	st, ok := v.(*SyncState)
	if !ok {
		return
	}

	st.Mu.Lock()
	if st.Started {
		close(st.Stop)
		st.Started = false
	}
	st.Mu.Unlock()

	SafeSync(st)
}

// flushSyncsOn sends the pending points of the synced states that use b,
// before b's pool closes: a state released at the same grace as its
// backend, but after it, could not send them any more (stopSync).
func flushSyncsOn(b *RedisBackend) {
	var states []*SyncState

	syncRegistry.Mu.Lock()
	for _, e := range syncRegistry.Entries {
		if st, ok := e.Value.(*SyncState); ok {
			states = append(states, st)
		}
	}
	syncRegistry.Mu.Unlock()

	for _, st := range states {
		st.Mu.Lock()
		mine := st.Backend == b
		st.Mu.Unlock()

		if mine {
			SafeSync(st)
		}
	}
}

// SyncStateFor returns the synced counters of the middleware called name,
// held until ctx is cancelled, set to use backend every interval. It does no
// I/O: the goroutine starts at the first request (syncTake).
func SyncStateFor(ctx context.Context, name string, backend *RedisBackend, interval time.Duration, capacity int, listen func()) *SyncState {
	v := syncRegistry.Take(ctx, name, func() interface{} {
		return NewSyncState()
	})

	st, _ := v.(*SyncState)

	st.Mu.Lock()
	st.Backend, st.Interval, st.Max, st.listen = backend, interval, capacity, listen
	st.Mu.Unlock()

	return st
}

// SyncWindow returns l's window at now: its start and end, aligned to the
// epoch (limit.Aligned) or the calendar (limit.Period), so that every
// replica computes the same.
func SyncWindow(l *layer, now int64) (int64, int64) {
	if l.Calendar != 0 {
		return limit.Period(now, l.Calendar, l.UtcOffset)
	}

	return limit.Aligned(now, l.Duration)
}

// SyncKey is the Redis key of bucket in l's window that starts at start:
// on a Cluster with the bucket in a hash tag.
func SyncKey(l *layer, bucket string, cluster bool, start int64) string {
	if cluster {
		return l.RedisKey + "{" + bucket + "}:" + strconv.FormatInt(start/int64(time.Millisecond), 10)
	}

	return l.RedisKey + bucket + ":" + strconv.FormatInt(start/int64(time.Millisecond), 10)
}

// syncCounterFor returns the counter of l's key bucket at now, made when
// missing or of an ended window. Called with st.mu held.
func syncCounterFor(st *SyncState, l *layer, bucket string, now int64) *SyncCounter {
	c := st.ByLayer[l.Name][bucket]
	if c == nil || c.End <= now {
		c = SyncRestart(st, l, bucket, now)
	}

	return c
}

// SyncRestart makes the counter of bucket in l's window at now, replacing
// one of an ended window, and starts the sync goroutine at the first
// request. Kept out of the request path's common case (doc.go: frames).
// Called with st.mu held.
func SyncRestart(st *SyncState, l *layer, bucket string, now int64) *SyncCounter {
	if !st.Started {
		StartSync(st)
	}

	m := st.ByLayer[l.Name]
	if m == nil {
		m = map[string]*SyncCounter{}
		st.ByLayer[l.Name] = m
	}

	old := m[bucket]
	if old != nil {
		flushStats(old)
	} else {
		if st.Size >= st.Max {
			purgeCounters(st, now)
		}

		st.Size++
	}

	start, end := SyncWindow(l, now)
	key := SyncKey(l, bucket, st.Backend != nil && st.Backend.cluster != nil, start)

	c := &SyncCounter{Key: key, layer: l.Name, bucket: bucket, points: l.Points, End: end, stats: l.Stats,
		ResetSec: limit.CeilSeconds(end)}
	c.ResetH = []string{strconv.FormatInt(c.ResetSec, 10)}
	if st.Backend != nil && st.Backend.cluster != nil {
		c.slot = redisresp.Slot(key)
	}

	m[bucket] = c

	return c
}

// flushStats adds a counter's decisions to its layer's stats. Called with
// st.mu held.
func flushStats(c *SyncCounter) {
	if c.Allowed != 0 {
		atomic.AddInt64(&c.stats.RedisAllowed, c.Allowed)
		c.Allowed = 0
	}

	if c.Refused != 0 {
		atomic.AddInt64(&c.stats.RedisRefused, c.Refused)
		c.Refused = 0
	}
}

// dropCounter removes c from m. Called with st.mu held.
func dropCounter(st *SyncState, m map[string]*SyncCounter, c *SyncCounter) {
	flushStats(c)
	delete(m, c.bucket)
	st.Size--
}

// purgeCounters drops the counters whose window ended, and at the cap the
// ones with nothing to send and below their points, whose totals come back
// at their next sync. Called with st.mu held.
func purgeCounters(st *SyncState, now int64) {
	for _, m := range st.ByLayer {
		for _, c := range m {
			if c.End <= now {
				dropCounter(st, m, c)
			}
		}
	}

	for _, m := range st.ByLayer {
		for _, c := range m {
			if st.Size < st.Max {
				return
			}

			if c.Pending == 0 && c.Inflight == 0 && !c.Logged && c.Remote < c.points {
				dropCounter(st, m, c)
			}
		}
	}
}

// SyncTake decides a request's synced layers locally, each a fixed window
// (limit.Fits): all or nothing, as the other stores (../stores.go take). It
// starts the sync goroutine at the first request.
func SyncTake(st *SyncState, t *tally, ch *charge) {
	t.Shown = -1
	layers, now, all := ch.Layers, ch.Now, ch.All
	if len(layers) == 0 {
		return
	}

	cost := rule.CostOf(t)

	st.Mu.Lock()

	var one [4]*SyncCounter
	counters := one[:0]
	refused := false

	for i, l := range layers {
		// syncCounterFor, written out: a call per layer costs more than
		// these lines (doc.go: frames).
		c := st.ByLayer[l.Name][ch.Keys[i]]
		if c == nil || c.End <= now {
			c = SyncRestart(st, l, ch.Keys[i], now)
		}

		c.points = l.Points
		c.Touched = true
		counters = append(counters, c)

		count := c.Remote + c.Inflight + c.Pending
		if limit.Fits(count, cost, l.Points) {
			if !l.CheckOnly {
				count += cost
			}

			rule.Allow(t, i, l, count, c.End, c.ResetH)

			continue
		}

		first := !c.Logged
		c.Logged = true

		if rule.RefuseAs(t, i, l, count+cost, c.End, c.ResetH, first) {
			c.Refused++
			refused = true
			if !all {
				break
			}
		}
	}

	chargeSynced(t, counters, layers, cost, all || !refused)

	listen := refused && t.Firsts != 0 && st.listen != nil
	st.Mu.Unlock()

	if listen {
		st.listen()
	}
}

// chargeSynced charges cost to the counters of a request's layers when
// charge is set (no layer refused, or a dry run), and counts the decisions.
// Called with st.mu held.
func chargeSynced(t *tally, counters []*SyncCounter, layers []*layer, cost int64, charge bool) {
	for i, c := range counters {
		if layers[i].CheckOnly {
			continue
		}

		if charge {
			c.Pending += cost
		}

		if !t.Refused || i < t.Shown {
			c.Allowed++
		}
	}
}

// SyncForget drops the counters of bucket in the layer called layer, every
// window's, and reports whether one counted something: a reset (reset.go,
// or another replica's through resetsub.go).
func SyncForget(st *SyncState, layer, bucket string) bool {
	st.Mu.Lock()
	defer st.Mu.Unlock()

	m := st.ByLayer[layer]

	c := m[bucket]
	if c == nil {
		return false
	}

	dropCounter(st, m, c)

	return c.Remote+c.Pending+c.Inflight > 0
}

// syncRefund gives cost back to the charge's counters: a later refusal of
// the request voided their charge (../stores.go refund).
func syncRefund(st *SyncState, ch *charge, cost int64) {
	st.Mu.Lock()

	for i, l := range ch.Layers {
		c := syncCounterFor(st, l, ch.Keys[i], ch.Now)
		c.Pending -= cost
	}

	st.Mu.Unlock()
}

// StartSync starts the goroutine that syncs st every interval, until the
// registry releases st. Called with st.mu held.
func StartSync(st *SyncState) {
	st.Started = true
	st.Stop = make(chan struct{})

	go RunSync(st, st.Stop)
}

// RunSync syncs st every interval until stop is closed. A panic ends one
// sync, not the loop (safeSync): a goroutine's panic would end the whole
// process. One outside a sync ends the loop, and the next request starts
// another.
func RunSync(st *SyncState, stop chan struct{}) {
	defer func() {
		if r := recover(); r != nil {
			st.Mu.Lock()
			if st.Stop == stop {
				st.Started = false
			}
			st.Mu.Unlock()
		}
	}()

	for {
		st.Mu.Lock()
		interval := st.Interval
		st.Mu.Unlock()

		timer := time.NewTimer(interval)

		select {
		case <-stop:
			timer.Stop()
			return
		case <-timer.C:
		}

		SafeSync(st)
	}
}

// SafeSync is one sync that recovers from a panic, giving the points of a
// sync cut short back to pending.
func SafeSync(st *SyncState) {
	defer func() {
		if r := recover(); r != nil {
			unsend(st, nil)
		}
	}()

	_ = SyncNow(st, st.Now().UnixNano())
}

// SyncNow sends every live counter's pending points to Redis and replaces
// their remote totals with the replies; it drops the counters whose window
// ended at now. On an error the points stay pending. One sync runs at a
// time: a call while one is in flight returns at once.
func SyncNow(st *SyncState, now int64) error {
	batch, backend := CollectSync(st, now)
	if batch == nil {
		return nil
	}

	probe := false

	if backend.Down.Load() {
		use := false
		if use, probe = backend.Usable(now); !use {
			unsend(st, batch)
			return ErrSyncSkipped
		}
	}

	totals, err := SendSync(backend, batch, now)
	if err != nil {
		unsend(st, batch)

		if !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) {
			backend.Failed(now, probe, err)
		}

		return err
	}

	ApplySync(st, batch, totals)

	if probe {
		backend.Succeeded(now)
	}

	return nil
}

// CollectSync moves every live counter's pending points in flight and
// returns those counters, sorted by slot, and the backend to send them to;
// nil when there is nothing to sync or a sync is under way.
func CollectSync(st *SyncState, now int64) ([]*SyncCounter, *RedisBackend) {
	st.Mu.Lock()
	defer st.Mu.Unlock()

	if st.Syncing || st.Backend == nil {
		return nil, nil
	}

	var batch []*SyncCounter

	for _, m := range st.ByLayer {
		batch = collectLayer(st, m, batch, now)
	}

	if len(batch) == 0 {
		return nil, nil
	}

	sort.Slice(batch, func(i, j int) bool { return batch[i].slot < batch[j].slot })
	st.Syncing = true

	return batch, st.Backend
}

// collectLayer is collectSync for one layer's counters, appended to batch.
func collectLayer(st *SyncState, m map[string]*SyncCounter, batch []*SyncCounter, now int64) []*SyncCounter {
	for _, c := range m {
		if c.End <= now {
			dropCounter(st, m, c)
			continue
		}

		flushStats(c)

		// A key no request asked for since the last sync keeps its total,
		// a lower bound of Redis's (they only grow but by a refund), until
		// one does; a key Redis counts at its points refuses every request
		// until its window ends. Neither needs a call.
		if c.Pending == 0 && (!c.Touched || c.Remote >= c.points && c.points > 0) {
			continue
		}

		c.Touched = false

		c.Inflight = c.Pending
		c.Pending = 0
		batch = append(batch, c)
	}

	return batch
}

// unsend puts the points of a sync that did not happen back to pending; nil
// does so for every counter (a sync cut short by a panic).
func unsend(st *SyncState, batch []*SyncCounter) {
	st.Mu.Lock()
	defer st.Mu.Unlock()

	if batch == nil {
		for _, m := range st.ByLayer {
			for _, c := range m {
				batch = append(batch, c)
			}
		}
	}

	for _, c := range batch {
		c.Pending += c.Inflight
		c.Inflight = 0
	}

	st.Syncing = false
}

// ApplySync replaces the counters' remote totals with Redis's.
func ApplySync(st *SyncState, batch []*SyncCounter, totals []int64) {
	st.Mu.Lock()
	defer st.Mu.Unlock()

	for i, c := range batch {
		total := totals[i]
		if total < 0 {
			total = 0
		}

		c.Remote, c.Inflight = total, 0
	}

	st.Syncing = false
}

// SendSync runs syncScript for batch: chunks of syncBatch keys, one call
// each, or on a Cluster one call per slot, sent together. It returns the
// totals in batch's order.
func SendSync(b *RedisBackend, batch []*SyncCounter, now int64) ([]int64, error) {
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
		ints, serverErr, err := call.Call.RunIntsOn(b.Pool, call.Encoded)
		if err := checkSyncReply(ints, serverErr, err, batch, bounds, k); err != nil {
			return nil, err
		}

		totals = append(totals, ints...)
	}

	return totals, nil
}

// checkSyncReply checks the reply of call k: one total per key sent.
func checkSyncReply(ints []int64, serverErr string, err error, batch []*SyncCounter, bounds []int, k int) error {
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
		return fmt.Errorf("%w: %d totals for %d keys", ErrBadReply, len(ints), end-bounds[k])
	}

	return nil
}

// encodeSync encodes syncScript's keys and arguments for counters.
func encodeSync(counters []*SyncCounter, now int64) string {
	keys, args := "", ""

	for _, c := range counters {
		ttl := (c.End - now + syncKeyGrace) / int64(time.Millisecond)

		keys += redisresp.Bulk(c.Key)
		args += redisresp.Bulk(strconv.FormatInt(c.Inflight, 10)) + redisresp.Bulk(strconv.FormatInt(ttl, 10))
	}

	return keys + args
}
