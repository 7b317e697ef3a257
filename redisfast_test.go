package tierlimit

import (
	"crypto/sha1"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// compact is takeScript's one-integer reply for an allowed request.
func compact(left, resetMs, window, i int64) string {
	return ":" + strconv.FormatInt((left*(window+1)+resetMs)*16+i, 10) + "\r\n"
}

// TestServeRedisReadsTheOneIntegerReply: redisPath shows the layer, the
// requests left and the reset the integer packs, and sends its plan's call.
func TestServeRedisReadsTheOneIntegerReply(t *testing.T) {
	srv := newCannedRedis(t, compact(1, 42000, 60000, 1))
	h, logs := redisHarness(t, srv.l.Addr().String(), func(c *Config) {
		c.Global = LayerConfig{Points: 100, Duration: "10s"}
	})

	if h.p.mode != modeRedis {
		t.Fatalf("mode %d, want modeRedis", h.p.mode)
	}

	rec := h.get("/api", "203.0.113.9:1")
	reset := h.clock.Now().Add(43*time.Second - 1).Unix() // rounded up

	if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "1" || rec.Header().Get("X-RateLimit-Limit") != "3" ||
		rec.Header().Get("X-RateLimit-Reset") != strconv.FormatInt(reset, 10) || rec.Header().Get("RateLimit") != `"ip";r=1;t=42` {
		t.Fatalf("%d %v, want ip with 1 left, reset in 42s", rec.Code, rec.Header())
	}

	sum := sha1.Sum([]byte(takeScript))
	want := []string{"EVALSHA", hex.EncodeToString(sum[:]), "2", h.p.fast.store.Prefix + "global:global", h.p.fast.store.Prefix + "ip:203.0.113.9",
		"2", "1", "100", "10000", "0", "0", "3", "60000", "0", "0"}
	srv.mu.Lock()
	got := srv.last
	srv.mu.Unlock()

	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("command %q, want %q", got, want)
	}

	if logs.Len() != 0 {
		t.Fatalf("decided in memory: %s", logs)
	}

	// The fallback remembers what Redis reported of the layer shown
	// (redisstore/fallback.go): 2 of 3 in use.
	if n := peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", "203.0.113.9"); n != 2 {
		t.Fatalf("memory count %d, want 2, the count Redis reported", n)
	}
}

// TestServeRedisRejectsIntegersOutOfRange: an integer naming no layer of
// the plan, or more requests left than the layer's points, is a bad reply:
// memory decides and Redis is reported unavailable.
func TestServeRedisRejectsIntegersOutOfRange(t *testing.T) {
	for name, reply := range map[string]string{
		"layer beyond the plan": compact(1, 42000, 60000, 2),
		"left at the points":    compact(3, 42000, 60000, 1),
		"negative":              ":-5\r\n",
	} {
		srv := newCannedRedis(t, reply)
		h, logs := redisHarness(t, srv.l.Addr().String(), func(c *Config) {
			c.Global = LayerConfig{Points: 100, Duration: "10s"}
		})

		rec := h.get("/api", "203.0.113.9:1")
		if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "2" ||
			peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", "203.0.113.9") != 1 || !strings.Contains(logs.String(), "REDIS_UNAVAILABLE") {
			t.Errorf("%s: %d %v %q, want the memory store's decision", name, rec.Code, rec.Header(), logs)
		}
	}
}

// TestServeRedisWithAKeyBlocked: a blocked client is refused without a
// Redis call while the others keep being served by the script.
func TestServeRedisWithAKeyBlocked(t *testing.T) {
	srv := newCannedRedis(t, "*2\r\n:4\r\n:30000\r\n") // ip: count 4 of 3
	h, _ := redisHarness(t, srv.l.Addr().String(), nil)

	if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("first refusal: %d", rec.Code)
	}

	srv.setReply(compact(1, 5000, 60000, 0)) // memory would leave 2

	for i := 0; i < 2; i++ {
		calls := srv.commands.Load()

		if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusTooManyRequests || srv.commands.Load() != calls {
			t.Fatalf("blocked client: %d after %d Redis calls, want a 429 without one", rec.Code, srv.commands.Load()-calls)
		}

		rec := h.get("/api", "203.0.113.10:1")
		if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "1" || srv.commands.Load() != calls+1 {
			t.Fatalf("other client: %d %v after %d Redis calls, want the script's decision", rec.Code, rec.Header(), srv.commands.Load()-calls)
		}
	}

	// The blocked refusal, from the layer's refusal cache, is the store's own
	// (refuseBlockedGeneral), headers and body, as the seconds to the reset
	// go down (the cache is refreshed) and the second turns.
	for _, step := range []time.Duration{0, 0, 700 * time.Millisecond, 1100 * time.Millisecond, 28 * time.Second} {
		h.clock.Add(step)

		fast := h.get("/api", "203.0.113.9:1")
		general := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.RemoteAddr = "203.0.113.9:1"

		if !refuseBlockedGeneral(h.p, general, req, h.p.planIP, "203.0.113.9", h.p.now().UnixNano()) {
			t.Fatalf("after %v: the store's code does not find the key blocked", step)
		}

		if fast.Code != general.Code || !reflect.DeepEqual(fast.Header(), general.Header()) || fast.Body.String() != general.Body.String() {
			t.Fatalf("after %v: the blocked refusal\n%d %v %s\nwant the store's\n%d %v %s", step,
				fast.Code, fast.Header(), fast.Body, general.Code, general.Header(), general.Body)
		}
	}
}
