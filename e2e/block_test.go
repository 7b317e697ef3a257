package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// blockDynamic is an ip layer of 3 per second that blocks a client it
// refused for 4s, on the memory store or, with {{store}} set, on Redis.
func blockDynamic(store string) string {
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
          ip: {points: 3, duration: 1s, blockDuration: 4s}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`)
}

const blockClient = "203.0.113.44"

// blockHolds sends a client's 4 requests through envs in turn, the 4th
// refused; checks that 1.5 s later it is still refused, with Retry-After 2-3,
// through each env; and that 4.3 s after the block began it is allowed. The
// sleeps are the block's own time: Traefik's clock cannot be moved.
func blockHolds(t *testing.T, envs ...*env) {
	t.Helper()

	at := func(i int) *env { return envs[i%len(envs)] }

	for i := 0; i < 3; i++ {
		if r := at(i).get(at(i).traefik.Web+"/api", from(blockClient)); r.code != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, r.code)
		}
	}

	sent := time.Now()
	r := at(3).get(at(3).traefik.Web+"/api", from(blockClient))
	began := time.Now()

	if r.code != http.StatusTooManyRequests {
		t.Fatalf("the 4th request: %d", r.code)
	}

	time.Sleep(time.Until(sent.Add(1500 * time.Millisecond)))

	for i, e := range envs {
		r := e.get(e.traefik.Web+"/api", from(blockClient))
		if ra := r.header.Get("Retry-After"); r.code != http.StatusTooManyRequests || (ra != "2" && ra != "3") {
			t.Fatalf("1.5 s into the block, through %d: %d, Retry-After %q", i, r.code, ra)
		}
	}

	time.Sleep(time.Until(began.Add(4300 * time.Millisecond)))

	for i, e := range envs {
		if r := e.get(e.traefik.Web+"/api", from(blockClient)); r.code != http.StatusOK {
			t.Fatalf("4.3 s after the block began, through %d: %d %v", i, r.code, r.header)
		}
	}
}

// TestBlockDurationThroughTraefik: a client's 4th request within the second
// is refused, it stays refused after its window reset, and it is let in when
// the block ends.
func TestBlockDurationThroughTraefik(t *testing.T) {
	e := start(t, blockDynamic(""))
	e.waitRouters("api")

	blockHolds(t, e)

	if n := strings.Count(e.traefik.Logs(), `"event":"RATE_LIMIT_TRIGGERED"`); n != 1 {
		t.Fatalf("%d RATE_LIMIT_TRIGGERED lines for one block:\n%s", n, tail(e.traefik.Logs(), 10))
	}
}

// TestBlockDurationWithRedisThroughTraefik: the block set through one
// Traefik process is honoured by the other, on one redis-server, and each
// process reports it once.
func TestBlockDurationWithRedisThroughTraefik(t *testing.T) {
	rs := startRedis(t)
	store := `store: redis
          redis: {address: "` + rs.Addr + `"}`
	a := start(t, blockDynamic(store))
	b := start(t, blockDynamic(store))
	a.waitRouters("api")
	b.waitRouters("api")

	blockHolds(t, a, b)

	// One event per process that refused the key during the block: b, whose
	// refusal started it, and a, which learnt of it from Redis's reply;
	// none for the refusals each then made from its block list.
	for name, e := range map[string]*env{"a": a, "b": b} {
		if n := strings.Count(e.traefik.Logs(), `"event":"RATE_LIMIT_TRIGGERED"`); n != 1 {
			t.Errorf("%d RATE_LIMIT_TRIGGERED lines through %s for one block, want 1:\n%s", n, name, tail(e.traefik.Logs(), 10))
		}
	}
}

// TestBlockDurationOnAClusterThroughTraefik: on a three-primary Redis Cluster
// the block is a key under the client's hash tag, set through one Traefik
// process and honoured by the other (each seeded with other primaries).
func TestBlockDurationOnAClusterThroughTraefik(t *testing.T) {
	c, err := harness.StartCluster(t.TempDir(), 3, 0)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(c.Kill)
	grantACL(t, c.Nodes()...)

	store := func(seed string) string {
		return `store: redis
          redis: {cluster: {addresses: ["` + seed + `"]}, username: ` + aclUser + `, password: ` + aclPassword + `, timeout: 1s, dialTimeout: 1s}`
	}
	a := start(t, blockDynamic(store(c.Primaries[0].Addr)))
	b := start(t, blockDynamic(store(c.Primaries[2].Addr)))
	a.waitRouters("api")
	b.waitRouters("api")

	// Another client's block: its key, and both processes refuse it.
	other := "203.0.113.45"
	at := func(i int) *env { return []*env{a, b}[i%2] }
	for i := 0; i < 4; i++ {
		at(i).get(at(i).traefik.Web+"/api", from(other))
	}

	if v := clusterGet(t, c.Primaries, "ratelimit:edge@file:ip:{"+other+"}:block"); v != "1" {
		t.Fatalf("the block key in the cluster: %q, want 1", v)
	}

	for name, e := range map[string]*env{"a": a, "b": b} {
		if r := e.get(e.traefik.Web+"/api", from(other)); r.code != http.StatusTooManyRequests {
			t.Fatalf("the blocked client through %s: %d", name, r.code)
		}
	}

	blockHolds(t, a, b)

	for name, e := range map[string]*env{"a": a, "b": b} {
		if strings.Contains(e.traefik.Logs(), "REDIS_UNAVAILABLE") {
			t.Errorf("through %s, the cluster was unavailable:\n%s", name, tail(e.traefik.Logs(), 10))
		}
	}
}
