package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// syncedInflightDynamic is an instance on synced Redis (redis.syncInterval
// 100ms, the ip layer a synced fixed window) with a concurrency route:
// 2 requests in flight per client on /sse, a lease of 60s.
func syncedInflightDynamic(redisAddr string) string {
	return strings.NewReplacer("{{redis}}", redisAddr).Replace(`
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [twins]
      service: backend
  middlewares:
    twins:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}", syncInterval: 100ms}
          global: {points: 0}
          ip: {points: 1000, duration: 1h}
          routes:
            - {name: inflight, paths: [/sse], key: ip, points: 2, duration: 60s, algorithm: concurrency}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`)
}

// syncedTwins starts two Traefik processes with syncedInflightDynamic on one
// redis-server, and an admin connection to it.
func syncedTwins(t *testing.T) (a, b *env, admin *redisresp.Pool) {
	t.Helper()

	r := startRedis(t)
	admin = r.Client(redisresp.Options{})
	t.Cleanup(admin.Close)

	a = start(t, syncedInflightDynamic(r.Addr))
	b = start(t, syncedInflightDynamic(r.Addr))
	a.waitRouters("api")
	b.waitRouters("api")

	return a, b, admin
}

// heldInRedis is how many slots Redis holds for the route's client ip.
func heldInRedis(t *testing.T, admin *redisresp.Pool, ip string) int64 {
	t.Helper()
	return redisDo(t, admin, "ZCARD", "ratelimit:twins@file:inflight:"+ip).Int
}

// admitted sends a held request from ip and fails unless it is admitted,
// with the free slots after it in X-RateLimit-Remaining.
func admitted(t *testing.T, e *env, ip, id, remaining string) *slowReq {
	t.Helper()

	s := sendSlow(t, e, e.traefik.Web, ip, id)
	if s.code != http.StatusOK {
		t.Fatalf("held request %s: %d, want 200", id, s.code)
	}

	if got := s.hdr.Get("X-RateLimit-Remaining"); got != remaining || !strings.HasPrefix(s.hdr.Get("RateLimit"), `"inflight";r=`+remaining+";") {
		t.Fatalf("held request %s: X-RateLimit-Remaining %q, RateLimit %q; want %s slots free in the inflight route", id, got, s.hdr.Get("RateLimit"), remaining)
	}

	return s
}

// checkInflightRefusal checks a refusal by the inflight route as
// docs/limits.md#concurrency states it: 429, Retry-After: 1, the route's 2
// slots none free, in concurrent requests.
func checkInflightRefusal(t *testing.T, s *slowReq, what string) {
	t.Helper()

	want := map[string]string{
		"Retry-After":           "1",
		"X-RateLimit-Limit":     "2",
		"X-RateLimit-Remaining": "0",
		"RateLimit-Policy":      `"inflight";q=2;w=60;qu="concurrent-requests"`,
	}

	if s.code != http.StatusTooManyRequests {
		t.Fatalf("%s: %d, want 429", what, s.code)
	}

	for k, v := range want {
		if got := s.hdr.Get(k); got != v {
			t.Fatalf("%s: %s %q, want %q", what, k, got, v)
		}
	}

	if got := s.hdr.Get("RateLimit"); !strings.HasPrefix(got, `"inflight";r=0;t=`) {
		t.Fatalf("%s: RateLimit %q, want the inflight route with r=0", what, got)
	}
}

// TestTwoSyncedTraefiksShareAConcurrencyRoutesSlots: with
// redis.syncInterval, a concurrency route counts in Redis exactly, so two
// Traefik processes hold its 2 slots per client between them, not 2 each:
// two requests held through A, a third through B is refused; once one of
// A's ends, B admits one, whose headers count the slot A still holds.
func TestTwoSyncedTraefiksShareAConcurrencyRoutesSlots(t *testing.T) {
	a, b, admin := syncedTwins(t)

	const ip = "198.51.100.50"

	x := admitted(t, a, ip, "x", "1")
	y := admitted(t, a, ip, "y", "0")

	checkInflightRefusal(t, sendSlow(t, b, b.traefik.Web, ip, "z"), "a third request in flight, through B")
	checkInflightRefusal(t, sendSlow(t, a, a.traefik.Web, ip, "z2"), "a third request in flight, through A")

	if n := heldInRedis(t, admin, ip); n != 2 {
		t.Fatalf("Redis holds %d slots of the client's 2 requests through A, want 2", n)
	}

	// Another client is not held back by the first's slots.
	other := admitted(t, b, "198.51.100.51", "other", "1")
	endSlow(t, b, other)

	endSlow(t, a, x)

	w := admitSoon(t, b, ip, "w")
	if got := w.hdr.Get("X-RateLimit-Remaining"); got != "0" {
		t.Fatalf("B admitted a request beside the one A holds: X-RateLimit-Remaining %q, want 0", got)
	}

	checkInflightRefusal(t, sendSlow(t, b, b.traefik.Web, ip, "v"), "a third request in flight again, through B")

	endSlow(t, b, w)
	endSlow(t, a, y)

	waitRedis(t, "the client's slots to be freed in Redis once its requests ended", func() bool { return heldInRedis(t, admin, ip) == 0 })
}

// TestASlotFreedByAHangUpOnOneSyncedTraefikIsFreeOnTheOther: a client that
// hangs up on a request held through A (its response not ended, the backend
// still holding it) gives its slot back in Redis, and B admits a request in
// its place long before the backend would have answered or the lease ended.
func TestASlotFreedByAHangUpOnOneSyncedTraefikIsFreeOnTheOther(t *testing.T) {
	a, b, admin := syncedTwins(t)

	const ip = "198.51.100.52"

	x := admitted(t, a, ip, "x", "1")
	y := admitted(t, a, ip, "y", "0")
	checkInflightRefusal(t, sendSlow(t, b, b.traefik.Web, ip, "z"), "a third request in flight, through B")

	// Hang up on x mid-response.
	x.body.Close()

	began := time.Now()
	w := admitSoon(t, b, ip, "w")
	t.Logf("B admitted %v after the hang-up on A", time.Since(began).Round(time.Millisecond))

	if n := heldInRedis(t, admin, ip); n != 2 {
		t.Fatalf("Redis holds %d slots of the client (y through A, w through B), want 2", n)
	}

	checkInflightRefusal(t, sendSlow(t, a, a.traefik.Web, ip, "v"), "a third request in flight, through A")

	endSlow(t, b, w)
	endSlow(t, a, y)
}

// waitRedis polls cond until it holds, failing after 5s.
func waitRedis(t *testing.T, what string, cond func() bool) {
	t.Helper()

	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after 5s", what)
		}

		time.Sleep(20 * time.Millisecond)
	}
}
