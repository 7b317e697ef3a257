package tierlimit

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
)

// blockedIP is an ip layer of 3 per second that blocks a refused client for 4s.
func blockedIP(algorithm string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points, c.Assets.Points = 0, 0
		c.IP = LayerConfig{Points: 3, Duration: "1s", Algorithm: algorithm, BlockDuration: "4s"}
		if algorithm == "tokenbucket" {
			c.IP = LayerConfig{Points: 3, Duration: "1s", Algorithm: algorithm, Burst: 3, BlockDuration: "4s"}
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
	cfg.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 1, Duration: "1s", BlockDuration: "15m"}}

	s, err := parse(cfg)
	if err != nil || s.Routes[0].Block != 15*time.Minute {
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

		if code, doc := a.reset("?layer=ip&key="+client, ""); code != http.StatusOK || doc.Redis == nil || *doc.Redis != redisCleared {
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
	redisStoreOf(h.p).Backend = &redisBackend{Pool: pool, Single: pool, Address: dead, Log: io.Discard}

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
