package tierlimit

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
)

// blockedIP is an ip layer of 3 per second that blocks a refused client for 4s.
func blockedIP(algorithm string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points, c.Assets.Points = 0, 0
		c.IP = config.LayerConfig{Points: 3, Duration: "1s", Algorithm: algorithm, BlockDuration: "4s"}
		if algorithm == "tokenbucket" {
			c.IP = config.LayerConfig{Points: 3, Duration: "1s", Algorithm: algorithm, Burst: 3, BlockDuration: "4s"}
		}
	}
}

// A key its layer refused stays refused for blockDuration from that refusal,
// after its window reset, with Retry-After at the block's end; then it is let
// in. The block is one event, and another client is not blocked.
func TestBlockOutlivesTheWindow(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		h := newHarness(t, blockedIP(algorithm))
		client := "203.0.113.9:1"

		for i := 0; i < 3; i++ {
			if rec := h.get("/api", client); rec.Code != http.StatusOK {
				t.Fatalf("%s: request %d: %d", algorithm, i+1, rec.Code)
			}
		}

		began := h.clock.Now()
		rec := h.get("/api", client)
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "4" {
			t.Fatalf("%s: the 4th request: %d, Retry-After %q, want 429 and 4", algorithm, rec.Code, rec.Header().Get("Retry-After"))
		}

		h.clock.Add(1500 * time.Millisecond)
		rec = h.get("/api", client)
		if ra := rec.Header().Get("Retry-After"); rec.Code != http.StatusTooManyRequests || (ra != "2" && ra != "3") {
			t.Fatalf("%s: 1.5s into the block: %d, Retry-After %q", algorithm, rec.Code, ra)
		}

		if want := formatInt(limit.CeilSeconds(began.Add(4 * time.Second).UnixNano())); rec.Header().Get("X-RateLimit-Reset") != want {
			t.Fatalf("%s: X-RateLimit-Reset %q, want the block's end %s", algorithm, rec.Header().Get("X-RateLimit-Reset"), want)
		}

		if rec := h.get("/api", "203.0.113.10:1"); rec.Code != http.StatusOK {
			t.Fatalf("%s: another client is refused: %d", algorithm, rec.Code)
		}

		h.clock.Add(2400 * time.Millisecond)
		if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("%s: 3.9s into the block: %d", algorithm, rec.Code)
		}

		h.clock.Add(400 * time.Millisecond)
		if rec := h.get("/api", client); rec.Code != http.StatusOK {
			t.Fatalf("%s: 4.3s after the block began: %d", algorithm, rec.Code)
		}

		if n := strings.Count(h.events.String(), "RATE_LIMIT_TRIGGERED"); n != 1 {
			t.Fatalf("%s: %d events for one block:\n%s", algorithm, n, h.events)
		}
	}
}

// Without blockDuration a refused key is let in when its window resets.
func TestNoBlockByDefault(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		blockedIP("fixed")(c)
		c.IP.BlockDuration = ""
	})

	h.burst("203.0.113.9", 4)
	h.clock.Add(1100 * time.Millisecond)

	if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusOK {
		t.Fatalf("after the window: %d", rec.Code)
	}
}

// The status page lists a blocked key with the block's end, and a reset of
// the key ends the block.
func TestStatusListsAndResetEndsABlock(t *testing.T) {
	h := statusHarness(t, blockedIP("fixed"))
	client := "203.0.113.9"

	h.burst(client, 4)
	began := h.clock.Now()
	h.clock.Add(2 * time.Second)

	doc := h.status("/_rl")
	if len(doc.Keys.Items) != 1 || doc.Keys.Items[0].Key != client || !doc.Keys.Items[0].Limited ||
		doc.Keys.Items[0].ResetUnix != limit.CeilSeconds(began.Add(4*time.Second).UnixNano()) {
		t.Fatalf("status of a blocked key: %+v", doc.Keys.Items)
	}

	if code, doc := h.reset("?layer=ip&key="+client, ""); code != http.StatusOK || !doc.Memory {
		t.Fatalf("reset of a blocked key: %d %+v", code, doc)
	}

	if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
		t.Fatalf("after the reset: %d", rec.Code)
	}
}

func TestBlockDurationConfig(t *testing.T) {
	for _, v := range []string{"-1s", "soon", "0.5ms"} {
		cfg := CreateConfig()
		cfg.IP.BlockDuration = v

		if _, err := parse(cfg); err == nil || !strings.Contains(err.Error(), "ip.blockDuration") || !strings.Contains(err.Error(), v) {
			t.Fatalf("blockDuration %q: %v", v, err)
		}
	}

	cfg := CreateConfig()
	cfg.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 1, Duration: "1s", BlockDuration: "15m"}}

	s, err := parse(cfg)
	if err != nil || s.Routes[0].BlockDuration != 15*time.Minute {
		t.Fatalf("a route's blockDuration: %v", err)
	}
}

// On Redis, a refusal sets the key's block key with blockDuration as its TTL;
// while it lives the key is refused after its counter is gone (its window
// over), by this replica locally and by another through Redis, and a reset
// deletes it.
func TestBlockOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		redisDo(t, admin, "FLUSHALL")
		a, _ := redisHarness(t, addr, func(c *Config) { blockedIP(algorithm)(c); c.Status.Path = "/_rl" })
		b, _ := redisHarness(t, addr, blockedIP(algorithm))
		client := "203.0.113.9"

		// b is a replica of a: another process of the same middleware.
		for i, l := range b.p.layers {
			l.RedisKey = a.p.layers[i].RedisKey
		}

		a.burst(client, 4)

		key := a.p.layers[layerIndex(a, "ip")].RedisKey + client
		if v := redisDo(t, admin, "PTTL", key+":block"); v.Int < 3000 || v.Int > 4000 {
			t.Fatalf("%s: the block key's PTTL: %+v", algorithm, v)
		}

		redisDo(t, admin, "DEL", key) // the window is over

		for name, h := range map[string]*harness{"the refusing replica": a, "another replica": b} {
			rec := h.get("/api", client+":1")
			if ra := rec.Header().Get("Retry-After"); rec.Code != http.StatusTooManyRequests || (ra != "3" && ra != "4") {
				t.Fatalf("%s: %s: %d, Retry-After %q", algorithm, name, rec.Code, ra)
			}
		}

		if code, doc := a.reset("?layer=ip&key="+client, ""); code != http.StatusOK || doc.Redis == nil || *doc.Redis != redisstore.RedisCleared {
			t.Fatalf("%s: reset: %d %+v", algorithm, code, doc)
		}

		if v := redisDo(t, admin, "EXISTS", key+":block"); v.Int != 0 {
			t.Fatalf("%s: the block key outlived the reset", algorithm)
		}

		if rec := a.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s: after the reset: %d", algorithm, rec.Code)
		}
	}
}

// With Redis down from the start, the memory fallback blocks as memory does:
// a refused client stays refused after its window resets, for the rest of
// the block (Retry-After at its end), then is let in; the block is one
// event. The block reaches the block list too, so it holds after Redis is
// back (takeLocal).
func TestBlockInTheMemoryFallback(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		h, _ := redisHarness(t, closedPort(t), blockedIP(algorithm))
		client := "203.0.113.9:1"

		for i := 0; i < 3; i++ {
			if rec := h.get("/api", client); rec.Code != http.StatusOK {
				t.Fatalf("%s: request %d: %d", algorithm, i+1, rec.Code)
			}
		}

		if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "4" {
			t.Fatalf("%s: the 4th request: %d, Retry-After %q, want 429 and 4", algorithm, rec.Code, rec.Header().Get("Retry-After"))
		}

		if !redisStoreOf(h.p).Backend.Down.Load() {
			t.Fatalf("%s: Redis is not down", algorithm)
		}

		h.clock.Add(1500 * time.Millisecond)
		if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "3" {
			t.Fatalf("%s: 1.5s into the block, its window over: %d, Retry-After %q, want 429 and 3", algorithm, rec.Code, rec.Header().Get("Retry-After"))
		}

		if reset := redisStoreOf(h.p).Blocked.ResetOf(h.p.layers[0].BlockPrefix, "203.0.113.9", h.clock.Now().UnixNano()); reset == 0 {
			t.Fatalf("%s: the fallback's block is not on the block list", algorithm)
		}

		h.clock.Add(2800 * time.Millisecond)
		if rec := h.get("/api", client); rec.Code != http.StatusOK {
			t.Fatalf("%s: 4.3s after the block began: %d", algorithm, rec.Code)
		}

		if n := strings.Count(h.events.String(), "RATE_LIMIT_TRIGGERED"); n != 1 {
			t.Fatalf("%s: %d events for one block:\n%s", algorithm, n, h.events)
		}
	}
}

// A block Redis set holds while Redis is down: the block list refuses the
// key after its window is over, until the block's end, without Redis.
func TestRedisBlockHoldsWhileRedisIsDownOnRedisServer(t *testing.T) {
	addr, _ := redisServer(t)
	h, _ := redisHarness(t, addr, blockedIP("fixed"))
	client := "203.0.113.9:1"

	for i := 0; i < 4; i++ {
		h.get("/api", client)
	}

	// Redis goes away: every call fails from now on.
	dead := closedPort(t)
	pool := redisresp.NewPool(redisresp.Options{Address: dead, Timeout: time.Second})
	redisStoreOf(h.p).Backend = &redisstore.RedisBackend{Pool: pool, Single: pool, Address: dead, Log: io.Discard}

	h.clock.Add(1500 * time.Millisecond)
	if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "3" {
		t.Fatalf("1.5s into Redis's block, Redis down: %d, Retry-After %q, want 429 and 3", rec.Code, rec.Header().Get("Retry-After"))
	}

	// A call fails: the memory fallback decides the other clients.
	if rec := h.get("/api", "203.0.113.10:1"); rec.Code != http.StatusOK || !redisStoreOf(h.p).Backend.Down.Load() {
		t.Fatalf("another client with Redis down: %d, down %v", rec.Code, redisStoreOf(h.p).Backend.Down.Load())
	}

	if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("the blocked client in the fallback: %d", rec.Code)
	}

	h.clock.Add(2800 * time.Millisecond)
	if rec := h.get("/api", client); rec.Code != http.StatusOK {
		t.Fatalf("after the block, Redis down: %d", rec.Code)
	}
}

// blockedWithin is an ip layer of 10 a minute that blocks a refused client
// for 5s, behind global.
func blockedWithin(c *Config) {
	c.Global = config.LayerConfig{Points: 1000, Duration: "60s"}
	c.IP = config.LayerConfig{Points: 10, Duration: "60s", BlockDuration: "5s"}
}

// TestBlockShorterThanTheWindowGivesNoExtraRequests: a key blocked for 5s
// of a 60s window is refused while blocked without its layer's count moving,
// so once the block ends within the window the key still has no point left.
// Global, charged before ip and given back, counts the 10 allowed only.
func TestBlockShorterThanTheWindowGivesNoExtraRequests(t *testing.T) {
	h := newHarness(t, blockedWithin)
	client := "203.0.113.9:1"

	for i := 1; i <= 21; i++ {
		if rec := h.get("/api", client); rec.Code != http.StatusOK && i <= 10 || rec.Code != http.StatusTooManyRequests && i > 10 {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}

	h.clock.Add(6 * time.Second)

	for i := 1; i <= 10; i++ {
		if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("request %d after the block, within the window: %d, want 429: the window's 10 points are spent", i, rec.Code)
		}

		h.clock.Add(6 * time.Second) // past each new block, still in the window
		if h.clock.Now().Sub(time.Date(2026, 6, 15, 10, 0, 0, 200e6, time.UTC)) >= time.Minute {
			break
		}
	}

	if n := countsByLayer(h); n["ip"] != 10 || n["global"] != 10 {
		t.Fatalf("counts %v, want 10 in ip and global", n)
	}
}

// TestReloadToDryRunRefusesNoBlockedKey: keys blocked before a reload to dry
// run, top-level or on the rule that blocked them, are let through by the
// dry-run instance and counted there; a key blocked by a rule that stays
// enforced is not.
func TestReloadToDryRunRefusesNoBlockedKey(t *testing.T) {
	base := func(c *Config) {
		blockedWithin(c)
		c.IP.BlockDuration = "1h"
		c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 2, Duration: "60s", BlockDuration: "1h"}}
	}

	// .1 is blocked by ip on /api, .2 by the login route on /login.
	type blockedClient struct{ rule, path, client string }
	clients := []blockedClient{{"ip", "/api", "203.0.113.1:1"}, {"login", "/login", "203.0.113.2:1"}}

	for _, tc := range []struct {
		dry  string // the rule made dry run, or "all"
		mark func(c *Config)
	}{
		{"all", func(c *Config) { c.DryRun = true }},
		{"ip", func(c *Config) { c.IP.DryRun = true }},
		{"login", func(c *Config) { c.Routes[0].DryRun = true }},
	} {
		h := newHarness(t, base)
		h.burst("203.0.113.1", 11)
		for i := 0; i < 3; i++ {
			h.get("/login", "203.0.113.2:1")
		}

		for _, c := range clients {
			if rec := h.get(c.path, c.client); rec.Code != http.StatusTooManyRequests {
				t.Fatalf("dry run of %s: %s from %s before the reload: %d, want blocked", tc.dry, c.path, c.client, rec.Code)
			}
		}

		r := reloaded(t, h, with(base, tc.mark))

		for _, c := range clients {
			want, counted := http.StatusTooManyRequests, int64(0)
			if tc.dry == "all" || tc.dry == c.rule {
				want, counted = http.StatusOK, 1
			}

			l := r.p.layers[layerIndex(r, c.rule)]
			before := l.Entries[strings.TrimSuffix(c.client, ":1")].Count

			if rec := r.get(c.path, c.client); rec.Code != want {
				t.Errorf("dry run of %s: %s from %s after the reload: %d, want %d", tc.dry, c.path, c.client, rec.Code, want)
			}

			if n := l.Entries[strings.TrimSuffix(c.client, ":1")].Count - before; n != counted {
				t.Errorf("dry run of %s: %s from %s after the reload counted %d in %s, want %d", tc.dry, c.path, c.client, n, c.rule, counted)
			}
		}
	}
}

// TestReloadToDryRunRefusesNoBlockedKeyOnRedisServer is
// TestReloadToDryRunRefusesNoBlockedKey on Redis, where the blocks are Redis
// keys and entries of each replica's block list: the dry-run rule lets its
// blocked key through and counts it in Redis.
func TestReloadToDryRunRefusesNoBlockedKeyOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)
	base := func(c *Config) {
		asACLUser(c)
		blockedWithin(c)
		c.IP.BlockDuration = "1h"
		c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 2, Duration: "60s", BlockDuration: "1h"}}
	}

	for _, tc := range []struct {
		dry  string // the rule made dry run, or "all"
		mark func(c *Config)
	}{
		{"all", func(c *Config) { c.DryRun = true }},
		{"ip", func(c *Config) { c.IP.DryRun = true }},
		{"login", func(c *Config) { c.Routes[0].DryRun = true }},
	} {
		redisDo(t, admin, "FLUSHALL")

		h, _ := redisHarness(t, addr, base)
		h.burst("203.0.113.1", 11)
		for i := 0; i < 3; i++ {
			h.get("/login", "203.0.113.2:1")
		}

		r := reloaded(t, h, with(base, func(c *Config) {
			c.Store = "redis"
			c.Redis.Address = addr
			c.Redis.Timeout = "1s"
			tc.mark(c)
		}))
		r.p.stores.redis.Backend = h.p.stores.redis.Backend

		for _, c := range []struct{ rule, path, client, key string }{
			{"ip", "/api", "203.0.113.1:1", h.p.layers[layerIndex(h, "ip")].RedisKey + "203.0.113.1"},
			{"login", "/login", "203.0.113.2:1", h.p.routes[0].layer.RedisKey + "203.0.113.2"},
		} {
			want, counted := http.StatusTooManyRequests, 0
			if tc.dry == "all" || tc.dry == c.rule {
				want, counted = http.StatusOK, 1
			}

			before, _ := strconv.Atoi(redisDo(t, admin, "GET", c.key).Str)

			if rec := r.get(c.path, c.client); rec.Code != want {
				t.Errorf("dry run of %s: %s from %s after the reload: %d, want %d", tc.dry, c.path, c.client, rec.Code, want)
			}

			if after, _ := strconv.Atoi(redisDo(t, admin, "GET", c.key).Str); after-before != counted {
				t.Errorf("dry run of %s: %s from %s after the reload counted %d in Redis, want %d", tc.dry, c.path, c.client, after-before, counted)
			}
		}
	}
}

// TestRefusalsOfABlockedKeyAreCounted: every request a block refuses is in
// the key's refused count on the status page, while its window lives and
// after it, and in the layer's refused requests there and in the metrics;
// in memory and on Redis.
func TestRefusalsOfABlockedKeyAreCounted(t *testing.T) {
	blocking := func(c *Config) {
		c.Global.Points, c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0, 0
		c.Status.Path = "/_rl"
		c.IP = config.LayerConfig{Points: 3, Duration: "1s", BlockDuration: "10s"}
	}

	addr, _ := redisServer(t)
	redis, _ := redisHarness(t, addr, with(blocking, asACLUser))

	for _, tc := range []struct {
		name string
		h    *harness
	}{{"memory", newHarness(t, blocking)}, {"redis", redis}} {
		refusedOnStatus(t, tc.name, tc.h)
	}
}

// refusedOnStatus is TestRefusalsOfABlockedKeyAreCounted on one instance.
func refusedOnStatus(t *testing.T, name string, h *harness) {
	t.Helper()

	client := "203.0.113.9"

	keyRefused := func() int64 {
		t.Helper()

		doc := h.status("/_rl")
		if len(doc.Keys.Items) != 1 || doc.Keys.Items[0].Key != client || !doc.Keys.Items[0].Limited {
			t.Fatalf("%s: status: %+v", name, doc.Keys.Items)
		}

		if len(doc.Layers) != 1 || doc.Layers[0].Refused != doc.Keys.Items[0].Refused {
			t.Fatalf("%s: layers %+v, keys %+v: want the layer's refused to be its one key's", name, doc.Layers, doc.Keys.Items)
		}

		return doc.Keys.Items[0].Refused
	}

	h.burst(client, 6) // 3 allowed, the 4th starts the block, 2 refused by it

	if n := keyRefused(); n != 3 {
		t.Fatalf("%s: key refused %d within its window, want 3", name, n)
	}

	h.clock.Add(2 * time.Second) // the window ended, the block goes on
	h.burst(client, 2)

	if n := keyRefused(); n != 5 {
		t.Fatalf("%s: key refused %d after its window, want 5", name, n)
	}

	metrics := h.get("/_rl/metrics", local).Body.String()
	if want := `tierlimit_requests_total{middleware="` + h.p.name + `",layer="ip",decision="refused"} 5`; !strings.Contains(metrics, want) {
		t.Fatalf("%s: metrics without %s:\n%s", name, want, metrics)
	}
}
