package tierlimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
)

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
		c.Global = LayerConfig{Points: 100, Duration: "60s"}
		c.IP = LayerConfig{Points: 2, Duration: "60s", Algorithm: "concurrency"}
		c.Routes = []RouteConfig{{Name: "llm", Paths: []string{"/v1/"}, Key: "ip", Points: 10, Duration: "60s", CostFrom: "header:X-Usage", Reserve: 1}}
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
		failures := RouteConfig{Name: "failures", Paths: []string{"/v1/"}, Key: "ip", Points: 100, Duration: "60s", CountStatus: []int{500}}
		c.Routes = append([]RouteConfig{failures}, c.Routes...)
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
			c.IP = LayerConfig{Points: 1, Duration: "60s"}
			c.Principal.CredentialHeaders = []string{"Authorization"}
			c.Routes = []RouteConfig{{Name: "calls", Paths: []string{"/api"}, Key: "ip", Points: 2, Duration: "60s", Algorithm: "concurrency"}}
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
			c.IP = LayerConfig{Points: 3, Duration: "60s", Algorithm: algorithm}
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
	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h := newProxiedHarness(t, func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = proxy.l.Addr().String()
		c.Redis.Timeout = "1s"
		c.Redis.DialTimeout = "1s"
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 2, Duration: "60s", Algorithm: "concurrency"}
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
