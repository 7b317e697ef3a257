package tierlimit

import (
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The status page and the metrics list only the layers an instance can
// charge: not user and service at an edge (no principal.userHeader), not
// service without its flag's header, not assets without asset paths, not a
// layer with points 0.

// metricLayers is the layers of tierlimit_requests_total in a metrics page.
func metricLayers(t *testing.T, h *harness) string {
	t.Helper()

	rec := h.get("/_rl/metrics", local)
	if rec.Code != http.StatusOK {
		t.Fatalf("metrics: %d %s", rec.Code, rec.Body)
	}

	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`tierlimit_requests_total\{[^}]*layer="([^"]*)"`).FindAllStringSubmatch(rec.Body.String(), -1) {
		seen[m[1]] = true
	}

	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}

	sort.Strings(names)

	return strings.Join(names, ",")
}

func TestStatusListsOnlyLayersTheInstanceCharges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		want   string // the layers, sorted
	}{
		{"edge", func(c *Config) {}, "assets,global,ip"},
		{"edge without asset paths", func(c *Config) { c.Assets.PathPrefixes = []string{} }, "global,ip"},
		{"edge with ip off", func(c *Config) { c.IP.Points = 0 }, "assets,global"},
		{"edge with a route", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 5, Duration: "60s"}}
		}, "assets,global,ip,login"},
		{"after ForwardAuth", func(c *Config) {
			c.Global.Points, c.IP.Points, c.Assets.Points = 0, 0, 0
			c.Principal.UserHeader = "X-Auth-User"
		}, "service,user"},
		{"after ForwardAuth, no service accounts", func(c *Config) {
			c.Global.Points, c.IP.Points, c.Assets.Points = 0, 0, 0
			c.Principal.UserHeader = "X-Auth-User"
			c.Principal.ServiceAccountHeader = ""
		}, "user"},
		{"after ForwardAuth, with plans", func(c *Config) {
			c.Global.Points, c.IP.Points, c.Assets.Points, c.Service.Points = 0, 0, 0, 0
			c.Principal.UserHeader = "X-Auth-User"
			c.Principal.PlanHeader = "X-Auth-Plan"
			c.Plans = map[string]PlanConfig{"pro": {Points: 10, Duration: "60s"}, "free": {Points: 0}}
		}, "pro,user"},
	} {
		h := newHarness(t, func(c *Config) {
			c.Status.Path = "/_rl"
			tc.mutate(c)
		})

		var names []string
		for _, l := range h.status("/_rl").Layers {
			names = append(names, l.Name)
		}

		sort.Strings(names)

		if got := strings.Join(names, ","); got != tc.want {
			t.Errorf("%s: status page lists %q, want %q", tc.name, got, tc.want)
		}

		if got := metricLayers(t, h); got != tc.want {
			t.Errorf("%s: metrics list %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A layer the edge never charges is no layer of it: a reset of it is a
// 400 naming it, as for any unknown layer.
func TestResetOfALayerTheEdgeNeverChargesIsUnknown(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Status.Path = "/_rl" })

	rec := h.do(http.MethodPost, "/_rl/reset?layer=user&key=alice", local, nil)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "user") {
		t.Errorf("reset of user at the edge: %d %s, want a 400 naming the layer", rec.Code, rec.Body)
	}
}
