package e2e

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// TestLayerlessRequestsCostRedisNothing: the file example (the recommended
// chain, both instances on Redis) in two Traefik processes on one
// redis-server. An anonymous request has no layer on the principal instance:
// it costs that instance no script call, marks nothing down, and user
// budgets stay counted in Redis.
func TestLayerlessRequestsCostRedisNothing(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "examples/file/dynamic.yml"))
	if err != nil {
		t.Fatal(err)
	}

	r := startRedis(t)
	dynamic := strings.NewReplacer("http://whoami:80", "{{backend}}", "http://auth:9000", "{{auth}}", "redis:6379", r.Addr).Replace(string(raw))

	a := start(t, dynamic)
	b := start(t, dynamic)
	a.waitRouters("api")
	b.waitRouters("api")

	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	// Load the script in Redis outside the measurement.
	for _, e := range []*env{a, b} {
		if r := e.get(e.traefik.Web+"/", bearer("user-carol")); r.code != http.StatusOK {
			t.Fatalf("warm-up: %d", r.code)
		}
	}

	redisDo(t, admin, "CONFIG", "RESETSTAT")

	anon := from("198.51.100.77")

	for i := 0; i < 20; i++ {
		e := []*env{a, b}[i%2]

		if r := e.get(e.traefik.Web+"/", anon); r.code != http.StatusOK || r.header.Get("RateLimit-Policy") != `"ip";q=50;w=1` {
			t.Fatalf("anonymous %d: %d %v", i, r.code, r.header)
		}

		if r := e.get(e.traefik.Web+"/", bearer("user-bob")); r.code != http.StatusOK || r.header.Get("RateLimit-Policy") != `"user";q=300;w=60` {
			t.Fatalf("bob %d: %d %v", i, r.code, r.header)
		}
	}

	if v := redisDo(t, admin, "GET", "ratelimit:ratelimit-principal@file:user:bob"); v.Str != "20" {
		t.Errorf("bob's counter in Redis %q, want 20 (his requests)", v.Str)
	}

	// The edge: one call per request (40); the principal instance: bob's 20 only.
	if n := scriptCalls(t, admin); n != 60 {
		t.Errorf("%d script calls for 20 anonymous and 20 user requests, want 60 (none for the anonymous ones on the principal instance)", n)
	}

	for _, e := range []*env{a, b} {
		if logs := grepLines(e.traefik.Logs(), "REDIS_"); logs != "" {
			t.Errorf("Redis events logged:\n%s", logs)
		}
	}
}

// infoField returns a numeric field of INFO section.
func infoField(t *testing.T, p *redisresp.Pool, section, field string) int {
	t.Helper()

	for _, line := range strings.Split(redisDo(t, p, "INFO", section).Str, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO %s: %q", field, line)
			}

			return n
		}
	}

	t.Fatalf("INFO %s has no %s", section, field)

	return 0
}

// clientIDs returns the ids of the connections Redis has open, but the admin's.
func clientIDs(t *testing.T, p *redisresp.Pool) map[string]bool {
	t.Helper()

	self := strconv.FormatInt(redisDo(t, p, "CLIENT", "ID").Int, 10)
	ids := map[string]bool{}

	for _, line := range strings.Split(redisDo(t, p, "CLIENT", "LIST").Str, "\n") {
		if id, ok := strings.CutPrefix(strings.Fields(line + " x")[0], "id="); ok && id != self {
			ids[id] = true
		}
	}

	return ids
}

// load sends requests to url from many client addresses until stop is
// called; stop returns how many failed or got a 5xx.
func load(e *env, url string, workers int) (stop func() int64) {
	done := make(chan struct{})

	var bad atomic.Int64
	var wg sync.WaitGroup
	var first sync.Once

	for w := 0; w < workers; w++ {
		w := w

		wg.Add(1)

		go func() {
			defer wg.Done()

			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}

				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("X-Forwarded-For", "10.9."+strconv.Itoa(w)+"."+strconv.Itoa(i%250+1))

				resp, err := e.client.Do(req)
				if err != nil {
					bad.Add(1)
					first.Do(func() { e.t.Logf("first failed request at %s: %v", time.Now().Format(time.RFC3339Nano), err) })
					continue
				}

				body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()

				if resp.StatusCode >= 500 {
					bad.Add(1)
					first.Do(func() {
						e.t.Logf("first failed request at %s: %d %q", time.Now().Format(time.RFC3339Nano), resp.StatusCode, body)
					})
				}
			}
		}()
	}

	return func() int64 {
		close(done)
		wg.Wait()

		return bad.Load()
	}
}

// waitServed waits until path answers something other than 404: the
// configuration that added its router serves.
func (e *env) waitServed(path string) {
	e.t.Helper()

	deadline := time.Now().Add(30 * time.Second)

	for e.get(e.traefik.Web+path, nil).code == http.StatusNotFound {
		if time.Now().After(deadline) {
			e.t.Fatalf("the configuration with %s never served", path)
		}

		time.Sleep(20 * time.Millisecond) // polling a reload, not a window
	}
}

// waitFor polls cond until it holds, failing after limit with what() as the state.
func waitFor(t *testing.T, limit time.Duration, cond func() bool, what func() string) {
	t.Helper()
	pollEvery(t, limit, 100*time.Millisecond, cond, what)
}

// pollEvery is waitFor polling cond every interval.
func pollEvery(t *testing.T, limit, interval time.Duration, cond func() bool, what func() string) {
	t.Helper()

	deadline := time.Now().Add(limit)

	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still after %s: %s", limit, what())
		}

		time.Sleep(interval) // polling, not an assertion on time
	}
}

const reloadDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/api`" + `)
      middlewares: [rl]
      service: backend
    marker:
      entryPoints: [web]
      rule: Path(` + "`/marker-{{n}}`" + `)
      service: backend
  middlewares:
    rl:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}", password: "{{password}}", timeout: "{{timeout}}", poolSize: 4}
          global: {points: 0}
          ip: {points: 1000000, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

func reloadConfig(redisAddr, password string, n int) string {
	return strings.NewReplacer("{{redis}}", redisAddr, "{{password}}", password, "{{n}}", strconv.Itoa(n),
		"{{timeout}}", strconv.Itoa(500+n)+"ms").Replace(reloadDynamic)
}

// TestReloadsReleaseRedisConnections: ten reloads under load, each changing
// redis.timeout (501ms, 502ms, ...), leave at most poolSize connections open to Redis once the
// replaced configurations' pools are released; after a password rotation, the
// connections authenticated with the old password are closed.
func TestReloadsReleaseRedisConnections(t *testing.T) {
	r := startRedis(t, "--requirepass", "old-pass-1")

	admin := r.Client(redisresp.Options{Password: "old-pass-1"})
	defer admin.Close()

	e := startWith(t, reloadConfig(r.Addr, "old-pass-1", 0), harness.Options{ProvidersThrottle: "20ms"})
	e.waitServed("/marker-0")

	stop := load(e, e.traefik.Web+"/api", 6)
	stopped := false

	defer func() {
		if !stopped {
			stop()
		}
	}()

	for n := 1; n <= 10; n++ {
		if err := e.traefik.WriteDynamic(e.render(reloadConfig(r.Addr, "old-pass-1", n))); err != nil {
			t.Fatal(err)
		}

		e.waitServed("/marker-" + strconv.Itoa(n))
	}

	t.Logf("connected_clients right after 10 reloads: %d", infoField(t, admin, "clients", "connected_clients"))

	// poolSize 4, plus this test's own connection.
	waitFor(t, 40*time.Second, func() bool { return infoField(t, admin, "clients", "connected_clients") <= 5 },
		func() string {
			return "connected_clients " + strconv.Itoa(infoField(t, admin, "clients", "connected_clients")) + ", want at most 5"
		})

	// Rotate the password: the new one is added, the configuration moves to
	// it, the old one is removed. Connections authenticated with the old one
	// stay authenticated in Redis until the plugin closes them.
	old := clientIDs(t, admin)
	if len(old) == 0 {
		t.Fatal("no plugin connection open under load")
	}

	redisDo(t, admin, "ACL", "SETUSER", "default", ">new-pass-2")

	if err := e.traefik.WriteDynamic(e.render(reloadConfig(r.Addr, "new-pass-2", 11))); err != nil {
		t.Fatal(err)
	}

	e.waitServed("/marker-11")
	redisDo(t, admin, "ACL", "SETUSER", "default", "<old-pass-1")

	waitFor(t, 40*time.Second, func() bool {
		for id := range clientIDs(t, admin) {
			if old[id] {
				return false
			}
		}

		return true
	}, func() string { return "connections authenticated with the old password still open" })

	if n := stop(); n != 0 {
		t.Errorf("%d requests failed or got a 5xx across the reloads", n)
	}

	stopped = true

	// Still counting in Redis, with the new password.
	e.get(e.traefik.Web+"/api", from("198.51.100.99"))

	if v := redisDo(t, admin, "GET", "ratelimit:rl@file:ip:198.51.100.99"); v.Str != "1" {
		t.Errorf("counter in Redis after the rotation %q, want 1", v.Str)
	}

	if n := infoField(t, admin, "clients", "connected_clients"); n > 5 {
		t.Errorf("connected_clients %d after the rotation, want at most 5", n)
	}

	// Releasing a pool is no Redis failure. (A call slower than the timeout
	// on a loaded machine is one, and not this test's business.)
	logs := e.traefik.Logs()
	for _, sign := range []string{"pool closed", "WRONGPASS", "NOAUTH"} {
		if strings.Contains(logs, sign) {
			t.Errorf("%q in Traefik's log:\n%s", sign, grepLines(logs, "REDIS_"))
		}
	}

	// A panic recovered in a release callback would leave the pool open
	// (Traefik logs the interpreter's panics).
	if strings.Contains(logs, "panic") {
		t.Errorf("a panic in Traefik's log:\n%s", grepLines(logs, "panic"))
	}
}

const renameDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [rl-{{n}}]
      service: backend
    stay:
      entryPoints: [web]
      rule: PathPrefix(` + "`/stay`" + `)
      middlewares: [stay]
      service: backend
  middlewares:
    rl-{{n}}:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}"}
          global: {points: 0}
          ip: {points: 1000000, duration: 20s}
          websocket: {maxConnectionsPerIP: 5}
          status: {path: /_rl}
    stay:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 1000, duration: 3600s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

var registryLine = regexp.MustCompile(`(?m)^tierlimit_registry_entries\{registry="([a-z]+)"\} ([0-9]+)$`)

func registrySizes(e *env) (string, map[string]int) {
	body := e.get(e.traefik.Web+"/_rl/metrics", nil).body
	sizes := map[string]int{}

	for _, m := range registryLine.FindAllStringSubmatch(body, -1) {
		sizes[m[1]], _ = strconv.Atoi(m[2])
	}

	return body, sizes
}

func goroutines(t *testing.T, e *env) int {
	t.Helper()

	resp, err := e.client.Get(e.traefik.API + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()

	line, _ := bufio.NewReader(resp.Body).ReadString('\n')

	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "goroutine profile: total ")))
	if err != nil {
		t.Fatalf("pprof: %q", line)
	}

	return n
}

// TestRenamedMiddlewaresLeaveNothingBehind: 100 reloads that each rename a
// middleware (memory counters, Redis block list, connection counter, Redis
// pool). The registries end up holding what the last configuration uses
// (a renamed middleware's counters, the Redis store's memory fallback, are
// kept until its 20 s windows end, then go), Traefik's goroutines do not
// grow, and a middleware that stays keeps its counters through every reload.
func TestRenamedMiddlewaresLeaveNothingBehind(t *testing.T) {
	r := startRedis(t)
	render := func(n int) string {
		return strings.NewReplacer("{{redis}}", r.Addr, "{{n}}", strconv.Itoa(n)).Replace(renameDynamic)
	}

	e := startWith(t, render(0), harness.Options{ProvidersThrottle: "20ms", Debug: true})
	e.waitRouters("api", "stay")

	stayClient := from("198.51.100.200")
	baseline := 0

	for n := 0; n <= 100; n++ {
		if n > 0 {
			if err := e.traefik.WriteDynamic(e.render(render(n))); err != nil {
				t.Fatal(err)
			}
		}

		name := `middleware="rl-` + strconv.Itoa(n) + `@file"`
		deadline := time.Now().Add(30 * time.Second)

		for body, _ := registrySizes(e); !strings.Contains(body, name); body, _ = registrySizes(e) {
			if time.Now().After(deadline) {
				t.Fatalf("reload %d never served", n)
			}

			time.Sleep(20 * time.Millisecond) // polling a reload, not a window
		}

		e.get(e.traefik.Web+"/api", from("10.8.0."+strconv.Itoa(n%250+1)))

		// The middleware that stays counts on: 1000 - (n+1) left.
		if got := e.get(e.traefik.Web+"/stay", stayClient); got.header.Get("X-RateLimit-Remaining") != strconv.Itoa(999-n) {
			t.Fatalf("reload %d: the middleware that stays has %q left, want %d (counters lost at a reload)",
				n, got.header.Get("X-RateLimit-Remaining"), 999-n)
		}

		if n == 10 {
			e.client.CloseIdleConnections()
			baseline = goroutines(t, e)
		}
	}

	// What the last configuration uses: stores of rl-100 and stay, one block
	// list, one connection counter, one Redis pool. A renamed middleware's
	// empty block list and connection counter go at the grace, its store
	// once its windows ended.
	want := map[string]int{"stores": 2, "blocklists": 1, "connections": 1, "redis": 1}

	var last map[string]int

	waitFor(t, 40*time.Second, func() bool {
		_, last = registrySizes(e)

		for k, v := range want {
			if last[k] != v {
				return false
			}
		}

		return true
	}, func() string { return "registry sizes " + formatSizes(last) + ", want " + formatSizes(want) })

	// What passes drains (a grace's timer, a pool closing, the test's own
	// idle connections) is not growth: the count is waited for, a leak stays.
	after := 0
	waitFor(t, 30*time.Second, func() bool {
		e.client.CloseIdleConnections()
		after = goroutines(t, e)
		return after <= baseline+20
	}, func() string {
		return "goroutines grew from " + strconv.Itoa(baseline) + " after 10 reloads to " + strconv.Itoa(after) + " after 100"
	})
	t.Logf("goroutines: %d after 10 reloads, %d after 100", baseline, after)

	if strings.Contains(e.traefik.Logs(), "panic") {
		t.Errorf("a panic in Traefik's log:\n%s", grepLines(e.traefik.Logs(), "panic"))
	}
}

func formatSizes(m map[string]int) string {
	var parts []string

	for _, k := range []string{"stores", "blocklists", "connections", "redis"} {
		parts = append(parts, k+"="+strconv.Itoa(m[k]))
	}

	return strings.Join(parts, " ")
}

// TestMaxTrackedBelowTheLayersIsRefused: a cap that cannot hold one counter
// per layer is a configuration error naming maxTracked; at the minimum, the
// layers of one request never evict each other's counters.
func TestMaxTrackedBelowTheLayersIsRefused(t *testing.T) {
	e := start(t, `
http:
  routers:
    tight:
      entryPoints: [web]
      rule: PathPrefix(`+"`/tight`"+`)
      middlewares: [tight]
      service: backend
    small:
      entryPoints: [web]
      rule: PathPrefix(`+"`/small`"+`)
      middlewares: [small]
      service: backend
  middlewares:
    tight:
      plugin:
        tierlimit:
          maxTracked: 1
          global: {points: 1000, duration: 1s}
          ip: {points: 5, duration: 60s}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
    small:
      plugin:
        tierlimit:
          maxTracked: 2
          global: {points: 5, duration: 60s}
          ip: {points: 50, duration: 60s}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`)

	states, err := e.traefik.WaitRouters(30*time.Second, "tight", "small")
	if err != nil {
		t.Fatal(err)
	}

	if s := states["tight"]; s.Status == "enabled" || !strings.Contains(strings.Join(s.Error, " "), `maxTracked = "1": must be at least 2`) {
		t.Fatalf("router with maxTracked 1 below global + ip: %q %v", s.Status, s.Error)
	}

	if s := states["small"]; s.Status != "enabled" {
		t.Fatalf("router with maxTracked 2: %q %v", s.Status, s.Error)
	}

	// Ten clients: each new ip counter needs room, and the global counter the
	// request just charged is never the one evicted.
	allowed := 0

	for i := 1; i <= 10; i++ {
		if r := e.get(e.traefik.Web+"/small", from("198.51.100."+strconv.Itoa(i))); r.code == http.StatusOK {
			allowed++
		}
	}

	if allowed != 5 {
		t.Fatalf("%d of 10 requests through global 5 at maxTracked 2, want 5", allowed)
	}
}
