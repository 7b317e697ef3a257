package tierlimit

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/config"
)

// TestNewTurnsAPanicIntoAnErrorNamingTheField: a panic while building the
// middleware (here made by buildHook, for a route, a route's plan or a plan
// called boom) is New's error, naming the middleware and the part of the
// configuration that building alone panics on, never a panic that would
// make Traefik drop every router. A panic that needs several parts names
// none of them; a configuration without the culprit builds.
func TestNewTurnsAPanicIntoAnErrorNamingTheField(t *testing.T) {
	buildHook = func(s *config.Settings) {
		var names []string
		for _, rs := range s.Routes {
			names = append(names, rs.Name)
			for _, p := range rs.Plans {
				names = append(names, p.Name)
			}
		}

		for _, p := range s.Plans {
			names = append(names, p.Name)
		}

		for _, n := range names {
			if n == "boom" || n == "chat.boom" || n == "both" && len(names) > 1 {
				panic("boom in " + n)
			}
		}
	}
	t.Cleanup(func() { buildHook = nil })

	route := func(name string) RouteConfig {
		return RouteConfig{Name: name, Paths: []string{"/" + name}, Points: 5, Duration: "1s"}
	}

	for _, tc := range []struct {
		name string
		set  func(c *Config)
		want string // "" when it builds
	}{
		{"a route", func(c *Config) { c.Routes = []RouteConfig{route("fine"), route("boom")} },
			`configuring mw@test: building routes[1] failed (a bug of the plugin, please report it with this configuration): panic: boom in boom`},
		{"a route's plan", func(c *Config) {
			routePlanConfig(c)
			c.Routes[0].Plans["boom"] = PlanConfig{Points: 5, Duration: "1s"}
		}, `configuring mw@test: building routes[0].plans.boom failed`},
		{"a plan", func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-Auth-User", "X-Auth-Plan"
			c.Plans = map[string]PlanConfig{"boom": {Points: 5, Duration: "1s"}, "pro": {Points: 5, Duration: "1s"}}
		}, `configuring mw@test: building plans.boom failed`},
		{"several parts", func(c *Config) { c.Routes = []RouteConfig{route("both"), route("fine")} },
			`configuring mw@test: building the middleware failed (a bug of the plugin, please report it with this configuration): panic: boom in both`},
		{"no culprit", func(c *Config) { c.Routes = []RouteConfig{route("fine")} }, ""},
	} {
		cfg := CreateConfig()
		tc.set(cfg)

		h, err := New(context.Background(), http.NotFoundHandler(), cfg, "mw@test")
		switch {
		case tc.want == "" && (err != nil || h == nil):
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want) || h != nil):
			t.Errorf("%s: handler %v, error %v; want none and an error starting %s", tc.name, h, err, tc.want)
		case err != nil && errors.Is(err, config.ErrConfig):
			t.Errorf("%s: a panic reads as an invalid configuration: %v", tc.name, err)
		}
	}
}
