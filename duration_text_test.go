package tierlimit

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The status page and the policy header report such a window as a
// duration: "1.5s", and w=2 (whole seconds, rounded up).
func TestDecimalDurationIsReportedAsADuration(t *testing.T) {
	h := statusHarness(t, func(c *Config) { c.IP.Duration = "1.500000" })

	rec := h.get("/api", "203.0.113.1:1")
	if got := rec.Header().Get("Ratelimit-Policy"); got != `"ip";q=5;w=2` {
		t.Errorf("RateLimit-Policy %q, want %q", got, `"ip";q=5;w=2`)
	}

	doc := h.status("/_rl")
	if len(doc.Layers) != 1 || doc.Layers[0].Duration != "1.5s" {
		t.Fatalf("status layers %+v, want ip with duration 1.5s", doc.Layers)
	}

	h.clock.now = h.clock.now.Add(1500 * time.Millisecond)
	if rec := h.get("/api", "203.0.113.1:1"); rec.Header().Get("X-Ratelimit-Remaining") != "4" {
		t.Errorf("after 1.5s: X-RateLimit-Remaining %q, want a new window's 4", rec.Header().Get("X-Ratelimit-Remaining"))
	}
}

// Errors name a bare decimal number of seconds as a duration too, never as
// the file provider's "1.500000"; a bare integer as written.
func TestDurationErrorsShowBareSecondsAsDurations(t *testing.T) {
	for want, mutate := range map[string]func(c *Config){
		`ip.duration = "0.0001s": must be at least 1ms`:                        func(c *Config) { c.IP.Duration = "0.000100" },
		`ip.duration = "90.5s": cannot be set together with ip.calendar (day)`: func(c *Config) { c.IP.Duration = "90.500000"; c.IP.Calendar = "day" },
		`ip.blockDuration = "40000000.5s": longer than a year`:                 func(c *Config) { c.IP.BlockDuration = "40000000.500000" },
		`ip.blockDuration = "40000000": longer than a year`:                    func(c *Config) { c.IP.BlockDuration = "40000000" },
		`redis.timeout = "0.0005s": must be at least 1ms`:                      func(c *Config) { c.Redis.Timeout = "0.000500" },
		`routes[0].duration = "1.5.0": not a duration`: func(c *Config) {
			c.Routes = []RouteConfig{{Name: "a", Paths: []string{"/a"}, Points: 1, Duration: "1.5.0"}}
		},
	} {
		cfg := CreateConfig()
		mutate(cfg)

		_, err := New(context.Background(), http.NotFoundHandler(), cfg, "durations@test")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %s", err, want)
		}
	}
}
