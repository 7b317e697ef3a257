package tierlimit

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/config"
)

// routePlanConfig: a chat route of 2 requests a minute per API key, 5 for
// principals on the pro plan (routes[].plans), after ForwardAuth.
func routePlanConfig(c *Config) {
	c.Global.Points = 0
	c.User = LayerConfig{Points: 100, Duration: "60s"}
	c.Principal.UserHeader = "X-Auth-User"
	c.Principal.PlanHeader = "X-Auth-Plan"
	c.Routes = []RouteConfig{{
		Name: "chat", Paths: []string{"/v1/chat"}, Key: "header:X-Api-Key", Points: 2, Duration: "60s",
		Plans: map[string]PlanConfig{"pro": {Points: 5, Duration: "60s"}},
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
		{"bad plan name", func(c *Config) { c.Routes[0].Plans["pro plus"] = PlanConfig{Points: 5, Duration: "60s"} },
			`routes[0].plans = "pro plus": a plan's name must be`},
		{"bad duration", func(c *Config) { c.Routes[0].Plans["pro"] = PlanConfig{Points: 5, Duration: "soon"} },
			`routes[0].plans.pro.duration = "soon": not a duration`},
		{"below the route's cost", func(c *Config) {
			c.Routes[0].Cost = 3
			c.Routes[0].Plans["pro"] = PlanConfig{Points: 2, Duration: "60s"}
			c.Routes[0].Points = 10
		}, `routes[0].plans.pro.points = "2": holds less than the route's cost, 3`},
		{"a route's name", func(c *Config) {
			c.Routes = append(c.Routes, RouteConfig{Name: "chat.pro", Paths: []string{"/x"}, Points: 1, Duration: "1s"})
		}, `routes[0].plans = "chat.pro": is the name of a route`},
		{"a sliding plan with syncInterval", func(c *Config) {
			c.Store = "redis"
			c.Redis.Address = "127.0.0.1:6379"
			c.Redis.SyncInterval = "100ms"
			c.Routes[0].Plans["pro"] = PlanConfig{Points: 5, Duration: "60s", Algorithm: "sliding"}
		}, `redis.syncInterval = "100ms"`},
		{"a plan on a route that is off", func(c *Config) { c.Routes[0].Points = 0 },
			`routes[0].plans.pro.points = "5": is ignored on a route with points 0 (off), which matches nothing`},
		{"unknown key", func(c *Config) {
			c.Routes[0].Plans["pro"] = PlanConfig{Points: 5, Duration: "60s", Unknown: map[string]interface{}{"pointz": 5}}
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
		set  func(rc *RouteConfig)
	}{
		{"up front", func(rc *RouteConfig) {}},
		{"countStatus", func(rc *RouteConfig) { rc.CountStatus = []int{200} }},
		{"costFrom", func(rc *RouteConfig) { rc.CostFrom = "header:X-Usage" }},
	} {
		mutate := func(c *Config) {
			routePlanConfig(c)
			c.Status.Path = "/_rl"
			shape.set(&c.Routes[0])
			c.Routes[0].Plans["free"] = PlanConfig{Points: 0}
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
