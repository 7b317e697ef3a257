package tierlimit

import (
	"net/http"
	"strings"
	"testing"
)

// TestMixedPathShowsTheLayerWithFewestLeft: on a Redis instance with global
// counted in memory (mixedPath), the headers show the layer of either store
// with the fewest requests left, and of equals the first (global), as one
// take of every layer would (mergeTally).
func TestMixedPathShowsTheLayerWithFewestLeft(t *testing.T) {
	addr, _ := redisServer(t)

	for _, c := range []struct {
		name              string
		global, ip        int
		policy, remaining string
	}{
		{"fewest left in memory", 5, 10, `"global";q=5;`, "4"},
		{"fewest left in Redis", 10, 5, `"ip";q=5;`, "4"},
		{"equal: the first", 10, 10, `"global";q=10;`, "9"},
	} {
		h, _ := redisHarness(t, addr, func(cfg *Config) {
			cfg.Global = LayerConfig{Points: c.global, Duration: "1h", Store: "memory"}
			cfg.IP = LayerConfig{Points: c.ip, Duration: "1h"}
		})

		if _, ok := h.h.(*mixedPath); !ok {
			t.Fatalf("%s: handler %T, want mixedPath", c.name, h.h)
		}

		rec := h.get("/api", "203.0.113.9:1")
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: %d, want 200", c.name, rec.Code)
		}

		if p := rec.Header().Get("RateLimit-Policy"); !strings.HasPrefix(p, c.policy) || rec.Header().Get("X-RateLimit-Remaining") != c.remaining {
			t.Errorf("%s: RateLimit-Policy %q, X-RateLimit-Remaining %q; want %s..., %s", c.name, p, rec.Header().Get("X-RateLimit-Remaining"), c.policy, c.remaining)
		}
	}
}
