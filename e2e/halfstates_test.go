package e2e

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

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
