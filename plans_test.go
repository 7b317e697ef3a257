package tierlimit

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/config"
)

// planConfig is the principal instance of the example: user 3/60s,
// service 4/60s, plans free 5/60s and pro 20/60s, and open, a plan with
// limiting off.
func planConfig(c *Config) {
	c.Global = config.LayerConfig{Points: 1000, Duration: "60s"}
	c.IP.Points = 0
	c.Assets.Points = 0
	c.User = config.LayerConfig{Points: 3, Duration: "60s"}
	c.Service = config.LayerConfig{Points: 4, Duration: "60s"}
	c.Principal.UserHeader = "X-Auth-User"
	c.Principal.PlanHeader = "X-Auth-Plan"
	c.Plans = map[string]config.PlanConfig{
		"free": {Points: 5, Duration: "60s"},
		"pro":  {Points: 20, Duration: "60s"},
		"open": {Points: 0},
	}
}

func TestPlanConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		set  func(c *Config)
		want string
	}{
		{"negative points", func(c *Config) { c.Plans["pro"] = config.PlanConfig{Points: -1, Duration: "60s"} },
			`plans.pro.points = "-1": must be >= 0`},
		{"bad duration", func(c *Config) { c.Plans["pro"] = config.PlanConfig{Points: 5, Duration: "soon"} },
			`plans.pro.duration = "soon": not a duration`},
		{"no duration", func(c *Config) { c.Plans["pro"] = config.PlanConfig{Points: 5} }, `plans.pro.duration = "": not a duration`},
		{"bad algorithm", func(c *Config) { c.Plans["pro"] = config.PlanConfig{Points: 5, Duration: "1s", Algorithm: "leaky"} },
			`plans.pro.algorithm = "leaky"`},
		{"burst on a window", func(c *Config) { c.Plans["pro"] = config.PlanConfig{Points: 5, Duration: "1s", Burst: 9} },
			`plans.pro.burst = "9": only algorithm "tokenbucket" takes a burst`},
		{"bad name", func(c *Config) { c.Plans["pro plus"] = config.PlanConfig{Points: 5, Duration: "1s"} },
			`plans = "pro plus": a plan's name must be 1-64 characters`},
		{"built-in name", func(c *Config) { c.Plans["user"] = config.PlanConfig{Points: 5, Duration: "1s"} },
			`plans = "user": is the name of a built-in layer`},
		{"connection cap's name", func(c *Config) { c.Plans["websocket"] = config.PlanConfig{Points: 5, Duration: "1s"} },
			`plans = "websocket": is the name of a built-in layer`},
		{"route's name", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "pro", Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		}, `plans = "pro": is the name of a route`},
		{"names differing in case", func(c *Config) { c.Plans["Pro"] = config.PlanConfig{Points: 5, Duration: "1s"} },
			`plans = "pro": differs only in case from another plan`},
		{"plans without a plan header", func(c *Config) { c.Principal.PlanHeader = "" },
			`principal.planHeader = "": plans are set but no header names a principal's plan`},
		{"plan header before ForwardAuth", func(c *Config) { c.Principal.UserHeader = "" },
			`principal.planHeader = "X-Auth-Plan": needs principal.userHeader`},
		{"plan header not a header", func(c *Config) { c.Principal.PlanHeader = "X Plan" },
			`principal.planHeader = "X Plan": not a header name`},
		{"plan header is the user header", func(c *Config) { c.Principal.PlanHeader = "x-auth-user" },
			`principal.planHeader = "x-auth-user": is the principal's or the service-account flag's header`},
		{"maxTracked counts plans", func(c *Config) { c.MaxTracked = 4 },
			`maxTracked = "4": must be at least 5, one counter for each layer that is on (global, user, service, free, pro)`},
		{"unknown key in a plan", func(c *Config) {
			c.Plans["pro"] = config.PlanConfig{Points: 5, Duration: "1s", Unknown: map[string]interface{}{"pointz": "5"}}
		}, `unknown field "plans.pro.pointz" (did you mean "plans.pro.points"?)`},
		{"a plan takes no key", func(c *Config) {
			c.Plans["pro"] = config.PlanConfig{Points: 5, Duration: "1s", Unknown: map[string]interface{}{"key": "host"}}
		}, `unknown field "plans.pro.key"`},
	}

	for _, tc := range cases {
		cfg := CreateConfig()
		planConfig(cfg)
		tc.set(cfg)

		_, err := parse(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, config.ErrConfig) {
			t.Errorf("%s: got %v, want an error with %s", tc.name, err, tc.want)
		}
	}

	cfg := CreateConfig()
	planConfig(cfg)

	if _, err := parse(cfg); err != nil {
		t.Fatalf("the plan configuration: %v", err)
	}

	// Without plans the header is not read, wherever the instance is.
	cfg = CreateConfig()
	cfg.Principal.UserHeader = "X-Auth-User"
	cfg.Principal.PlanHeader = "X-Auth-Plan"

	if s, err := parse(cfg); err != nil || s.PlanHeader != "" {
		t.Fatalf("plan header without plans: %v, planHeader %q", err, s.PlanHeader)
	}
}

// planHarnesses are planConfig on the fast path, the general path and a
// real redis-server.
func planHarnesses(t *testing.T) map[string]*harness {
	fast := newHarness(t, planConfig)
	if fast.p.mode != modePrincipalPlans {
		t.Fatalf("mode %d, want modePrincipalPlans", fast.p.mode)
	}

	general := newHarness(t, planConfig)
	general.p.mode = modeGeneral
	general.h = general.p

	addr, _ := redisServer(t)
	redis, _ := redisHarness(t, addr, planConfig)

	return map[string]*harness{"fast": fast, "general": general, "redis": redis}
}

func principalHeaders(user, plan string) map[string]string {
	h := map[string]string{"X-Auth-User": user}
	if plan != "" {
		h["X-Auth-Plan"] = plan
	}

	return h
}

// spendUntilRefused sends requests for hdr until one is refused (at most limit), and
// returns how many were allowed and the refusal's layer.
func spendUntilRefused(t *testing.T, h *harness, hdr map[string]string, limit int) (int, string) {
	t.Helper()

	for i := 0; i < limit; i++ {
		rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", hdr)
		if rec.Code == http.StatusTooManyRequests {
			return i, refusedLayer(rec)
		}

		if rec.Code != http.StatusOK {
			t.Fatalf("%v: request %d: %d", hdr, i+1, rec.Code)
		}
	}

	return limit, ""
}

// TestPlansReplaceUser: a principal whose plan header names a plan gets
// that plan's budget, in a bucket named after the plan; no plan header or an
// unknown plan is user; a service account stays on service whatever its
// plan header; a plan with points 0 charges global only.
func TestPlansReplaceUser(t *testing.T) {
	for name, h := range planHarnesses(t) {
		rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", principalHeaders("alice", "pro"))
		if rec.Header().Get("RateLimit-Policy") != `"pro";q=20;w=60` || rec.Header().Get("RateLimit") != `"pro";r=19;t=60` {
			t.Fatalf("%s: pro's headers: %v", name, rec.Header())
		}

		for _, tc := range []struct {
			user, plan string
			allowed    int
			layer      string
		}{
			{"alice", "pro", 19, "pro"},
			{"bob", "free", 5, "free"},
			{"carol", "gold", 3, "user"},
			{"dan", "", 3, "user"},
			{"erin", "PRO", 3, "user"}, // names are exact
			{"batch-pro", "pro", 0, ""},
		} {
			hdr := principalHeaders(tc.user, tc.plan)
			if tc.user == "batch-pro" {
				hdr["X-Auth-Service-Account"] = "true"
				tc.allowed, tc.layer = 4, "service"
			}

			if n, layer := spendUntilRefused(t, h, hdr, 30); n != tc.allowed || layer != tc.layer {
				t.Errorf("%s: %s with plan %q: %d allowed, then refused by %q; want %d, then %q", name, tc.user, tc.plan, n, layer, tc.allowed, tc.layer)
			}
		}

		// Limiting off for open: global only, and user's bucket untouched.
		if n, _ := spendUntilRefused(t, h, principalHeaders("frank", "open"), 30); n != 30 {
			t.Errorf("%s: frank on open: refused after %d", name, n)
		}

		rec = h.do(http.MethodGet, "/api", "10.0.0.1:1", principalHeaders("frank", "open"))
		if got := rec.Header().Get("RateLimit-Policy"); got != `"global";q=1000;w=60` {
			t.Errorf("%s: open's policy %q, want global's", name, got)
		}

		if n, layer := spendUntilRefused(t, h, principalHeaders("frank", ""), 30); n != 3 || layer != "user" {
			t.Errorf("%s: frank without a plan: %d allowed, then %q", name, n, layer)
		}

		if !strings.Contains(h.events.String(), `"limiter":"free"`) || !strings.Contains(h.events.String(), `"limiter":"pro"`) {
			t.Errorf("%s: events name no plan: %s", name, h.events.String())
		}

		if got := layerNames(h.p.layers); got != "global,user,service,free,pro" {
			t.Errorf("%s: layers %s", name, got)
		}
	}
}

// TestPlanChangeMidWindow: a principal whose plan changes is counted in the
// new plan's bucket from its next request; its old plan's count stays.
func TestPlanChangeMidWindow(t *testing.T) {
	for name, h := range planHarnesses(t) {
		left := func(plan string) string {
			rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", principalHeaders("alice", plan))
			return rec.Header().Get("RateLimit")
		}

		for i := 0; i < 3; i++ {
			left("pro")
		}

		for _, step := range []struct{ plan, want string }{
			{"free", `"free";r=4;t=60`},
			{"free", `"free";r=3;t=60`},
			{"pro", `"pro";r=16;t=60`},
			{"", `"user";r=2;t=60`},
			{"pro", `"pro";r=15;t=60`},
		} {
			if got := left(step.plan); got != step.want {
				t.Errorf("%s: alice on %q: RateLimit %q, want %q", name, step.plan, got, step.want)
			}
		}
	}
}

// TestPlanKeysInRedis: a plan's bucket is <keyPrefix>:<middleware>:<plan>:<principal>.
func TestPlanKeysInRedis(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, planConfig)

	for i := 0; i < 2; i++ {
		h.do(http.MethodGet, "/api", "10.0.0.1:1", principalHeaders("alice", "pro"))
	}

	key := "ratelimit:" + h.p.name + ":pro:alice"
	if v := redisDo(t, admin, "GET", key); v.Str != "2" {
		t.Fatalf("GET %s: %q, want 2", key, v.Str)
	}

	if v := redisDo(t, admin, "EXISTS", "ratelimit:"+h.p.name+":user:alice"); v.Int != 0 {
		t.Fatalf("alice on pro was charged to user too: %v", v)
	}
}

// TestPlanIsLayerOnStatusAndMetrics: the status page and the metrics list a
// plan under its name.
func TestPlanIsLayerOnStatusAndMetrics(t *testing.T) {
	h := newHarness(t, with(planConfig, func(c *Config) { c.Status.Path = "/_tierlimit" }))

	for i := 0; i < 6; i++ {
		h.do(http.MethodGet, "/api", "10.0.0.1:1", principalHeaders("bob", "free"))
	}

	for _, target := range []string{"/_tierlimit", "/_tierlimit/metrics"} {
		rec := h.get(target, "127.0.0.1:1")
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "free") || !strings.Contains(rec.Body.String(), "pro") {
			t.Errorf("%s: %d %s", target, rec.Code, rec.Body.String())
		}
	}

	metrics := h.get("/_tierlimit/metrics", "127.0.0.1:1").Body.String()
	if !strings.Contains(metrics, `layer="free"`) {
		t.Errorf("metrics have no free layer:\n%s", metrics)
	}

}

// TestLowerCasePlanHeaderFindsThePlan: header names are case-insensitive, so
// principal.planHeader "x-auth-plan" reads the X-Auth-Plan header a request
// carries, on the fast path and the general path.
func TestLowerCasePlanHeaderFindsThePlan(t *testing.T) {
	lower := func(c *Config) {
		planConfig(c)
		c.Principal.PlanHeader = "x-auth-plan"
	}

	general := newHarness(t, lower)
	general.p.mode = modeGeneral
	general.h = general.p

	for _, tc := range []struct {
		name string
		h    *harness
	}{{"fast", newHarness(t, lower)}, {"general", general}} {
		if n, layer := spendUntilRefused(t, tc.h, principalHeaders("bob", "free"), 30); n != 5 || layer != "free" {
			t.Errorf("%s: bob on free: %d allowed, then refused by %q; want 5, then free", tc.name, n, layer)
		}
	}
}

// routePlanConfig: a chat route of 2 requests a minute per API key, 5 for
// principals on the pro plan (routes[].plans), after ForwardAuth.
func routePlanConfig(c *Config) {
	c.Global.Points = 0
	c.User = config.LayerConfig{Points: 100, Duration: "60s"}
	c.Principal.UserHeader = "X-Auth-User"
	c.Principal.PlanHeader = "X-Auth-Plan"
	c.Routes = []config.RouteConfig{{
		Name: "chat", Paths: []string{"/v1/chat"}, Key: "header:X-Api-Key", Points: 2, Duration: "60s",
		Plans: map[string]config.PlanConfig{"pro": {Points: 5, Duration: "60s"}},
	}}
}

// chatsAllowed sends chat requests of the principal user on plan (none:
// "") with API key key until one is refused, and returns how many were
// allowed and the refusal's layer.
func chatsAllowed(t *testing.T, h *harness, user, plan, key string) (int, string) {
	t.Helper()

	hdr := map[string]string{"X-Api-Key": key}
	if user != "" {
		hdr["X-Auth-User"] = user
	}

	if plan != "" {
		hdr["X-Auth-Plan"] = plan
	}

	for i := 0; i < 20; i++ {
		rec := h.do(http.MethodPost, "/v1/chat", "10.0.0.1:1", hdr)
		if rec.Code == http.StatusTooManyRequests {
			return i, refusedLayer(rec)
		}

		if rec.Code != http.StatusOK {
			t.Fatalf("chat %d: %d", i+1, rec.Code)
		}
	}

	return 20, ""
}

// TestRoutePlansGiveAPlanItsBudget: a pro principal gets the route's pro
// window (its own layer, chat.pro), a principal on another plan or none the
// route's own, keyed as the route is; a request without a principal that
// sends a plan header gets the route's own: the header is the auth
// server's only for its principals. In memory and on a real redis-server.
func TestRoutePlansGiveAPlanItsBudget(t *testing.T) {
	addr, _ := redisServer(t)
	redis, _ := redisHarness(t, addr, routePlanConfig)

	for name, h := range map[string]*harness{"memory": newHarness(t, routePlanConfig), "redis": redis} {
		for _, tc := range []struct {
			user, plan, key string
			allowed         int
			layer           string
		}{
			{"ann", "pro", "key-a", 5, "chat.pro"},
			{"bob", "free", "key-b", 2, "chat"},
			{"cid", "", "key-c", 2, "chat"},
			{"", "pro", "key-d", 2, "chat"},
		} {
			if n, layer := chatsAllowed(t, h, tc.user, tc.plan, tc.key); n != tc.allowed || layer != tc.layer {
				t.Errorf("%s: %q on plan %q: %d allowed, refused by %q; want %d and %q", name, tc.user, tc.plan, n, layer, tc.allowed, tc.layer)
			}
		}
	}
}

func TestRoutePlanConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(c *Config)
		want string
	}{
		{"no plan header", func(c *Config) { c.Principal.PlanHeader = "" },
			`principal.planHeader = "": routes[0].plans is set but no header names a principal's plan`},
		{"bad plan name", func(c *Config) { c.Routes[0].Plans["pro plus"] = config.PlanConfig{Points: 5, Duration: "60s"} },
			`routes[0].plans = "pro plus": a plan's name must be`},
		{"bad duration", func(c *Config) { c.Routes[0].Plans["pro"] = config.PlanConfig{Points: 5, Duration: "soon"} },
			`routes[0].plans.pro.duration = "soon": not a duration`},
		{"below the route's cost", func(c *Config) {
			c.Routes[0].Cost = 3
			c.Routes[0].Plans["pro"] = config.PlanConfig{Points: 2, Duration: "60s"}
			c.Routes[0].Points = 10
		}, `routes[0].plans.pro.points = "2": holds less than the route's cost, 3`},
		{"a route's name", func(c *Config) {
			c.Routes = append(c.Routes, config.RouteConfig{Name: "chat.pro", Paths: []string{"/x"}, Points: 1, Duration: "1s"})
		}, `routes[0].plans = "chat.pro": is the name of a route`},
		{"a sliding plan with syncInterval", func(c *Config) {
			c.Store = "redis"
			c.Redis.Address = "127.0.0.1:6379"
			c.Redis.SyncInterval = "100ms"
			c.Routes[0].Plans["pro"] = config.PlanConfig{Points: 5, Duration: "60s", Algorithm: "sliding"}
		}, `redis.syncInterval = "100ms"`},
		{"a plan on a route that is off", func(c *Config) { c.Routes[0].Points = 0 },
			`routes[0].plans.pro.points = "5": is ignored on a route with points 0 (off), which matches nothing`},
		{"unknown key", func(c *Config) {
			c.Routes[0].Plans["pro"] = config.PlanConfig{Points: 5, Duration: "60s", Unknown: map[string]interface{}{"pointz": 5}}
		}, `unknown field "routes[0].plans.pro.pointz"`},
	} {
		cfg := CreateConfig()
		routePlanConfig(cfg)
		tc.set(cfg)

		_, err := parse(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, config.ErrConfig) {
			t.Errorf("%s: got %v, want an error with %s", tc.name, err, tc.want)
		}
	}
}

// TestARoutePlanOfPointsZeroHasNoLimitOnTheRoute: points 0 on a route's
// plan means that plan has no limit on the route, as points 0 turns off
// every other layer: its principals are charged nothing in the route's
// layer (the other layers charge them as before), whether the route charges
// up front, counts statuses or reads its cost from the response, in memory,
// exact Redis and synced Redis; no header, status page or metric shows an
// off plan's layer. Before, New panicked on it (a nil layer, build.go) and
// Traefik dropped every router with it.
func TestARoutePlanOfPointsZeroHasNoLimitOnTheRoute(t *testing.T) {
	addr, _ := redisServer(t)

	for _, shape := range []struct {
		name string
		set  func(rc *config.RouteConfig)
	}{
		{"up front", func(rc *config.RouteConfig) {}},
		{"countStatus", func(rc *config.RouteConfig) { rc.CountStatus = []int{200} }},
		{"costFrom", func(rc *config.RouteConfig) { rc.CostFrom = "header:X-Usage" }},
	} {
		mutate := func(c *Config) {
			routePlanConfig(c)
			c.Status.Path = "/_rl"
			shape.set(&c.Routes[0])
			c.Routes[0].Plans["free"] = config.PlanConfig{Points: 0}
		}

		redis, _ := redisHarness(t, addr, mutate)
		synced, _, _ := syncHarness(t, addr, mutate)

		for store, h := range map[string]*harness{"memory": newHarness(t, mutate), "redis": redis, "synced": synced} {
			name := shape.name + ", " + store
			h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
				rw.Header().Set("X-Usage", "1")
				_, _ = rw.Write([]byte("ok"))
			})

			hdr := map[string]string{"X-Api-Key": "key-f", "X-Auth-User": "fay", "X-Auth-Plan": "free"}
			for i := 0; i < 20; i++ {
				rec := h.do(http.MethodPost, "/v1/chat", "10.0.0.1:1", hdr)
				if rec.Code != http.StatusOK {
					t.Fatalf("%s: free request %d: %d, want 200 (no limit on the route)", name, i+1, rec.Code)
				}

				if got := rec.Header().Get("RateLimit-Policy") + rec.Header().Get("RateLimit"); strings.Contains(got, "chat") {
					t.Fatalf("%s: free request %d shows the route: %s", name, i+1, got)
				}
			}

			// user (100 a minute) still charges them.
			if rec := h.do(http.MethodGet, "/other", "10.0.0.1:1", hdr); rec.Header().Get("X-RateLimit-Remaining") != "79" {
				t.Errorf("%s: user after 20 free chats: remaining %q, want 79", name, rec.Header().Get("X-RateLimit-Remaining"))
			}

			if n, layer := chatsAllowed(t, h, "bob", "", "key-b"); n != 2 || layer != "chat" {
				t.Errorf("%s: a principal without a plan: %d allowed, refused by %q; want 2 and chat", name, n, layer)
			}

			for _, l := range h.status("/_rl").Layers {
				if strings.HasPrefix(l.Name, "chat.free") {
					t.Errorf("%s: the status page shows the off plan's layer %q", name, l.Name)
				}
			}

			if rec := h.get("/_rl/metrics", local); strings.Contains(rec.Body.String(), "chat.free") {
				t.Errorf("%s: the metrics show the off plan's layer", name)
			}
		}
	}
}
