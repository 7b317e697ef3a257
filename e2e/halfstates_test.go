package e2e

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// halfStateDynamic is a million-point window per IP on redisAddr, as README's
// ACL user, with the status page.
func halfStateDynamic(redisAddr string) string {
	return strings.ReplaceAll(`
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(`+"`/`"+`)
      middlewares: [recovery]
      service: backend
  middlewares:
    recovery:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}", username: `+aclUser+`, password: `+aclPassword+`, timeout: 300ms, dialTimeout: 250ms}
          global: {points: 0}
          ip: {points: 1000000, duration: 1h}
          status: {path: /_ratelimit}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`, "{{redis}}", redisAddr)
}

// replicationField is field's value in the server's INFO replication.
func replicationField(t *testing.T, admin *redisresp.Pool, field string) string {
	t.Helper()

	for _, line := range strings.Split(redisDo(t, admin, "INFO", "replication").Str, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}

	return ""
}

// TestAReadOnlyRedisThroughTraefik: the read-only Redis (a primary
// demoted to a replica of another server, REPLICAOF, which answers PING and
// reads but refuses every write with READONLY) under steady traffic through
// the real Traefik: every request is decided (200), one REDIS_UNAVAILABLE
// with the reason readonly and no REDIS_RECOVERED while it lasts (the
// probes write, as requests do), the metric and the status page steady;
// once it is a primary again, one REDIS_RECOVERED, and Redis counts the
// outage's requests and the ones after.
func TestAReadOnlyRedisThroughTraefik(t *testing.T) {
	r := startOpenRedis(t)
	other := startOpenRedis(t, "--repl-diskless-sync-delay", "0")
	grantACL(t, r)

	e := start(t, halfStateDynamic(r.Addr))
	e.waitRouters("api")

	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	client := "198.51.100.30"
	key := "ratelimit:recovery@file:ip:" + client
	sent := 0
	send := func() {
		t.Helper()

		if res := e.get(e.traefik.Web+"/api", from(client)); res.code != http.StatusOK {
			t.Fatalf("request %d answered %d %s, want 200", sent+1, res.code, res.body)
		}

		sent++
	}

	for i := 0; i < 20; i++ {
		send()
	}

	if got := redisDo(t, admin, "GET", key).Str; got != "20" {
		t.Fatalf("Redis holds %q before the demotion, want 20", got)
	}

	host, port, _ := strings.Cut(other.Addr, ":")
	redisDo(t, admin, "REPLICAOF", host, port)
	waitFor(t, 10*time.Second, func() bool { return replicationField(t, admin, "master_link_status") == "up" }, func() string {
		return "the demoted server did not sync with the other"
	})

	// Steady traffic for 3 s, through several back-offs and their probes.
	before := sent
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		send()
	}

	during := sent - before
	logs := grepLines(e.traefik.Logs(), `"REDIS_`)

	if strings.Count(logs, "REDIS_UNAVAILABLE") != 1 || strings.Count(logs, "REDIS_RECOVERED") != 0 || !strings.Contains(logs, `"reason":"readonly"`) {
		t.Fatalf("%d requests while Redis is read-only: want one REDIS_UNAVAILABLE with reason readonly and no REDIS_RECOVERED:\n%s", during, logs)
	}

	if m := fallbackMetric(e); m != "1" {
		t.Fatalf("tierlimit_redis_fallback %s while Redis is read-only, want 1", m)
	}

	var status struct {
		Reason string `json:"redisFallbackReason"`
	}

	if err := json.Unmarshal([]byte(e.get(e.traefik.Web+"/_ratelimit", nil).body), &status); err != nil || status.Reason != "readonly" {
		t.Fatalf("status page redisFallbackReason %q (%v), want readonly", status.Reason, err)
	}

	redisDo(t, admin, "REPLICAOF", "NO", "ONE")
	waitFor(t, 15*time.Second, func() bool { return fallbackMetric(e) == "0" }, func() string {
		return "tierlimit_redis_fallback " + fallbackMetric(e) + " after Redis took writes again:\n" + grepLines(e.traefik.Logs(), `"REDIS_`)
	})

	if logs := grepLines(e.traefik.Logs(), `"REDIS_`); strings.Count(logs, "REDIS_UNAVAILABLE") != 1 || strings.Count(logs, "REDIS_RECOVERED") != 1 {
		t.Fatalf("want one REDIS_UNAVAILABLE, then one REDIS_RECOVERED:\n%s", logs)
	}

	for i := 0; i < 10; i++ {
		send()
	}

	// The sync replaced the 20 with the other server's data (none); the
	// outage's requests are paid into Redis, the 10 after counted there.
	want := strconv.Itoa(during + 10)
	waitFor(t, 10*time.Second, func() bool { return redisDo(t, admin, "GET", key).Str == want }, func() string {
		return "Redis holds " + redisDo(t, admin, "GET", key).Str + ", want " + want + " (the outage's " + strconv.Itoa(during) + " and 10 after)"
	})
}

// namedBy is the primary sentinel s names, or "".
func namedBy(s *harness.Redis) string {
	p := s.Client(redisresp.Options{Timeout: 2 * time.Second})
	defer p.Close()

	v, err := p.Do("SENTINEL", "get-master-addr-by-name", "mymaster")
	if err != nil || len(v.Array) != 2 {
		return ""
	}

	return v.Array[0].Str + ":" + v.Array[1].Str
}

// TestADemotedPrimaryMovesRequestsAtOnceThroughSentinel: a failover that
// the plugin's sentinel did not announce (it is frozen: the announcement is
// lost, as on a partition), then the old primary demoted (REPLICAOF the new
// one): under load from Traefik, the first READONLY asks the sentinels at
// once and the call runs on the new primary. No request fails (no 5xx), no
// outage is logged (the call that met READONLY was answered by the new
// primary, not by memory), and a client is counted in the new primary.
func TestADemotedPrimaryMovesRequestsAtOnceThroughSentinel(t *testing.T) {
	g := startSentinelGroup(t)
	e := start(t, sentinelDynamic(g.addresses()))
	e.waitRouters("api", "load")
	g.waitReady()

	old := g.primary()
	if old == "" {
		t.Fatal("the sentinels name no primary")
	}

	// The plugin finds the primary through the first sentinel, which it
	// then watches for announcements.
	watched := g.sentinels[0]
	burst(t, []*env{e}, "/api", "198.51.100.40", 2)
	waitFor(t, 10*time.Second, func() bool {
		p := watched.Client(redisresp.Options{})
		defer p.Close()

		v, err := p.Do("CLIENT", "LIST")
		return err == nil && strings.Contains(v.Str, "cmd=subscribe")
	}, func() string { return "the plugin did not subscribe to the first sentinel" })

	// Load on every Redis call, through the switch.
	stop := make(chan struct{})
	var failed, served atomic.Int64
	var wg sync.WaitGroup

	for w := 0; w < 4; w++ {
		base := "10.9." + strconv.Itoa(w) + "."

		wg.Add(1)

		go func() {
			defer wg.Done()

			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}

				if code, err := getCode(e, "/load", base+strconv.Itoa(i%200)); err != nil || code != http.StatusOK {
					failed.Add(1)
				}

				served.Add(1)
			}
		}()
	}

	halted := false
	halt := func() {
		if !halted {
			halted = true
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(halt)

	if err := watched.Pause(); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = watched.Resume() })

	p := g.sentinels[1].Client(redisresp.Options{Timeout: 5 * time.Second})
	defer p.Close()

	if v, err := p.Do("SENTINEL", "FAILOVER", "mymaster"); err != nil || v.IsError() {
		t.Fatalf("SENTINEL FAILOVER: %+v %v", v, err)
	}

	var promoted string
	waitFor(t, 40*time.Second, func() bool {
		promoted = namedBy(g.sentinels[1])
		return promoted != "" && promoted != old && namedBy(g.sentinels[2]) == promoted
	}, func() string { return "the sentinels did not name a new primary" })

	// The old primary is demoted, as the sentinels would in seconds.
	admin := g.servers[old].Client(redisresp.Options{})
	defer admin.Close()

	host, port, _ := strings.Cut(promoted, ":")
	redisDo(t, admin, "REPLICAOF", host, port)

	// A client of the limited middleware is counted in the new primary.
	client := "198.51.100.41"
	if got := burst(t, []*env{e}, "/api", client, 2); sum(got) != 2 {
		t.Fatalf("allowed %v of 2", got)
	}

	if got := counter(t, g.servers[promoted], client); got != "2" {
		t.Fatalf("the new primary %s holds %s for the client, want 2: the requests after the demotion did not move there", promoted, got)
	}

	before := served.Load()
	waitFor(t, 10*time.Second, func() bool { return served.Load() >= before+200 }, func() string { return "the load stalled" })
	halt()

	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests under load failed or were not 200", failed.Load(), served.Load())
	}

	logs := grepLines(e.traefik.Logs(), `"REDIS_`)
	if strings.Contains(logs, "REDIS_UNAVAILABLE") || !strings.Contains(logs, "REDIS_PRIMARY_CHANGED") {
		t.Fatalf("want the switch logged and no outage: the READONLY reply moves the call to the new primary:\n%s", logs)
	}
}
