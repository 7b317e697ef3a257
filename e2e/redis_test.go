package e2e

import (
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// startRedis starts a redis-server for a test. Without extra arguments its
// default user, which the plugin uses when configured with no credentials,
// has exactly README's ACL line: every Redis scenario of the suite runs with
// the documented rights and no more (the tests' own inspection goes through
// an admin user).
func startRedis(t *testing.T, extra ...string) *harness.Redis {
	t.Helper()

	if len(extra) > 0 {
		return startOpenRedis(t, extra...)
	}

	acl := readmeACL(t, aclUser, "unused")[3:]
	for i, rule := range acl {
		if strings.HasPrefix(rule, ">") {
			acl[i] = "nopass"
		}
	}

	r, err := harness.StartRestrictedRedis(t.TempDir(), acl)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(r.Kill)

	return r
}

// startOpenRedis starts a redis-server whose default user may do anything
// (replication and sentinels use it).
func startOpenRedis(t *testing.T, extra ...string) *harness.Redis {
	t.Helper()

	r, err := harness.StartRedis(t.TempDir(), extra...)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(r.Kill)

	return r
}

func redisDo(t *testing.T, p *redisresp.Pool, args ...string) redisresp.Value {
	t.Helper()

	v, err := p.Do(args...)
	if err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}

	if v.IsError() {
		t.Fatalf("redis %v: %s", args, v.Str)
	}

	return v
}

// scriptCalls returns how many times EVALSHA and EVAL ran since the last CONFIG RESETSTAT.
func scriptCalls(t *testing.T, p *redisresp.Pool) int {
	t.Helper()

	info := redisDo(t, p, "INFO", "commandstats").Str
	total := 0

	for _, line := range strings.Split(info, "\r\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}

		for _, field := range strings.Split(line[strings.Index(line, ":")+1:], ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, _ := strconv.Atoi(v)
				total += n
			}
		}
	}

	return total
}

// keys lists the keys under prefix.
func keys(t *testing.T, p *redisresp.Pool, prefix string) []string {
	t.Helper()

	var out []string

	cursor := "0"
	for {
		v := redisDo(t, p, "SCAN", cursor, "MATCH", prefix+"*", "COUNT", "1000")
		cursor = v.Array[0].Str

		for _, k := range v.Array[1].Array {
			out = append(out, k.Str)
		}

		if cursor == "0" {
			sort.Strings(out)
			return out
		}
	}
}

func redisDynamic(redisAddr, middleware string) string {
	return strings.NewReplacer("{{redis}}", redisAddr, "{{middleware}}", middleware).Replace(`
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [{{middleware}}]
      service: backend
  middlewares:
    shared:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}"}
          global: {points: 0}
          ip: {points: 100, duration: 10s}
    layered:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}"}
          global: {points: 1000, duration: 5s}
          ip: {points: 5, duration: 60s}
          assets: {points: 300, duration: 3s}
          routes:
            - {name: auth_login, methods: [POST], paths: [/auth/login], points: 100, duration: 30s}
    outage:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}", timeout: 100ms, dialTimeout: 250ms}
          global: {points: 0}
          ip: {points: 20, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`)
}

// TestTwoTraefiksShareOneBudgetInRedis: 64 concurrent clients from one IP,
// spread over two Traefik processes sharing one redis-server, get exactly the
// ip layer's 100 requests in total, not 100 per process.
func TestTwoTraefiksShareOneBudgetInRedis(t *testing.T) {
	r := startRedis(t)
	a := start(t, redisDynamic(r.Addr, "shared"))
	b := start(t, redisDynamic(r.Addr, "shared"))
	a.waitRouters("api")
	b.waitRouters("api")

	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	for attempt := 1; ; attempt++ {
		client := from("198.51.100." + strconv.Itoa(attempt))

		var ok, refused, other atomic.Int64
		var wg sync.WaitGroup

		began := time.Now()

		for w := 0; w < 64; w++ {
			w := w

			wg.Add(1)

			go func() {
				defer wg.Done()

				for i := 0; i < 10; i++ {
					target := a
					if (w+i)%2 == 1 {
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
			}()
		}

		wg.Wait()

		if time.Since(began) < 9*time.Second {
			if ok.Load() != 100 || refused.Load() != 540 || other.Load() != 0 {
				t.Fatalf("640 requests over two Traefiks: %d allowed, %d refused, %d other; want exactly 100 allowed",
					ok.Load(), refused.Load(), other.Load())
			}

			return
		}

		if attempt == 3 {
			t.Fatal("3 bursts outlasted the 10s window; the machine is too slow for this test")
		}
	}
}

// TestOneScriptCallPerRequestAndKeysExpire: whatever the number of layers, a
// request costs one script call; a client known to be over its limit costs
// none; every key the plugin writes has a TTL no longer than its layer's window.
func TestOneScriptCallPerRequestAndKeysExpire(t *testing.T) {
	r := startRedis(t)
	e := start(t, redisDynamic(r.Addr, "layered"))
	e.waitRouters("api")

	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	// Load the script (EVALSHA, NOSCRIPT, EVAL) outside the measurement.
	e.get(e.traefik.Web+"/api", from("192.0.2.1"))
	redisDo(t, admin, "CONFIG", "RESETSTAT")

	client := from("198.51.100.1")

	// global + ip + auth_login: three layers, one call each request.
	for i := 1; i <= 5; i++ {
		if r := e.do(http.MethodPost, e.traefik.Web+"/auth/login", client); r.code != http.StatusOK {
			t.Fatalf("login %d: %d", i, r.code)
		}

		if n := scriptCalls(t, admin); n != i {
			t.Fatalf("after %d requests, %d script calls", i, n)
		}
	}

	checkRefusal(t, e.do(http.MethodPost, e.traefik.Web+"/auth/login", client), "ip", 5)

	if n := scriptCalls(t, admin); n != 6 {
		t.Fatalf("after the refusal, %d script calls, want 6", n)
	}

	// Known over its limit: refused locally, no call.
	for i := 0; i < 20; i++ {
		checkRefusal(t, e.get(e.traefik.Web+"/api", client), "ip", 5)
	}

	if n := scriptCalls(t, admin); n != 6 {
		t.Fatalf("a client known over its limit cost %d script calls", n-6)
	}

	e.get(e.traefik.Web+"/assets/app.js", from("198.51.100.2"))

	windows := map[string]int64{"global": 5000, "ip": 60000, "assets": 3000, "auth_login": 30000}
	prefix := "ratelimit:layered@file:"
	found := map[string]bool{}

	for _, k := range keys(t, admin, prefix) {
		layer := strings.SplitN(strings.TrimPrefix(k, prefix), ":", 2)[0]

		ttl := redisDo(t, admin, "PTTL", k).Int
		if ttl <= 0 || ttl > windows[layer] {
			t.Errorf("key %s: PTTL %d, want within (0, %d]", k, ttl, windows[layer])
		}

		found[layer] = true
	}

	for layer := range windows {
		if !found[layer] {
			t.Errorf("no key for layer %s under %s", layer, prefix)
		}
	}

	if v := redisDo(t, admin, "GET", prefix+"ip:198.51.100.1"); v.Str != "5" {
		t.Fatalf("ip counter %q, want 5 (the allowed; a refused request is charged nothing)", v.Str)
	}
}

type latencies []time.Duration

func (l latencies) pct(p float64) time.Duration {
	s := append(latencies(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })

	return s[int(float64(len(s)-1)*p)]
}

// TestRedisKilledUnderLoad: with Redis gone, every request is decided in
// memory with the same limits, from the counts Redis last reported (no 5xx,
// no client past the limit), the outage
// is logged once, and shared counting resumes after Redis comes back.
func TestRedisKilledUnderLoad(t *testing.T) {
	r := startRedis(t)
	e := start(t, redisDynamic(r.Addr, "outage"))
	e.waitRouters("api")

	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	for i := 0; i < 5; i++ {
		e.get(e.traefik.Web+"/api", from("198.51.100.1"))
	}

	if v := redisDo(t, admin, "GET", "ratelimit:outage@file:ip:198.51.100.1"); v.Str != "5" {
		t.Fatalf("counter in Redis %q, want 5", v.Str)
	}

	admin.Close()
	r.Kill()

	// Background load from many clients while Redis is down.
	stop := make(chan struct{})
	var bad atomic.Int64
	var wg sync.WaitGroup

	for w := 0; w < 8; w++ {
		w := w

		wg.Add(1)

		go func() {
			defer wg.Done()

			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}

				resp, err := e.client.Get(e.traefik.Web + "/api?bg")
				if err != nil {
					bad.Add(1)
					continue
				}

				resp.Body.Close()

				if resp.StatusCode >= 500 {
					bad.Add(1)
				}

				_ = w
			}
		}()
	}

	var lat latencies
	allowed := 0

	for i := 0; i < 40; i++ {
		began := time.Now()
		r := e.get(e.traefik.Web+"/api", from("198.51.100.1"))
		lat = append(lat, time.Since(began))

		switch r.code {
		case http.StatusOK:
			allowed++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("during the outage: %d %q", r.code, r.body)
		}
	}

	close(stop)
	wg.Wait()

	// Memory starts the key from the 5 Redis last reported (docs/redis.md).
	if allowed != 15 {
		t.Fatalf("during the outage the client got %d requests, want exactly the 15 left of its limit of 20", allowed)
	}

	if bad.Load() != 0 {
		t.Fatalf("%d background requests failed or got 5xx during the outage", bad.Load())
	}

	t.Logf("latency during the outage (40 sequential requests, 8 concurrent clients): p50 %s, p99 %s, max %s",
		lat.pct(0.5), lat.pct(0.99), lat.pct(1))

	if n := strings.Count(e.traefik.Logs(), "REDIS_UNAVAILABLE"); n != 1 {
		t.Fatalf("REDIS_UNAVAILABLE logged %d times, want once", n)
	}

	if err := r.Start(); err != nil {
		t.Fatal(err)
	}

	admin = r.Client(redisresp.Options{})
	defer admin.Close()

	// Shared counting resumes by itself within the back-off (at most 5s).
	deadline := time.Now().Add(10 * time.Second)

	for {
		e.get(e.traefik.Web+"/api", from("198.51.100.9"))

		if v := redisDo(t, admin, "GET", "ratelimit:outage@file:ip:198.51.100.9"); !v.Null {
			break
		}

		if time.Now().After(deadline) {
			t.Fatal("requests did not go back to Redis within 10s of its restart")
		}

		time.Sleep(50 * time.Millisecond) // pacing the probe requests, not waiting for a window
	}

	if n := strings.Count(e.traefik.Logs(), "REDIS_RECOVERED"); n != 1 {
		t.Fatalf("REDIS_RECOVERED logged %d times, want once", n)
	}
}

// TestRedisCredentials: requirepass and an ACL user work with the right
// credentials; with wrong ones the error is logged once and memory decides.
func TestRedisCredentials(t *testing.T) {
	r := startRedis(t, "--requirepass", "secret")

	admin := r.Client(redisresp.Options{Password: "secret"})
	defer admin.Close()

	// What fixed windows need (README's ACL line grants every algorithm's):
	// a refusal gives the script's INCRBY back with DECRBY.
	redisDo(t, admin, "ACL", "SETUSER", "limiter", "on", ">s3cret", "~ratelimit:*",
		"+evalsha", "+eval", "+get", "+set", "+incrby", "+decrby", "+pttl")

	mw := func(name, creds string) string {
		return `
    ` + name + `:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "` + r.Addr + `", ` + creds + `}
          global: {points: 0}
          ip: {points: 3, duration: 60s}`
	}

	router := func(name string) string {
		return `
    ` + name + `:
      entryPoints: [web]
      rule: PathPrefix(` + "`/" + name + "`" + `)
      middlewares: [` + name + `]
      service: backend`
	}

	names := []string{"passok", "passbad", "aclok", "aclbad"}
	creds := []string{`password: secret`, `password: bad-pass-7x`, `username: limiter, password: s3cret`, `username: limiter, password: bad-acl-9q`}

	dynamic := "http:\n  routers:"
	for _, n := range names {
		dynamic += router(n)
	}

	dynamic += "\n  middlewares:"
	for i, n := range names {
		dynamic += mw(n, creds[i])
	}

	dynamic += "\n  services:\n    backend:\n      loadBalancer:\n        servers:\n          - url: \"{{backend}}\"\n"

	e := start(t, dynamic)
	e.waitRouters(names...)

	// Spread over about a second, so that failing configurations probe Redis
	// again after their back-off (and must not log again).
	for round := 0; round < 20; round++ {
		for _, n := range names {
			r := e.get(e.traefik.Web+"/"+n, from("198.51.100.1"))

			want := http.StatusOK
			if round >= 3 {
				want = http.StatusTooManyRequests
			}

			if r.code != want {
				t.Fatalf("%s request %d: %d, want %d", n, round+1, r.code, want)
			}
		}

		time.Sleep(60 * time.Millisecond) // pacing, so back-offs expire; not an assertion
	}

	for _, n := range []string{"passok", "aclok"} {
		if v := redisDo(t, admin, "GET", "ratelimit:"+n+"@file:ip:198.51.100.1"); v.Str != "3" {
			t.Errorf("%s: counter in Redis %q, want 3 (the allowed; refusals are charged nothing)", n, v.Str)
		}
	}

	for _, n := range []string{"passbad", "aclbad"} {
		if ks := keys(t, admin, "ratelimit:"+n+"@file:"); len(ks) != 0 {
			t.Errorf("%s wrote %v with wrong credentials", n, ks)
		}
	}

	logs := e.traefik.Logs()
	if n := strings.Count(logs, "REDIS_UNAVAILABLE"); n != 2 || strings.Count(logs, "WRONGPASS") != 2 {
		t.Fatalf("want one REDIS_UNAVAILABLE with WRONGPASS per wrong configuration, got %d:\n%s", n, grepLines(logs, "REDIS_"))
	}

	for _, secret := range []string{"bad-pass-7x", "bad-acl-9q", "s3cret"} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a password (%s) reached Traefik's log", secret)
		}
	}
}

func grepLines(s, sub string) string {
	var out []string

	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}

	return strings.Join(out, "\n")
}

// TestRedisThatNeverAnswers: a server that accepts connections and never
// replies. Requests fall back to memory after redis.timeout, and the back-off
// keeps later requests from waiting: the server sees a handful of connection
// attempts, not one per request.
func TestRedisThatNeverAnswers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	var accepted atomic.Int64

	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}

			accepted.Add(1)

			go func() {
				defer c.Close()

				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()

	dynamic := strings.Replace(redisDynamic(l.Addr().String(), "outage"), "ip: {points: 20, duration: 60s}", "ip: {points: 50, duration: 60s}", 1)
	e := start(t, dynamic)
	e.waitRouters("api")

	var lat latencies
	allowed := 0
	const total = 300

	for i := 0; i < total; i++ {
		began := time.Now()
		r := e.get(e.traefik.Web+"/api", from("198.51.100.1"))
		lat = append(lat, time.Since(began))

		switch r.code {
		case http.StatusOK:
			allowed++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("request %d: %d %q", i, r.code, r.body)
		}
	}

	if allowed != 50 {
		t.Fatalf("%d allowed, want the in-memory limit 50", allowed)
	}

	if n := accepted.Load(); n > 20 {
		t.Fatalf("%d connections for %d requests: Redis is not skipped during the back-off", n, total)
	}

	logs := grepLines(e.traefik.Logs(), "REDIS_UNAVAILABLE")
	if strings.Count(logs, "REDIS_UNAVAILABLE") != 1 || !strings.Contains(logs, `"reason":"timeout"`) {
		t.Fatalf("want one REDIS_UNAVAILABLE with the reason timeout, got:\n%s", logs)
	}

	t.Logf("silent Redis: %d requests, %d connection attempts; latency p50 %s, p99 %s, max %s (redis.timeout 100ms)",
		total, accepted.Load(), lat.pct(0.5), lat.pct(0.99), lat.pct(1))
}

// TestRedisFlapDoesNotSplitACount: the plugin's Redis user is switched off
// and its connections killed (Redis keeps its data), then switched on
// again. A 20-point client that Redis had at 8 takes 4 more in memory, and
// once Redis answers again those 4 are added to its count there: across
// the flap the client gets its 20, not 8 + 4 + 12.
func TestRedisFlapDoesNotSplitACount(t *testing.T) {
	r := startRedis(t)
	e := start(t, redisDynamic(r.Addr, "outage"))
	e.waitRouters("api")

	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	key := "ratelimit:outage@file:ip:198.51.100.1"
	allowed := 0
	send := func(n int) {
		for i := 0; i < n; i++ {
			if e.get(e.traefik.Web+"/api", from("198.51.100.1")).code == http.StatusOK {
				allowed++
			}
		}
	}

	send(8)

	redisDo(t, admin, "ACL", "SETUSER", "default", "off")
	redisDo(t, admin, "CLIENT", "KILL", "USER", "default")
	send(4)

	if v := redisDo(t, admin, "GET", key).Str; allowed != 12 || v != "8" {
		t.Fatalf("%d allowed, Redis at %q; want 12 allowed, 4 of them in memory", allowed, v)
	}

	redisDo(t, admin, "ACL", "SETUSER", "default", "on")

	// A probe ends the outage (back-off at most 5s); the 4 are then added,
	// off the request.
	waitFor(t, 15*time.Second, func() bool {
		e.get(e.traefik.Web+"/api", from("198.51.100.9"))
		v := redisDo(t, admin, "GET", key)
		return v.Str == "12"
	}, func() string {
		return "Redis holds " + redisDo(t, admin, "GET", key).Str + ", want 12:\n" + grepLines(e.traefik.Logs(), "REDIS_")
	})

	send(10)

	if allowed != 20 {
		t.Errorf("%d allowed across the flap, want the limit of 20", allowed)
	}
}
