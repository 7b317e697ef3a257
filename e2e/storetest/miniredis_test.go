// Package storetest runs the RESP client and the redis store, Lua script
// included, against miniredis: fast tests that need neither Traefik nor
// redis-server, run by `make unit`. The scripts on a real redis-server are
// tested in the root package (redisserver_test.go) and, through Traefik, in
// e2e/redis_test.go.
package storetest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
)

func TestClientAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	p := redisresp.NewPool(redisresp.Options{Address: m.Addr(), Timeout: time.Second})
	defer p.Close()

	if v, err := p.Do("SET", "k", "hello world\r\nwith CRLF"); err != nil || v.Str != "OK" {
		t.Fatalf("SET: %v %v", v, err)
	}

	if v, err := p.Do("GET", "k"); err != nil || v.Kind != redisresp.KindBulk || v.Str != "hello world\r\nwith CRLF" {
		t.Fatalf("GET: %+v %v", v, err)
	}

	if v, err := p.Do("GET", "missing"); err != nil || !v.Null {
		t.Fatalf("GET missing: %+v %v", v, err)
	}

	replies, err := p.Pipeline([][]string{{"INCR", "n"}, {"INCR", "n"}, {"INCRBY", "n", "40"}, {"LPUSH", "l", "a", "b"}, {"LRANGE", "l", "0", "-1"}})
	if err != nil {
		t.Fatal(err)
	}

	if replies[0].Int != 1 || replies[1].Int != 2 || replies[2].Int != 42 || len(replies[4].Array) != 2 || replies[4].Array[0].Str != "b" {
		t.Fatalf("pipeline: %+v", replies)
	}

	// A server error is a value, and the connection stays usable.
	if v, err := p.Do("INCR", "k"); err != nil || !v.IsError() || !strings.Contains(v.Str, "not an integer") {
		t.Fatalf("INCR on a string: %+v %v", v, err)
	}

	if v, err := p.Do("PING"); err != nil || v.Str != "PONG" {
		t.Fatalf("PING after an error reply: %+v %v", v, err)
	}
}

func TestClientAuthAndSelectAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	m.RequireAuth("secret")
	m.RequireUserAuth("limiter", "s3cret")

	cases := []struct {
		name string
		opts redisresp.Options
		ok   bool
	}{
		{"password", redisresp.Options{Password: "secret"}, true},
		{"acl user", redisresp.Options{Username: "limiter", Password: "s3cret"}, true},
		{"wrong password", redisresp.Options{Password: "nope-123"}, false},
		{"wrong acl password", redisresp.Options{Username: "limiter", Password: "nope-456"}, false},
		{"no password", redisresp.Options{}, false},
	}

	for _, tc := range cases {
		tc.opts.Address, tc.opts.Timeout = m.Addr(), time.Second
		p := redisresp.NewPool(tc.opts)

		v, err := p.Do("SET", "who", tc.name)
		if tc.ok && (err != nil || v.Str != "OK") {
			t.Errorf("%s: %+v %v", tc.name, v, err)
		}

		if !tc.ok && err == nil && !v.IsError() {
			t.Errorf("%s: accepted", tc.name)
		}

		if err != nil && strings.Contains(err.Error(), tc.opts.Password) && tc.opts.Password != "" {
			t.Errorf("%s: the error discloses the password: %v", tc.name, err)
		}

		p.Close()
	}

	// SELECT: a key set in db 3 is not in db 0.
	p3 := redisresp.NewPool(redisresp.Options{Address: m.Addr(), Password: "secret", DB: 3, Timeout: time.Second})
	defer p3.Close()

	if _, err := p3.Do("SET", "only3", "x"); err != nil {
		t.Fatal(err)
	}

	if m.DB(3).Exists("only3") == false || m.DB(0).Exists("only3") {
		t.Fatal("SELECT 3 did not take effect")
	}
}

func TestScriptFallsBackToEvalAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	p := redisresp.NewPool(redisresp.Options{Address: m.Addr(), Timeout: time.Second})
	defer p.Close()

	s := redisresp.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)

	for want := int64(5); want <= 15; want += 5 {
		v, err := s.Run(p, []string{"c"}, []string{"5"})
		if err != nil || v.Int != want {
			t.Fatalf("run: %+v %v, want %d", v, err, want)
		}
	}

	if _, err := p.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}

	if v, err := s.Run(p, []string{"c"}, []string{"5"}); err != nil || v.Int != 20 {
		t.Fatalf("after SCRIPT FLUSH: %+v %v", v, err)
	}

	bad := redisresp.NewScript(`return redis.call('NOPE')`)
	if v, err := bad.Run(p, nil, nil); err != nil || !v.IsError() {
		t.Fatalf("script error: %+v %v", v, err)
	}
}

func TestClosedPoolAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	p := redisresp.NewPool(redisresp.Options{Address: m.Addr(), Timeout: time.Second})

	if _, err := p.Do("PING"); err != nil {
		t.Fatal(err)
	}

	p.Close()

	if _, err := p.Do("PING"); !errors.Is(err, redisresp.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestRedisStoreAgainstMiniredis runs the compiled plugin on miniredis: the
// window lives in Redis (moving miniredis's clock resets it), counts are exact.
func TestRedisStoreAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)

	cfg := tierlimit.CreateConfig()
	cfg.Store = "redis"
	cfg.Redis.Address = m.Addr()
	cfg.Redis.Timeout = "1s"
	cfg.Global.Points = 0
	cfg.IP = config.LayerConfig{Points: 3, Duration: "10s"}

	h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, "mini@test")
	if err != nil {
		t.Fatal(err)
	}

	get := func(client string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.RemoteAddr = client + ":1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		return rec
	}

	for i, want := range []string{"2", "1"} {
		if rec := get("203.0.113.1"); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != want {
			t.Fatalf("request %d: %d %v", i+1, rec.Code, rec.Header())
		}
	}

	key := "ratelimit:mini@test:ip:203.0.113.1"
	if got, _ := m.Get(key); got != "2" {
		t.Fatalf("counter %q", got)
	}

	if ttl := m.TTL(key); ttl <= 0 || ttl > 10*time.Second {
		t.Fatalf("TTL %s, want within (0, 10s]", ttl)
	}

	m.FastForward(10 * time.Second)

	if rec := get("203.0.113.1"); rec.Header().Get("X-RateLimit-Remaining") != "2" {
		t.Fatalf("after the window: %v", rec.Header())
	}

	// A second client: exactly 3 allowed.
	allowed := 0

	for i := 0; i < 10; i++ {
		if get("203.0.113.2").Code == http.StatusOK {
			allowed++
		}
	}

	if allowed != 3 {
		t.Fatalf("%d allowed, want 3", allowed)
	}
}

// TestSlidingWindowAgainstMiniredis: with algorithm sliding, a client that
// spends its points at the end of one window and again at the start of the
// next is refused in the second burst, on Redis as in memory (the same counts
// at the same moments), with the time moved by miniredis's clock.
func TestSlidingWindowAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)

	newPlugin := func(store, name string) http.Handler {
		cfg := tierlimit.CreateConfig()
		cfg.Store = store
		cfg.Redis.Address = m.Addr()
		cfg.Redis.Timeout = "1s"
		cfg.Global.Points = 0
		cfg.IP = config.LayerConfig{Points: 10, Duration: "10s", Algorithm: "sliding"}

		h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, name)
		if err != nil {
			t.Fatal(err)
		}

		return h
	}

	h := newPlugin("redis", "sliding@test")

	burst := func(n int) (allowed int, last *httptest.ResponseRecorder) {
		for i := 0; i < n; i++ {
			req := httptest.NewRequest(http.MethodGet, "/api", nil)
			req.RemoteAddr = "203.0.113.1:1"
			last = httptest.NewRecorder()
			h.ServeHTTP(last, req)

			if last.Code == http.StatusOK {
				allowed++
			}
		}

		return allowed, last
	}

	burst(1)
	m.FastForward(9900 * time.Millisecond)

	if got, _ := burst(9); got != 9 {
		t.Fatalf("end of the first window: %d of 9 allowed", got)
	}

	m.FastForward(200 * time.Millisecond)

	got, last := burst(10)
	if got != 1 {
		t.Fatalf("start of the next window: %d of 10 allowed, want 1 (the previous window still weighs 9)", got)
	}

	if last.Code != http.StatusTooManyRequests || last.Header().Get("Retry-After") == "" {
		t.Fatalf("refusal: %d %v", last.Code, last.Header())
	}

	key := "ratelimit:sliding@test:ip:203.0.113.1"
	if c := m.HGet(key, "c"); c != "1" || m.HGet(key, "p") != "10" {
		t.Fatalf("hash c=%q p=%q, want the current and previous counts 1 and 10", c, m.HGet(key, "p"))
	}

	if ttl := m.TTL(key); ttl <= 10*time.Second || ttl > 20*time.Second {
		t.Fatalf("TTL %s, want the rest of this window plus one more", ttl)
	}

	// A reload that turns a fixed layer sliding finds a counter of the other
	// kind: it is started afresh, in Redis, rather than failing the script.
	m.Set("ratelimit:switch@test:ip:203.0.113.1", "7")
	h = newPlugin("redis", "switch@test")

	if got, _ := burst(1); got != 1 || m.HGet("ratelimit:switch@test:ip:203.0.113.1", "c") != "1" {
		t.Fatalf("switched key: %d allowed, hash c=%q", got, m.HGet("ratelimit:switch@test:ip:203.0.113.1", "c"))
	}
}

// TestRefusedRequestChargesNoLayerAgainstMiniredis: a layer is refused only
// once the request would take it over its points, not when it has just
// reached them, and the refused request is charged to no layer.
func TestRefusedRequestChargesNoLayerAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)

	cfg := tierlimit.CreateConfig()
	cfg.Store = "redis"
	cfg.Redis.Address = m.Addr()
	cfg.Redis.Timeout = "1s"
	cfg.Global = config.LayerConfig{Points: 2, Duration: "10s"}
	cfg.IP = config.LayerConfig{Points: 5, Duration: "10s"}

	h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, "layers@test")
	if err != nil {
		t.Fatal(err)
	}

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.RemoteAddr = "203.0.113.1:1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		if rec.Code != want {
			t.Fatalf("request %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	// The refused third request, refused by global, changed neither counter.
	global, _ := m.Get("ratelimit:layers@test:global:global")
	ip, _ := m.Get("ratelimit:layers@test:ip:203.0.113.1")

	if global != "2" || ip != "2" {
		t.Fatalf("counters global %q, ip %q, want 2 and 2 (keys %v)", global, ip, m.Keys())
	}
}

// TestShortenedDurationStartsAfreshAgainstMiniredis: a reload that shortens a
// layer's duration leaves keys whose TTL is longer than the new window; the
// script starts them afresh, as memory does, instead of replying with a reset
// beyond the window (which the store takes for a bad reply from Redis).
func TestShortenedDurationStartsAfreshAgainstMiniredis(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding"} {
		m := miniredis.RunT(t)

		for i, duration := range []string{"60s", "10s"} {
			cfg := tierlimit.CreateConfig()
			cfg.Store = "redis"
			cfg.Redis.Address = m.Addr()
			cfg.Redis.Timeout = "1s"
			cfg.Global.Points = 0
			cfg.IP = config.LayerConfig{Points: 5, Duration: duration, Algorithm: algorithm}

			h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, "shortened-"+algorithm+"@test")
			if err != nil {
				t.Fatal(err)
			}

			for j := 1; j <= 3; j++ {
				req := httptest.NewRequest(http.MethodGet, "/api", nil)
				req.RemoteAddr = "203.0.113.1:1"
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)

				left := strings.TrimSpace(rec.Header().Get("X-RateLimit-Remaining"))
				if rec.Code != http.StatusOK || left != strconv.Itoa(5-j) {
					t.Fatalf("%s, duration %s, request %d: %d, %s left, want %d (a fresh window)", algorithm, duration, j, rec.Code, left, 5-j)
				}
			}

			// Redis decided (memory, deciding instead, would answer alike).
			key := "ratelimit:shortened-" + algorithm + "@test:ip:203.0.113.1"

			count, _ := m.Get(key)
			if algorithm == "sliding" {
				count = m.HGet(key, "c")
			}

			if count != "3" {
				t.Fatalf("%s, duration %s: Redis holds %q, want 3", algorithm, duration, count)
			}

			if ttl := m.TTL(key); i == 1 && ttl > 20*time.Second {
				t.Fatalf("%s: the key lives %v after the window became 10s", algorithm, ttl)
			}
		}
	}
}
