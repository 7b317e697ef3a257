package tierlimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisstore"
)

// A route's cost is what a matching request spends in every layer it is
// charged to, on every path: synced counting, a countStatus route's charge
// after the response, an outage's debt paid to Redis, and the tokens a
// refusal gives back to a token bucket.

// exportRoute is a route of ip-keyed exports of cost 10, with room for 100
// of them: the ip layer's points decide.
func exportRoute(c *Config) {
	c.Routes = []RouteConfig{{Name: "export", Paths: []string{"/export"}, Key: "ip", Points: 1000, Duration: "60s", Cost: 10}}
}

// TestSyncedCountingChargesTheCost: with redis.syncInterval, an export of
// cost 10 spends 10 of each of its layers' leases; the ip layer's 35 points
// take three exports, not 35, and Redis counts 30 once the leases are back.
func TestSyncedCountingChargesTheCost(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, func(c *Config) {
		c.Global = LayerConfig{Points: 1000, Duration: "60s"}
		c.IP = LayerConfig{Points: 35, Duration: "60s"}
		exportRoute(c)
	})
	client := "203.0.113.9"

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/export", client+":1"); rec.Code != want {
			t.Fatalf("export %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	for _, name := range []string{"global", "ip", "export"} {
		bucket := client
		if name == "global" {
			bucket = "global"
		}

		if c := counterOf(st, name, bucket); c == nil || redisstore.Counted(c) != 30 {
			t.Fatalf("%s's counter %+v, want 30 counted: three exports of cost 10", name, c)
		}
	}

	// Every lease back: Redis counts what was admitted.
	if err := redisstore.SyncNow(st, h.clock.Now().UnixNano(), true); err != nil {
		t.Fatal(err)
	}

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())
	if got := redisDo(t, admin, "GET", redisstore.SyncKey(ip, client, false, start)).Str; got != "30" {
		t.Fatalf("ip's total in Redis %q, want 30", got)
	}
}

// TestCostedCountStatusRouteChargesTheCost: a login route of 9 points that
// counts failures at a cost of 3 takes three failures, then refuses: each
// 401 is charged its cost, not 1.
func TestCostedCountStatusRouteChargesTheCost(t *testing.T) {
	costed := func(c *Config) {
		loginConfig(c)
		c.Routes[0].Points = 9
		c.Routes[0].Cost = 3
	}

	addr, _ := redisServer(t)
	redis, _ := redisHarness(t, addr, with(costed, asACLUser))

	for _, tc := range []struct {
		name string
		h    *harness
	}{{"memory", newHarness(t, costed)}, {"redis", redis}} {
		name, h := tc.name, tc.h
		h.p.next = loginBackend

		for i, want := range []int{http.StatusUnauthorized, http.StatusUnauthorized, http.StatusUnauthorized, http.StatusTooManyRequests} {
			if rec := login(h, "bad"); rec.Code != want {
				t.Fatalf("%s: bad login %d: %d, want %d", name, i+1, rec.Code, want)
			}
		}

		if name == "memory" {
			if w := h.p.routes[0].layer.Entries["203.0.113.1"]; w == nil || w.Count != 9 {
				t.Fatalf("memory: login window %+v, want count 9", w)
			}
		}
	}
}

// TestOutageChargesArePaidAtTheirCost: exports admitted in memory while
// Redis is unreachable are added to Redis at their cost when it answers
// again: one export before the outage and two during it leave 30 in the
// ip key and the route's key.
func TestOutageChargesArePaidAtTheirCost(t *testing.T) {
	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h, _ := redisHarness(t, proxy.l.Addr().String(), func(c *Config) {
		asACLUser(c)
		c.IP = LayerConfig{Points: 100, Duration: "1h"}
		c.Redis.DialTimeout = "1s"
		exportRoute(c)
	})
	rs := h.p.stores.redis
	client := "203.0.113.7"

	export := func() {
		t.Helper()

		if rec := h.get("/export", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("export: %d", rec.Code)
		}
	}

	export()
	proxy.cut()
	export()
	export()

	if !rs.Backend.Down.Load() {
		t.Fatal("the exports during the cut were not decided in memory")
	}

	proxy.restore()
	redisstore.PayOwed(rs)

	for _, l := range []*layer{h.p.layers[layerIndex(h, "ip")], h.p.routes[0].layer} {
		if got := redisDo(t, admin, "GET", l.RedisKey+client).Str; got != "30" {
			t.Errorf("%s in Redis after the payment: %q, want 30 (10 before the outage, 2 x 10 during it)", l.Name, got)
		}
	}
}

// TestRefusedCostGivesATokenBucketItsTokensBack: an export of cost 3 that
// the route refuses gives the ip bucket, charged before the route, all 3
// tokens back: the 4 tokens left before it are there after it.
func TestRefusedCostGivesATokenBucketItsTokensBack(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 1, Duration: "1h", Algorithm: "tokenbucket", Burst: 10}
		c.Routes = []RouteConfig{{Name: "export", Paths: []string{"/export"}, Key: "ip", Points: 6, Duration: "1h", Cost: 3}}
	})
	client := "203.0.113.1:1"

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/export", client); rec.Code != want || want == http.StatusTooManyRequests && refusedLayer(rec) != "export" {
			t.Fatalf("export %d: %d (%s), want %d", i+1, rec.Code, refusedLayer(rec), want)
		}
	}

	allowed := 0
	for i := 0; i < 10; i++ {
		if h.get("/api", client).Code == http.StatusOK {
			allowed++
		}

		h.clock.Add(time.Millisecond)
	}

	if allowed != 4 {
		t.Fatalf("%d reads allowed after the refused export, want the 4 tokens left before it", allowed)
	}
}
