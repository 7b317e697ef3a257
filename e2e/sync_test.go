package e2e

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
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
          ip: {points: 200, duration: 30s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`)
}

// TestSyncedTraefiksNeverOverAdmit: with redis.syncInterval, replicas admit
// only from points Redis leased them, so one client's 600 requests sent
// concurrently to two Traefik processes get at most the ip layer's 200 (and
// at least 180: leases shrink near the points instead of stranding them), at
// a few script calls per interval instead of one per request; half a second
// later both refuse the client, and Redis holds what was leased.
func TestSyncedTraefiksNeverOverAdmit(t *testing.T) {
	leasedBurst(t, 2)
}

// TestSyncedTraefiksNeverOverAdmitWithThreeProcesses: the same over three
// processes, where more replicas hold leases of the same key at once.
func TestSyncedTraefiksNeverOverAdmitWithThreeProcesses(t *testing.T) {
	leasedBurst(t, 3)
}

const (
	leasedPoints   = 200
	leasedRequests = 600
	leasedWindow   = 30 * time.Second
)

// leasedBurst runs one client's 600 requests over n synced Traefik processes
// sharing a redis-server, as fast as they answer, and checks the bounds above.
func leasedBurst(t *testing.T, n int) {
	r := startRedis(t)

	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	// A 30s window is aligned to the clock, so a run can straddle its end
	// and see the next window's 200 too. Rather than sleep until a window
	// starts, a run that saw two windows is done again on fresh processes
	// with another client; the next one starts just after a window's start.
	// The clock, the client's keys in Redis and the allowed responses'
	// X-RateLimit-Reset are each enough to tell: the keys alone can miss an
	// ended window whose charges never reached Redis.
	for attempt := 1; ; attempt++ {
		ip := "198.51.100." + strconv.Itoa(10*n+attempt)
		prefix := "ratelimit:synced@file:ip:" + ip + ":"

		envs := make([]*env, n)
		for i := range envs {
			envs[i] = start(t, syncDynamic(r.Addr))
		}

		for _, e := range envs {
			e.waitRouters("api")
		}

		redisDo(t, admin, "CONFIG", "RESETSTAT")

		began := time.Now()
		got := leasedSend(envs, ip, leasedRequests)
		took := time.Since(began)

		// Five intervals: every process knows the key is at its points.
		time.Sleep(500 * time.Millisecond)

		later := make([]int, n)
		for i, e := range envs {
			later[i] = e.get(e.traefik.Web+"/api", from(ip)).code
		}

		ended := time.Now()
		calls := scriptCalls(t, admin)
		ks := keys(t, admin, prefix)

		if began.Truncate(leasedWindow) != ended.Truncate(leasedWindow) || len(ks) > 1 || len(got.resets) > 1 {
			for _, e := range envs {
				e.traefik.Stop()
			}

			if attempt == 3 {
				t.Fatalf("3 runs straddled a window's end (last: keys %v, allowed per X-RateLimit-Reset %v)", ks, got.resets)
			}

			t.Logf("run %d straddled a window's end (keys %v, allowed per X-RateLimit-Reset %v): again with fresh processes and another client",
				attempt, ks, got.resets)

			continue
		}

		t.Logf("%d processes: %d allowed, %d refused, %d other in %s, %d script calls, allowed per X-RateLimit-Reset %v",
			n, got.ok, got.refused, got.other, took.Round(time.Millisecond), calls, got.resets)

		if got.ok < leasedPoints*9/10 || got.ok > leasedPoints || got.other != 0 {
			t.Errorf("%d requests from one client over %d synced Traefiks: %d allowed, %d refused, %d other (first: %q), %d script calls; want %d to %d allowed and none other",
				leasedRequests, n, got.ok, got.refused, got.other, got.firstOther, calls, leasedPoints*9/10, leasedPoints)
		}

		if calls > 60 {
			t.Errorf("%d script calls for %d requests over %d processes, want at most 60", calls, leasedRequests, n)
		}

		for i, code := range later {
			if code != http.StatusTooManyRequests {
				t.Errorf("process %d of %d half a second later: %d, want 429", i+1, n, code)
			}
		}

		key := prefix + strconv.FormatInt(began.Truncate(leasedWindow).UnixMilli(), 10)
		if len(ks) != 1 || ks[0] != key {
			t.Fatalf("keys of the client in Redis: %v, want [%s]", ks, key)
		}

		// What was leased: at least what the processes allowed, never more than the points.
		if v, _ := strconv.ParseInt(redisDo(t, admin, "GET", key).Str, 10, 64); v < got.ok || v > leasedPoints {
			t.Errorf("key %s holds %d, want at least the %d allowed and at most the %d points", key, v, got.ok, leasedPoints)
		}

		// A window's key lives KeyGrace past its end (docs/redis.md#clocks).
		most := (leasedWindow + redisstore.KeyGrace).Milliseconds()
		if ttl := redisDo(t, admin, "PTTL", key).Int; ttl <= 0 || ttl > most {
			t.Errorf("key %s: PTTL %d, want within (0, %d]: the window's rest and KeyGrace", key, ttl, most)
		}

		return
	}
}

// leasedCounts is what a burst's responses were; resets counts the allowed
// ones per X-RateLimit-Reset, one value per window.
type leasedCounts struct {
	ok, refused, other int64
	firstOther         string // what the first other answer was
	resets             map[string]int
}

// leasedSend sends total requests from ip over envs, four workers per process
// sending back to back, and counts the answers.
func leasedSend(envs []*env, ip string, total int) leasedCounts {
	transport := &http.Transport{MaxIdleConnsPerHost: 4}
	defer transport.CloseIdleConnections()

	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	var sent, ok, refused, other atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup

	resets := map[string]int{}
	firstOther := ""
	noteOther := func(what string) {
		other.Add(1)
		mu.Lock()
		if firstOther == "" {
			firstOther = what
		}
		mu.Unlock()
	}

	for _, e := range envs {
		for w := 0; w < 4; w++ {
			wg.Add(1)

			go func(url string) {
				defer wg.Done()

				for sent.Add(1) <= int64(total) {
					req, _ := http.NewRequest(http.MethodGet, url, nil)
					req.Header.Set("X-Forwarded-For", ip)

					resp, err := client.Do(req)
					if err != nil {
						noteOther(err.Error())
						continue
					}

					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()

					switch resp.StatusCode {
					case http.StatusOK:
						ok.Add(1)
						mu.Lock()
						resets[resp.Header.Get("X-RateLimit-Reset")]++
						mu.Unlock()
					case http.StatusTooManyRequests:
						refused.Add(1)
					default:
						noteOther(resp.Status)
					}
				}
			}(e.traefik.Web + "/api")
		}
	}

	wg.Wait()

	return leasedCounts{ok: ok.Load(), refused: refused.Load(), other: other.Load(), firstOther: firstOther, resets: resets}
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

	// Redis holds what was leased: at least what was allowed, at most the
	// points. A client allowed all of its points is then at exactly them.
	const globalPoints = 100000000 // clusterDynamic's

	for i := 0; i < clients; i++ {
		client := "198.51.100." + strconv.Itoa(i)
		if n := sum("ratelimit:clustered@file:ip:{" + client + "}:*"); n != clusterLimit {
			t.Errorf("client %s: %d in the cluster, want %d", client, n, clusterLimit)
		}
	}

	if n := sum("ratelimit:clustered@file:global:{global}:*"); n < clients*clusterLimit || n > globalPoints {
		t.Errorf("global: %d in the cluster, want between the %d allowed and %d", n, clients*clusterLimit, globalPoints)
	}
}
