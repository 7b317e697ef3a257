package tierlimit

import (
	"net/http"
	"strconv"
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

// TestMixedPathOnACluster: with global counted in memory, an instance on a
// Redis Cluster takes mixedPath, its call on the node of the client's slot:
// ip is counted in Redis under the key the general path uses (the client
// its hash tag), global in memory, and ip's refusal gives global its point
// back.
func TestMixedPathOnACluster(t *testing.T) {
	addr, admin := clusterNode(t)

	h := newHarness(t, func(c *Config) {
		c.Store = "redis"
		c.Redis.Cluster = &RedisClusterConfig{Addresses: []string{addr}}
		c.Redis.Timeout = "2s"
		c.Global = LayerConfig{Points: 100, Duration: "1h", Store: "memory"}
		c.IP = LayerConfig{Points: 2, Duration: "1h"}
	})

	if _, ok := h.h.(*mixedPath); !ok {
		t.Fatalf("handler %T, want mixedPath", h.h)
	}

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", "203.0.113.9:1"); rec.Code != want {
			t.Fatalf("request %d: %d, want %d", i, rec.Code, want)
		}
	}

	key := h.p.planIP[1].RedisKey + "{203.0.113.9}"
	if v := redisDo(t, admin, "GET", key).Str; v != "2" {
		t.Fatalf("%s in Redis: %q, want 2", key, v)
	}

	// The path's own call, not the general path after a failed one: it
	// names that key, and the node answered no call with an error.
	client := "203.0.113.9"
	rp := h.p.fast.ip
	if cmd := rp.heads[len(client)] + client + rp.tail; !strings.Contains(cmd, "$"+strconv.Itoa(len(key))+"\r\n"+key+"\r\n") {
		t.Fatalf("mixedPath's call %q does not name %s", cmd, key)
	}

	// NOSCRIPT: the script's first call, which loads it.
	for _, line := range strings.Split(redisDo(t, admin, "INFO", "errorstats").Str, "\r\n") {
		if strings.HasPrefix(line, "errorstat_") && !strings.HasPrefix(line, "errorstat_NOSCRIPT:") {
			t.Fatalf("the node answered an error: %s", line)
		}
	}

	if n := peekCount(h.p.memory, h.clock.Now().UnixNano(), "global", "global"); n != 2 {
		t.Fatalf("global in memory: %d after 2 allowed and 1 refused by ip, want 2", n)
	}
}
