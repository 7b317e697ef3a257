package tierlimit

import (
	"net/http"
	"testing"

	"github.com/tierlimit/tierlimit/config"
)

// gatewayConfig is an LLM gateway's: 50 requests a minute per IP, 1000
// tokens a minute per API key charged what the response reports (100
// reserved while in flight) and, with slots, 2 requests in flight per key.
func gatewayConfig(slots bool) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP.Points, c.IP.Duration = 50, "60s"
		c.Routes = []config.RouteConfig{{
			Name: "chat", Paths: []string{"/v1/"}, Key: "header:X-Api-Key", Points: 1000, Duration: "60s",
			CostFrom: "json:usage.total_tokens", Reserve: 100,
		}}
		if slots {
			c.Routes = append(c.Routes, config.RouteConfig{
				Name: "inflight", Paths: []string{"/v1/"}, Key: "header:X-Api-Key", Points: 2, Duration: "5m", Algorithm: "concurrency",
			})
		}
	}
}

// A metered client reads every layer that admitted its request in
// RateLimit-Policy and each one's state in RateLimit, the most
// restrictive first (X-RateLimit-* shows it), then the request's order:
// the tokens it has left although a concurrency layer has fewer left.
func TestAMeteredClientReadsEveryPolicyInItsHeaders(t *testing.T) {
	addr, _ := redisServer(t)
	redis := func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = addr
		asACLUser(c)
	}

	for _, tc := range []struct {
		name  string
		store func(c *Config)
		slots bool
	}{
		{"memory", func(*Config) {}, true},
		{"exact redis", redis, true},
		{"synced redis", func(c *Config) { redis(c); synced(c) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) {
				gatewayConfig(tc.slots)(c)
				tc.store(c)
			})
			h.backend = jsonUsage(100)

			policy := `"ip";q=50;w=60, "chat";q=1000;w=60`
			rate := []string{`"ip";r=49;t=60, "chat";r=900;t=60`, `"ip";r=48;t=60, "chat";r=800;t=60`}
			if tc.slots {
				policy = `"inflight";q=2;w=300;qu="concurrent-requests", ` + policy
				rate = []string{`"inflight";r=1;t=300, ` + rate[0], `"inflight";r=1;t=300, ` + rate[1]}
			}

			for i, want := range rate {
				rec := h.key("k1")
				if rec.Code != http.StatusOK {
					t.Fatalf("request %d: %d, want 200", i+1, rec.Code)
				}

				if got := rec.Header().Get("RateLimit-Policy"); got != policy {
					t.Errorf("request %d: RateLimit-Policy %q, want %q", i+1, got, policy)
				}

				if got := rec.Header().Get("RateLimit"); got != want {
					t.Errorf("request %d: RateLimit %q, want %q", i+1, got, want)
				}
			}
		})
	}
}
