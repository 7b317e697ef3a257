package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

const memoryGlobalDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [backstop]
      service: backend
  middlewares:
    backstop:
      plugin:
        tierlimit:
          {{store}}
          global: {points: 30, duration: 60s, store: memory}
          ip: {points: 5, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestMemoryGlobalWithRedisThroughTraefik: with store: redis and global
// {store: memory}, on one Redis server and on a Cluster, global is counted
// in the Traefik process: no global key in Redis, while the ip keys are
// there. Global still limits (its 31st request is refused), a request ip
// refuses spends no global point, and one global refuses leaves no ip key.
// On the Cluster, each request is one script call (global in Redis would
// be a second, in its own slot).
func TestMemoryGlobalWithRedisThroughTraefik(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		r := startRedis(t)
		memoryGlobal(t, "store: redis\n          redis: {address: \""+r.Addr+"\"}", []*harness.Redis{r}, func(key string) string { return key })
	})

	t.Run("cluster", func(t *testing.T) {
		c, err := harness.StartCluster(t.TempDir(), 3, 0)
		if err != nil {
			t.Fatalf("starting a Redis Cluster: %v", err)
		}
		defer c.Kill()

		memoryGlobal(t, "store: redis\n          redis: {cluster: {addresses: [\""+strings.Join(c.Seeds(), `", "`)+"\"]}}", c.Primaries, func(key string) string { return "{" + key + "}" })
	})
}

// memoryGlobal is TestMemoryGlobalWithRedisThroughTraefik on the Redis
// nodes of store, whose bucket keys key makes.
func memoryGlobal(t *testing.T, store string, nodes []*harness.Redis, key func(string) string) {
	e := start(t, strings.ReplaceAll(memoryGlobalDynamic, "{{store}}", store))
	e.waitRouters("api")

	var admins []*redisresp.Pool
	for _, r := range nodes {
		admin := r.Client(redisresp.Options{})
		defer admin.Close()

		admins = append(admins, admin)
	}

	const noisy = "198.51.100.1"

	// 5 allowed, 5 refused by ip: global at 5, not 10.
	got := e.tally(10, 1, http.MethodGet, e.traefik.Web+"/api", from(noisy))
	if want := map[string]int{"200": 5, "429 ip": 5}; !sameCounts(got, want) {
		t.Errorf("10 requests of one client: %s, want %s", formatCounts(got), formatCounts(want))
	}

	// Every node has the script now; 25 other clients take global to 30.
	for _, a := range admins {
		redisDo(t, a, "CONFIG", "RESETSTAT")
	}

	for i := 1; i <= 25; i++ {
		client := "203.0.113." + strconv.Itoa(i)
		if got := e.answer(http.MethodGet, e.traefik.Web+"/api", from(client)); got != "200" {
			t.Fatalf("client %d of 25 after the noisy one: %s, want 200 (the noisy client's refusals spent global)", i, got)
		}
	}

	calls := 0
	for _, a := range admins {
		calls += scriptCalls(t, a)
	}

	// A node that had not run the script yet takes an EVALSHA and an EVAL.
	if calls > 25+len(admins) {
		t.Errorf("%d script calls for 25 requests, want one each", calls)
	}

	if got := e.answer(http.MethodGet, e.traefik.Web+"/api", from("203.0.113.99")); got != "429 global" {
		t.Errorf("the 31st allowed request: %s, want 429 global", got)
	}

	prefix := "ratelimit:backstop@file:"
	all := map[string]string{}

	for _, r := range nodes {
		for k, v := range redisCounts(t, r, prefix) {
			all[k] = v
		}
	}

	for k := range all {
		if strings.Contains(k, ":global:") {
			t.Errorf("a global key in Redis: %s (all keys %v)", k, all)
		}
	}

	if v := all[prefix+"ip:"+key(noisy)]; v != "5" {
		t.Errorf("ip of the noisy client in Redis %q, want 5 (all keys %v)", v, all)
	}

	if v := all[prefix+"ip:"+key("203.0.113.1")]; v != "1" {
		t.Errorf("ip of 203.0.113.1 in Redis %q, want 1", v)
	}

	if v, ok := all[prefix+"ip:"+key("203.0.113.99")]; ok {
		t.Errorf("the client global refused has an ip key in Redis: %q", v)
	}
}
