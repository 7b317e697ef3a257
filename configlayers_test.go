package tierlimit

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
)

func layerNames(layers []*layer) string {
	names := make([]string, 0, len(layers))
	for _, l := range layers {
		names = append(names, l.Name)
	}

	return strings.Join(names, ",")
}

// TestPlansFollowTheCatalogue: the plans drawn up from the catalogue's
// classes are the layers each kind of request is charged, in evaluation
// order, with the layers that are off left out; every plan and route
// charges requestCost.
func TestPlansFollowTheCatalogue(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   map[string]string
	}{
		{"defaults", func(c *Config) {}, map[string]string{
			"ip": "global,ip", "assets": "global,assets", "user": "global,user", "service": "global,service",
			"cred": "global", "invalid": "ip", "exempt": "global", "layers": "global,ip,assets,user,service,login",
		}},
		{"global and assets off", func(c *Config) { c.Global.Points = 0; c.Assets.Points = 0 }, map[string]string{
			"ip": "ip", "assets": "", "user": "user", "service": "service",
			"cred": "", "invalid": "ip", "exempt": "", "layers": "ip,user,service,login",
		}},
		{"ip off", func(c *Config) { c.IP.Points = 0 }, map[string]string{
			"ip": "global", "assets": "global,assets", "user": "global,user", "service": "global,service",
			"cred": "global", "invalid": "", "exempt": "global", "layers": "global,assets,user,service,login",
		}},
	}

	for _, tc := range cases {
		cfg := CreateConfig()
		cfg.Exempt.IPs = []string{"203.0.113.7"}
		cfg.Principal.UserHeader = "X-Auth-User" // else user and service are never charged (neverCharged)
		cfg.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 3, Duration: "1m"}}
		tc.mutate(cfg)

		s, err := parse(cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}

		p := build(context.Background(), s, http.NotFoundHandler(), "plans-"+strings.ReplaceAll(tc.name, " ", "-")+"@test")

		got := map[string]string{
			"ip": layerNames(p.planIP), "assets": layerNames(p.planAssets), "user": layerNames(p.planUser),
			"service": layerNames(p.planService), "cred": layerNames(p.planCred), "invalid": layerNames(p.planInvalid),
			"exempt": layerNames(p.exempt.plan), "layers": layerNames(p.layers),
		}

		for plan, want := range tc.want {
			if got[plan] != want {
				t.Errorf("%s: plan %s charges %q, want %q", tc.name, plan, got[plan], want)
			}
		}

		if len(p.routes) != 1 {
			t.Fatalf("%s: %d routes, want 1", tc.name, len(p.routes))
		}

		if p.planCost != requestCost || p.routes[0].cost != requestCost || requestCost != 1 {
			t.Errorf("%s: plans cost %d, route cost %d, want 1 each", tc.name, p.planCost, p.routes[0].cost)
		}
	}
}

// TestCatalogueDrivesDefaultsAndKeys: CreateConfig's layer defaults are the
// catalogue's, every built-in name is reserved for routes, and only the
// layers whose row takes a key accept one.
func TestCatalogueDrivesDefaultsAndKeys(t *testing.T) {
	s, err := parse(CreateConfig())
	if err != nil {
		t.Fatal(err)
	}

	for i, row := range builtinLayers {
		spec := s.Builtin[i]
		if spec.Name != row.Name || spec.Points != int64(row.Points) || spec.Duration != mustDuration(t, row.Duration) {
			t.Errorf("%s: parsed %+v from the defaults, want %d/%s", row.Name, spec, row.Points, row.Duration)
		}

		if !config.IsBuiltinName(row.Name) {
			t.Errorf("%s: not reserved for routes", row.Name)
		}

		cfg := CreateConfig()
		cfg.Routes = []RouteConfig{{Name: row.Name, Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		if _, err := parse(cfg); err == nil || !strings.Contains(err.Error(), "is the name of a built-in layer") {
			t.Errorf("route named %s: %v", row.Name, err)
		}
	}

	for _, row := range builtinLayers {
		cfg := CreateConfig()
		lcKey(cfg, row.Name, "header:X-Api-Key")

		_, err := parse(cfg)
		if config.TakesKey(row.Builtin, keyHeader) != (err == nil) {
			t.Errorf("%s.key header:X-Api-Key: %v, row takes %v", row.Name, err, row.Keys)
		}
	}
}

func mustDuration(t *testing.T, raw string) time.Duration {
	t.Helper()

	d, err := config.ParseDuration(raw)
	if err != nil {
		t.Fatal(err)
	}

	return d
}

// lcKey sets the key of the built-in layer called name.
func lcKey(c *Config, name, key string) {
	switch name {
	case layerGlobal:
		c.Global.Key = key
	case layerIP:
		c.IP.Key = key
	case layerAssets:
		c.Assets.Key = key
	case layerUser:
		c.User.Key = key
	case layerService:
		c.Service.Key = key
	}
}
