package tierlimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/limit"
)

// A dry-run rule never shows in the client's headers: they show the most
// restrictive rule that enforces. Dry-run rules show only in events, the
// status page and metrics, unless every rule is in dry run.

// probeInDryRun: ip enforced at 5 a minute, a probe route keyed by ip in dry
// run at 2 a minute, global off (redisHarness turns it off too).
func probeInDryRun(c *Config) {
	c.Global.Points = 0
	c.IP = LayerConfig{Points: 5, Duration: "60s"}
	c.Routes = []RouteConfig{{Name: "probe", Paths: []string{"/probe"}, Points: 2, Duration: "60s", DryRun: true}}
}

// wantHeaders checks every rate-limit header of rec against layer name with
// points a minute and left requests left in a window of 60 s that started at
// the harness's first request (synced counting: at the last whole minute,
// syncWindow).
func wantHeaders(t *testing.T, h *harness, rec *httptest.ResponseRecorder, what, name string, points, left int) {
	t.Helper()

	end := h.clock.Now().UnixNano() + 60e9
	if rs := h.p.stores.redis; rs != nil && rs.Synced != nil {
		end -= end % 60e9
	}

	reset := strconv.FormatInt(limit.CeilSeconds(end), 10)
	want := map[string]string{
		"X-Ratelimit-Limit":     strconv.Itoa(points),
		"X-Ratelimit-Remaining": strconv.Itoa(left),
		"X-Ratelimit-Reset":     reset,
		"Ratelimit-Policy":      `"` + name + `";q=` + strconv.Itoa(points) + ";w=60",
		"Ratelimit":             `"` + name + `";r=` + strconv.Itoa(left) + ";t=60",
	}

	for k, v := range want {
		if got := rec.Header().Get(k); got != v {
			t.Errorf("%s: %s %q, want %q", what, k, got, v)
		}
	}
}

// dryRouteScenario: 4 probes from one client all reach the backend with
// ip's headers (its 5 less those spent), although the dry-run route is out
// from the 3rd on; the route's would-be refusal is reported once, as a dry
// run.
func dryRouteScenario(t *testing.T, h *harness) {
	t.Helper()

	for i := 1; i <= 4; i++ {
		rec := h.get("/probe", "203.0.113.1:1")
		if rec.Code != http.StatusOK {
			t.Fatalf("probe %d: %d", i, rec.Code)
		}

		wantHeaders(t, h, rec, "probe "+strconv.Itoa(i), "ip", 5, 5-i)
	}

	if h.calls.Load() != 4 {
		t.Fatalf("backend saw %d of 4 probes", h.calls.Load())
	}

	ev := strings.TrimSpace(h.events.String())
	if strings.Count(ev, "\n") != 0 || !strings.Contains(ev, `"limiter":"probe"`) || !strings.Contains(ev, `"dryRun":true`) {
		t.Errorf("events, want one dry-run probe line:\n%s", ev)
	}
}

func TestDryRunRouteShowsEnforcedHeadersInMemory(t *testing.T) {
	dryRouteScenario(t, newHarness(t, probeInDryRun))
}

func TestDryRunRouteShowsEnforcedHeadersOnRedis(t *testing.T) {
	addr, _ := redisServer(t)
	h, _ := redisHarness(t, addr, with(probeInDryRun, asACLUser))
	dryRouteScenario(t, h)
}

func TestDryRunRouteShowsEnforcedHeadersSynced(t *testing.T) {
	addr, _ := redisServer(t)
	h, _, _ := syncHarness(t, addr, with(probeInDryRun, asACLUser))
	dryRouteScenario(t, h)
}

// Redis down: the memory fallback decides, with the same headers.
func TestDryRunRouteShowsEnforcedHeadersInFallback(t *testing.T) {
	h, _ := redisHarness(t, closedPort(t), probeInDryRun)
	dryRouteScenario(t, h)
}

// Every rule in dry run: the most restrictive one shows, nothing left once
// it would refuse, whether the top-level dryRun or each rule's says so. Each
// rule the instance can charge: user and service, enforced but never
// charged at an edge (no principal.userHeader), do not count.
func TestEveryRuleInDryRunShowsTheMostRestrictive(t *testing.T) {
	for name, mutate := range map[string]func(c *Config){
		"top-level": with(probeInDryRun, func(c *Config) { c.DryRun = true }),
		"each rule": with(probeInDryRun, func(c *Config) { c.IP.DryRun = true; c.Assets.DryRun = true }),
	} {
		for store, h := range map[string]*harness{
			"memory": newHarness(t, mutate),
			"redis":  redisOn(t, mutate),
		} {
			for i := 1; i <= 3; i++ {
				rec := h.get("/probe", "203.0.113.1:1")
				if rec.Code != http.StatusOK {
					t.Fatalf("%s, %s: probe %d: %d", name, store, i, rec.Code)
				}

				left := 2 - i
				if left < 0 {
					left = 0
				}

				wantHeaders(t, h, rec, name+", "+store+": probe "+strconv.Itoa(i), "probe", 2, left)
			}
		}
	}
}

// redisOn is a harness on a redis-server of its own.
func redisOn(t *testing.T, mutate func(c *Config)) *harness {
	t.Helper()

	addr, _ := redisServer(t)
	h, _ := redisHarness(t, addr, with(mutate, asACLUser))

	return h
}

// A request that only dry-run rules charge, on an instance where others
// enforce, shows no rate-limit headers, and its would-be refusal is still
// reported: a credentialed probe at the edge is charged to global (off here)
// and the route.
func TestOnlyDryRunRulesShowNoHeadersAndStillReport(t *testing.T) {
	mutate := with(probeInDryRun, func(c *Config) { c.Principal.CredentialHeaders = []string{"Authorization"} })

	for store, h := range map[string]*harness{
		"memory": newHarness(t, mutate),
		"redis":  redisOn(t, mutate),
	} {
		for i := 1; i <= 3; i++ {
			rec := h.do(http.MethodGet, "/probe", "203.0.113.1:1", map[string]string{"Authorization": "Bearer x"})
			if rec.Code != http.StatusOK {
				t.Fatalf("%s: probe %d: %d", store, i, rec.Code)
			}

			for _, k := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit", "Ratelimit-Policy"} {
				if v := rec.Header().Get(k); v != "" {
					t.Errorf("%s: probe %d: %s %q from a dry-run rule", store, i, k, v)
				}
			}
		}

		ev := strings.TrimSpace(h.events.String())
		if strings.Count(ev, "\n") != 0 || !strings.Contains(ev, `"limiter":"probe"`) || !strings.Contains(ev, `"dryRun":true`) {
			t.Errorf("%s: events, want one dry-run probe line:\n%s", store, ev)
		}
	}
}
