package tierlimit

import (
	"errors"
	"net/http"
	"testing"

	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
)

// ownBackends gives the test a registry of Redis backends of its own, whose
// grace timers it fires (fakeTimers), in place of the process's.
func ownBackends(t *testing.T) *fakeTimers {
	t.Helper()

	saved := redisstore.Backends
	reg := &backendRegistry{ByConfig: lifetime.NewHeldRegistry(redisstore.CloseBackend)}
	ft := newFakeTimers(reg.ByConfig)
	redisstore.Backends = reg
	t.Cleanup(func() { redisstore.Backends = saved })

	return ft
}

// TestAReloadOfRedisSettingsKeepsTheSettlementOfAStreamInFlight: a stream
// on exact Redis (a costFrom route reserving 300, beside a concurrency
// layer) is held open across a reload that changes a redis setting (a new
// backend) and past the old backend's release grace, then reports 700 and
// ends. Its settlement and its slot's release reach Redis: the key counts
// 700, the slot is free; the old pool closes once the stream has ended.
func TestAReloadOfRedisSettingsKeepsTheSettlementOfAStreamInFlight(t *testing.T) {
	addr, admin := redisServer(t)
	ft := ownBackends(t)

	conf := func(timeout string) func(c *Config) {
		return with(meteredRoute("json:usage.total_tokens", 300), func(c *Config) {
			c.Store = "redis"
			c.Redis.Address = addr
			c.Redis.Timeout = timeout
			asACLUser(c)
			c.IP = LayerConfig{Points: 2, Duration: "60s", Algorithm: "concurrency"}
		})
	}

	h := newProxiedHarness(t, conf("1s"))
	sb := newStepBackend("text/event-stream")
	h.backend = sb

	old := h.p.stores.redis.Backend
	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	slots := h.p.stores.redis.Prefix + "ip:203.0.113.1"

	o := h.open(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1"})
	s := sb.next(t)
	s.send("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
	o.readUntil("\n\n")

	if got := redisDo(t, admin, "ZCARD", slots).Int; got != 1 {
		t.Fatalf("%d slots taken in Redis while the stream runs, want 1", got)
	}

	// The timeout rotated: a backend of its own for the new instance.
	r := reloaded(t, h, conf("2s"))
	if r.p.stores.redis.Backend == old {
		t.Fatal("the reload kept the old backend: the test needs a new one")
	}

	ft.next(t)() // the old backend's grace has passed

	s.send("data: {\"choices\":[],\"usage\":{\"total_tokens\":700}}\n\n")
	s.send("data: [DONE]\n\n")
	s.end()
	o.readAll()
	o.wait()

	if got := redisDo(t, admin, "GET", key).Str; got != "700" {
		t.Errorf("Redis holds %q for the stream's key, want the 700 it reported", got)
	}

	if got := redisDo(t, admin, "ZCARD", slots).Int; got != 0 {
		t.Errorf("%d slots taken in Redis once the stream has ended, want 0", got)
	}

	if _, err := old.Pool.(*redisresp.Pool).Do("PING"); !errors.Is(err, redisresp.ErrClosed) {
		t.Errorf("the old backend's pool once its last request has ended: %v, want ErrClosed", err)
	}
}
