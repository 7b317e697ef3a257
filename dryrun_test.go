package tierlimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
)

func TestDryRunOnEveryRuleParses(t *testing.T) {
	cfg := CreateConfig()
	cfg.IP.DryRun = true
	cfg.Assets.DryRun = true
	cfg.Principal.UserHeader = "X-Auth-User"
	cfg.Principal.PlanHeader = "X-Auth-Plan"
	cfg.Plans = map[string]config.PlanConfig{"pro": {Points: 5, Duration: "1s", DryRun: true}, "free": {Points: 5, Duration: "1s"}}
	cfg.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 2, Duration: "60s", DryRun: true}}

	s, err := parse(cfg)
	if err != nil {
		t.Fatal(err)
	}

	got := map[string]bool{}
	for _, l := range append(append(s.Builtin, s.Plans...), s.Routes[0].Rule) {
		got[l.Name] = l.DryRun
	}

	want := map[string]bool{"global": false, "ip": true, "assets": true, "user": false, "service": false, "pro": true, "free": false, "login": true}
	for name, dry := range want {
		if got[name] != dry {
			t.Errorf("%s: dryRun %v, want %v", name, got[name], dry)
		}
	}

	// A dry-run tier leaves the fast paths, whose refusals know no dry run.
	if m := chooseMode(s); m != modeGeneral {
		t.Errorf("mode %d with a dry-run ip layer", m)
	}
}

// loginAndEmail is the instance: a login route of 2 a minute in dry
// run, an enforced e-mail route of 2 a minute.
func loginAndEmail(c *Config) {
	c.Global = config.LayerConfig{Points: 1000, Duration: "60s"}
	c.IP = config.LayerConfig{Points: 100, Duration: "60s"}
	c.Routes = []config.RouteConfig{
		{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Points: 2, Duration: "60s", DryRun: true},
		{Name: "email", Methods: []string{"POST"}, Paths: []string{"/auth/password/request"}, Points: 2, Duration: "60s"},
	}
}

// loginAndEmailScenario: 5 logins reach the backend, every one with the
// headers of ip (a dry-run rule never shows in them), and the route is
// reported once, as a dry run; the 3rd and 4th e-mail are refused, reported
// once, not as a dry run.
func loginAndEmailScenario(t *testing.T, h *harness) {
	t.Helper()

	for i := 1; i <= 5; i++ {
		rec := h.do(http.MethodPost, "/auth/login", "203.0.113.1:1", nil)
		if rec.Code != http.StatusOK {
			t.Fatalf("login %d: %d", i, rec.Code)
		}

		want := `"ip";r=` + strconv.Itoa(100-i) + ";t=60"

		if got := rec.Header().Get("Ratelimit"); got != want {
			t.Fatalf("login %d: RateLimit %q, want %q", i, got, want)
		}
	}

	if h.calls.Load() != 5 {
		t.Fatalf("backend saw %d of 5 logins", h.calls.Load())
	}

	for i, want := range []int{200, 200, 429, 429} {
		if rec := h.do(http.MethodPost, "/auth/password/request", "203.0.113.1:1", nil); rec.Code != want {
			t.Fatalf("e-mail %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	lines := strings.Split(strings.TrimSpace(h.events.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("events:\n%s", h.events.String())
	}

	if !strings.Contains(lines[0], `"limiter":"auth_login"`) || !strings.Contains(lines[0], `"dryRun":true`) {
		t.Errorf("login event %s", lines[0])
	}

	if !strings.Contains(lines[1], `"limiter":"email"`) || strings.Contains(lines[1], "dryRun") {
		t.Errorf("e-mail event %s", lines[1])
	}
}

func TestDryRunRouteInMemory(t *testing.T) {
	loginAndEmailScenario(t, newHarness(t, loginAndEmail))
}

func TestDryRunRouteOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, with(loginAndEmail, asACLUser))
	loginAndEmailScenario(t, h)

	// The login route was charged every login, and its key was never
	// blocked: a dry-run layer refuses nothing, here or in Redis.
	l := h.p.routes[0].layer
	if v := redisDo(t, admin, "GET", l.RedisKey+"203.0.113.1").Str; v != "5" {
		t.Errorf("login count %q, want 5", v)
	}

	rs := h.p.stores.redis
	if rs.Blocked.ResetOf(l.BlockPrefix, "203.0.113.1", t0) != 0 {
		t.Error("the dry-run login route blocked its key")
	}

	if rs.Blocked.ResetOf(h.p.routes[1].layer.BlockPrefix, "203.0.113.1", t0) == 0 {
		t.Error("the enforced e-mail route did not block its key")
	}
}

// probeConfig: a dry-run route "probe" of one point evaluated before an
// enforced route "x" of two, on the same path.
func probeConfig(algorithm string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 100, Duration: "60s"}
		c.Routes = []config.RouteConfig{
			{Name: "probe", Paths: []string{"/x"}, Points: 1, Duration: "60s", Algorithm: algorithm, DryRun: true},
			{Name: "x", Paths: []string{"/x"}, Points: 2, Duration: "60s"},
		}
	}
}

// TestRefusedRequestSpendsNothingOfADryRunRule: three requests, the third
// refused by x. The probe lets all three through: a fixed window counts the
// first two (the second over its point), a sliding window or a token
// bucket takes only the first, which it holds. The third, refused, changes
// no count, the probe's included: it is given back where it was charged,
// and nothing is taken where it was not.
func TestRefusedRequestSpendsNothingOfADryRunRule(t *testing.T) {
	for _, tc := range []struct {
		algorithm string
		want      int64
	}{{"fixed", 2}, {"sliding", 1}, {"tokenbucket", 1}} {
		h := newHarness(t, probeConfig(tc.algorithm))

		for i, want := range []int{200, 200, 429} {
			if rec := h.get("/x", "203.0.113.1:1"); rec.Code != want {
				t.Fatalf("%s: request %d: %d, want %d", tc.algorithm, i+1, rec.Code, want)
			}
		}

		if w := h.p.routes[0].layer.Entries["203.0.113.1"]; w == nil || w.Count != tc.want {
			t.Errorf("%s: probe window %+v, want count %d", tc.algorithm, w, tc.want)
		}

		if n := strings.Count(h.events.String(), `"limiter":"probe","key":"203.0.113.1","ip":"203.0.113.1","middleware":"`+h.p.name+`","dryRun":true`); n != 1 {
			t.Errorf("%s: probe reported %d times:\n%s", tc.algorithm, n, h.events.String())
		}
	}
}

func TestRefusedRequestSpendsNothingOfADryRunRuleOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	for _, tc := range []struct {
		algorithm string
		read      []string
		want      string
	}{{"fixed", []string{"GET"}, "2"}, {"sliding", []string{"HGET", "", "c"}, "1"}} {
		h, _ := redisHarness(t, addr, with(probeConfig(tc.algorithm), asACLUser))

		for i, want := range []int{200, 200, 429} {
			if rec := h.get("/x", "203.0.113.1:1"); rec.Code != want {
				t.Fatalf("%s: request %d: %d, want %d", tc.algorithm, i+1, rec.Code, want)
			}
		}

		args := append([]string{}, tc.read...)
		key := h.p.routes[0].layer.RedisKey + "203.0.113.1"
		if len(args) == 1 {
			args = append(args, key)
		} else {
			args[1] = key
		}

		if v := redisDo(t, admin, args...).Str; v != tc.want {
			t.Errorf("%s: probe count %q, want %s", tc.algorithm, v, tc.want)
		}

		if !strings.Contains(h.events.String(), `"limiter":"probe"`) || !strings.Contains(h.events.String(), `"dryRun":true`) {
			t.Errorf("%s: events %s", tc.algorithm, h.events.String())
		}
	}
}

// TestTopLevelDryRunEventsSayDryRun: the top-level dryRun reports what it
// would refuse as a dry run, not as refusals.
func TestTopLevelDryRunEventsSayDryRun(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.DryRun = true
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1, Duration: "1s"}
	})

	for i := 0; i < 3; i++ {
		if rec := h.get("/", "203.0.113.1:1"); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, rec.Code)
		}
	}

	if ev := strings.TrimSpace(h.events.String()); strings.Count(ev, "\n") != 0 || !strings.Contains(ev, `"limiter":"ip"`) || !strings.Contains(ev, `"dryRun":true`) {
		t.Errorf("events %q", ev)
	}
}

// TestTopLevelDryRunOnAMixedStoreCountsEveryLayer: with dryRun, a memory
// layer over its points stops nothing, the Redis layers beside it included:
// each of them counts every request.
func TestTopLevelDryRunOnAMixedStoreCountsEveryLayer(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.DryRun = true
		c.Global = config.LayerConfig{Points: 2, Duration: "1h", Store: "memory"}
		c.IP = config.LayerConfig{Points: 100, Duration: "1h"}
	})

	if ok := h.p.stores.mixed; !ok {
		t.Fatalf("store %T, want the mixed store", h.p.stores)
	}

	for i := 1; i <= 5; i++ {
		if rec := h.get("/api", "203.0.113.1:1"); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}

	if n := peekCount(h.p.memory, h.clock.Now().UnixNano(), "global", "global"); n != 5 {
		t.Errorf("global (memory) at %d, want 5", n)
	}

	if n := redisDo(t, admin, "GET", h.p.layers[layerIndex(h, "ip")].RedisKey+"203.0.113.1").Str; n != "5" {
		t.Errorf("ip (Redis) at %q, want 5: the dry run skipped Redis once global was over", n)
	}
}

// A dry-run rule never shows in the client's headers: they show the most
// restrictive rule that enforces. Dry-run rules show only in events, the
// status page and metrics, unless every rule is in dry run.

// probeInDryRun: ip enforced at 5 a minute, a probe route keyed by ip in dry
// run at 2 a minute, global off (redisHarness turns it off too).
func probeInDryRun(c *Config) {
	c.Global.Points = 0
	c.IP = config.LayerConfig{Points: 5, Duration: "60s"}
	c.Routes = []config.RouteConfig{{Name: "probe", Paths: []string{"/probe"}, Points: 2, Duration: "60s", DryRun: true}}
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
