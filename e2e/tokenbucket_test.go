package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
)

// TestTokenBucketOnRedisServer runs the token-bucket script on a real
// redis-server (Lua 5.1, TIME in a script): a burst, the refusal's headers,
// the key's shape and TTL, and keys left by another algorithm.
func TestTokenBucketOnRedisServer(t *testing.T) {
	r := startRedis(t)
	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	cfg := tierlimit.CreateConfig()
	cfg.Store = "redis"
	cfg.Redis.Address = r.Addr
	cfg.Redis.Timeout = "2s"
	cfg.Global.Points = 0
	// One token every 10s, a bucket of 3.
	cfg.IP = config.LayerConfig{Points: 6, Duration: "60s", Algorithm: "tokenbucket", Burst: 3}

	h, err := tierlimit.New(context.Background(), http.NotFoundHandler(), cfg, "bucket@test")
	if err != nil {
		t.Fatal(err)
	}

	send := func(client string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.RemoteAddr = client + ":1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		return rec
	}

	for i := 1; i <= 3; i++ {
		rec := send("203.0.113.1")
		if rec.Code != http.StatusNotFound || rec.Header().Get("X-Ratelimit-Remaining") != strconv.Itoa(3-i) || rec.Header().Get("X-Ratelimit-Limit") != "3" {
			t.Fatalf("request %d: %d, remaining %q, limit %q", i, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"), rec.Header().Get("X-Ratelimit-Limit"))
		}
	}

	rec := send("203.0.113.1")
	if ra, _ := strconv.Atoi(rec.Header().Get("Retry-After")); rec.Code != http.StatusTooManyRequests || ra < 1 || ra > 10 {
		t.Fatalf("4th request: %d, Retry-After %q (the first token is back 10s after the first request)", rec.Code, rec.Header().Get("Retry-After"))
	}

	key := "ratelimit:bucket@test:ip:203.0.113.1"

	// A TAT in microseconds has 16 digits, and must be stored whole (Lua's
	// tostring would keep 14).
	v := redisDo(t, admin, "HGET", key, "r")
	if !regexp.MustCompile(`^[0-9]{16}$`).MatchString(v.Str) {
		t.Fatalf("r = %q, want microseconds in full", v.Str)
	}

	// The key lives until the bucket is full again: 30s after the burst (a
	// wrong unit or a window's TTL would be far off).
	if ttl := redisDo(t, admin, "PTTL", key).Int; ttl < 15000 || ttl > 30000 {
		t.Fatalf("PTTL %d, want about 30s", ttl)
	}

	// Keys of the other algorithms, left by a reload, start afresh.
	redisDo(t, admin, "SET", "ratelimit:bucket@test:ip:203.0.113.2", "99", "PX", "60000")
	redisDo(t, admin, "HSET", "ratelimit:bucket@test:ip:203.0.113.3", "c", "99", "p", "99")
	redisDo(t, admin, "PEXPIRE", "ratelimit:bucket@test:ip:203.0.113.3", "60000")

	for _, client := range []string{"203.0.113.2", "203.0.113.3"} {
		if rec := send(client); rec.Code != http.StatusNotFound || rec.Header().Get("X-Ratelimit-Remaining") != "2" {
			t.Fatalf("%s over another algorithm's key: %d, remaining %q", client, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"))
		}
	}

	if typ := redisDo(t, admin, "TYPE", "ratelimit:bucket@test:ip:203.0.113.2").Str; typ != "hash" {
		t.Fatalf("a fixed window's key became a %s", typ)
	}
}

// rateLimitDynamic puts Traefik's built-in rateLimit and tierlimit configured
// from the migration table (docs/migrating.md) side by side, one pair of routers per
// source criterion: a request header, the request host, and the client IP
// taken at depth 1 of X-Forwarded-For, the TCP peer (no sourceCriterion),
// and a request header with both on Redis. 6 per hour with a burst of 3: a
// token every 10 minutes, so no token comes back while the test runs, and the
// built-in, which would delay a request by up to 500ms at this rate rather
// than refuse it, has nothing to delay.
const rateLimitDynamic = `
http:
  routers:
    builtin-header: {entryPoints: [web], rule: "PathPrefix(` + "`/builtin/header`" + `)", middlewares: [builtin-header], service: backend}
    tier-header:    {entryPoints: [web], rule: "PathPrefix(` + "`/tier/header`" + `)", middlewares: [tier-header], service: backend}
    builtin-host:   {entryPoints: [web], rule: "PathPrefix(` + "`/builtin/host`" + `)", middlewares: [builtin-host], service: backend}
    tier-host:      {entryPoints: [web], rule: "PathPrefix(` + "`/tier/host`" + `)", middlewares: [tier-host], service: backend}
    builtin-ip:     {entryPoints: [web], rule: "PathPrefix(` + "`/builtin/ip`" + `)", middlewares: [builtin-ip], service: backend}
    tier-ip:        {entryPoints: [web], rule: "PathPrefix(` + "`/tier/ip`" + `)", middlewares: [tier-ip], service: backend}
    builtin-peer:   {entryPoints: [web], rule: "PathPrefix(` + "`/builtin/peer`" + `)", middlewares: [builtin-peer], service: backend}
    tier-peer:      {entryPoints: [web], rule: "PathPrefix(` + "`/tier/peer`" + `)", middlewares: [tier-peer], service: backend}
    builtin-redis:  {entryPoints: [web], rule: "PathPrefix(` + "`/builtin/redis`" + `)", middlewares: [builtin-redis], service: backend}
    tier-redis:     {entryPoints: [web], rule: "PathPrefix(` + "`/tier/redis`" + `)", middlewares: [tier-redis], service: backend}
  middlewares:
    builtin-header:
      rateLimit: {average: 6, period: 1h, burst: 3, sourceCriterion: {requestHeaderName: X-Api-Key}}
    tier-header:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {algorithm: tokenbucket, points: 6, duration: 1h, burst: 3, key: "header:X-Api-Key"}
    builtin-host:
      rateLimit: {average: 6, period: 1h, burst: 3, sourceCriterion: {requestHost: true}}
    tier-host:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {algorithm: tokenbucket, points: 6, duration: 1h, burst: 3, key: host}
    builtin-ip:
      rateLimit: {average: 6, period: 1h, burst: 3, sourceCriterion: {ipStrategy: {depth: 1}}}
    tier-ip:
      plugin:
        tierlimit:
          trustedHops: 1
          global: {points: 0}
          ip: {algorithm: tokenbucket, points: 6, duration: 1h, burst: 3}
    builtin-peer:
      rateLimit: {average: 6, period: 1h, burst: 3}
    tier-peer:
      plugin:
        tierlimit:
          trustedProxies: []
          global: {points: 0}
          ip: {algorithm: tokenbucket, points: 6, duration: 1h, burst: 3}
    builtin-redis:
      rateLimit:
        average: 6
        period: 1h
        burst: 3
        sourceCriterion: {requestHeaderName: X-Api-Key}
        redis: {endpoints: ["{{redis}}"]}
    tier-redis:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}"}
          global: {points: 0}
          ip: {algorithm: tokenbucket, points: 6, duration: 1h, burst: 3, key: "header:X-Api-Key"}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestTokenBucketAnswersLikeTraefiksRateLimit sends one request sequence to
// each built-in rateLimit router and to its tierlimit twin, through the real
// Traefik binary, and compares the answers one by one.
func TestTokenBucketAnswersLikeTraefiksRateLimit(t *testing.T) {
	r := startOpenRedis(t) // Traefik's own limiter connects as the default user too
	e := start(t, strings.ReplaceAll(rateLimitDynamic, "{{redis}}", r.Addr))
	e.waitRouters("builtin-header", "tier-header", "builtin-host", "tier-host", "builtin-ip", "tier-ip", "builtin-peer", "tier-peer", "builtin-redis", "tier-redis")

	// Sources in the order sent: a and b reach their burst, c does not.
	sequence := []string{"a", "a", "b", "a", "a", "b", "c", "b", "b", "a", "b", "c"}

	send := func(path, criterion, source string) int {
		req, err := http.NewRequest(http.MethodGet, e.traefik.Web+path, nil)
		if err != nil {
			t.Fatal(err)
		}

		switch criterion {
		case "header", "redis":
			req.Header.Set("X-Api-Key", "key-"+source)
		case "host":
			req.Host = source + ".example"
		case "ip", "peer":
			req.Header.Set("X-Forwarded-For", "198.51.100."+strconv.Itoa(int(source[0]))+", 203.0.113."+strconv.Itoa(int(source[0])))
		}

		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}

		resp.Body.Close()

		if criterion == "redis" && path == "/tier/redis" && resp.Header.Get("X-Ratelimit-Limit") != "3" {
			t.Fatalf("tierlimit on Redis: X-RateLimit-Limit %q", resp.Header.Get("X-Ratelimit-Limit"))
		}

		return resp.StatusCode
	}

	for _, criterion := range []string{"header", "host", "ip", "peer", "redis"} {
		var builtin, tier []int

		for _, source := range sequence {
			builtin = append(builtin, send("/builtin/"+criterion, criterion, source))
			tier = append(tier, send("/tier/"+criterion, criterion, source))
		}

		want := []int{200, 200, 200, 200, 429, 200, 200, 200, 429, 429, 429, 200}
		if criterion == "peer" {
			// Every request comes from the test's address, whatever X-Forwarded-For says.
			want = []int{200, 200, 200, 429, 429, 429, 429, 429, 429, 429, 429, 429}
		}
		for i := range sequence {
			if builtin[i] != want[i] || tier[i] != want[i] {
				t.Fatalf("%s: request %d (%s): built-in rateLimit %v, tierlimit %v; both should be %v", criterion, i, sequence[i], builtin, tier, want)
			}
		}
	}

	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	if got := keys(t, admin, "ratelimit:tier-redis@file:ip:"); len(got) != 3 {
		t.Fatalf("tierlimit's buckets in Redis: %v, want one per API key", got)
	}
}

// TestReadmeACLRunsEveryAlgorithm creates the ACL user the README describes,
// with exactly the commands it lists, and runs a fixed, a sliding and a
// token-bucket layer through it: each must reach Redis, not the memory
// fallback.
func TestReadmeACLRunsEveryAlgorithm(t *testing.T) {
	r := startRedis(t, "--requirepass", "secret")
	admin := r.Client(redisresp.Options{Password: "secret"})
	defer admin.Close()

	// README's line, as it is: ACL SETUSER tierlimit on >PASSWORD ...
	redisDo(t, admin, readmeACL(t, aclUser, "s3cret")...)

	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		cfg := tierlimit.CreateConfig()
		cfg.Store = "redis"
		cfg.Redis.Address = r.Addr
		cfg.Redis.Username = aclUser
		cfg.Redis.Password = "s3cret"
		cfg.Redis.Timeout = "2s"
		cfg.Global.Points = 0
		cfg.IP = config.LayerConfig{Points: 5, Duration: "60s", Algorithm: algorithm}

		h, err := tierlimit.New(context.Background(), http.NotFoundHandler(), cfg, "acl-"+algorithm+"@test")
		if err != nil {
			t.Fatal(err)
		}

		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "203.0.113.1:1"
		h.ServeHTTP(httptest.NewRecorder(), req)

		if got := keys(t, admin, "ratelimit:acl-"+algorithm+"@test:"); len(got) != 1 {
			t.Fatalf("%s through the README's ACL: Redis keys %v, want one (else memory decided)", algorithm, got)
		}
	}
}
