package tierlimit

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/tierlimit/tierlimit/config"
)

// New's last line of defence: a configuration that validation accepts and
// building then trips on is a bug of ours, found by e2e/configfuzz. Where
// Traefik would drop every router with a panic, New returns this error.

// buildHook, when set, runs before build: tests make build panic with it.
var buildHook func(s *config.Settings)

// panicError is the error of a panic r in New: the middleware, the part of
// the configuration that building alone panics on (panicField) when cfg was
// parsed, and the panic itself.
func panicError(ctx context.Context, name string, cfg *config.Settings, r interface{}) error {
	where := "validating the configuration"
	if cfg != nil {
		where = "building the middleware"
		if field := panicField(ctx, cfg, name); field != "" {
			where = "building " + field
		}
	}

	return fmt.Errorf("configuring %s: %s failed (a bug of the plugin, please report it with this configuration): panic: %v", name, where, r)
}

// panicField names the route, route plan, plan or built-in layer that makes
// build panic when it is the only one configured; "" when none does (the
// panic needs several of them). Each try is built under another name, in a
// context already done, so that it holds no counters of name.
func panicField(ctx context.Context, s *config.Settings, name string) string {
	probe, cancel := context.WithCancel(ctx)
	cancel()

	for i, rs := range s.Routes {
		t := config.Alone(s)
		t.Routes = []config.Route{rs}
		if !buildPanics(probe, t, name) {
			continue
		}

		field := "routes[" + strconv.Itoa(i) + "]"
		for _, plan := range rs.Plans {
			one := rs
			one.Plans = []config.Rule{plan}
			t.Routes = []config.Route{one}
			if buildPanics(probe, t, name) {
				return field + ".plans." + strings.TrimPrefix(plan.Name, rs.Name+".") // config.RoutePlanName
			}
		}

		return field
	}

	for _, plan := range s.Plans {
		t := config.Alone(s)
		t.Plans = []config.Rule{plan}
		if buildPanics(probe, t, name) {
			return "plans." + plan.Name
		}
	}

	for i, rule := range s.Builtin {
		t := config.Alone(s)
		t.Builtin[i] = rule
		if buildPanics(probe, t, name) {
			return rule.Name
		}
	}

	return ""
}

// buildPanics reports whether building s panics.
func buildPanics(ctx context.Context, s *config.Settings, name string) (panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()

	if buildHook != nil {
		buildHook(s)
	}

	build(ctx, s, http.NotFoundHandler(), name+"#probe")

	return false
}
