package tierlimit

import (
	"errors"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
)

// delays replaces the plugin's afterDelay with timers of a manual clock:
// a waiting request's timer fires when the test moves the clock past its
// moment (advance), never by itself.
type delays struct {
	t     *testing.T
	clock *clock

	mu      sync.Mutex
	changed *sync.Cond
	pending []*delayTimer
	asked   []time.Duration // every wait asked for, in order
}

type delayTimer struct {
	at time.Time
	f  func()
}

// manualDelays makes h's waits run on h's clock until the test ends.
func manualDelays(t *testing.T, h *harness) *delays {
	d := &delays{t: t, clock: h.clock}
	d.changed = sync.NewCond(&d.mu)

	old := afterDelay
	afterDelay = d.after
	// A test that stops early lets its waiting requests go, so that its
	// servers close.
	t.Cleanup(func() {
		afterDelay = old
		d.advance(366 * 24 * time.Hour)
	})

	return d
}

func (d *delays) after(wait time.Duration, f func()) func() bool {
	d.mu.Lock()
	defer d.mu.Unlock()

	tm := &delayTimer{at: d.clock.Now().Add(wait), f: f}
	d.pending = append(d.pending, tm)
	d.asked = append(d.asked, wait)
	d.changed.Broadcast()

	return func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()

		for i, p := range d.pending {
			if p == tm {
				d.pending = append(d.pending[:i], d.pending[i+1:]...)
				d.changed.Broadcast()

				return true
			}
		}

		return false
	}
}

// waiting waits until n requests have asked for a wait in all, and returns
// the waits asked for.
func (d *delays) waiting(n int) []time.Duration {
	d.t.Helper()

	stop := time.AfterFunc(20*time.Second, func() {
		d.mu.Lock()
		d.asked = append(d.asked, -1) // marks the timeout
		d.changed.Broadcast()
		d.mu.Unlock()
	})
	defer stop.Stop()

	d.mu.Lock()
	defer d.mu.Unlock()

	for len(d.asked) < n {
		d.changed.Wait()
	}

	out := append([]time.Duration(nil), d.asked...)
	for _, w := range out {
		if w < 0 {
			d.t.Fatalf("%d waits asked for, want %d", len(out)-1, n)
		}
	}

	return out
}

// held is how many requests are waiting now.
func (d *delays) held() int {
	d.mu.Lock()
	defer d.mu.Unlock()

	return len(d.pending)
}

// advance moves the clock by step and fires the timers now due, earliest
// first.
func (d *delays) advance(step time.Duration) {
	d.clock.Add(step)
	now := d.clock.Now()

	d.mu.Lock()
	sort.SliceStable(d.pending, func(i, j int) bool { return d.pending[i].at.Before(d.pending[j].at) })

	var due []*delayTimer

	for len(d.pending) > 0 && !d.pending[0].at.After(now) {
		due = append(due, d.pending[0])
		d.pending = d.pending[1:]
	}
	d.mu.Unlock()

	for _, tm := range due {
		tm.f()
	}
}

// delayCase is a layer with a maxDelay under which two requests fit, the
// next two wait for their places (each later than the one before, or at
// the same next window for a fixed window) and the fifth is refused.
type delayCase struct {
	name  string
	layer config.LayerConfig
	// age readies the window after the two requests that fit: a fixed
	// window must end within its maxDelay.
	age func(t *testing.T, h *harness, admin *redisresp.Pool)
	// keyed: age shortens the Redis key's TTL by its name, which on a
	// Cluster has a hash tag (there the case is left to the other stores)
	keyed bool
	// waits are the waits of requests 3 and 4, to the millisecond (Redis
	// counts in milliseconds from its own clock: a wait it reports may be
	// shorter by the real time the test has run).
	waits [2]time.Duration
	// retryAfter is the fifth's Retry-After, when it fits without a wait
	// ("": not checked)
	retryAfter string
}

func delayCases(redis bool) []delayCase {
	unit := time.Nanosecond // what a sliding window's wait is counted in
	if redis {
		unit = time.Millisecond
	}

	cases := []delayCase{
		// 2 tokens per 10s (one per 5s), burst 2: the third token is back
		// 5s on, the fourth 10s; the fifth (15s) is beyond maxDelay.
		{name: "tokenbucket", layer: config.LayerConfig{Points: 2, Duration: "10s", Algorithm: "tokenbucket", Burst: 2, MaxDelay: "12s"},
			waits: [2]time.Duration{5 * time.Second, 10 * time.Second}},
		// Sliding, 2 per 10s: the third fits once the window after starts
		// (the two weigh while less than half of it is over: 1 + floor(2 x
		// left / 10s) <= 2 needs left < 5s, just after it starts: 10s and
		// one unit of time); the fourth once half of that one
		// is over (15s); the fifth, two windows on, waits too long.
		{name: "sliding", layer: config.LayerConfig{Points: 2, Duration: "10s", Algorithm: "sliding", MaxDelay: "16s"},
			waits: [2]time.Duration{10*time.Second + unit, 15*time.Second + unit}},
		// Fixed, 2 per 10s with 5s left: the next window, 5s on, holds the
		// third and the fourth; the fifth would wait for the one after.
		{name: "fixed", layer: config.LayerConfig{Points: 2, Duration: "10s", MaxDelay: "9s"},
			age: func(t *testing.T, h *harness, admin *redisresp.Pool) {
				if admin == nil {
					h.clock.Add(5 * time.Second)
					return
				}

				key := "ratelimit:" + h.p.name + ":ip:203.0.113.7"
				if got := redisDo(t, admin, "PEXPIRE", key, "5000"); got.Int != 1 {
					t.Fatalf("PEXPIRE %s: %+v", key, got)
				}
			},
			keyed: true, waits: [2]time.Duration{5 * time.Second, 5 * time.Second}, retryAfter: "15"},
		// The same with a maxDelay of an hour, past the window: the place is
		// at most the next window, so the fifth is refused all the same.
		{name: "fixed, maxDelay past the window", layer: config.LayerConfig{Points: 2, Duration: "10s", MaxDelay: "1h"},
			age: func(t *testing.T, h *harness, admin *redisresp.Pool) {
				if admin == nil {
					h.clock.Add(5 * time.Second)
					return
				}

				key := "ratelimit:" + h.p.name + ":ip:203.0.113.7"
				if got := redisDo(t, admin, "PEXPIRE", key, "5000"); got.Int != 1 {
					t.Fatalf("PEXPIRE %s: %+v", key, got)
				}
			},
			keyed: true, waits: [2]time.Duration{5 * time.Second, 5 * time.Second}, retryAfter: "15"},
	}

	// A day that ends in 30 minutes (on the instance's clock, which a
	// calendar's period is of, in Redis too): the next day holds the third
	// and the fourth (in Redis the next day's key).
	cases = append(cases, delayCase{name: "calendar", layer: config.LayerConfig{Points: 2, Calendar: "day", MaxDelay: "1h"},
		age: func(t *testing.T, h *harness, _ *redisresp.Pool) {
			now := h.clock.Now()
			end := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
			h.clock.Add(end.Sub(now) - 30*time.Minute)
		},
		waits: [2]time.Duration{30 * time.Minute, 30 * time.Minute}, retryAfter: "88200"})

	return cases
}

// closeTo reports whether a wait Redis reported is the one expected: at
// most it, and short of it by no more than the real time a test runs.
func closeTo(got, want time.Duration, redis bool) bool {
	if !redis {
		return got == want
	}

	return got <= want && got > want-5*time.Second
}

// ipDelayHarness is the proxied harness of an instance whose only layer is
// ip, on store: "memory", "redis" (exact, at addr), "synced" (at addr,
// synced counters beside it) or "cluster" (a Cluster node at addr).
func ipDelayHarness(t *testing.T, store, addr string, ip config.LayerConfig) *harness {
	t.Helper()

	conf := func(c *Config) {
		c.Global.Points = 0
		c.IP = ip
		if store == "synced" {
			c.Redis.SyncInterval = "1h"
		}
	}

	switch store {
	case "cluster":
		return newProxiedHarness(t, with(conf, func(c *Config) {
			c.Store, c.Redis.Timeout = "redis", "1s"
			c.Redis.Cluster = &config.RedisClusterConfig{Addresses: []string{addr}}
		}))
	case "redis", "synced":
		h, _ := redisHarness(t, addr, with(conf, asACLUser))
		return behindProxy(t, h)
	default:
		return newProxiedHarness(t, conf)
	}
}

// TestMaxDelayQueuesABurstInOrder: on memory and on exact Redis, for each
// algorithm, beside synced counters (where the script counts such a layer)
// and on a Cluster (a reply per slot, merged with its wait), a burst beyond the limit is delayed, not refused, each request
// reserving its place at once (the next one waits longer, or for the same
// next window), and served in order when its moment comes; a request
// whose place is beyond maxDelay is refused as without it (429,
// Retry-After) and reserves nothing.
func TestMaxDelayQueuesABurstInOrder(t *testing.T) {
	for _, store := range []string{"memory", "redis", "synced", "cluster"} {
		var addr string

		var admin *redisresp.Pool
		switch store {
		case "cluster":
			addr, admin = clusterNode(t)
		case "redis", "synced":
			addr, admin = redisServer(t)
		}

		for _, tc := range delayCases(store != "memory") {
			if store == "cluster" && tc.keyed {
				continue
			}

			t.Run(store+"/"+tc.name, func(t *testing.T) {
				queuesInOrder(t, ipDelayHarness(t, store, addr, tc.layer), admin, tc)
			})
		}
	}
}

func queuesInOrder(t *testing.T, h *harness, admin *redisresp.Pool, tc delayCase) {
	redis := admin != nil
	d := manualDelays(t, h)
	const client = "203.0.113.7:1234"

	for i := 1; i <= 2; i++ {
		if rec := h.get("/api", client); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}

	if tc.age != nil {
		tc.age(t, h, admin)
	}

	third := h.open(http.MethodGet, "/third", client, nil)
	d.waiting(1)
	fourth := h.open(http.MethodGet, "/fourth", client, nil)
	waits := d.waiting(2)

	if !closeTo(waits[0], tc.waits[0], redis) || !closeTo(waits[1], tc.waits[1], redis) {
		t.Fatalf("waits %v, want %v", waits, tc.waits)
	}

	// Beyond maxDelay: refused as without it, and nothing reserved.
	rec := h.get("/api", client)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("fifth: %d, Retry-After %q, want 429 with one", rec.Code, rec.Header().Get("Retry-After"))
	}

	if got := rec.Header().Get("Retry-After"); tc.retryAfter != "" && got != tc.retryAfter {
		t.Fatalf("fifth: Retry-After %s, want %s (the next window's end)", got, tc.retryAfter)
	}

	if n := h.calls.Load(); n != 2 || d.held() != 2 {
		t.Fatalf("backend called %d times and %d waiting, want 2 and 2", n, d.held())
	}

	// The third goes first: the fourth waits on, unless it shares its place.
	d.advance(tc.waits[0])
	if res := third.head(); res.StatusCode != http.StatusOK {
		t.Fatalf("third: %d after its wait", res.StatusCode)
	}

	third.wait()

	if tc.waits[1] != tc.waits[0] {
		if n := h.calls.Load(); n != 3 || d.held() != 1 {
			t.Fatalf("after the third's wait: backend called %d times, %d waiting, want 3 and 1", n, d.held())
		}

		d.advance(tc.waits[1] - tc.waits[0])
	}

	if res := fourth.head(); res.StatusCode != http.StatusOK {
		t.Fatalf("fourth: %d after its wait", res.StatusCode)
	}

	fourth.wait()

	if n := h.calls.Load(); n != 4 {
		t.Fatalf("backend called %d times, want 4", n)
	}

}

// TestMaxDelayRefusalReservesNothing: a request beyond maxDelay is refused
// with the Retry-After of its place and reserves nothing: the bucket's TAT
// (memory's window, Redis's key) is what it was before the refusals.
func TestMaxDelayRefusalReservesNothing(t *testing.T) {
	addr, admin := redisServer(t)

	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			h := ipDelayHarness(t, store, addr, config.LayerConfig{Points: 2, Duration: "10s", Algorithm: "tokenbucket", Burst: 1, MaxDelay: "7s"})
			d := manualDelays(t, h)
			const client = "203.0.113.8:1234"

			tat := func() string {
				if store == "redis" {
					v := redisDo(t, admin, "HMGET", "ratelimit:"+h.p.name+":ip:203.0.113.8", "r", "n")
					return v.String()
				}

				h.p.memory.Mu.Lock()
				defer h.p.memory.Mu.Unlock()

				return strconv.FormatInt(h.p.memory.Maps["ip"]["203.0.113.8"].Reset, 10)
			}

			if rec := h.get("/api", client); rec.Code != http.StatusOK {
				t.Fatalf("first: %d", rec.Code)
			}

			second := h.open(http.MethodGet, "/second", client, nil) // 5s
			d.waiting(1)

			before := tat()

			// 10s: beyond 7s, twice; neither reserves.
			for i := 0; i < 2; i++ {
				rec := h.get("/api", client)
				if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "10" {
					t.Fatalf("refused %d: %d, Retry-After %q, want 429 and 10", i, rec.Code, rec.Header().Get("Retry-After"))
				}
			}

			if after := tat(); after != before {
				t.Fatalf("the bucket moved from %s to %s: a refusal reserved", before, after)
			}

			d.advance(5 * time.Second)
			second.wait()

			if n := h.calls.Load(); n != 2 {
				t.Fatalf("backend called %d times, want 2", n)
			}
		})
	}
}

// TestMaxDelayARefusalBlocksOnlyUntilAPlaceComesWithinReach: a request
// refused because its place is beyond maxDelay blocks its key (the Redis
// store's block list refuses the next ones without asking Redis) only until
// a place comes within maxDelay: a daily quota of 2 with a maxDelay of an
// hour, spent 2 hours before midnight, refuses the third; 90 minutes later
// the fourth waits 30 minutes for the next day instead of being refused.
func TestMaxDelayARefusalBlocksOnlyUntilAPlaceComesWithinReach(t *testing.T) {
	addr, _ := redisServer(t)
	clusterAddr, _ := clusterNode(t)

	for _, store := range []string{"memory", "redis", "synced", "cluster"} {
		t.Run(store, func(t *testing.T) {
			at := addr
			if store == "cluster" {
				at = clusterAddr
			}

			h := ipDelayHarness(t, store, at, config.LayerConfig{Points: 2, Calendar: "day", MaxDelay: "1h"})
			d := manualDelays(t, h)
			now := h.clock.Now()
			h.clock.Add(time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC).Sub(now) - 2*time.Hour)

			const client = "203.0.113.10:1234"
			for i := 1; i <= 2; i++ {
				if rec := h.get("/api", client); rec.Code != http.StatusOK {
					t.Fatalf("request %d: %d", i, rec.Code)
				}
			}

			if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests {
				t.Fatalf("third, 2h before its place: %d, want 429", rec.Code)
			}

			h.clock.Add(90 * time.Minute)

			fourth := h.open(http.MethodGet, "/fourth", client, nil)
			if waits := d.waiting(1); waits[0] != 30*time.Minute {
				t.Fatalf("fourth waits %v, want 30m", waits)
			}

			d.advance(30 * time.Minute)
			if res := fourth.head(); res.StatusCode != http.StatusOK {
				t.Fatalf("fourth: %d after its wait", res.StatusCode)
			}

			fourth.wait()
		})
	}
}

// TestMaxDelayOutageChargesArePaidToTheirPeriod: a daily quota of 2 on
// Redis with a maxDelay of an hour, 30 minutes before midnight: one
// request counted in Redis, then Redis unreachable; the memory fallback
// admits the second and queues the third into the next day. When Redis
// answers again, what the fallback charged is paid to each charge's day:
// the day's key 2, the next day's 1 (not 3 to the day, which would leave
// the next day a request short).
func TestMaxDelayOutageChargesArePaidToTheirPeriod(t *testing.T) {
	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h, _ := redisHarness(t, proxy.l.Addr().String(), func(c *Config) {
		asACLUser(c)
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 2, Calendar: "day", MaxDelay: "1h"}
		c.Redis.DialTimeout = "1s"
	})
	h = behindProxy(t, h)
	d := manualDelays(t, h)
	rs := h.p.stores.redis

	now := h.clock.Now()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	h.clock.Add(midnight.Sub(now) - 30*time.Minute)

	const client = "203.0.113.12"
	key := "ratelimit:" + h.p.name + ":ip:" + client + ":"
	day, next := key+strconv.FormatInt(midnight.Add(-24*time.Hour).Unix(), 10), key+strconv.FormatInt(midnight.Unix(), 10)

	if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
		t.Fatalf("first, on Redis: %d", rec.Code)
	}

	proxy.cut()

	if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK || !rs.Backend.Down.Load() {
		t.Fatalf("second: %d, down %v; want 200 from the memory fallback", rec.Code, rs.Backend.Down.Load())
	}

	third := h.open(http.MethodGet, "/third", client+":1", nil)
	if waits := d.waiting(1); waits[0] != 30*time.Minute {
		t.Fatalf("third waits %v in the fallback, want 30m (the next day)", waits)
	}

	proxy.restore()
	redisstore.PayOwed(rs)

	if got := redisDo(t, admin, "MGET", day, next); got.Array[0].Str != "2" || got.Array[1].Str != "1" {
		t.Fatalf("the day's and the next day's keys after the recovery: %q %q, want 2 and 1", got.Array[0].Str, got.Array[1].Str)
	}

	d.advance(30 * time.Minute)
	third.wait()
}

// TestMaxDelayAPlaceAnotherSlotRefusedIsGivenBackToItsPeriod: on a Redis
// Cluster each slot's call decides its own layers, so a request whose
// client's daily quota (maxDelay 1h, 30 minutes before midnight) reserved
// a place in the next day while global, in another slot, refused it, is
// given that place back, in the next day's key: the day's keeps its count.
func TestMaxDelayAPlaceAnotherSlotRefusedIsGivenBackToItsPeriod(t *testing.T) {
	addr, admin := clusterNode(t)
	h := newProxiedHarness(t, func(c *Config) {
		c.Store, c.Redis.Timeout = "redis", "1s"
		c.Redis.Cluster = &config.RedisClusterConfig{Addresses: []string{addr}}
		c.Global = config.LayerConfig{Points: 2, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 1, Calendar: "day", MaxDelay: "1h"}
	})
	manualDelays(t, h)

	now := h.clock.Now()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	h.clock.Add(midnight.Sub(now) - 30*time.Minute)

	const a, b = "203.0.113.13", "203.0.113.14"
	for _, client := range []string{a, b} {
		if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s's first: %d", client, rec.Code)
		}
	}

	// a's second: its quota would queue it into the next day, global
	// refuses it.
	if rec := h.get("/api", a+":1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a's second: %d, want 429 (global)", rec.Code)
	}

	key := "ratelimit:" + h.p.name + ":ip:{" + a + "}:"
	day, next := key+strconv.FormatInt(midnight.Add(-24*time.Hour).Unix(), 10), key+strconv.FormatInt(midnight.Unix(), 10)
	got := redisDo(t, admin, "MGET", day, next)
	if got.Array[0].Str != "1" || got.Array[1].Str != "0" && !got.Array[1].Null {
		t.Fatalf("a's day and next day after the refusal: %q %q, want 1 and 0 (the place given back)", got.Array[0].Str, got.Array[1].Str)
	}
}

// TestMaxDelayClientGoneGivesItsPlaceBack: a client that hangs up while
// its request waits gives the place back (the store's give-back), and
// nothing is proxied: the next request takes the place.
func TestMaxDelayClientGoneGivesItsPlaceBack(t *testing.T) {
	addr, _ := redisServer(t)

	for _, store := range []string{"memory", "redis", "synced"} {
		for _, tc := range delayCases(store != "memory") {
			t.Run(store+"/"+tc.name, func(t *testing.T) {
				h := ipDelayHarness(t, store, addr, tc.layer)
				d := manualDelays(t, h)
				const client = "203.0.113.7:1234"

				for i := 1; i <= 2; i++ {
					if rec := h.get("/api", client); rec.Code != http.StatusOK {
						t.Fatalf("request %d: %d", i, rec.Code)
					}
				}

				if tc.age != nil {
					var admin *redisresp.Pool
					if store != "memory" {
						admin = redisresp.NewPool(redisresp.Options{Address: addr})
						t.Cleanup(admin.Close)
					}

					tc.age(t, h, admin)
				}

				gone := h.open(http.MethodGet, "/gone", client, nil)
				d.waiting(1)
				gone.hangUp()
				gone.wait()

				// Its place is the next request's: the next two wait as the
				// third and the fourth of a burst do.
				next := h.open(http.MethodGet, "/next", client, nil)
				d.waiting(2)
				after := h.open(http.MethodGet, "/after", client, nil)
				waits := d.waiting(3)
				if !closeTo(waits[1], tc.waits[0], store != "memory") || !closeTo(waits[2], tc.waits[1], store != "memory") {
					t.Fatalf("waits %v: the place was not given back (want %v after the first)", waits, tc.waits)
				}

				d.advance(tc.waits[1])
				next.wait()
				after.wait()

				if n := h.calls.Load(); n != 4 {
					t.Fatalf("backend called %d times, want 4 (the gone request proxied nothing)", n)
				}
			})
		}
	}
}

// TestMaxDelayWaitsThroughAReload: a request waiting when Traefik reloads
// goes on at its moment on the old instance, and the new one (same
// counters) sees its place taken.
func TestMaxDelayWaitsThroughAReload(t *testing.T) {
	conf := func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 2, Duration: "10s", Algorithm: "tokenbucket", Burst: 2, MaxDelay: "12s"}
	}

	h := newProxiedHarness(t, conf)
	d := manualDelays(t, h)
	const client = "203.0.113.9:1234"

	for i := 1; i <= 2; i++ {
		if rec := h.get("/api", client); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}

	third := h.open(http.MethodGet, "/third", client, nil)
	d.waiting(1)

	r := reloaded(t, h, conf)

	fourth := r.open(http.MethodGet, "/fourth", client, nil)
	if waits := d.waiting(2); waits[1] != 10*time.Second {
		t.Fatalf("waits %v: the new instance does not see the third's place", waits)
	}

	d.advance(5 * time.Second)
	if res := third.head(); res.StatusCode != http.StatusOK {
		t.Fatalf("third, across the reload: %d", res.StatusCode)
	}

	third.wait()
	d.advance(5 * time.Second)
	fourth.wait()

	if n := h.calls.Load() + r.calls.Load(); n != 4 {
		t.Fatalf("backend called %d times, want 4", n)
	}
}

// TestMaxDelayEveryLayerAllOrNothing: when several layers apply, the wait
// is the longest of theirs, and a request that one layer refuses outright
// reserves nothing in the others.
func TestMaxDelayEveryLayerAllOrNothing(t *testing.T) {
	h := newProxiedHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 3, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 2, Duration: "10s", Algorithm: "tokenbucket", Burst: 1, MaxDelay: "30s"}
		c.Routes = []config.RouteConfig{{Name: "slow", Paths: []string{"/slow"}, Key: "ip", Points: 1, Duration: "20s", Algorithm: "tokenbucket", Burst: 1, MaxDelay: "30s"}}
	})
	d := manualDelays(t, h)
	const client = "203.0.113.10:1234"

	if rec := h.get("/slow", client); rec.Code != http.StatusOK {
		t.Fatalf("first: %d", rec.Code)
	}

	// ip's place is 5s on, slow's 20s: it waits 20s.
	second := h.open(http.MethodGet, "/slow", client, nil)
	if waits := d.waiting(1); waits[0] != 20*time.Second {
		t.Fatalf("wait %v, want the longest of the layers', 20s", waits[0])
	}

	// global has one point left: /api takes it after ip's place (10s on).
	third := h.open(http.MethodGet, "/api", client, nil)
	if waits := d.waiting(2); waits[1] != 10*time.Second {
		t.Fatalf("waits %v, want 10s for the third", waits)
	}

	// global refuses outright: ip keeps its places (the next one 15s on).
	if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("global spent: %d", rec.Code)
	}

	d.advance(20 * time.Second)
	second.wait()
	third.wait()

	if n := h.calls.Load(); n != 3 {
		t.Fatalf("backend called %d times, want 3", n)
	}
}

// TestMaxDelayConfigErrorsNameTheField: a maxDelay that cannot be kept is a
// configuration error naming the field and its value.
func TestMaxDelayConfigErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"unparsable", func(c *Config) { c.IP.MaxDelay = "soon" }, `ip.maxDelay = "soon"`},
		{"negative", func(c *Config) { c.IP.MaxDelay = "-1s" }, `ip.maxDelay = "-1s"`},
		{"concurrency", func(c *Config) {
			c.IP = config.LayerConfig{Points: 5, Duration: "30s", Algorithm: "concurrency", MaxDelay: "1s"}
		}, `ip.maxDelay = "1s"`},
		{"countStatus route", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 5, Duration: "60s", CountStatus: []int{401}, MaxDelay: "1s"}}
		}, `routes[0].maxDelay = "1s"`},
		{"costFrom route", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "llm", Paths: []string{"/v1/"}, Key: "ip", Points: 500, Duration: "60s", CostFrom: "header:X-Cost", MaxDelay: "1s"}}
		}, `routes[0].maxDelay = "1s"`},
		// A route's plan may not wait where its route may not: the error
		// names the plan's field.
		{"countStatus route's plan", func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-User", "X-Plan"
			c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 5, Duration: "60s", CountStatus: []int{401},
				Plans: map[string]config.PlanConfig{"free": {Points: 5, Duration: "60s"}, "pro": {Points: 50, Duration: "60s", MaxDelay: "1s"}}}}
		}, `routes[0].plans.pro.maxDelay = "1s"`},
		{"costFrom route's plan", func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-User", "X-Plan"
			c.Routes = []config.RouteConfig{{Name: "llm", Paths: []string{"/v1/"}, Key: "ip", Points: 500, Duration: "60s", CostFrom: "header:X-Cost",
				Plans: map[string]config.PlanConfig{"pro": {Points: 5000, Duration: "60s", MaxDelay: "2s"}}}}
		}, `routes[0].plans.pro.maxDelay = "2s"`},
		{"plan", func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-User", "X-Plan"
			c.Plans = map[string]config.PlanConfig{"pro": {Points: 5, Duration: "1s", MaxDelay: "2 seconds"}}
		}, `plans.pro.maxDelay = "2 seconds"`},
	} {
		cfg := CreateConfig()
		c.mutate(cfg)

		_, err := parse(cfg)
		if err == nil || !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.want)
		}
	}

	// Zero is no delay, on any algorithm.
	cfg := CreateConfig()
	cfg.IP.MaxDelay = "0"
	if _, err := parse(cfg); err != nil {
		t.Fatalf("maxDelay 0: %v", err)
	}

	// A horizon past the next window is no error: the place is at most the
	// next window (delayCases: "fixed, maxDelay past the window").
	cfg = CreateConfig()
	cfg.IP = config.LayerConfig{Points: 5, Duration: "1s", MaxDelay: "1h"}
	cfg.User = config.LayerConfig{Points: 5, Calendar: "day", MaxDelay: "48h"}
	if _, err := parse(cfg); err != nil {
		t.Fatalf("maxDelay past the window: %v", err)
	}

	// A calendar window counted in Redis takes one too (its next period is
	// the next key).
	cfg.Store = "redis"
	if _, err := parse(cfg); err != nil {
		t.Fatalf("maxDelay on a calendar window in Redis: %v", err)
	}

	_ = strconv.Itoa
}

// waitsOrEnds reports how a request just opened went on: the wait it
// asked for (the n-th wait of d), or -1 when its handler ended without
// one (answered at once, or refused).
func waitsOrEnds(t *testing.T, d *delays, o *openRequest, n int) time.Duration {
	t.Helper()

	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		d.mu.Lock()
		asked := append([]time.Duration(nil), d.asked...)
		d.mu.Unlock()

		if len(asked) >= n {
			return asked[n-1]
		}

		select {
		case <-o.ended:
			return -1
		case <-time.After(5 * time.Millisecond): // polling the two, not a window
		}
	}

	t.Fatalf("%s neither waited nor ended", o.what)

	return 0
}

// placeKey is the Redis key that holds the places of a fixed or calendar
// case's third and fourth requests from client ("" for the others).
func placeKey(h *harness, tc delayCase, client string) string {
	ip := strings.Split(client, ":")[0]
	key := "ratelimit:" + h.p.name + ":ip:" + ip

	switch {
	case tc.layer.Calendar != "":
		now := h.clock.Now()
		midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)

		return key + ":" + strconv.FormatInt(midnight.Unix(), 10)
	case tc.layer.Algorithm == "":
		return key
	}

	return ""
}

// TestMaxDelayFallbackKeepsThePlacesRedisReserved: Redis reserves the
// third request of a burst a place (the next window, the next day, tokens
// ahead) and then becomes unreachable while it waits. The memory fallback
// starts the key from what Redis reported of it: the fourth request may
// not be admitted before its place (the one Redis would have given it, or
// later), and the fifth is refused: never more than the points in a
// window, from either store. When Redis answers again, what the fallback
// admitted is paid to the key of its place. The third goes on at its moment.
func TestMaxDelayFallbackKeepsThePlacesRedisReserved(t *testing.T) {
	addr, admin := redisServer(t)

	for _, store := range []string{"redis", "synced"} {
		for _, tc := range delayCases(true) {
			t.Run(store+"/"+tc.name, func(t *testing.T) {
				proxy := newSwitchProxy(t, addr)
				h := ipDelayHarness(t, store, proxy.l.Addr().String(), tc.layer)
				d := manualDelays(t, h)
				rs := h.p.stores.redis
				const client = "203.0.113.7:1234"

				for i := 1; i <= 2; i++ {
					if rec := h.get("/api", client); rec.Code != http.StatusOK {
						t.Fatalf("request %d: %d", i, rec.Code)
					}
				}

				if tc.age != nil {
					tc.age(t, h, admin)
				}

				third := h.open(http.MethodGet, "/third", client, nil)
				if waits := d.waiting(1); !closeTo(waits[0], tc.waits[0], true) {
					t.Fatalf("third waits %v on Redis, want %v", waits[0], tc.waits[0])
				}

				proxy.cut()

				fourth := h.open(http.MethodGet, "/fourth", client, nil)
				wait := waitsOrEnds(t, d, fourth, 2)
				if !rs.Backend.Down.Load() {
					t.Fatal("the fourth was decided in Redis, want the memory fallback")
				}

				if wait < 0 {
					fourth.wait()
					if n := h.calls.Load(); n != 2 {
						t.Fatalf("fourth, in the fallback: answered at once (backend called %d times), want it to wait for its place (%v) or be refused", n, tc.waits[1])
					}
				} else if wait < tc.waits[1]-time.Second {
					t.Fatalf("fourth waits %v in the fallback, want at least its place in Redis, %v", wait, tc.waits[1])
				}

				rec := h.get("/api", client)
				if rec.Code != http.StatusTooManyRequests {
					t.Fatalf("fifth, in the fallback: %d, want 429", rec.Code)
				}

				// What the fallback admitted is paid to the key of its place:
				// the next window (the same key), the next day's key.
				proxy.restore()
				owed := rs
				if owed.Exact != nil {
					owed = owed.Exact
				}
				redisstore.PayOwed(owed)

				if key := placeKey(h, tc, client); key != "" {
					if got := redisDo(t, admin, "GET", key); got.Str != "2" {
						t.Fatalf("%s after the recovery: %q, want 2 (the third and the fourth)", key, got.Str)
					}
				}

				d.advance(tc.waits[0])
				if res := third.head(); res.StatusCode != http.StatusOK {
					t.Fatalf("third, its place reserved before the outage: %d", res.StatusCode)
				}

				third.wait()
				d.advance(366 * 24 * time.Hour)
				fourth.wait()
			})
		}
	}

}

// TestMaxDelayAPlaceGivenBackIsTakenAfterARefusal: a burst takes the places
// within maxDelay and the next request is refused (its place beyond it);
// then the client of the last place goes away, giving it back. The next
// request takes that place and waits for it, as the memory store lets it:
// the refusal before the give-back does not keep refusing the key (on
// Redis, the block list) until the old place comes within maxDelay.
func TestMaxDelayAPlaceGivenBackIsTakenAfterARefusal(t *testing.T) {
	addr, admin := redisServer(t)
	clusterAddr, _ := clusterNode(t)

	for _, store := range []string{"memory", "redis", "synced", "cluster"} {
		for _, tc := range delayCases(store != "memory") {
			if store == "cluster" && tc.keyed {
				continue
			}

			t.Run(store+"/"+tc.name, func(t *testing.T) {
				at := addr
				if store == "cluster" {
					at = clusterAddr
				}

				h := ipDelayHarness(t, store, at, tc.layer)
				d := manualDelays(t, h)
				const client = "203.0.113.7:1234"

				for i := 1; i <= 2; i++ {
					if rec := h.get("/api", client); rec.Code != http.StatusOK {
						t.Fatalf("request %d: %d", i, rec.Code)
					}
				}

				if tc.age != nil {
					if store == "memory" {
						tc.age(t, h, nil)
					} else {
						tc.age(t, h, admin)
					}
				}

				third := h.open(http.MethodGet, "/third", client, nil)
				d.waiting(1)
				fourth := h.open(http.MethodGet, "/fourth", client, nil)
				d.waiting(2)

				if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests {
					t.Fatalf("fifth, beyond maxDelay: %d, want 429", rec.Code)
				}

				fourth.hangUp()
				fourth.wait()

				sixth := h.open(http.MethodGet, "/sixth", client, nil)
				if wait := waitsOrEnds(t, d, sixth, 3); !closeTo(wait, tc.waits[1], store != "memory") {
					sixth.wait()
					t.Fatalf("sixth, after the fourth gave its place back: wait %v (-1: none, refused), want the fourth's place, %v", wait, tc.waits[1])
				}

				d.advance(tc.waits[1])
				third.wait()
				sixth.wait()

				if n := h.calls.Load(); n != 4 {
					t.Fatalf("backend called %d times, want 4", n)
				}
			})
		}
	}
}

// TestMaxDelayRateLimitResetIsCountedFromThePlace: a request that waited
// for its place is answered then, and its headers show the rule as of that
// moment: RateLimit's t counts the seconds to the reset from the place (the
// next fixed window's length, the bucket's full-again time from the token's
// moment), not from the moment the request arrived, which its wait has
// made stale.
func TestMaxDelayRateLimitResetIsCountedFromThePlace(t *testing.T) {
	now := time.Date(2026, 6, 15, 10, 0, 0, 200e6, time.UTC) // newHarness's clock
	toFebruary := time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC).Sub(now)

	for _, c := range []struct {
		name   string
		layer  config.LayerConfig
		start  time.Duration // the clock moved before the first request
		age    time.Duration // and after the second
		wait   time.Duration
		rate   string
		policy string // "": not checked
	}{
		// 2 per 10s, 5s in: the third's place is the next window, 5s on,
		// which resets 10s after it.
		{"fixed", config.LayerConfig{Points: 2, Duration: "10s", MaxDelay: "9s"}, 0, 5 * time.Second, 5 * time.Second, `"ip";r=1;t=10`, ""},
		// A token each 5s, burst 2: the third's token is back 5s on, the
		// bucket full again 10s after that.
		{"tokenbucket", config.LayerConfig{Points: 2, Duration: "10s", Algorithm: "tokenbucket", Burst: 2, MaxDelay: "12s"}, 0, 0, 5 * time.Second, `"ip";r=0;t=10`, ""},
		// A month of 2, 30 minutes before February: the third's place is
		// February, whose 28 days are the policy's (not January's 31) and
		// the seconds to its reset.
		{"month", config.LayerConfig{Points: 2, Calendar: "month", MaxDelay: "1h"}, toFebruary - 30*time.Minute, 0, 30 * time.Minute, `"ip";r=1;t=2419200`, `"ip";q=2;w=2419200`},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := ipDelayHarness(t, "memory", "", c.layer)
			d := manualDelays(t, h)
			const client = "203.0.113.11:1234"

			h.clock.Add(c.start)

			for i := 1; i <= 2; i++ {
				if rec := h.get("/api", client); rec.Code != http.StatusOK {
					t.Fatalf("request %d: %d", i, rec.Code)
				}
			}

			h.clock.Add(c.age)

			third := h.open(http.MethodGet, "/third", client, nil)
			if waits := d.waiting(1); waits[0] != c.wait {
				t.Fatalf("third waits %v, want %v", waits, c.wait)
			}

			d.advance(c.wait)
			res := third.head()
			third.wait()

			if got := res.Header.Get("RateLimit"); res.StatusCode != http.StatusOK || got != c.rate {
				t.Fatalf("third, answered at its place: %d, RateLimit %s, want 200 and %s", res.StatusCode, got, c.rate)
			}

			if got := res.Header.Get("RateLimit-Policy"); c.policy != "" && got != c.policy {
				t.Fatalf("third, answered at its place: RateLimit-Policy %s, want %s", got, c.policy)
			}
		})
	}
}
