package tierlimit

import (
	"context"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
)

// inflight is a request served in a goroutine, held by the backend until
// released.
type inflight struct {
	entered chan struct{}                   // closed when the backend has it
	release chan struct{}                   // closed to let the backend answer
	done    chan *httptest.ResponseRecorder // its response, once served
}

type holdKey struct{}

// holding makes h's backend hold every request that carries an inflight
// until it is released.
func holding(h *harness) {
	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if f, _ := req.Context().Value(holdKey{}).(*inflight); f != nil {
			close(f.entered)
			<-f.release
		}

		_, _ = rw.Write([]byte("ok"))
	})
}

// start sends a request from remote that the backend holds; it returns once
// the request is in the backend (admitted) or answered (refused), and
// reports which.
func start(t *testing.T, h *harness, remote string) (*inflight, *httptest.ResponseRecorder) {
	t.Helper()

	return startPath(t, h, remote, "/slow")
}

// startPath is start for a request of path, with the headers hdr.
func startPath(t *testing.T, h *harness, remote, path string, hdr ...string) (*inflight, *httptest.ResponseRecorder) {
	t.Helper()

	f := &inflight{entered: make(chan struct{}), release: make(chan struct{}), done: make(chan *httptest.ResponseRecorder, 1)}
	req := httptest.NewRequest(http.MethodGet, path, nil).WithContext(context.WithValue(context.Background(), holdKey{}, f))
	req.RemoteAddr = remote

	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}

	go func() {
		rec := httptest.NewRecorder()
		h.h.ServeHTTP(rec, req)
		f.done <- rec
	}()

	select {
	case <-f.entered:
		return f, nil
	case rec := <-f.done:
		return nil, rec
	case <-time.After(10 * time.Second):
		t.Fatal("a request was neither admitted nor answered")
	}

	return nil, nil
}

// end releases an admitted request and waits for its answer.
func end(t *testing.T, f *inflight) *httptest.ResponseRecorder {
	t.Helper()
	close(f.release)

	return <-f.done
}

func concurrencyIP(points int, lease string) func(c *Config) {
	return func(c *Config) {
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = config.LayerConfig{Points: points, Duration: lease, Algorithm: "concurrency"}
	}
}

// checkRefusedForConcurrency checks a concurrency layer's refusal: 429,
// Retry-After: 1, the concurrency policy.
func checkRefusedForConcurrency(t *testing.T, rec *httptest.ResponseRecorder, what string) {
	t.Helper()

	if rec == nil || rec.Code != http.StatusTooManyRequests {
		t.Fatalf("%s: %v, want a 429", what, rec)
	}

	if got := rec.Header().Get("Retry-After"); got != "1" {
		t.Fatalf("%s: Retry-After %q, want 1", what, got)
	}

	if got := rec.Header().Get("RateLimit-Policy"); !strings.Contains(got, `qu="concurrent-requests"`) || !strings.Contains(got, `"ip";q=2;w=60`) {
		t.Fatalf("%s: RateLimit-Policy %q, want ip's q=2;w=60 in concurrent requests", what, got)
	}
}

// concurrencyScenario runs the scenario on h (ip: 2 slots): two of
// three held requests from one client are admitted, another client is
// admitted meanwhile, and once they end two more are.
func concurrencyScenario(t *testing.T, h *harness) {
	t.Helper()
	holding(h)

	a, _ := start(t, h, "203.0.113.1:1000")
	b, _ := start(t, h, "203.0.113.1:1001")
	if a == nil || b == nil {
		t.Fatal("the first two requests were not admitted")
	}

	_, refused := start(t, h, "203.0.113.1:1002")
	checkRefusedForConcurrency(t, refused, "the third request in flight")

	other, _ := start(t, h, "203.0.113.2:1000")
	if other == nil {
		t.Fatal("another client was refused while the first held its slots")
	}

	rec := end(t, a)
	if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "1" {
		t.Fatalf("the first request: %d, remaining %q; want 200 with 1 slot left after it", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}

	end(t, b)
	end(t, other)

	c, _ := start(t, h, "203.0.113.1:1003")
	d, _ := start(t, h, "203.0.113.1:1004")
	if c == nil || d == nil {
		t.Fatal("after the first two ended, two more were not admitted")
	}

	_, refused = start(t, h, "203.0.113.1:1005")
	checkRefusedForConcurrency(t, refused, "a third again")
	end(t, c)
	end(t, d)
}

func TestConcurrencyHoldsAndReleasesSlots(t *testing.T) {
	h := newHarness(t, concurrencyIP(2, "60s"))
	concurrencyScenario(t, h)

	// One event per full episode of the key, with its requests in flight.
	lines := eventLines(h.events.String(), "RATE_LIMIT_TRIGGERED")
	if len(lines) != 2 || !strings.Contains(lines[0], `"limiter":"ip","key":"203.0.113.1"`) || !strings.Contains(lines[0], `"inFlight":2`) {
		t.Fatalf("events %q, want two refusals of ip with 2 in flight", lines)
	}
}

func TestConcurrencyOnRedisServer(t *testing.T) {
	addr, _ := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		concurrencyIP(2, "60s")(c)
	})

	concurrencyScenario(t, h)

	if h.p.stores.redis.Backend.Down.Load() {
		t.Fatal("Redis was marked down: the memory fallback decided")
	}

	// Memory mirrors the slots this process holds in Redis.
	f, _ := start(t, h, "203.0.113.1:1010")
	if got := inFlightOf(h, "ip", "203.0.113.1"); got != 1 {
		t.Fatalf("memory mirrors %d slots of the client in Redis, want 1", got)
	}

	end(t, f)

	if got := inFlightOf(h, "ip", "203.0.113.1"); got != 0 {
		t.Fatalf("memory mirrors %d slots after the request ended, want 0", got)
	}
}

// TestConcurrencyLeaseRunsOut: a request that never ends frees its slot when
// its lease does, on the injected clock: not before, and then.
func TestConcurrencyLeaseRunsOut(t *testing.T) {
	h := newHarness(t, concurrencyIP(1, "10s"))
	holding(h)

	hung, _ := start(t, h, "203.0.113.1:1000")
	if hung == nil {
		t.Fatal("the first request was not admitted")
	}

	h.clock.Add(10*time.Second - time.Nanosecond)
	if _, rec := start(t, h, "203.0.113.1:1001"); rec == nil || rec.Code != http.StatusTooManyRequests {
		t.Fatal("a request was admitted before the hung one's lease ended")
	}

	h.clock.Add(time.Nanosecond)
	next, _ := start(t, h, "203.0.113.1:1002")
	if next == nil {
		t.Fatal("the hung request's slot was not freed when its lease ended")
	}

	// The hung request ends late: its release frees nothing of the new one's.
	end(t, hung)
	if _, rec := start(t, h, "203.0.113.1:1003"); rec == nil || rec.Code != http.StatusTooManyRequests {
		t.Fatal("the late end of an expired request freed another request's slot")
	}

	end(t, next)
}

// TestConcurrencyAllOrNothing: a request another layer refuses holds no
// slot, and one a concurrency layer refuses spends nothing elsewhere.
func TestConcurrencyAllOrNothing(t *testing.T) {
	// A route of 2 per hour after ip's 1 slot: the route refuses the
	// second request, which must leave ip's slot free.
	h := newHarness(t, func(c *Config) {
		concurrencyIP(1, "60s")(c)
		c.Routes = []config.RouteConfig{{Name: "export", Paths: []string{"/slow"}, Points: 1, Duration: "1h"}}
	})
	holding(h)

	first, _ := start(t, h, "203.0.113.1:1000")
	if first == nil {
		t.Fatal("the first request was not admitted")
	}

	end(t, first)

	_, rec := start(t, h, "203.0.113.1:1001")
	if rec == nil || rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"layer":"export"`) {
		t.Fatalf("the second request: %v, want the route's refusal", rec)
	}

	if n := h.p.memory.Count(); n == 0 {
		t.Fatal("no counter at all")
	}

	if got := inFlightOf(h, "ip", "203.0.113.1"); got != 0 {
		t.Fatalf("ip holds %d slots after the route refused the request, want 0", got)
	}

	// global (before ip) spent 1 for the first request only; a request
	// refused by ip's slots spends no global.
	h2 := newHarness(t, concurrencyIP(1, "60s"))
	holding(h2)
	held, _ := start(t, h2, "203.0.113.1:1000")
	for i := 0; i < 3; i++ {
		_, rec := start(t, h2, "203.0.113.1:1001")
		checkRefusedForConcurrency1(t, rec)
	}

	if count, _ := h2.p.memory.Peek(h2.clock.Now().UnixNano(), "global", "global"); count != 1 {
		t.Fatalf("global counts %d, want 1: refusals for concurrency spent global", count)
	}

	end(t, held)
}

func checkRefusedForConcurrency1(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()

	if rec == nil || rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"layer":"ip"`) {
		t.Fatalf("%v, want ip's refusal", rec)
	}
}

func inFlightOf(h *harness, layer, key string) int64 {
	return memstore.InFlight(h.p.memory, layer, key, h.clock.Now().UnixNano())
}

// TestConcurrencyRedisSlotOfADeadReplica: in Redis a slot whose lease ended
// (a replica that died holding it) counts no more, one whose lease runs
// does, and a refusal changes nothing in Redis.
func TestConcurrencyRedisSlotOfADeadReplica(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		concurrencyIP(2, "60s")(c)
		c.Global.Points = 0
	})
	holding(h)

	key := "ratelimit:" + h.p.name + ":ip:203.0.113.1"
	redisDo(t, admin, "ZADD", key, "1", "dead:1", "99999999999999", "alive:1")

	f, _ := start(t, h, "203.0.113.1:1000")
	if f == nil {
		t.Fatal("the ended slot still counted: no request admitted")
	}

	before := serverState(t, admin)
	_, rec := start(t, h, "203.0.113.1:1001")
	checkRefusedForConcurrency1(t, rec)

	if after := serverState(t, admin); after != before {
		t.Fatalf("a refusal changed Redis:\n%s\nto\n%s", before, after)
	}

	end(t, f)

	if v := redisDo(t, admin, "ZCARD", key); v.Int != 1 {
		t.Fatalf("ZCARD %s = %d after the release, want 1 (the live slot; the dead one dropped)", key, v.Int)
	}
}

// concurrencyShape is a configuration with concurrency layers: ip (2 slots),
// the plan pro (1 slot per principal), a route keyed by the constant global
// (3 slots) and a fixed global of 16 per hour, so that refusals come from
// each and spend nothing elsewhere.
func concurrencyShape(c *Config) {
	c.Global = config.LayerConfig{Points: 16, Duration: "1h"}
	c.IP = config.LayerConfig{Points: 2, Duration: "1h", Algorithm: "concurrency"}
	c.User = config.LayerConfig{Points: 100, Duration: "1h"}
	c.Principal.UserHeader = "X-Auth-User"
	c.Principal.PlanHeader = "X-Auth-Plan"
	c.Plans = map[string]config.PlanConfig{"pro": {Points: 1, Duration: "1h", Algorithm: "concurrency"}}
	c.Routes = []config.RouteConfig{{Name: "export", Key: "global", Paths: []string{"/export"}, Points: 3, Duration: "1h", Algorithm: "concurrency"}}
}

// TestMemoryAndRedisAgreeOnConcurrency: a seeded script of requests that
// start (held by the backend) and end, from a few clients, gets the same
// answers in memory and in Redis: status, refusing layer, slots left.
func TestMemoryAndRedisAgreeOnConcurrency(t *testing.T) {
	addr, _ := redisServer(t)

	refusals := map[string]int{}

	for seed := int64(1); seed <= 6; seed++ {
		a := newHarness(t, concurrencyShape)
		b, _ := redisHarness(t, addr, with(concurrencyShape, asACLUser))
		holding(a)
		holding(b)

		rng := rand.New(rand.NewSource(seed))
		var held [][2]*inflight

		for step := 0; step < 60; step++ {
			if len(held) > 0 && rng.Intn(5) < 2 {
				k := rng.Intn(len(held))
				end(t, held[k][0])
				end(t, held[k][1])
				held = append(held[:k], held[k+1:]...)

				continue
			}

			remote := "203.0.113." + strconv.Itoa(1+rng.Intn(3)) + ":1000"
			path := "/slow"
			if rng.Intn(2) == 0 {
				path = "/export"
			}

			var hdr []string
			if rng.Intn(3) == 0 {
				hdr = []string{"X-Auth-User", "u" + strconv.Itoa(rng.Intn(2)), "X-Auth-Plan", "pro"}
			}

			fa, ra := startPath(t, a, remote, path, hdr...)
			fb, rb := startPath(t, b, remote, path, hdr...)

			if (fa == nil) != (fb == nil) {
				t.Fatalf("seed %d step %d: %s %s admitted in memory %v, in Redis %v", seed, step, remote, path, fa != nil, fb != nil)
			}

			if fa != nil {
				held = append(held, [2]*inflight{fa, fb})
				continue
			}

			for _, h := range []string{"X-Ratelimit-Remaining", "Ratelimit-Policy", "Retry-After"} {
				if ra.Header().Get(h) != rb.Header().Get(h) {
					t.Fatalf("seed %d step %d: %s: memory %q, Redis %q", seed, step, h, ra.Header().Get(h), rb.Header().Get(h))
				}
			}

			la, lb := refusedLayer(ra), refusedLayer(rb)
			if la != lb {
				t.Fatalf("seed %d step %d: refused by %q in memory, %q in Redis", seed, step, la, lb)
			}

			refusals[la]++
		}

		for _, f := range held {
			end(t, f[0])
			end(t, f[1])
		}

	}

	if refusals["ip"] == 0 || refusals["export"] == 0 || refusals["global"] == 0 || refusals["pro"] == 0 {
		t.Fatalf("refusals %v: the scripts do not reach every layer", refusals)
	}
}

// TestConcurrencyOnStatusAndMetrics: the status page lists a key's slots in
// flight and the layer's algorithm; the metrics export them.
func TestConcurrencyOnStatusAndMetrics(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		concurrencyIP(2, "60s")(c)
		c.Status.Path = "/_tierlimit"
	})
	holding(h)

	f, _ := start(t, h, "203.0.113.1:1000")
	g, _ := start(t, h, "203.0.113.1:1001")

	page := h.get("/_tierlimit", "127.0.0.1:1000").Body.String()
	for _, want := range []string{`"algorithm":"concurrency"`, `"key":"203.0.113.1","count":2,"limit":2,"limited":true`} {
		if !strings.Contains(page, want) {
			t.Fatalf("status page without %s:\n%s", want, page)
		}
	}

	metrics := h.get("/_tierlimit/metrics", "127.0.0.1:1000").Body.String()
	if !strings.Contains(metrics, `tierlimit_in_flight{middleware="`+h.p.name+`",layer="ip"} 2`) {
		t.Fatalf("metrics without 2 in flight on ip:\n%s", metrics)
	}

	end(t, f)
	end(t, g)

	metrics = h.get("/_tierlimit/metrics", "127.0.0.1:1000").Body.String()
	if !strings.Contains(metrics, `layer="ip"} 0`) || strings.Contains(metrics, `tierlimit_in_flight{middleware="`+h.p.name+`",layer="ip"} 2`) {
		t.Fatalf("metrics after the requests ended:\n%s", metrics)
	}
}

// TestConcurrencyConfigErrors: what cannot combine with a concurrency layer
// is an error naming the field and its value.
func TestConcurrencyConfigErrors(t *testing.T) {
	conc := func(points int) config.LayerConfig {
		return config.LayerConfig{Points: points, Duration: "60s", Algorithm: "concurrency"}
	}
	route := func(mut func(rc *config.RouteConfig)) []config.RouteConfig {
		rc := config.RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 2, Duration: "60s", Algorithm: "concurrency"}
		mut(&rc)
		return []config.RouteConfig{rc}
	}

	cases := []struct {
		mutate func(c *Config)
		want   string
	}{
		{func(c *Config) { c.IP = conc(2); c.IP.Duration, c.IP.Calendar = "", "day" }, `ip.calendar = "day": takes algorithm "fixed" only`},
		{func(c *Config) { c.IP = conc(2); c.IP.BlockDuration = "1m" }, `ip.blockDuration = "1m": does not apply to algorithm "concurrency"`},
		{func(c *Config) { c.IP = conc(2); c.IP.Burst = 3 }, `ip.burst = "3": only algorithm "tokenbucket" takes a burst`},
		{func(c *Config) { c.Routes = route(func(rc *config.RouteConfig) { rc.Cost = 2 }) }, `routes[0].cost = "2": a concurrency layer (export) holds one slot per request`},
		{func(c *Config) { c.Routes = route(func(rc *config.RouteConfig) { rc.CountStatus = []int{401} }) }, `routes[0].countStatus = "401": cannot charge a concurrency layer (export)`},
		{func(c *Config) {
			c.IP = conc(2)
			c.Principal.CredentialHeaders = []string{"Authorization"}
		}, `ip.algorithm = "concurrency": cannot hold a slot for a credentialed request`},
	}

	for i, tc := range cases {
		cfg := CreateConfig()
		tc.mutate(cfg)

		if _, err := parse(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("case %d: error %v, want it to contain %s", i, err, tc.want)
		}
	}

	for _, ok := range []func(c *Config){
		func(c *Config) { c.Global = conc(100) },
		func(c *Config) { c.User = conc(3); c.Principal.UserHeader = "X-Auth-User" },
		func(c *Config) {
			c.IP = conc(2)
			c.IP.Store = "memory"
			c.Store, c.Redis.SyncInterval = "redis", "1s"
		},
		func(c *Config) {
			c.IP = conc(2)
			c.Store, c.Redis.SyncInterval = "redis", "1s"
		},
		func(c *Config) { c.Routes = route(func(rc *config.RouteConfig) { rc.Cost = 1 }) },
	} {
		cfg := CreateConfig()
		ok(cfg)

		if _, err := parse(cfg); err != nil {
			t.Errorf("%v, want no error", err)
		}
	}
}

// TestConcurrencyInMemoryOnARedisInstance: a concurrency layer counted in
// memory (store: memory) on a Redis instance gives its slot back when a
// Redis layer refuses the request after it.
func TestConcurrencyInMemoryOnARedisInstance(t *testing.T) {
	addr, _ := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Global = config.LayerConfig{Points: 1, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 1, Duration: "60s", Algorithm: "concurrency", Store: "memory"}
	})
	holding(h)

	f, _ := start(t, h, "203.0.113.1:1000")
	if f == nil {
		t.Fatal("the first request was not admitted")
	}

	_, rec := start(t, h, "203.0.113.1:1001")
	checkRefusedForConcurrency1(t, rec)
	end(t, f)

	_, rec = start(t, h, "203.0.113.1:1002")
	if rec == nil || !strings.Contains(rec.Body.String(), `"layer":"global"`) {
		t.Fatalf("%v, want global's refusal", rec)
	}

	if got := inFlightOf(h, "ip", "203.0.113.1"); got != 0 {
		t.Fatalf("ip holds %d slots after Redis's global refused the request, want 0", got)
	}
}

// TestConcurrencyWhileRedisIsDown: the memory fallback holds slots while
// Redis cannot, and releases them.
func TestConcurrencyWhileRedisIsDown(t *testing.T) {
	h, _ := redisHarness(t, closedPort(t), concurrencyIP(2, "60s"))
	concurrencyScenario(t, h)

	if !h.p.stores.redis.Backend.Down.Load() {
		t.Fatal("Redis was not marked down")
	}
}

// TestConcurrencyOfAnExemptClient: an exempt client pays global, here a
// concurrency layer, and gives its slot back once served.
func TestConcurrencyOfAnExemptClient(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 1, Duration: "60s", Algorithm: "concurrency"}
		c.Exempt.IPs = []string{"203.0.113.1"}
	})
	holding(h)

	f, _ := start(t, h, "203.0.113.1:1000")
	if f == nil {
		t.Fatal("the exempt request was not admitted")
	}

	if _, rec := start(t, h, "203.0.113.2:1000"); rec == nil || rec.Code != http.StatusTooManyRequests {
		t.Fatalf("another client: %v, want global's refusal while the exempt one holds its slot", rec)
	}

	end(t, f)

	g, _ := start(t, h, "203.0.113.2:1001")
	if g == nil {
		t.Fatal("the exempt request's slot was not released")
	}

	end(t, g)
}

// TestConcurrencyInDryRun: a dry-run concurrency layer admits past its
// slots, reports the would-be refusal, and takes no slot for it: once the
// first request ends, the layer is free again.
func TestConcurrencyInDryRun(t *testing.T) {
	addr, _ := redisServer(t)
	dry := func(c *Config) {
		concurrencyIP(1, "60s")(c)
		c.IP.DryRun = true
	}

	for name, h := range map[string]*harness{
		"memory": newHarness(t, dry),
		"redis":  func() *harness { h, _ := redisHarness(t, addr, with(dry, asACLUser)); return h }(),
	} {
		holding(h)

		f, _ := start(t, h, "203.0.113.1:1000")
		g, _ := start(t, h, "203.0.113.1:1001")
		if f == nil || g == nil {
			t.Fatalf("%s: a dry-run layer refused", name)
		}

		if !strings.Contains(h.events.String(), `"dryRun":true`) {
			t.Fatalf("%s: no dry-run refusal reported: %s", name, h.events.String())
		}

		end(t, f)
		end(t, g)

		h.events.Reset()
		k, _ := start(t, h, "203.0.113.1:1002")
		end(t, k)

		if strings.Contains(h.events.String(), "RATE_LIMIT_TRIGGERED") {
			t.Fatalf("%s: the layer still held a slot after both requests ended: %s", name, h.events.String())
		}
	}
}

// TestConcurrencyReset: an operator's reset of a key frees its slots, in
// memory and in Redis; the requests then ending release nothing of others'.
func TestConcurrencyReset(t *testing.T) {
	addr, _ := redisServer(t)
	conf := func(c *Config) {
		concurrencyIP(1, "60s")(c)
		c.Status.Path = "/_rl"
	}

	for name, h := range map[string]*harness{
		"memory": newHarness(t, conf),
		"redis":  func() *harness { h, _ := redisHarness(t, addr, with(conf, asACLUser)); return h }(),
	} {
		holding(h)

		f, _ := start(t, h, "203.0.113.1:1000")
		if _, rec := start(t, h, "203.0.113.1:1001"); f == nil || rec == nil {
			t.Fatalf("%s: the first request was not admitted, or the second not refused", name)
		}

		if rec := h.do(http.MethodPost, "/_rl/reset?layer=ip&key=203.0.113.1", "127.0.0.1:1000", nil); rec.Code != http.StatusOK {
			t.Fatalf("%s: reset answered %d: %s", name, rec.Code, rec.Body)
		}

		// A request of another nanosecond (memory names a slot by its lease end).
		h.clock.Add(time.Millisecond)

		g, _ := start(t, h, "203.0.113.1:1002")
		if g == nil {
			t.Fatalf("%s: the reset did not free the slot", name)
		}

		end(t, f)

		if _, rec := start(t, h, "203.0.113.1:1003"); rec == nil {
			t.Fatalf("%s: the request reset away freed the slot of the one after it", name)
		}

		end(t, g)
	}
}

// On exact Redis, memory mirrors what Redis reported to this process: the
// counts and the concurrency slots its requests hold (the status page, the
// metrics and the fallback read them). A request that another layer
// refuses after its concurrency slot and counts were taken (a costFrom
// route, which takes its reservation after the other layers) gives them
// back in Redis and in the mirror alike.

// mirrorClient is the client of the mirror tests.
const mirrorClient = "203.0.113.50"

// beside is an instance on exact Redis at addr with a concurrency layer
// (ip: 2 in flight) beside a costFrom route of 10 per client whose
// responses report nothing (each request holds its reserve of 1): the
// route refuses the 11th request, after global and ip took theirs.
func beside(addr string) func(c *Config) {
	return func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = addr
		c.Redis.Timeout = "1s"
		c.Redis.DialTimeout = "1s"
		c.Global = config.LayerConfig{Points: 100, Duration: "60s"}
		c.IP = config.LayerConfig{Points: 2, Duration: "60s", Algorithm: "concurrency"}
		c.Routes = []config.RouteConfig{{Name: "llm", Paths: []string{"/v1/"}, Key: "ip", Points: 10, Duration: "60s", CostFrom: "header:X-Usage", Reserve: 1}}
		c.Status.Path = "/_rl"
	}
}

// refusedBeside sends the 12 requests of the issue to h (10 allowed, the
// last 2 refused by the costFrom route) and waits until none is in flight.
func refusedBeside(t *testing.T, h *harness) {
	t.Helper()

	allowed := 0
	for i := 0; i < 12; i++ {
		if h.do(http.MethodPost, "/v1/chat", mirrorClient+":1", nil).Code == http.StatusOK {
			allowed++
		}
	}

	h.quiet()

	if allowed != 10 {
		t.Fatalf("%d of 12 allowed, want 10: the route refuses the 11th", allowed)
	}
}

// ipSlots is what Redis holds (ZCARD) of the client's ip slots and what
// memory mirrors of them, at the harness's now.
func ipSlots(t *testing.T, h *harness, admin *redisresp.Pool) (redis, mirror int64) {
	t.Helper()

	ip := h.p.layers[layerIndex(h, "ip")]

	return redisDo(t, admin, "ZCARD", ip.RedisKey+mirrorClient).Int, memstore.InFlight(h.p.memory, "ip", mirrorClient, h.clock.Now().UnixNano())
}

// TestARequestAnotherRouteRefusesGivesItsSlotBackInTheMirror: after 12
// requests of which the costFrom route refused 2, nothing runs: Redis holds
// no slot of the client, nor does memory, and the metrics count none in
// flight.
func TestARequestAnotherRouteRefusesGivesItsSlotBackInTheMirror(t *testing.T) {
	addr, admin := redisServer(t)
	h := newProxiedHarness(t, beside(addr))

	refusedBeside(t, h)

	if redis, mirror := ipSlots(t, h, admin); redis != 0 || mirror != 0 {
		t.Fatalf("with nothing in flight, Redis holds %d slots (ZCARD) and memory mirrors %d, want 0 and 0", redis, mirror)
	}

	metrics := h.get("/_rl/metrics", local).Body.String()
	if want := `tierlimit_in_flight{middleware="` + h.p.name + `",layer="ip"} 0`; !strings.Contains(metrics, want) {
		t.Fatalf("metrics without %s:\n%s", want, grepLines(metrics, "tierlimit_in_flight"))
	}
}

// TestARequestAnotherRouteRefusesFreesItsRedisSlotBesideACheckOnlyRoute: a
// countStatus route (check-only, evaluated but not charged) among the
// layers the refusal gives back does not make the give-back lose the
// request's lease: Redis frees its slot, as memory does.
func TestARequestAnotherRouteRefusesFreesItsRedisSlotBesideACheckOnlyRoute(t *testing.T) {
	addr, admin := redisServer(t)
	h := newProxiedHarness(t, with(beside(addr), func(c *Config) {
		failures := config.RouteConfig{Name: "failures", Paths: []string{"/v1/"}, Key: "ip", Points: 100, Duration: "60s", CountStatus: []int{500}}
		c.Routes = append([]config.RouteConfig{failures}, c.Routes...)
	}))

	refusedBeside(t, h)

	if redis, mirror := ipSlots(t, h, admin); redis != 0 || mirror != 0 {
		t.Fatalf("with nothing in flight, Redis holds %d slots (ZCARD) and memory mirrors %d, want 0 and 0", redis, mirror)
	}
}

// TestTheStatusPageCountsWhatRedisCounts: after the refusals, each count
// the status page shows is Redis's (GET), and it shows no request in
// flight.
func TestTheStatusPageCountsWhatRedisCounts(t *testing.T) {
	addr, admin := redisServer(t)
	h := newProxiedHarness(t, beside(addr))

	refusedBeside(t, h)

	shown := map[string]int64{}
	for _, it := range h.status("/_rl").Keys.Items {
		shown[it.Layer+"/"+it.Key] = it.Count
	}

	if n, ok := shown["ip/"+mirrorClient]; ok {
		t.Errorf("the status page shows ip %d in flight with nothing running", n)
	}

	for _, lk := range []struct{ layer, key string }{{"global", "global"}, {"llm", mirrorClient}} {
		l := h.p.layers[layerIndex(h, lk.layer)]
		redis, _ := strconv.ParseInt(redisDo(t, admin, "GET", l.RedisKey+lk.key).Str, 10, 64)

		if got := shown[lk.layer+"/"+lk.key]; got != redis {
			t.Errorf("the status page shows %s %d, Redis holds %d", lk.layer, got, redis)
		}
	}
}

// TestAReloadThatMovesTheLayerToMemoryAdmitsAKeyWithNothingInFlight: the
// reload counts ip in this process's memory (store: memory), which starts
// from what the mirror holds: no slot, as nothing runs.
func TestAReloadThatMovesTheLayerToMemoryAdmitsAKeyWithNothingInFlight(t *testing.T) {
	addr, _ := redisServer(t)
	h := newProxiedHarness(t, beside(addr))

	refusedBeside(t, h)

	r := reloaded(t, h, with(beside(addr), func(c *Config) { c.IP.Store = "memory" }))

	if rec := r.get("/api", mirrorClient+":1"); rec.Code != http.StatusOK {
		t.Fatalf("after the reload, a request of a key with nothing in flight: %d %s, want 200", rec.Code, rec.Body)
	}
}

// TestTheFallbackRefusesNoPhantomSlotDuringAnOutage: Redis goes away after
// the refusals; the memory fallback, which starts from the mirror, admits
// the client, who has nothing in flight.
func TestTheFallbackRefusesNoPhantomSlotDuringAnOutage(t *testing.T) {
	addr, _ := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h := newProxiedHarness(t, beside(proxy.l.Addr().String()))

	refusedBeside(t, h)
	proxy.cut()

	rec := h.get("/api", mirrorClient+":1")
	if !h.p.stores.redis.Backend.Down.Load() {
		t.Fatal("Redis was not marked down: the fallback did not decide")
	}

	if rec.Code != http.StatusOK {
		t.Fatalf("the fallback answered %d %s to a client with nothing in flight, want 200", rec.Code, rec.Body)
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string

	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}

	return strings.Join(out, "\n")
}

// TestARefusedInvalidCredentialFreesOnlyItsOwnSlot: a credentialed request
// that the edge admits, whose response is a 401 and whose ip charge then
// refuses it, gives back what it was charged up front but frees its
// concurrency slot once, at its release: another request of the key still
// in flight keeps its slot, in memory and on Redis (in Redis and its
// mirror), with a clock that has not moved since both were admitted.
func TestARefusedInvalidCredentialFreesOnlyItsOwnSlot(t *testing.T) {
	addr, admin := redisServer(t)

	for _, store := range []string{"memory", "redis"} {
		h := newProxiedHarness(t, func(c *Config) {
			c.Store = store
			c.Redis.Address = addr
			c.Redis.Timeout = "1s"
			c.Global.Points = 0
			c.IP = config.LayerConfig{Points: 1, Duration: "60s"}
			c.Principal.CredentialHeaders = []string{"Authorization"}
			c.Routes = []config.RouteConfig{{Name: "calls", Paths: []string{"/api"}, Key: "ip", Points: 2, Duration: "60s", Algorithm: "concurrency"}}
		})

		entered, release := make(chan struct{}), make(chan struct{})
		h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
			if req.Header.Get("X-Hold") != "" {
				entered <- struct{}{}
				<-release
			}

			if req.Header.Get("Authorization") == "Bearer bad" {
				rw.WriteHeader(http.StatusUnauthorized)
				return
			}

			_, _ = rw.Write([]byte("ok"))
		})

		held := h.open(http.MethodGet, "/api", mirrorClient+":1", map[string]string{"Authorization": "Bearer good", "X-Hold": "1"})
		<-entered

		bad := map[string]string{"Authorization": "Bearer bad"}
		if rec := h.do(http.MethodGet, "/api", mirrorClient+":2", bad); rec.Code != http.StatusUnauthorized {
			t.Fatalf("%s: the first invalid credential: %d, want its 401 (ip 1 of 1)", store, rec.Code)
		}

		if rec := h.do(http.MethodGet, "/api", mirrorClient+":2", bad); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("%s: the second invalid credential: %d, want a 429 from ip", store, rec.Code)
		}

		calls := h.p.layers[layerIndex(h, "calls")]
		mirror := memstore.InFlight(h.p.memory, "calls", mirrorClient, h.clock.Now().UnixNano())
		if mirror != 1 {
			t.Errorf("%s: memory holds %d slots of calls with one request in flight, want 1", store, mirror)
		}

		if store == "redis" {
			if n := redisDo(t, admin, "ZCARD", calls.RedisKey+mirrorClient).Int; n != 1 {
				t.Errorf("redis: Redis holds %d slots of calls (ZCARD) with one request in flight, want 1", n)
			}
		}

		close(release)
		_ = held.readAll()
		held.wait()
		h.quiet()

		if n := memstore.InFlight(h.p.memory, "calls", mirrorClient, h.clock.Now().UnixNano()); n != 0 {
			t.Errorf("%s: memory holds %d slots of calls with nothing in flight, want 0", store, n)
		}
	}
}

// TestTheStatusPageCountsWhatRedisCountsInADryRun: a dry-run instance
// charges a fixed layer past its points in Redis, and a sliding one up to
// them (a sliding counter never holds more); the status page shows what
// Redis holds.
func TestTheStatusPageCountsWhatRedisCountsInADryRun(t *testing.T) {
	addr, admin := redisServer(t)

	for _, algorithm := range []string{"fixed", "sliding"} {
		h := newProxiedHarness(t, func(c *Config) {
			c.Store = "redis"
			c.Redis.Address = addr
			c.Redis.Timeout = "1s"
			c.DryRun = true
			c.Global.Points = 0
			c.IP = config.LayerConfig{Points: 3, Duration: "60s", Algorithm: algorithm}
			c.Status.Path = "/_rl"
		})

		for i := 0; i < 5; i++ {
			h.get("/api", mirrorClient+":1")
		}

		ip := h.p.layers[layerIndex(h, "ip")]
		read := []string{"GET", ip.RedisKey + mirrorClient}
		if algorithm == "sliding" {
			read = []string{"HGET", ip.RedisKey + mirrorClient, "c"}
		}

		held := redisDo(t, admin, read...).Str

		redis, _ := strconv.ParseInt(held, 10, 64)
		page := keysOf(h.status("/_rl").Keys.Items)

		if want := "ip/" + mirrorClient + "=" + held; page != want {
			t.Errorf("%s: the status page shows %q, Redis holds %d", algorithm, page, redis)
		}
	}
}

// TestAReleaseDuringAnOutageFreesTheRedisSlotAtTheRecovery: a request that
// Redis admitted and that ends while Redis is away frees its slot in memory
// at once, and in Redis once Redis answers again, not at its lease's end:
// after the recovery Redis holds no slot of a client with nothing in
// flight.
func TestAReleaseDuringAnOutageFreesTheRedisSlotAtTheRecovery(t *testing.T) {
	releaseDuringAnOutage(t, func(c *Config) { c.Global.Points = 0 })
}

// releaseDuringAnOutage holds a request of a client whose ip layer is a
// concurrency layer in Redis (mutate sets the rest), cuts Redis off, ends
// the request, restores Redis and waits for its slot to go from Redis.
func releaseDuringAnOutage(t *testing.T, mutate func(c *Config)) {
	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h := newProxiedHarness(t, func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = proxy.l.Addr().String()
		c.Redis.Timeout = "1s"
		c.Redis.DialTimeout = "1s"
		mutate(c)
		c.IP = config.LayerConfig{Points: 2, Duration: "60s", Algorithm: "concurrency"}
	})

	entered, release := make(chan struct{}), make(chan struct{})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if req.Header.Get("X-Hold") != "" {
			entered <- struct{}{}
			<-release
		}

		_, _ = rw.Write([]byte("ok"))
	})

	held := h.open(http.MethodGet, "/api", mirrorClient+":1", map[string]string{"X-Hold": "1"})
	<-entered

	ip := h.p.layers[layerIndex(h, "ip")]
	if n := redisDo(t, admin, "ZCARD", ip.RedisKey+mirrorClient).Int; n != 1 {
		t.Fatalf("Redis holds %d slots of the held request, want 1", n)
	}

	proxy.cut()
	if rec := h.get("/api", mirrorClient+":2"); rec.Code != http.StatusOK || !h.p.stores.redis.Backend.Down.Load() {
		t.Fatalf("during the outage: %d, down %v; want 200 from the fallback", rec.Code, h.p.stores.redis.Backend.Down.Load())
	}

	close(release)
	_ = held.readAll()
	held.wait()

	proxy.restore()
	h.clock.Add(time.Minute) // past the back-off: the next request probes
	if rec := h.get("/api", mirrorClient+":3"); rec.Code != http.StatusOK {
		t.Fatalf("after the recovery: %d, want 200", rec.Code)
	}

	waitFor(t, "Redis to free the slot released during the outage", func() bool {
		return redisDo(t, admin, "ZCARD", ip.RedisKey+mirrorClient).Int == 0
	})
}

// TestASettledReservationLeavesTheStatusPageAtRedisCount: responses that
// report more than their reservation (charged past it) or less (given
// back) move the count in Redis and in this Traefik's memory of it alike:
// the status page shows Redis's count.
func TestASettledReservationLeavesTheStatusPageAtRedisCount(t *testing.T) {
	addr, admin := redisServer(t)
	h := newProxiedHarness(t, func(c *Config) {
		meteredRoute("header:X-Usage", 5)(c)
		c.Store = "redis"
		c.Redis.Address = addr
		c.Redis.Timeout = "1s"
		c.Routes[0].Key = "ip"
		c.Status.Path = "/_rl"
	})
	h.backend = reportsAsAsked

	for i, cost := range []string{"9", "1", "9"} {
		client := "203.0.113." + strconv.Itoa(60+i%2)
		if rec := h.do(http.MethodPost, "/v1/x", client+":1", map[string]string{"X-Cost": cost}); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d, want 200", i, rec.Code)
		}
	}

	llm := h.p.layers[layerIndex(h, "llm")]
	shown := map[string]int64{}
	for _, it := range h.status("/_rl").Keys.Items {
		shown[it.Key] = it.Count
	}

	for _, client := range []string{"203.0.113.60", "203.0.113.61"} {
		redis, _ := strconv.ParseInt(redisDo(t, admin, "GET", llm.RedisKey+client).Str, 10, 64)
		if shown[client] != redis {
			t.Errorf("%s: the status page shows llm %d, Redis holds %d", client, shown[client], redis)
		}
	}
}

// A concurrency layer beside synced counters: its slots in Redis exactly.

// syncedSlots is an instance with redis.syncInterval, a synced global (a
// fixed window of 1000 an hour) and 2 requests in flight per client IP.
func syncedSlots(c *Config) {
	asACLUser(c)
	concurrencyIP(2, "60s")(c)
	synced(c)
}

// TestTwoSyncedReplicasShareAConcurrencyLayersSlots: with
// redis.syncInterval, a concurrency layer counts in Redis exactly, so two
// replicas hold 2 slots per client between them, not 2 each; a slot one
// frees the other can take. The global layer beside stays synced.
func TestTwoSyncedReplicasShareAConcurrencyLayersSlots(t *testing.T) {
	addr, admin := redisServer(t)
	a, b := clockedReplicas(t, addr, syncedSlots, 0)
	holding(a)
	holding(b)

	x, _ := start(t, a, "203.0.113.1:1000")
	y, _ := start(t, b, "203.0.113.1:1001")
	if x == nil || y == nil {
		t.Fatal("one request on each replica: not both admitted")
	}

	ip := a.p.layers[layerIndex(a, "ip")]
	if n := redisDo(t, admin, "ZCARD", ip.RedisKey+"203.0.113.1").Int; n != 2 {
		t.Fatalf("Redis holds %d slots of the client, want 2", n)
	}

	_, refused := start(t, a, "203.0.113.1:1002")
	checkRefusedForConcurrency(t, refused, "a third request, on the first replica")
	_, refused = start(t, b, "203.0.113.1:1003")
	checkRefusedForConcurrency(t, refused, "a third request, on the second replica")

	end(t, x)

	z, _ := start(t, b, "203.0.113.1:1004")
	if z == nil {
		t.Fatal("the slot the first replica freed: not taken on the second")
	}

	end(t, y)
	end(t, z)

	if n := redisDo(t, admin, "ZCARD", ip.RedisKey+"203.0.113.1").Int; n != 0 {
		t.Fatalf("Redis holds %d slots once every request ended, want 0", n)
	}

	if a.p.stores.redis.Synced == nil || a.p.stores.redis.Exact == nil {
		t.Fatal("the instance is not synced with its slots in Redis")
	}
}

// TestASyncedConcurrencyLayerWhileRedisIsDown: as in exact mode, the memory
// fallback holds the slots while Redis cannot, and releases them.
func TestASyncedConcurrencyLayerWhileRedisIsDown(t *testing.T) {
	h, _ := redisHarness(t, closedPort(t), func(c *Config) {
		concurrencyIP(2, "60s")(c)
		synced(c)
	})
	concurrencyScenario(t, h)

	if !h.p.stores.redis.Backend.Down.Load() {
		t.Fatal("Redis was not marked down")
	}
}

// TestASyncedSlotReleasedDuringAnOutageIsFreedAtTheRecovery: as in exact
// mode, a slot released while Redis is cut off is freed in Redis when it
// answers again, so that its key is not refused there until its lease ends.
func TestASyncedSlotReleasedDuringAnOutageIsFreedAtTheRecovery(t *testing.T) {
	releaseDuringAnOutage(t, func(c *Config) {
		c.Redis.SyncInterval = "1h"
		asACLUser(c)
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
	})
}
