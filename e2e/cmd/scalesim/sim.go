package main

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"math/rand"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/events"
)

// simConfig is one configuration of the simulation: replicas of the
// compiled plugin in this process, sharing one Redis deployment, under a
// Zipf load of keys (client IPs) on the ip layer.
type simConfig struct {
	Deployment   string        // "single" or "cluster"
	Addrs        []string      // the server, or the cluster's seeds
	Mode         string        // "exact" or "synced"
	Replicas     int           // plugin instances, each as on a Traefik of its own
	Keys         int           // client IPs the Zipf law draws from
	Rate         float64       // requests per second over all replicas; 0: as fast as the machine goes
	Duration     time.Duration // of the load
	Workers      int           // goroutines sending requests
	Points       int           // the ip layer's points per Window
	Window       time.Duration // the ip layer's duration
	SyncInterval time.Duration // redis.syncInterval in synced mode
	Zipf         float64       // exponent s of P(k) ∝ (1+k)^-s, > 1
	Seed         int64
}

// simResult is what one configuration measured.
type simResult struct {
	Config simConfig

	Requests, Admitted, Refused, Other int64
	Elapsed                            float64 // seconds of load
	Touched                            int64   // distinct keys requested
	ReplicaKeys                        int64   // distinct keys per replica, summed over replicas
	ReplicaKeyWindows                  int64   // distinct (key, window) pairs per replica, summed over replicas
	BadReset                           int64   // answers whose X-RateLimit-Reset was missing or out of range

	KeyWindows  int64   // (key, window) pairs that saw a request
	Over        int64   // ... that admitted more than Points
	MaxFill     float64 // the largest admitted/Points of any (key, window)
	HotWindows  int64   // (key, window) pairs with a refusal
	HotFillMean float64 // mean admitted/Points over them
	// (key, window) pairs asked at least twice their points, and their
	// mean admitted/Points: the keys a limit is for.
	FloodWindows  int64
	FloodFillMean float64

	Redis     redisDelta
	ClientCPU float64 // seconds of this process's CPU during the load
	HeapDelta int64   // HeapAlloc after the load minus before, both after a GC
	Outages   int64   // REDIS_UNAVAILABLE lines: memory decided some requests
	Events    int64   // event lines the replicas wrote (refusals, Redis states)
}

// eventCounter stands for Traefik's log: it counts the plugin's event lines,
// and among them the Redis outages.
type eventCounter struct {
	lines, outages atomic.Int64
}

func (e *eventCounter) Write(b []byte) (int, error) {
	e.lines.Add(int64(strings.Count(string(b), "\n")))
	if strings.Contains(string(b), "REDIS_UNAVAILABLE") {
		e.outages.Add(1)
	}

	return len(b), nil
}

var eventsSeen = &eventCounter{}

func init() {
	events.EventWriter = eventsSeen
}

// keyPad is the length of the run of colons that lets replicas of one
// process share Redis keys (replicaNames).
const keyPad = 64

// replicaNames returns replica i's keyPrefix and middleware name. Replicas
// on different machines have the same middleware name; in one process the
// name must differ, or they would share the registry's counters and leases.
// The Redis keys start with <keyPrefix>:<name>:, so colons moved from the
// name to the prefix keep every replica on the same keys:
// base + ":"*keyPad + "rl" whatever i.
func replicaNames(base string, i int) (prefix, name string) {
	return base + strings.Repeat(":", i), strings.Repeat(":", keyPad-1-i) + "rl"
}

// newReplicas makes c.Replicas instances of the plugin in front of a backend
// that answers 200. Each gets a Redis client of its own (a dial timeout of
// its own makes a distinct pool configuration), as on its own machine.
func newReplicas(ctx context.Context, c simConfig, base string) ([]http.Handler, error) {
	if c.Replicas > keyPad {
		return nil, fmt.Errorf("at most %d replicas", keyPad)
	}

	backend := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	hs := make([]http.Handler, c.Replicas)

	for i := range hs {
		conf := tierlimit.CreateConfig()
		conf.Store = "redis"
		conf.KeyPrefix, _ = replicaNames(base, i)
		conf.MaxTracked = 100000
		if c.Keys > conf.MaxTracked {
			conf.MaxTracked = c.Keys
		}

		conf.Global.Points = 0
		conf.IP.Points, conf.IP.Duration = c.Points, c.Window.String()
		// Generous: an outage would let memory decide, which is not what is measured.
		conf.Redis.Timeout = "5s"
		conf.Redis.DialTimeout = strconv.Itoa(2000+i) + "ms"

		if c.Deployment == "cluster" {
			conf.Redis.Cluster = &config.RedisClusterConfig{Addresses: c.Addrs}
		} else {
			conf.Redis.Address = c.Addrs[0]
		}

		if c.Mode == "synced" {
			conf.Redis.SyncInterval = c.SyncInterval.String()
		}

		_, name := replicaNames(base, i)

		h, err := tierlimit.New(ctx, backend, conf, name)
		if err != nil {
			return nil, err
		}

		hs[i] = h
	}

	return hs, nil
}

// tally is what the load saw, per key and window, without allocating on
// the request path: the arrays are made before the heap is measured.
type tally struct {
	base, slots int64
	admitted    []int32 // [key*slots + slot]
	refused     []int32
	seen        [][]uint32 // per replica, a bit per key
	active      [][]uint32 // per replica, a bit per (window, key)
	bad         atomic.Int64
	requests    atomic.Int64
	ok          atomic.Int64
	no          atomic.Int64
	other       atomic.Int64
}

func newTally(c simConfig, start time.Time) *tally {
	t := &tally{base: start.Unix(), slots: int64((c.Duration+c.Window)/time.Second) + 4}
	t.admitted = make([]int32, int64(c.Keys)*t.slots)
	t.refused = make([]int32, int64(c.Keys)*t.slots)
	t.seen = make([][]uint32, c.Replicas)

	for i := range t.seen {
		t.seen[i] = make([]uint32, c.Keys/32+1)
		t.active = append(t.active, make([]uint32, (int64(c.Keys)*t.slots)/32+1))
	}

	return t
}

// record counts one answer of replica r for key k, in the slot of its
// X-RateLimit-Reset: the window's end in whole seconds. A synced window is
// aligned to the epoch, so its answers all name its end. An exact window
// ends at the key's first hit + duration (Redis's PTTL), which a replica
// reports as its clock at the reply + PTTL, rounded up: the reply's delay
// (under a second) makes that end, c, or the second after it, c+1. The
// next window of the key ends at least Window later, from c+Window on: with
// Window >= 3s a window's answers are a run of neighbouring slots, and two
// windows are never neighbours (fills).
func (t *tally) record(r int, k uint64, code int, h http.Header) {
	t.requests.Add(1)
	atomic.OrUint32(&t.seen[r][k/32], 1<<(k%32))

	counts := t.admitted
	switch code {
	case http.StatusOK:
		t.ok.Add(1)
	case http.StatusTooManyRequests:
		t.no.Add(1)
		counts = t.refused
	default:
		t.other.Add(1)
		return
	}

	var reset int64 = -1
	if v := h["X-Ratelimit-Reset"]; len(v) == 1 {
		reset, _ = strconv.ParseInt(v[0], 10, 64)
	}

	slot := reset - t.base
	if slot < 0 || slot >= t.slots {
		t.bad.Add(1)
		return
	}

	i := int64(k)*t.slots + slot
	atomic.AddInt32(&counts[i], 1)
	atomic.OrUint32(&t.active[r][i/32], 1<<(i%32))
}

// fills sets the result's never-over and how-far-under figures, a window
// being a run of neighbouring slots (record).
func (t *tally) fills(res *simResult, points int) {
	var hotSum, floodSum float64

	for k := int64(0); k < int64(len(t.admitted))/t.slots; k++ {
		var a, r int32

		for s := int64(0); s <= t.slots; s++ {
			if s < t.slots && t.admitted[k*t.slots+s]+t.refused[k*t.slots+s] > 0 {
				a, r = a+t.admitted[k*t.slots+s], r+t.refused[k*t.slots+s]
				continue
			}

			if a+r == 0 {
				continue
			}

			fill := float64(a) / float64(points)
			res.KeyWindows++
			res.MaxFill = math.Max(res.MaxFill, fill)

			if int(a) > points {
				res.Over++
			}

			if r > 0 {
				res.HotWindows++
				hotSum += fill
			}

			if int(a+r) >= 2*points {
				res.FloodWindows++
				floodSum += fill
			}

			a, r = 0, 0
		}
	}

	if res.HotWindows > 0 {
		res.HotFillMean = hotSum / float64(res.HotWindows)
	}

	if res.FloodWindows > 0 {
		res.FloodFillMean = floodSum / float64(res.FloodWindows)
	}

	t.keys(res)
	res.Requests, res.Admitted, res.Refused, res.Other = t.requests.Load(), t.ok.Load(), t.no.Load(), t.other.Load()
	res.BadReset = t.bad.Load()
}

// keys counts the distinct keys requested, in all and per replica, and
// each replica's (key, window) pairs: runs of its slots of a key.
func (t *tally) keys(res *simResult) {
	union := make([]uint32, len(t.seen[0]))

	for r, words := range t.seen {
		for w, b := range words {
			union[w] |= b
			res.ReplicaKeys += int64(bits.OnesCount32(b))

			for ; b != 0; b &= b - 1 {
				k := int64(w)*32 + int64(bits.TrailingZeros32(b))
				res.ReplicaKeyWindows += t.runs(t.active[r], k)
			}
		}
	}

	for _, b := range union {
		res.Touched += int64(bits.OnesCount32(b))
	}
}

// runs is the number of runs of set bits among key k's slots in active.
func (t *tally) runs(active []uint32, k int64) int64 {
	var n int64

	prev := false

	for s := k * t.slots; s < (k+1)*t.slots; s++ {
		set := active[s/32]&(1<<(s%32)) != 0
		if set && !prev {
			n++
		}

		prev = set
	}

	return n
}

// writer is the least ResponseWriter: headers and status, the body dropped.
type writer struct {
	h    http.Header
	code int
}

func (w *writer) Header() http.Header { return w.h }

func (w *writer) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *writer) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(b), nil
}

// clientIP is key k's address: 100.64.0.0/10 (shared address space), which
// no default trusted proxy range covers, so the peer is the client.
func clientIP(k uint64) string {
	return "100." + strconv.Itoa(64+int(k>>16)) + "." + strconv.Itoa(int(k>>8&255)) + "." + strconv.Itoa(int(k&255)) + ":40000"
}

// load sends requests from c.Workers goroutines until end, each to a
// replica drawn uniformly (a load balancer) for a key drawn from the Zipf
// law, paced to c.Rate over all workers when it is set. keyBase offsets
// the keys (the warm-up's are apart from the measured ones).
func load(c simConfig, hs []http.Handler, end time.Time, keyBase uint64, t *tally) {
	var wg sync.WaitGroup

	for w := 0; w < c.Workers; w++ {
		wg.Add(1)

		go func(w int) {
			defer wg.Done()
			worker(c, hs, end, keyBase, t, w)
		}(w)
	}

	wg.Wait()
}

func worker(c simConfig, hs []http.Handler, end time.Time, keyBase uint64, t *tally, w int) {
	rnd := rand.New(rand.NewSource(c.Seed*1000 + int64(w) + int64(keyBase)))
	zipf := rand.NewZipf(rnd, c.Zipf, 1, uint64(c.Keys-1))
	base, _ := http.NewRequest(http.MethodGet, "http://api.example/api", nil)
	rw := &writer{h: http.Header{}}

	var interval time.Duration
	if c.Rate > 0 {
		interval = time.Duration(float64(c.Workers) / c.Rate * float64(time.Second))
	}

	start := time.Now()

	for i := 0; ; i++ {
		now := time.Now()
		if !now.Before(end) {
			return
		}

		if interval > 0 {
			if ahead := start.Add(time.Duration(i) * interval).Sub(now); ahead > time.Millisecond {
				time.Sleep(ahead)
			}
		}

		k := zipf.Uint64()
		r := rnd.Intn(len(hs))
		req := *base
		req.RemoteAddr = clientIP(keyBase + k)

		clear(rw.h)
		rw.code = 0
		hs[r].ServeHTTP(rw, &req)

		if t != nil {
			t.record(r, k, rw.code, rw.h)
		}
	}
}

// heapAlloc is the live heap after a collection.
func heapAlloc() int64 {
	runtime.GC()
	runtime.GC()

	var m runtime.MemStats
	runtime.ReadMemStats(&m)

	return int64(m.HeapAlloc)
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)

	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// warmKeys are requested before the measurement, so that the replicas'
// connections are open (their buffers are not counted as keys' memory);
// they lie above every measured key.
const warmKeys = 1 << 21

// simulate runs configuration c against Redis deployments already running
// (flushed) and measures it. base names the middleware (replicaNames).
func simulate(c simConfig, base string) (*simResult, error) {
	if c.Window < 3*time.Second || c.Window%time.Second != 0 {
		return nil, fmt.Errorf("window %s: whole seconds, at least 3s, tell windows apart (tally.record)", c.Window)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	hs, err := newReplicas(ctx, c, base)
	if err != nil {
		return nil, err
	}

	warm := c
	warm.Keys, warm.Rate = 16, 0
	load(warm, hs, time.Now().Add(200*time.Millisecond), warmKeys, nil)

	st := newStats(c.Addrs)
	defer st.close()

	start := time.Now()
	t := newTally(c, start)
	heap0, lines0, outages0 := heapAlloc(), eventsSeen.lines.Load(), eventsSeen.outages.Load()

	before, err := st.snapshot()
	if err != nil {
		return nil, err
	}

	cpu0, t0 := cpuSeconds(), time.Now()
	load(c, hs, t0.Add(c.Duration), 0, t)
	res := &simResult{Config: c, Elapsed: time.Since(t0).Seconds(), ClientCPU: cpuSeconds() - cpu0}
	res.HeapDelta = heapAlloc() - heap0

	// Leases go back after a second without requests: their calls are the
	// configuration's too.
	drain := 200 * time.Millisecond
	if c.Mode == "synced" {
		drain = time.Second + 3*c.SyncInterval + 300*time.Millisecond
	}

	time.Sleep(drain)

	after, err := st.snapshot()
	if err != nil {
		return nil, err
	}

	res.Redis = after.minus(before)
	res.Events, res.Outages = eventsSeen.lines.Load()-lines0, eventsSeen.outages.Load()-outages0
	t.fills(res, c.Points)
	runtime.KeepAlive(t)

	return res, nil
}
