package tierlimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The rules around a request: a plan header written in lower case, a listed
// status that the ip charge turns into a 429, blocks, dry runs after a
// reload and on a mixed store, and the refusals of a blocked key.

// TestLowerCasePlanHeaderFindsThePlan: header names are case-insensitive, so
// principal.planHeader "x-auth-plan" reads the X-Auth-Plan header a request
// carries, on the fast path and the general path.
func TestLowerCasePlanHeaderFindsThePlan(t *testing.T) {
	lower := func(c *Config) {
		planConfig(c)
		c.Principal.PlanHeader = "x-auth-plan"
	}

	general := newHarness(t, lower)
	general.p.mode = modeGeneral
	general.h = general.p

	for _, tc := range []struct {
		name string
		h    *harness
	}{{"fast", newHarness(t, lower)}, {"general", general}} {
		if n, layer := spendUntilRefused(t, tc.h, principalHeaders("bob", "free"), 30); n != 5 || layer != "free" {
			t.Errorf("%s: bob on free: %d allowed, then refused by %q; want 5, then free", tc.name, n, layer)
		}
	}
}

// TestListedStatusCountedWhenTheIPChargeRefuses: a credentialed login that
// the backend answers 401, a status the login route counts, is counted on
// the route also when the ip charge of the invalid credential turns the
// answer into a 429.
func TestListedStatusCountedWhenTheIPChargeRefuses(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global = LayerConfig{Points: 1000, Duration: "60s"}
		c.IP = LayerConfig{Points: 2, Duration: "60s"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
		c.Routes = []RouteConfig{{Name: "login", Methods: []string{"POST"}, Paths: []string{"/login"}, Points: 10, Duration: "60s", CountStatus: []int{401}}}
	})
	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusUnauthorized) })

	token := map[string]string{"Authorization": "Bearer garbage"}
	for i, want := range []int{http.StatusUnauthorized, http.StatusUnauthorized, http.StatusTooManyRequests} {
		if rec := h.do(http.MethodPost, "/login", "203.0.113.1:1", token); rec.Code != want {
			t.Fatalf("login %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	if w := h.p.routes[0].layer.Entries["203.0.113.1"]; w == nil || w.Count != 3 {
		t.Fatalf("login window %+v, want the three 401s counted, the one turned into a 429 included", w)
	}
}

// blockedWithin is an ip layer of 10 a minute that blocks a refused client
// for 5s, behind global.
func blockedWithin(c *Config) {
	c.Global = LayerConfig{Points: 1000, Duration: "60s"}
	c.IP = LayerConfig{Points: 10, Duration: "60s", BlockDuration: "5s"}
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
		c.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 2, Duration: "60s", BlockDuration: "1h"}}
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
		c.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 2, Duration: "60s", BlockDuration: "1h"}}
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

// TestTopLevelDryRunOnAMixedStoreCountsEveryLayer: with dryRun, a memory
// layer over its points stops nothing, the Redis layers beside it included:
// each of them counts every request.
func TestTopLevelDryRunOnAMixedStoreCountsEveryLayer(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.DryRun = true
		c.Global = LayerConfig{Points: 2, Duration: "1h", Store: "memory"}
		c.IP = LayerConfig{Points: 100, Duration: "1h"}
	})

	if ok := h.p.stores.mixed; !ok {
		t.Fatalf("store %T, want the mixed store", h.p.stores)
	}

	for i := 1; i <= 5; i++ {
		if rec := h.get("/api", "203.0.113.1:1"); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}

	if n := peekCount(h.p.memory, h.clock.Now().UnixNano(), "global", "global"); n != 5 {
		t.Errorf("global (memory) at %d, want 5", n)
	}

	if n := redisDo(t, admin, "GET", h.p.layers[layerIndex(h, "ip")].RedisKey+"203.0.113.1").Str; n != "5" {
		t.Errorf("ip (Redis) at %q, want 5: the dry run skipped Redis once global was over", n)
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
		c.IP = LayerConfig{Points: 3, Duration: "1s", BlockDuration: "10s"}
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
