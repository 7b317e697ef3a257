package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
)

// TestSlidingWindowOnRedisServer runs the sliding script on a real
// redis-server (Lua 5.1 there, gopher-lua in miniredis). Time is set through
// the keys' TTLs instead of waiting: a hash whose TTL is at most one window
// holds the window that just ended.
func TestSlidingWindowOnRedisServer(t *testing.T) {
	r := startRedis(t)
	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	newPlugin := func(name, algorithm string) http.Handler {
		cfg := tierlimit.CreateConfig()
		cfg.Store = "redis"
		cfg.Redis.Address = r.Addr
		cfg.Redis.Timeout = "2s"
		cfg.Global.Points = 0
		cfg.IP = config.LayerConfig{Points: 10, Duration: "10s", Algorithm: algorithm}

		h, err := tierlimit.New(context.Background(), http.NotFoundHandler(), cfg, name)
		if err != nil {
			t.Fatal(err)
		}

		return h
	}

	send := func(h http.Handler, n int) (allowed int, last *httptest.ResponseRecorder) {
		for i := 0; i < n; i++ {
			req := httptest.NewRequest(http.MethodGet, "/api", nil)
			req.RemoteAddr = "203.0.113.1:1"
			last = httptest.NewRecorder()
			h.ServeHTTP(last, req)

			if last.Code != http.StatusTooManyRequests {
				allowed++
			}
		}

		return allowed, last
	}

	// The window before ended 100ms ago with 10 requests: 10 x 9.9s/10s = 9
	// still weigh, so one request fits and the next is refused.
	key := "ratelimit:slide@test:ip:203.0.113.1"
	redisDo(t, admin, "HSET", key, "c", "10", "p", "0")
	redisDo(t, admin, "PEXPIRE", key, "9900")

	h := newPlugin("slide@test", "sliding")

	allowed, last := send(h, 3)
	if allowed != 1 || last.Code != http.StatusTooManyRequests {
		t.Fatalf("%d of 3 allowed (last %d), want 1", allowed, last.Code)
	}

	// It fits again once 10 x left/10s < 9, about 0.9s on: Retry-After 1.
	if got := last.Header().Get("Retry-After"); got != "1" {
		t.Fatalf("Retry-After %q, want 1", got)
	}

	hash := redisDo(t, admin, "HMGET", key, "c", "p").Array
	if len(hash) != 2 || hash[0].Str != "1" || hash[1].Str != "10" {
		t.Fatalf("hash %+v, want c=1 p=10", hash)
	}

	ttl := redisDo(t, admin, "PTTL", key).Int
	if ttl <= 10000 || ttl > 19900 {
		t.Fatalf("PTTL %d, want this window's 9.9s plus one window", ttl)
	}

	// A reload that changes the algorithm finds a key of the other kind, and
	// starts it afresh in Redis in both directions.
	fixedKey := "ratelimit:tofixed@test:ip:203.0.113.1"
	redisDo(t, admin, "HSET", fixedKey, "c", "3", "p", "2")
	redisDo(t, admin, "PEXPIRE", fixedKey, "15000")

	if n, _ := send(newPlugin("tofixed@test", "fixed"), 2); n != 2 {
		t.Fatalf("fixed over a sliding key: %d of 2 allowed", n)
	}

	if got := redisDo(t, admin, "GET", fixedKey).Str; got != "2" {
		t.Fatalf("fixed counter %q, want 2", got)
	}

	slidingKey := "ratelimit:tosliding@test:ip:203.0.113.1"
	redisDo(t, admin, "SET", slidingKey, "7", "PX", "5000")

	if n, _ := send(newPlugin("tosliding@test", "sliding"), 2); n != 2 {
		t.Fatalf("sliding over a fixed key: %d of 2 allowed", n)
	}

	if got := redisDo(t, admin, "HGET", slidingKey, "c").Str; got != strconv.Itoa(2) {
		t.Fatalf("sliding count %q, want 2", got)
	}
}
