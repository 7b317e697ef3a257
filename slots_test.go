package tierlimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
)

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
	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h := newProxiedHarness(t, func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = proxy.l.Addr().String()
		c.Redis.Timeout = "1s"
		c.Redis.DialTimeout = "1s"
		c.Redis.SyncInterval = "1h"
		asACLUser(c)
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
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
