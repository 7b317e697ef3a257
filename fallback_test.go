package tierlimit

import (
	"net/http"
	"strings"
	"testing"
)

// TestFallbackStartsFromWhatRedisLastReported: a key Redis had at 7 of 10
// when it went away gets 3 more from memory, not 10, for every algorithm and
// on both paths (modeRedis for a fixed ip layer, the general path for the
// others).
func TestFallbackStartsFromWhatRedisLastReported(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		addr, admin := redisServer(t)
		h, logs := redisHarness(t, addr, func(c *Config) {
			asACLUser(c)
			c.IP = algorithmLayer(algorithm, 10)
		})

		if (algorithm == "fixed") != (h.p.mode == modeRedis) {
			t.Fatalf("%s: mode %d", algorithm, h.p.mode)
		}

		client := "203.0.113.7"
		for i := 0; i < 7; i++ {
			if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
				t.Fatalf("%s: request %d refused by Redis: %d", algorithm, i+1, rec.Code)
			}
		}

		if v := redisDo(t, admin, "EXISTS", h.p.layers[0].RedisKey+client); v.Int != 1 {
			t.Fatalf("%s: not counted in Redis", algorithm)
		}

		_, _ = admin.Do("SHUTDOWN", "NOSAVE")

		allowed := 0
		for i := 0; i < 10; i++ {
			if rec := h.get("/api", client+":1"); rec.Code == http.StatusOK {
				allowed++
			}
		}

		if allowed != 3 {
			t.Errorf("%s: memory allowed %d after Redis went away at 7 of 10, want 3", algorithm, allowed)
		}

		if !strings.Contains(logs.String(), "REDIS_UNAVAILABLE") {
			t.Errorf("%s: not decided in memory:\n%s", algorithm, logs)
		}
	}
}
