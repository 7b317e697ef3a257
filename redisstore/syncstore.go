package redisstore

import (
	"context"
	"errors"
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

// redis.syncInterval: synced counters that admit only points they hold.
//
// A replica admits a synced layer's request from a lease: points of the key's
// window that Redis granted it (leaseScript, one atomic call), spent locally
// under one lock without a round trip. Redis counts every point it granted, so
// over a fleet a key never admits more than its points. A request whose
// counter holds too few points asks Redis for more at once (acquire: one call
// in flight per middleware, which the requests that need it wait for), and
// is refused, without a call, when Redis had no room for it at its last
// answer. The lease is the larger of what the request needs and a share of
// what the window has left (limit.LeaseGrant): large far from the points,
// down to one point, so that the last points go one request at a time.
//
// Every interval, one goroutine per middleware sends, in one script call per
// chunk of keys (per slot on a Cluster), what each key needs: more points for
// a key whose lease would not last the next interval at its last interval's
// use, and the lease of a key no request asked for during the last interval
// back to Redis, where other replicas can take it. A lease that ends with
// its window is not given back: the window's points went with it. Points a
// replica holds and does not spend are the only under-admission: at most
// the sum of the replicas' unspent leases, each at most a quarter of what
// the window had left when it was granted (docs/redis.md).
//
// Windows are fixed windows aligned to the epoch (a multiple of the
// duration, or the calendar period), and the key names its window's start,
// so that every replica agrees on the window without comparing TTLs and a
// new window starts from nothing in Redis and in memory. The key outlives
// its window by KeyGrace on the clock of the replica that ends it last
// (leaseScript never shortens its TTL), for replicas whose clocks are
// behind. Only fixed windows are synced: a sliding window or a token bucket
// with syncInterval is a configuration error (config/sync.go, checkSync).
//
// Failure: a replica keeps spending its lease while Redis is down. Without
// one, it decides against Redis's last total plus what it admitted without a
// lease (pending), as the memory fallback would: never fail open. Pending
// points are added to Redis by the next call that works, unconditionally, so a
// charge is never lost (a call that failed after Redis applied it may count
// twice, never zero times). The failure goes through the backend's outage
// (redisBackend.failed and succeeded: one REDIS_UNAVAILABLE and one
// REDIS_RECOVERED per outage, the back-off spacing the calls that probe).

// syncBatch bounds the keys of one script call: a script blocks Redis while it
// runs, so a large table is sent in several calls of one round trip each.
const syncBatch = 500

// maxLeaseRounds bounds the calls a request makes or waits for before it
// is decided with the points its counters hold: each call either grants
// its queued counters points or learns that Redis has none left, so more
// rounds mean other requests spent the grants first (the last points of a
// key that many requests want at once).
const maxLeaseRounds = 8

// errSyncSkipped is a sync that did not call Redis: the back-off is running.
var errSyncSkipped = errors.New("redis is in back-off")

// Counted is c's count as this replica sees it: its layer's points minus
// what the replica may still admit (what Redis had not granted at its last
// answer, and the lease). Pending points, admitted without a lease, count.
func Counted(c *SyncCounter) int64 {
	return c.Remote + c.Pending + c.Inflight - c.Lease - c.Back
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
	// Acquiring is closed when the lease call in flight ends; nil: none.
	// Wanting: the counters the next lease call asks for (queueNeeds).
	Acquiring chan struct{}
	Wanting   []*SyncCounter
	// Sending is what the sync in flight sends, put back if it panics;
	// Synced is closed when that sync ends.
	Sending []LeaseAsk
	Synced  chan struct{}
	Stop    chan struct{}
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
var syncRegistry = lifetime.NewHeldRegistry(stopSync)

// stopSync stops a released state's goroutine, then sends its pending
// points (a sync interval longer than the release grace, or charges made
// after the last sync): its counts that matter are Redis's.
func stopSync(v interface{}) {
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

	safeSync(st, true)
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
			safeSync(st, true)
		}
	}
}

// syncStateFor returns the synced counters of the middleware called name,
// held until ctx is cancelled, set to use backend every interval. It does no
// I/O: the goroutine starts at the first request (syncTake).
func syncStateFor(ctx context.Context, name string, backend *RedisBackend, interval time.Duration, capacity int, listen func()) *SyncState {
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
func SyncWindow(l *rule.Layer, now int64) (int64, int64) {
	if l.Calendar != 0 {
		return limit.Period(now, l.Calendar, l.UtcOffset)
	}

	return limit.Aligned(now, l.Duration)
}

// SyncKey is the Redis key of bucket in l's window that starts at start:
// on a Cluster with the bucket in a hash tag.
func SyncKey(l *rule.Layer, bucket string, cluster bool, start int64) string {
	if cluster {
		return l.RedisKey + "{" + bucket + "}:" + strconv.FormatInt(start/int64(time.Millisecond), 10)
	}

	return l.RedisKey + bucket + ":" + strconv.FormatInt(start/int64(time.Millisecond), 10)
}

// syncCounterFor returns the counter of l's key bucket at now, made when
// missing or of an ended window. Called with st.mu held.
func syncCounterFor(st *SyncState, l *rule.Layer, bucket string, now int64) *SyncCounter {
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
func SyncRestart(st *SyncState, l *rule.Layer, bucket string, now int64) *SyncCounter {
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

	c := &SyncCounter{Key: key, layer: l.Name, bucket: bucket, points: l.Capacity, End: end, stats: l.Stats,
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
	c.Need = 0
	delete(m, c.bucket)
	st.Size--
}

// purgeCounters drops the counters whose window ended, and at the cap the
// ones that hold nothing: no lease, nothing pending, no refusal reported.
// A dropped key asks Redis again at its next request. Called with st.mu
// held.
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

			if c.Lease == 0 && c.Pending == 0 && c.Inflight == 0 && !c.Logged {
				dropCounter(st, m, c)
			}
		}
	}
}

// SyncTake decides a request's synced layers, each a fixed window, from the
// leases its counters hold: all or nothing, as the other stores (../stores.go
// take). A counter that holds too few points asks Redis (acquire), unless
// Redis had no room at its last answer; while Redis is down it decides as
// the memory fallback would (decideSynced). It starts the sync goroutine at
// the first request.
func SyncTake(st *SyncState, t *rule.Tally, ch *rule.Charge) {
	t.Shown = -1
	if len(ch.Layers) == 0 {
		return
	}

	cost := rule.CostOf(t)
	counters := make([]*SyncCounter, len(ch.Layers))

	st.Mu.Lock()

	down := false
	for round := 0; ; round++ {
		for i, l := range ch.Layers {
			c := syncCounterFor(st, l, ch.Keys[i], ch.Now)
			c.points = l.Capacity
			c.Touched = true
			counters[i] = c
		}

		if down || round == maxLeaseRounds || !needsLease(counters, ch.Layers, cost) {
			break
		}

		// A lease going back is Redis's again only when its call ends:
		// asked before, it would not be there.
		if returning(counters) && st.Synced != nil {
			wait := st.Synced
			st.Mu.Unlock()
			<-wait
			st.Mu.Lock()

			continue
		}

		// Queued, the counters go with the next lease call, whichever
		// request makes it: the one in flight is waited for.
		queueNeeds(st, counters, ch.Layers, cost)

		if wait := st.Acquiring; wait != nil {
			st.Mu.Unlock()
			<-wait
			st.Mu.Lock()

			continue
		}

		down = acquire(st, ch.Now) != nil
	}

	decideSynced(t, counters, ch, cost, down)

	listen := t.Refused && t.Firsts != 0 && st.listen != nil
	st.Mu.Unlock()

	if listen {
		st.listen()
	}
}

// needsLease reports whether a counter holds less than cost while Redis, at
// its last answer, had room for the rest.
// Called with st.mu held.
func needsLease(counters []*SyncCounter, layers []*rule.Layer, cost int64) bool {
	for i, c := range counters {
		if c.Lease < cost && !layers[i].CheckOnly && limit.Fits(Counted(c), cost, c.points) {
			return true
		}
	}

	return false
}

// queuedAsks takes the queued counters (queueNeeds) into a lease call's
// asks, with what they admitted without a lease; on a Cluster sorted by
// slot, for one call per slot (SendLeases). Called with st.mu held.
func queuedAsks(st *SyncState, cluster bool) []LeaseAsk {
	asks := make([]LeaseAsk, 0, len(st.Wanting))
	for _, c := range st.Wanting {
		if c.Need == 0 {
			continue // dropped meanwhile (dropCounter)
		}

		asks = append(asks, LeaseAsk{c: c, add: c.Pending, need: c.Need, want: c.points, points: c.points})
		c.Inflight += c.Pending
		c.Pending = 0
		c.Need = 0
	}

	st.Wanting = st.Wanting[:0]

	if cluster {
		sort.Slice(asks, func(i, j int) bool { return asks[i].c.slot < asks[j].c.slot })
	}

	return asks
}

// queueNeeds queues, for the next lease call, each counter that holds less
// than cost, with the most a request queued for it lacks. Called with st.mu
// held.
func queueNeeds(st *SyncState, counters []*SyncCounter, layers []*rule.Layer, cost int64) {
	for i, c := range counters {
		if c.Lease >= cost || layers[i].CheckOnly {
			continue
		}

		if c.Need == 0 {
			st.Wanting = append(st.Wanting, c)
		}

		if cost-c.Lease > c.Need {
			c.Need = cost - c.Lease
		}
	}
}

// returning reports whether a counter is giving a lease back in the sync in
// flight. Called with st.mu held.
func returning(counters []*SyncCounter) bool {
	for _, c := range counters {
		if c.Back != 0 {
			return true
		}
	}

	return false
}

// decideSynced decides the request on its counters: a layer admits from
// its lease, or, when Redis is down, when its count fits the cost (the
// points then pending); else it refuses. All or nothing: the layers are
// charged when none refuses (or in a dry run, all: a refused layer's charge
// pending). Called with st.mu held.
func decideSynced(t *rule.Tally, counters []*SyncCounter, ch *rule.Charge, cost int64, down bool) {
	refused := false

	for i, l := range ch.Layers {
		c := counters[i]
		count := Counted(c)

		// A check (a countStatus route before the response) charges
		// nothing: it fits when the count does.
		fits := c.Lease >= cost || down && limit.Fits(count, cost, l.Capacity)
		if l.CheckOnly {
			fits = limit.Fits(count, cost, l.Capacity)
		}

		if fits {
			if !l.CheckOnly {
				count += cost
			}

			rule.Allow(t, i, l, count, c.End, c.ResetH)

			continue
		}

		first := !c.Logged
		c.Logged = true
		c.Full = !l.CheckOnly && limit.Full(count, l.Capacity)

		if rule.RefuseAs(t, i, l, count+cost, c.End, c.ResetH, first) {
			c.Refused++
			refused = true
			if !ch.All {
				break
			}
		}
	}

	chargeSynced(t, counters, ch.Layers, cost, ch.All || !refused)
}

// chargeSynced charges cost to the counters of a request's layers when
// charge is set (no layer refused, or a dry run): from the lease, the rest
// pending; and counts the decisions. Called with st.mu held.
func chargeSynced(t *rule.Tally, counters []*SyncCounter, layers []*rule.Layer, cost int64, charge bool) {
	for i, c := range counters {
		if layers[i].CheckOnly {
			continue
		}

		if charge && c.Lease >= cost {
			c.Lease -= cost
		} else if charge {
			c.Pending += cost - c.Lease
			c.Lease = 0
		}

		if !t.Refused || i < t.Shown {
			c.Allowed++
		}
	}
}

// acquire asks Redis, in one call, for the points the queued counters lack
// (queueNeeds), and sends what they admitted without a lease. It returns an
// error when Redis cannot answer: the request is then decided as the
// fallback would. Called with st.mu held; it unlocks it during the call,
// which the requests that need a lease meanwhile wait for.
func acquire(st *SyncState, now int64) error {
	backend := st.Backend
	if backend == nil {
		return errSyncSkipped
	}

	probe := false
	if backend.Down.Load() {
		use := false
		if use, probe = backend.Usable(now); !use {
			return errSyncSkipped
		}
	}

	asks := queuedAsks(st, backend.cluster != nil)

	done := make(chan struct{})
	st.Acquiring = done
	st.Mu.Unlock()

	replies, err := leasesAfterProbe(backend, asks, now, probe)

	st.Mu.Lock()
	st.Acquiring = nil
	close(done)

	if err != nil {
		unsendAsks(asks)

		if !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) && !errors.Is(err, errSyncSkipped) {
			st.Mu.Unlock()
			backend.Failed(now, false, err)
			st.Mu.Lock()
		}

		return err
	}

	applyAsks(asks, replies)

	return nil
}

// leasesAfterProbe sends asks, after the probe's write when the call is the
// back-off's probe (UseNow, made here without st.mu held); errSyncSkipped
// when the probe failed.
func leasesAfterProbe(backend *RedisBackend, asks []LeaseAsk, now int64, probe bool) ([]int64, error) {
	if probe && !backend.ProbeWrite(now) {
		return nil, errSyncSkipped
	}

	return SendLeases(backend, asks, now)
}

// SyncForget drops the counters of bucket in the layer called layer, every
// window's, and reports whether one counted something: a reset (reset.go,
// or another replica's through resetsub.go). Its lease goes with it: the
// reset deleted what Redis counted.
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
// the request voided their charge (../stores.go refund). It goes to the
// lease, which Redis counts; a counter whose window ended meanwhile is left
// alone.
func syncRefund(st *SyncState, ch *rule.Charge, cost int64) {
	st.Mu.Lock()

	for i, l := range ch.Layers {
		c := st.ByLayer[l.Name][ch.Keys[i]]
		if c != nil && c.End > ch.Now && !l.CheckOnly {
			c.Lease += cost
			c.Full = false
		}
	}

	st.Mu.Unlock()
}

// StartSync starts the goroutine that syncs st every interval, until the
// registry releases st. Called with st.mu held.
func StartSync(st *SyncState) {
	st.Started = true
	st.Stop = make(chan struct{})

	go runSync(st, st.Stop)
}

// runSync syncs st every interval until stop is closed. A panic ends one
// sync, not the loop (safeSync): a goroutine's panic would end the whole
// process. One outside a sync ends the loop, and the next request starts
// another.
func runSync(st *SyncState, stop chan struct{}) {
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

		safeSync(st, false)
	}
}

// safeSync is one sync (final: every lease given back) that recovers from
// a panic, putting what a sync cut short was sending back on its counters.
func safeSync(st *SyncState, final bool) {
	defer func() {
		if r := recover(); r != nil {
			st.Mu.Lock()
			unsendAsks(st.Sending)
			endSyncing(st)
			st.Mu.Unlock()
		}
	}()

	_ = SyncNow(st, st.Now().UnixNano(), final)
}

// SyncNow sends what every live counter needs (collectLayer) and applies
// Redis's answers; it drops the counters whose window ended at now. final
// gives every lease back (the middleware is released). On an error the
// counters keep their pending points and their leases. One sync runs at a
// time: a call while one is in flight returns at once.
func SyncNow(st *SyncState, now int64, final bool) error {
	asks, backend := CollectSync(st, now, final)
	if asks == nil {
		return nil
	}

	if backend.Down.Load() && !UseNow(backend, now) {
		EndSync(st, asks, nil)
		return errSyncSkipped
	}

	replies, err := SendLeases(backend, asks, now)
	EndSync(st, asks, replies)

	if err != nil {
		if !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) {
			backend.Failed(now, false, err)
		}

		return err
	}

	return nil
}

// EndSync applies a sync's replies to its counters, or, with none (the
// call failed or was skipped), puts back what it was sending.
func EndSync(st *SyncState, asks []LeaseAsk, replies []int64) {
	st.Mu.Lock()
	defer st.Mu.Unlock()

	if replies == nil {
		unsendAsks(asks)
	} else {
		applyAsks(asks, replies)
	}

	endSyncing(st)
}

// endSyncing marks the sync in flight ended, for the requests that wait
// for it. Called with st.mu held.
func endSyncing(st *SyncState) {
	st.Sending = nil
	st.Syncing = false

	if st.Synced != nil {
		close(st.Synced)
		st.Synced = nil
	}
}

// CollectSync takes what every live counter is to send (collectLayer) and
// returns it, sorted by slot, with the backend to send it to; nil when there
// is nothing to send or a sync is under way.
func CollectSync(st *SyncState, now int64, final bool) ([]LeaseAsk, *RedisBackend) {
	st.Mu.Lock()
	defer st.Mu.Unlock()

	if st.Syncing || st.Backend == nil {
		return nil, nil
	}

	idle := int64(1)
	if st.Interval > 0 && st.Interval < leaseIdle {
		idle = int64((leaseIdle + st.Interval - 1) / st.Interval)
	}

	var asks []LeaseAsk

	for _, m := range st.ByLayer {
		asks = collectLayer(st, m, asks, now, idle, final)
	}

	if len(asks) == 0 {
		return nil, nil
	}

	sort.Slice(asks, func(i, j int) bool { return asks[i].c.slot < asks[j].c.slot })
	st.Syncing = true
	st.Sending = asks
	st.Synced = make(chan struct{})

	return asks, st.Backend
}

// leaseIdle is how long a key goes without a request before its lease goes
// back to Redis: long enough that a key used now and then keeps its lease
// rather than asking anew, short enough that points a replica no longer
// needs reach the others soon.
const leaseIdle = time.Second

// collectLayer is CollectSync for one layer's counters, appended to asks: a
// counter sends its pending points; one that no request asked for during
// idle syncs gives its lease back (every one, when final); one that refuses
// for want of room asks for a point, which another replica may have given
// back; one whose lease would not last the next interval at the last
// interval's use, while Redis had room, asks for twice that use
// (limit.LeaseGrant bounds it).
func collectLayer(st *SyncState, m map[string]*SyncCounter, asks []LeaseAsk, now, idle int64, final bool) []LeaseAsk {
	for _, c := range m {
		if c.End <= now {
			dropCounter(st, m, c)
			continue
		}

		use := c.Allowed
		flushStats(c)

		a := LeaseAsk{c: c, add: c.Pending, points: c.points}

		if c.Touched {
			c.Idle = 0
		} else {
			c.Idle++
		}

		switch {
		case final || c.Idle >= idle:
			a.back = c.Lease
		case c.Touched && c.Full:
			a.want = 1 // another replica may have given points back
		case c.Touched && c.Lease < use && limit.Fits(Counted(c)+c.Lease, 1, c.points):
			a.want = 2 * use
		}

		c.Touched = false

		if a.add == 0 && a.back == 0 && a.want == 0 {
			continue
		}

		c.Inflight += a.add
		c.Pending = 0
		c.Lease -= a.back
		c.Back += a.back
		asks = append(asks, a)
	}

	return asks
}
