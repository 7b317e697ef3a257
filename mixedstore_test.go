package tierlimit

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestMemoryLayerOnRedisServer: global with store: memory on a Redis
// instance is counted in memory, never in Redis; a request ip refuses (in
// Redis) spends no global point, and one global refuses (in memory) calls
// no Redis and spends no ip point.
func TestMemoryLayerOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Global = LayerConfig{Points: 3, Duration: "1h", Store: "memory"}
		c.IP = LayerConfig{Points: 2, Duration: "1h"}
	})

	if _, ok := h.h.(*mixedPath); !ok || !h.p.stores.mixed {
		t.Fatalf("handler %T, mixed %v: want the mixed store on mixedPath", h.h, h.p.stores.mixed)
	}

	now := h.clock.Now().UnixNano()
	global := func() int64 { return peekCount(h.p.memory, now, "global", "global") }

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", "203.0.113.1:1"); rec.Code != want || rec.Code == http.StatusTooManyRequests && refusedLayer(rec) != "ip" {
			t.Fatalf("request %d from .1: %d (%s), want %d", i, rec.Code, refusedLayer(rec), want)
		}
	}

	if n := global(); n != 2 {
		t.Fatalf("global at %d after 2 allowed and 1 refused by ip, want 2", n)
	}

	if rec := h.get("/api", "203.0.113.2:1"); rec.Code != http.StatusOK || global() != 3 {
		t.Fatalf("request from .2: %d, global at %d, want 200 and 3", rec.Code, global())
	}

	calls := scriptCalls(t, admin)

	if rec := h.get("/api", "203.0.113.3:1"); rec.Code != http.StatusTooManyRequests || refusedLayer(rec) != "global" {
		t.Fatalf("request from .3: %d (%s), want refused by global", rec.Code, refusedLayer(rec))
	}

	if scriptCalls(t, admin) != calls || global() != 3 {
		t.Fatalf("the global refusal called Redis (%d script calls, %d before) or changed global (%d)", scriptCalls(t, admin), calls, global())
	}

	for _, k := range redisDo(t, admin, "KEYS", "*").Array {
		if strings.Contains(k.Str, ":global") {
			t.Fatalf("global is in Redis: %s", k.Str)
		}
	}

	if n := redisDo(t, admin, "GET", h.p.planIP[1].RedisKey+"203.0.113.1").Str; n != "2" {
		t.Fatalf("ip of .1 in Redis %q, want 2", n)
	}

	if n := redisDo(t, admin, "EXISTS", h.p.planIP[1].RedisKey+"203.0.113.3").Int; n != 0 {
		t.Fatalf("ip of .3, which global refused, is in Redis")
	}
}

// TestMergedTallyShowsAsOneTake: the tallies of the two stores merge as one
// take of every layer would report them: the refusing layer shown, else the
// one with the fewest requests left, the first of equals; first-refusal
// bits at the layers' own places.
func TestMergedTallyShowsAsOneTake(t *testing.T) {
	for _, c := range []struct {
		name       string
		mem, red   tally
		shown      int
		left       int64
		refused    bool
		firstsWant uint64
	}{
		{"fewest left in redis", tally{Shown: 0, Left: 5}, tally{Shown: 0, Left: 2}, 1, 2, false, 0},
		{"fewest left in memory", tally{Shown: 0, Left: 1}, tally{Shown: 1, Left: 2}, 0, 1, false, 0},
		{"equal: the first", tally{Shown: 0, Left: 2}, tally{Shown: 0, Left: 2}, 0, 2, false, 0},
		{"refused in redis", tally{Shown: 0, Left: 0}, tally{Shown: 1, Refused: true, Firsts: 2}, 2, 0, true, 4},
		{"dry run: both refuse, the first shown", tally{Shown: 0, Refused: true, Firsts: 1}, tally{Shown: 0, Refused: true, Firsts: 1}, 0, 0, true, 3},
		{"nothing in memory", tally{Shown: -1}, tally{Shown: 1, Left: 7}, 2, 7, false, 0},
	} {
		// Layer 0 in memory; 1 and 2 in Redis.
		tl := tally{Shown: -1}
		mergeTally(&tl, &c.mem, []int{0})
		mergeTally(&tl, &c.red, []int{1, 2})

		if tl.Shown != c.shown || tl.Left != c.left || tl.Refused != c.refused || tl.Firsts != c.firstsWant {
			t.Errorf("%s: %+v, want shown %d, left %d, refused %v, firsts %b", c.name, tl, c.shown, c.left, c.refused, c.firstsWant)
		}
	}
}

// TestMemoryLayerWhileRedisIsDown: with Redis unreachable, the Redis layers
// fall back to memory and the rule holds across them: ip's refusal (in the
// fallback) gives global (a memory layer) its point back.
func TestMemoryLayerWhileRedisIsDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	addr := l.Addr().String()
	l.Close()

	h, logs := redisHarness(t, addr, func(c *Config) {
		c.Global = LayerConfig{Points: 3, Duration: "1h", Store: "memory"}
		c.IP = LayerConfig{Points: 2, Duration: "1h"}
	})

	now := h.clock.Now().UnixNano()

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", "203.0.113.1:1"); rec.Code != want {
			t.Fatalf("request %d: %d, want %d", i, rec.Code, want)
		}
	}

	if !strings.Contains(logs.String(), "REDIS_UNAVAILABLE") {
		t.Fatalf("logs %q: want Redis reported unavailable", logs)
	}

	if g, ip := peekCount(h.p.memory, now, "global", "global"), peekCount(h.p.memory, now, "ip", "203.0.113.1"); g != 2 || ip != 2 {
		t.Fatalf("memory holds global %d, ip %d, want 2 and 2", g, ip)
	}
}

// TestMemoryRouteAfterRedisLayersOnRedisServer: a memory layer after the
// Redis ones (a route) is charged all or nothing with them too: its refusal
// charges no Redis layer, and Redis's refusal gives its point back.
func TestMemoryRouteAfterRedisLayersOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Global = LayerConfig{Points: 100, Duration: "1h"}
		c.IP = LayerConfig{Points: 2, Duration: "1h"}
		c.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 1, Duration: "1h", Store: "memory"}}
	})

	now := h.clock.Now().UnixNano()
	global := h.p.planIP[0].RedisKey + "global"

	for i, step := range []struct {
		path, client string
		code         int
		global       string
	}{
		{"/login", "203.0.113.1:1", http.StatusOK, "1"},
		{"/login", "203.0.113.1:1", http.StatusTooManyRequests, "1"}, // login (memory) refuses: Redis untouched
		{"/api", "203.0.113.1:1", http.StatusOK, "2"},
		{"/api", "203.0.113.3:1", http.StatusOK, "3"},
		{"/api", "203.0.113.3:1", http.StatusOK, "4"},
		{"/login", "203.0.113.3:1", http.StatusTooManyRequests, "4"}, // ip (Redis) refuses: login given back
	} {
		rec := h.get(step.path, step.client)
		if rec.Code != step.code {
			t.Fatalf("step %d: %d (%s), want %d", i, rec.Code, refusedLayer(rec), step.code)
		}

		if g := redisDo(t, admin, "GET", global).Str; g != step.global {
			t.Fatalf("step %d: global %q in Redis, want %s", i, g, step.global)
		}
	}

	if n := peekCount(h.p.memory, now, "login", "203.0.113.3"); n != 0 {
		t.Fatalf("login of .3 at %d after ip refused its only request, want 0", n)
	}
}
