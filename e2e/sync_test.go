package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

func syncDynamic(redisAddr string) string {
	return strings.NewReplacer("{{redis}}", redisAddr).Replace(`
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [synced]
      service: backend
  middlewares:
    synced:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}", syncInterval: 100ms}
          global: {points: 0}
          ip: {points: 200, duration: 1h}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`)
}

// TestSyncedTraefiksShareABudgetWithinOneInterval: with redis.syncInterval,
// two Traefik processes decide locally and sync every 100ms; one client's 600
// requests alternated between them get the ip layer's 200 plus at most what
// the other process charged in one interval (here at most 50), at a few
// script calls per interval instead of one per request; half a second later
// both refuse the client, and Redis holds exactly what they allowed. Synced
// windows are aligned to multiples of their duration on the clock: an hour
// keeps the run from straddling a window's end (with 30s, one run in about
// thirty crossed it and saw a new window's 200 too).
func TestSyncedTraefiksShareABudgetWithinOneInterval(t *testing.T) {
	r := startRedis(t)
	a := start(t, syncDynamic(r.Addr))
	b := start(t, syncDynamic(r.Addr))
	a.waitRouters("api")
	b.waitRouters("api")

	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	redisDo(t, admin, "CONFIG", "RESETSTAT")

	client := from("198.51.100.7")

	var ok, refused, other atomic.Int64

	// One request a millisecond at most, alternated: what the other process
	// charges in one interval, the bound of the over-admission, is then at
	// most 50 whatever the machine's speed.
	pace := time.NewTicker(time.Millisecond)
	defer pace.Stop()

	for i := 0; i < 600; i++ {
		<-pace.C

		target := a
		if i%2 == 1 {
			target = b
		}

		req, _ := http.NewRequest(http.MethodGet, target.traefik.Web+"/api", nil)
		req.Header.Set("X-Forwarded-For", client["X-Forwarded-For"])

		resp, err := target.client.Do(req)
		if err != nil {
			other.Add(1)
			continue
		}

		resp.Body.Close()

		switch resp.StatusCode {
		case http.StatusOK:
			ok.Add(1)
		case http.StatusTooManyRequests:
			refused.Add(1)
		default:
			other.Add(1)
		}
	}

	if ok.Load() < 200 || ok.Load() > 300 || other.Load() != 0 {
		t.Fatalf("600 requests over two synced Traefiks: %d allowed, %d refused, %d other; want 200 to 300 allowed",
			ok.Load(), refused.Load(), other.Load())
	}

	// Five intervals: every process has sent its charges and learnt the total.
	time.Sleep(500 * time.Millisecond)

	for name, e := range map[string]*env{"a": a, "b": b} {
		if r := e.get(e.traefik.Web+"/api", client); r.code != http.StatusTooManyRequests {
			t.Fatalf("process %s half a second later: %d, want 429", name, r.code)
		}
	}

	calls := scriptCalls(t, admin)
	t.Logf("%d allowed, %d refused, %d script calls", ok.Load(), refused.Load(), calls)

	if calls > 60 {
		t.Fatalf("%d script calls for 600 requests, want at most 60", calls)
	}

	total := int64(0)
	for _, k := range keys(t, admin, "ratelimit:synced@file:ip:198.51.100.7:") {
		n, _ := strconv.ParseInt(redisDo(t, admin, "GET", k).Str, 10, 64)
		total += n

		if ttl := redisDo(t, admin, "PTTL", k).Int; ttl <= 0 || ttl > 3602000 {
			t.Errorf("key %s: PTTL %d, want the window's rest", k, ttl)
		}
	}

	if total != ok.Load() {
		t.Fatalf("Redis counts %d for the client, the processes allowed %d", total, ok.Load())
	}
}

// TestSyncedOnACluster: on a Redis Cluster, each sync sends one call per
// slot (every client's key has its own, global another), and the totals
// land on the nodes that own the keys.
func TestSyncedOnACluster(t *testing.T) {
	c, err := harness.StartCluster(t.TempDir(), 3, 0)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(c.Kill)
	grantACL(t, c.Nodes()...)

	// Synced windows are aligned on the clock: hours keep the run clear of a window's end.
	dynamic := strings.Replace(clusterDynamic(c.Primaries[0].Addr), "timeout: 1s\n", "timeout: 1s\n            syncInterval: 100ms\n", 1)
	dynamic = strings.ReplaceAll(dynamic, "duration: 60s}", "duration: 1h}")
	e := start(t, dynamic)
	e.waitRouters("api")

	const clients = 8

	for i := 0; i < clients; i++ {
		client := "198.51.100." + strconv.Itoa(i)

		for j := 0; j < clusterLimit+5; j++ {
			code, err := getCode(e, "/api", client)
			want := http.StatusOK
			if j >= clusterLimit {
				want = http.StatusTooManyRequests
			}

			if err != nil || code != want {
				t.Fatalf("client %s, request %d: %d %v, want %d", client, j+1, code, err, want)
			}
		}
	}

	// Three intervals: every charge has been sent.
	time.Sleep(300 * time.Millisecond)

	sum := func(pattern string) int64 {
		total := int64(0)

		for _, r := range c.Primaries {
			for _, k := range nodeDo(t, r, "KEYS", pattern).Array {
				n, _ := strconv.ParseInt(nodeDo(t, r, "GET", k.Str).Str, 10, 64)
				total += n
			}
		}

		return total
	}

	for i := 0; i < clients; i++ {
		client := "198.51.100." + strconv.Itoa(i)
		if n := sum("ratelimit:clustered@file:ip:{" + client + "}:*"); n != clusterLimit {
			t.Errorf("client %s: %d in the cluster, want %d", client, n, clusterLimit)
		}
	}

	if n := sum("ratelimit:clustered@file:global:{global}:*"); n != clients*clusterLimit {
		t.Errorf("global: %d in the cluster, want %d", n, clients*clusterLimit)
	}
}
