package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// resetDynamic is an ip layer of 2/60s with the status page at /_rl, on the
// memory store or, with {{store}} set, on Redis.
func resetDynamic(store string) string {
	return strings.NewReplacer("{{store}}", store).Replace(`
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          {{store}}
          global: {points: 0}
          ip: {points: 2, duration: 60s}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
          status: {path: /_rl}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`)
}

type resetAnswer struct {
	Error     string `json:"error"`
	Layer     string `json:"layer"`
	Key       string `json:"key"`
	Memory    bool   `json:"memory"`
	BlockList bool   `json:"blockList"`
	Redis     string `json:"redis"`
}

const resetClient = "203.0.113.7"

// postReset posts a reset of the client's ip key with hdr (nil: from the
// loopback peer itself).
func (e *env) postReset(hdr map[string]string) response {
	e.t.Helper()

	return e.do(http.MethodPost, e.traefik.Web+"/_rl/reset?layer=ip&key="+resetClient, hdr)
}

// resetAnswered decodes the plugin's answer to a reset.
func resetAnswered(t *testing.T, r response) resetAnswer {
	t.Helper()

	var a resetAnswer
	if r.header.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(r.body), &a) != nil {
		t.Fatalf("reset: %d %v %q", r.code, r.header, r.body)
	}

	return a
}

// refusedResetsPassOn checks that resets a peer outside allowedIPs sends, or
// one that wrote an allowed address itself, reach the backend as ordinary
// requests, and that e still refuses the client afterwards.
func refusedResetsPassOn(t *testing.T, e *env) {
	t.Helper()

	for _, hdr := range []map[string]string{
		from("198.51.100.9"),             // outside allowedIPs, through the trusted loopback proxy
		from("127.0.0.1, 192.168.1.9"),   // loopback written by a client in the trusted ranges
		from("127.0.0.1, 198.51.100.10"), // ...or by an outside one
	} {
		if r := e.postReset(hdr); !strings.HasPrefix(r.body, "ok POST /_rl/reset\n") || r.header.Get("X-RateLimit-Limit") != "2" {
			t.Fatalf("reset from %v: not passed on: %d %v %q", hdr, r.code, r.header, r.body)
		}
	}

	if r := e.get(e.traefik.Web+"/api", from(resetClient)); r.code != http.StatusTooManyRequests {
		t.Fatalf("the client is let in after resets from outside: %d", r.code)
	}
}

// waitResetEvent waits for e's RATE_LIMIT_RESET line of the client's key,
// from the loopback operator, with what it cleared.
func waitResetEvent(t *testing.T, e *env, cleared string) {
	t.Helper()

	line := `"event":"RATE_LIMIT_RESET","severity":"info","limiter":"ip","key":"` + resetClient +
		`","operator":"127.0.0.1","middleware":"edge@file",` + cleared

	waitFor(t, 10*time.Second, func() bool { return strings.Contains(e.traefik.Logs(), line) },
		func() string { return "no " + line + " in\n" + tail(e.traefik.Logs(), 10) })

	if n := strings.Count(e.traefik.Logs(), "RATE_LIMIT_RESET"); n != 1 {
		t.Fatalf("%d RATE_LIMIT_RESET lines, want the one reset's:\n%s", n, tail(e.traefik.Logs(), 10))
	}
}

// TestResetThroughTraefik: a client the ip layer refuses is let in again
// right after a reset from 127.0.0.1, for the layer's points, and resets from
// anywhere else change nothing.
func TestResetThroughTraefik(t *testing.T) {
	e := start(t, resetDynamic(""))
	e.waitRouters("api")

	for i := 1; i <= 3; i++ {
		if r := e.get(e.traefik.Web+"/api", from(resetClient)); (i <= 2) != (r.code == http.StatusOK) {
			t.Fatalf("request %d: %d", i, r.code)
		}
	}

	refusedResetsPassOn(t, e)

	if r := e.get(e.traefik.Web+"/_rl/reset?layer=ip&key="+resetClient, nil); r.code != http.StatusMethodNotAllowed || r.header.Get("Allow") != "POST" {
		t.Fatalf("GET: %d %v", r.code, r.header)
	}

	if r := e.do(http.MethodPost, e.traefik.Web+"/_rl/reset?layer=ip", nil); r.code != http.StatusBadRequest || !strings.Contains(r.body, `"parameter":"key"`) {
		t.Fatalf("no key: %d %q", r.code, r.body)
	}

	r := e.postReset(nil)
	if a := resetAnswered(t, r); r.code != http.StatusOK || a.Layer != "ip" || a.Key != resetClient || !a.Memory || a.Redis != "" {
		t.Fatalf("reset: %d %q", r.code, r.body)
	}

	for i := 1; i <= 3; i++ {
		if r := e.get(e.traefik.Web+"/api", from(resetClient)); (i <= 2) != (r.code == http.StatusOK) {
			t.Fatalf("request %d after the reset: %d", i, r.code)
		}
	}

	waitResetEvent(t, e, `"memory":true,"blockList":false}`)

	if r := e.do(http.MethodPost, e.traefik.Web+"/_rl/reset?layer=ip&key=198.51.100.200", nil); r.code != http.StatusNotFound || resetAnswered(t, r).Error != "nothing to reset" {
		t.Fatalf("a key never seen: %d %q", r.code, r.body)
	}
}

// TestResetWithRedisThroughTraefik: two Traefik processes share a
// redis-server; a client refused through both, so that each refuses it from
// its own block list, is let in through either right after a reset through
// the first (the reset reaches the second's block list through Redis), and
// resets from outside change nothing in Redis.
func TestResetWithRedisThroughTraefik(t *testing.T) {
	rs := startRedis(t)
	store := `store: redis
          redis: {address: "` + rs.Addr + `"}`
	a := start(t, resetDynamic(store))
	b := start(t, resetDynamic(store))
	a.waitRouters("api")
	b.waitRouters("api")

	admin := rs.Client(redisresp.Options{})
	defer admin.Close()

	// One request through each, the third refused by Redis through a, the
	// fourth through b: each now blocks the client locally.
	for i, e := range []*env{a, b, a, b} {
		if r := e.get(e.traefik.Web+"/api", from(resetClient)); (i < 2) != (r.code == http.StatusOK) {
			t.Fatalf("request %d: %d", i+1, r.code)
		}
	}

	// b follows the resets once it blocks a key: wait until both do, so
	// that the reset below finds b listening (the subscription is up in
	// milliseconds; while it is down, a reset misses b: README).
	listening := func() bool { return redisDo(t, admin, "PUBSUB", "NUMSUB", "ratelimit:resets").Array[1].Int == 2 }
	waitFor(t, 10*time.Second, listening, func() string {
		return "not both Traefik processes follow ratelimit:resets:\n" + tail(b.traefik.Logs(), 10)
	})

	key := "ratelimit:edge@file:ip:" + resetClient
	if v := redisDo(t, admin, "GET", key); v.Str != "2" {
		t.Fatalf("%s is %+v, want 2", key, v)
	}

	refusedResetsPassOn(t, a)

	if v := redisDo(t, admin, "GET", key); v.Str != "2" {
		t.Fatalf("after resets from outside, %s is %+v, want 2", key, v)
	}

	r := a.postReset(nil)
	if ans := resetAnswered(t, r); r.code != http.StatusOK || !ans.BlockList || ans.Redis != "cleared" {
		t.Fatalf("reset: %d %q", r.code, r.body)
	}

	if n := redisDo(t, admin, "EXISTS", key).Int; n != 0 {
		t.Fatalf("%s still exists after the reset", key)
	}

	// b lets the client in again as soon as the reset's message reached it,
	// milliseconds after a answered: the requests b refuses meanwhile spend
	// nothing. Without the message, b would refuse for the rest of the
	// minute. Then the budget is shared afresh: one through b, one through
	// a, and the third refused.
	refusals := 0

	waitFor(t, 5*time.Second, func() bool {
		if r := b.get(b.traefik.Web+"/api", from(resetClient)); r.code == http.StatusOK {
			return true
		}

		refusals++

		return false
	}, func() string { return "b still refuses the client after the reset:\n" + tail(b.traefik.Logs(), 10) })

	t.Logf("b refused %d requests after the reset before its message arrived", refusals)

	for i, e := range []*env{a, b} {
		if r := e.get(e.traefik.Web+"/api", from(resetClient)); (i < 1) != (r.code == http.StatusOK) {
			t.Fatalf("request %d after the reset: %d", i+2, r.code)
		}
	}

	// Memory too: the fallback remembers what Redis reported (docs/redis.md).
	waitResetEvent(t, a, `"memory":true,"blockList":true,"redis":"cleared"}`)
}

// TestResetOnARedisClusterThroughTraefik: on a Redis Cluster the reset
// deletes the key in its hash-tagged form, on the node that holds its slot.
func TestResetOnARedisClusterThroughTraefik(t *testing.T) {
	c, err := harness.StartCluster(t.TempDir(), 3, 0)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(c.Kill)
	grantACL(t, c.Nodes()...)

	e := start(t, resetDynamic(`store: redis
          redis:
            cluster: {addresses: ["`+c.Primaries[0].Addr+`"]}
            username: `+aclUser+`
            password: `+aclPassword))
	e.waitRouters("api")

	for i := 1; i <= 3; i++ {
		if r := e.get(e.traefik.Web+"/api", from(resetClient)); (i <= 2) != (r.code == http.StatusOK) {
			t.Fatalf("request %d: %d", i, r.code)
		}
	}

	key := "ratelimit:edge@file:ip:{" + resetClient + "}"
	if v := clusterGet(t, c.Nodes(), key); v != "2" {
		t.Fatalf("%s is %q, want 2", key, v)
	}

	r := e.postReset(nil)
	if ans := resetAnswered(t, r); r.code != http.StatusOK || !ans.BlockList || ans.Redis != "cleared" {
		t.Fatalf("reset: %d %q", r.code, r.body)
	}

	if v := clusterGet(t, c.Nodes(), key); v != "" {
		t.Fatalf("%s is still %q after the reset", key, v)
	}

	if r := e.get(e.traefik.Web+"/api", from(resetClient)); r.code != http.StatusOK {
		t.Fatalf("refused after the reset: %d", r.code)
	}
}
