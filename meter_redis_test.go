package tierlimit

import (
	"math/rand"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
)

// reportsAsAsked is a backend that reports the cost the request's X-Cost
// names, in X-Usage; none for "none".
var reportsAsAsked = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
	if v := req.Header.Get("X-Cost"); v != "none" {
		rw.Header().Set("X-Usage", v)
	}
	_, _ = rw.Write([]byte("ok"))
})

// meteredShape is a seeded configuration with a costFrom route of the
// algorithm, its reserve drawn, beside global.
func meteredShape(seed int64, algorithm string) func(c *Config) {
	rng := rand.New(rand.NewSource(seed))
	reserve := []int{0, 100, 300}[rng.Intn(3)]
	global := 40 + rng.Intn(20)

	return func(c *Config) {
		meteredRoute("header:X-Usage", reserve)(c)
		c.Global = LayerConfig{Points: global, Duration: "60s"}
		c.Routes[0].Algorithm = algorithm
		if algorithm == "tokenbucket" {
			// Redis refills on its own clock, which runs while the test's
			// stands still: a refill too slow to matter during a run.
			c.Routes[0].Burst, c.Routes[0].Duration = 1000, "24h"
		}
	}
}

// agreeMetered sends the seeded script of metered requests to a (memory)
// and b, with the costs each response reports drawn, and compares the
// answers.
func agreeMetered(t *testing.T, name string, seed int64, a, b *harness, afterEach func()) {
	t.Helper()

	rng := rand.New(rand.NewSource(seed))
	refusals := 0

	for i := 0; i < 120; i++ {
		hdr := map[string]string{"X-Api-Key": "k" + strconv.Itoa(rng.Intn(3)), "X-Cost": strconv.Itoa(rng.Intn(400))}
		if rng.Intn(10) == 0 {
			hdr["X-Cost"] = "none"
		}

		ra := a.do(http.MethodPost, "/v1/x", "203.0.113.1:1", hdr)
		rb := b.do(http.MethodPost, "/v1/x", "203.0.113.1:1", hdr)

		if msg := differ(ra, rb, a.p.name, b.p.name, 1); msg != "" {
			t.Errorf("%s: request %d (%v): %s", name, i, hdr, msg)
			return
		}

		if ra.Code == http.StatusTooManyRequests {
			refusals++
		}

		if afterEach != nil {
			afterEach()
		}
	}

	if refusals == 0 {
		t.Errorf("%s: no refusal: the script does not reach the limits", name)
	}
}

// TestStoresAgreeOnReservationsOnRedisServer: seeded costFrom routes
// (fixed, sliding, token bucket; reserves of 1, 100, 300; reported costs
// below and past the reserve, and none) answer alike in memory, on exact
// Redis and, for fixed windows, on synced Redis, and end with the same
// counts.
func TestStoresAgreeOnReservationsOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	for seed := int64(1); seed <= 4; seed++ {
		for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
			name := algorithm + " seed " + strconv.FormatInt(seed, 10)
			conf := meteredShape(seed, algorithm)

			a := newHarness(t, conf)
			a.backend = reportsAsAsked
			b, _ := redisHarness(t, addr, with(conf, asACLUser))
			b.backend = reportsAsAsked
			agreeMetered(t, name+", exact", seed, a, b, nil)
			agreeCounts(t, name+", exact", a, b, admin, nil)

			if algorithm != "fixed" {
				continue
			}

			a = newHarness(t, conf)
			a.backend = reportsAsAsked
			b, _ = redisHarness(t, addr, with(with(conf, asACLUser), synced))
			b.backend = reportsAsAsked
			st := syncedOf(t, b)
			now := b.clock.Now().UnixNano()
			agreeMetered(t, name+", synced", seed, a, b, func() { mustSync(t, st, now) })

			if err := redisstore.SyncNow(st, now, true); err != nil {
				t.Fatalf("%s: the last sync: %v", name, err)
			}

			agreeCounts(t, name+", synced", a, b, admin, st)
		}
	}
}

// On exact Redis: three requests of 400 tokens, the fourth refused;
// another key allowed; Redis holds the 1200 reported.
func TestCostFromOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("json:usage.total_tokens", 0), asACLUser))
	h.backend = jsonUsage(400)
	spendsAsReported(t, "exact", h)

	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	if got := redisDo(t, admin, "GET", key).Str; got != "1200" {
		t.Errorf("Redis holds %q for k1, want 1200", got)
	}
}

// Ten simultaneous requests of reserve 300 on Redis: exactly three admitted.
func TestReserveBoundsRequestsInFlightOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 300), asACLUser))
	release := make(chan struct{})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		<-release
		rw.Header().Set("X-Usage", "100")
	})

	var wg sync.WaitGroup
	codes := make(chan int, 10)

	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- h.key("k1").Code
		}()
	}

	refused := 0
	for refused < 7 {
		select {
		case code := <-codes:
			if code != http.StatusTooManyRequests {
				t.Fatalf("a request answered %d before any was released", code)
			}
		case <-time.After(10 * time.Second):
			close(release)
			t.Fatalf("%d refused, then none in 10 s: want 7 refused while 3 are in flight", refused)
		}
		refused++
	}

	close(release)
	wg.Wait()
	close(codes)

	allowed := 0
	for code := range codes {
		if code == http.StatusOK {
			allowed++
		}
	}

	if allowed != 3 {
		t.Errorf("%d admitted, want 3", allowed)
	}

	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	if got := redisDo(t, admin, "GET", key).Str; got != "300" {
		t.Errorf("Redis holds %q once settled, want 3 x 100", got)
	}

	// The refusals blocked nothing: what the settlement gave back is there
	// for the next requests (the block list holds no key of this layer).
	for i := 1; i <= 2; i++ {
		if code := h.key("k1").Code; code != http.StatusOK {
			t.Errorf("request %d after the settlement: %d, want 200", i, code)
		}
	}
}

// A cost reported while Redis is down goes to the fallback and is owed to
// Redis: once Redis answers again, it holds the charge.
func TestCostReportedDuringAnOutageIsPaidOnRecovery(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 0), asACLUser))
	backend := h.p.stores.redis.Backend
	now := h.clock.Now().UnixNano()

	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		// Redis fails while the request is in flight.
		backend.Failed(now, false, errTestOutage)
		rw.Header().Set("X-Usage", "700")
	})

	if rec := h.key("k1"); rec.Code != http.StatusOK {
		t.Fatalf("request: %d", rec.Code)
	}

	// The fallback starts from Redis's last answer, the reservation of 1.
	if n, _ := h.p.stores.redis.Local.Peek(now, "llm", request.HashKey("k1")); n != 700 {
		t.Errorf("the fallback holds %d, want 1 + the 699 beyond the reservation", n)
	}

	redisstore.PayOwed(h.p.stores.redis)

	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	if got := redisDo(t, admin, "GET", key).Str; got != "700" {
		t.Errorf("Redis holds %q after the recovery, want 700", got)
	}
}

var errTestOutage = &testError{"redis went away"}

type testError struct{ s string }

func (e *testError) Error() string { return e.s }

// On Redis, a response that ends after its admission's window (by the
// plugin's clock) gives nothing back: Redis's key would be a later window's.
func TestGiveBackEndsWithTheAdmissionsWindowOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 300), asACLUser))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		h.clock.Add(61 * time.Second)
		rw.Header().Set("X-Usage", "20")
	})

	h.key("k1")

	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	if got := redisDo(t, admin, "GET", key).Str; got != "300" {
		t.Errorf("Redis holds %q, want the reservation of 300 kept: its window ended before the response", got)
	}
}

// A charge past the reservation adds to a key that holds 0 (its requests'
// points all given back) as to any other.
func TestSpendAddsToAKeyAtZeroOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 0), asACLUser))
	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	redisDo(t, admin, "SET", key, "0", "PX", "60000")

	l := h.p.routes[0].layer
	spend(h.p.stores, &charge{Layers: []*layer{l}, Keys: []string{request.HashKey("k1")}, Now: h.clock.Now().UnixNano()}, 5)

	if got := redisDo(t, admin, "GET", key).Str; got != "5" {
		t.Errorf("Redis holds %q after a charge of 5 on 0, want 5", got)
	}
}

// A costFrom route beside a concurrency layer: the other layers' take is a
// part of the request's charge, whose Redis slot the release after the
// response finds.
func TestCostFromBesideAConcurrencyLayerOnRedisServer(t *testing.T) {
	addr, _ := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 0), func(c *Config) {
		asACLUser(c)
		c.IP = LayerConfig{Points: 1, Duration: "60s", Algorithm: "concurrency"}
	}))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("X-Usage", "10")
	})

	m := newHarness(t, func(c *Config) {
		meteredRoute("header:X-Usage", 0)(c)
		c.IP = LayerConfig{Points: 1, Duration: "60s", Algorithm: "concurrency"}
	})
	m.backend = h.backend

	for i := 1; i <= 3; i++ {
		if code := h.key("k1").Code; code != http.StatusOK {
			t.Fatalf("Redis: request %d, one after the other: %d, want 200 (the slot of the one before released)", i, code)
		}

		if code := m.key("k1").Code; code != http.StatusOK {
			t.Fatalf("memory: request %d, one after the other: %d, want 200", i, code)
		}
	}
}

// A charge past the reservation on a sliding key that holds only the window
// before (its current window not started in Redis) starts the current
// window, the old count as the previous one's, as memory rotates.
func TestSpendStartsASlidingKeysWindowOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 0), func(c *Config) {
		asACLUser(c)
		c.Routes[0].Algorithm = "sliding"
	}))
	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	redisDo(t, admin, "HSET", key, "c", "70", "p", "5")
	redisDo(t, admin, "PEXPIRE", key, "30000") // half of the current 60 s window left

	l := h.p.routes[0].layer
	spend(h.p.stores, &charge{Layers: []*layer{l}, Keys: []string{request.HashKey("k1")}, Now: h.clock.Now().UnixNano()}, 9)

	c, p := redisDo(t, admin, "HGET", key, "c").Str, redisDo(t, admin, "HGET", key, "p").Str
	ttl := redisDo(t, admin, "PTTL", key).Int
	if c != "9" || p != "70" || ttl <= 60000 || ttl > 90000 {
		t.Errorf("sliding key after a charge of 9: c %q, p %q, PTTL %d; want 9, 70 and within (60000, 90000]", c, p, ttl)
	}
}
