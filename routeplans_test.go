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
