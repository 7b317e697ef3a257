// Package configdecode loads the plugin with Traefik's own loader (pkg/plugins,
// Yaegi, mapstructure) in process and hands it configurations shaped the way
// each provider shapes them: the file provider's strings, Docker labels through
// Traefik's label parser, and a Kubernetes CRD's JSON types.
package configdecode

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/traefik/traefik/v3/pkg/config/label"
	"github.com/traefik/traefik/v3/pkg/plugins"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

var builder *plugins.Builder

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tierlimit-configdecode-")
	if err != nil {
		panic(err)
	}

	code := func() int {
		defer os.RemoveAll(dir)

		if err := harness.CopyPlugin(filepath.Join(dir, "plugins-local")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}

		// Traefik's loader reads ./plugins-local relative to the working
		// directory, while it loads the plugin; the tests read testdata.
		wd, err := os.Getwd()
		if err == nil {
			err = os.Chdir(dir)
		}

		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}

		builder, err = plugins.NewBuilder(nil, nil, map[string]plugins.LocalDescriptor{
			"tierlimit": {ModuleName: harness.ModuleName},
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "loading the plugin with Traefik's loader:", err)
			return 1
		}

		if err := os.Chdir(wd); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}

		return m.Run()
	}()

	os.Exit(code)
}

// newError builds the middleware from a provider-shaped configuration and
// returns New's error ("" when it builds).
func newError(t *testing.T, config map[string]any) string {
	t.Helper()

	ctor, err := builder.Build("tierlimit", config, "configdecode@test")
	if err != nil {
		return err.Error()
	}

	if _, err := ctor(context.Background(), http.NotFoundHandler()); err != nil {
		return err.Error()
	}

	return ""
}

// withPlans is a principal instance with a plan header and plans.
func withPlans(plans map[string]any) map[string]any {
	return map[string]any{"principal": map[string]any{"userHeader": "X-Auth-User", "planHeader": "X-Auth-Plan"}, "plans": plans}
}

func TestUnknownKeysFromEveryProvider(t *testing.T) {
	fromLabels := func(labels map[string]string) map[string]any {
		conf, err := label.DecodeConfiguration(labels)
		if err != nil {
			t.Fatalf("Traefik cannot decode the labels: %v", err)
		}

		return conf.HTTP.Middlewares["rl"].Plugin["tierlimit"]
	}

	const lbl = "traefik.http.middlewares.rl.plugin.tierlimit."

	cases := []struct {
		provider string
		config   map[string]any
		want     string
	}{
		{"file", map[string]any{"ipp": map[string]any{"points": "5"}}, `unknown field "ipp" (did you mean "ip"?)`},
		{"file", map[string]any{"ip": map[string]any{"point": "5", "duration": "1s"}}, `unknown field "ip.point" (did you mean "ip.points"?)`},
		{"file", map[string]any{"redis": map[string]any{"adress": "redis:6379"}}, `unknown field "redis.adress" (did you mean "redis.address"?)`},
		{"file", map[string]any{"routes": []any{map[string]any{"name": "a", "paths": []any{"/a"}, "points": "1", "duration": "1s", "method": "POST"}}},
			`unknown field "routes[0].method" (did you mean "routes[0].methods"?)`},
		{"labels", fromLabels(map[string]string{lbl + "ipp.points": "5"}), `unknown field "ipp" (did you mean "ip"?)`},
		{"labels", fromLabels(map[string]string{lbl + "ip.point": "5", lbl + "ip.duration": "1s"}), `unknown field "ip.point" (did you mean "ip.points"?)`},
		{"labels", fromLabels(map[string]string{lbl + "principal.credentialheader": "Authorization"}),
			`unknown field "principal.credentialheader" (did you mean "principal.credentialHeaders"?)`},
		{"crd", map[string]any{"ip": map[string]any{"points": float64(5), "duration": "1s"}, "dryrun": true, "maxTracked": float64(10), "maxTraked": float64(10)},
			`unknown field "maxTraked" (did you mean "maxTracked"?)`},
		{"crd", map[string]any{"websocket": map[string]any{"maxConnectionPerIP": float64(3)}},
			`unknown field "websocket.maxConnectionPerIP" (did you mean "websocket.maxConnectionsPerIP"?)`},
		{"file", withPlans(map[string]any{"pro": map[string]any{"pointz": "5", "duration": "1s"}}),
			`unknown field "plans.pro.pointz" (did you mean "plans.pro.points"?)`},
		{"labels", fromLabels(map[string]string{lbl + "principal.userheader": "X-Auth-User", lbl + "principal.planheader": "X-Auth-Plan",
			lbl + "plans.pro.point": "5", lbl + "plans.pro.duration": "1s"}), `unknown field "plans.pro.point" (did you mean "plans.pro.points"?)`},
		{"crd", withPlans(map[string]any{"pro": map[string]any{"points": float64(5), "duration": "1s", "key": "host"}}),
			`unknown field "plans.pro.key"`},
	}

	for _, c := range cases {
		if got := newError(t, c.config); !strings.Contains(got, "invalid configuration: "+c.want) {
			t.Errorf("%s %v: error %q, want one with %s", c.provider, c.config, got, c.want)
		}
	}

	// The same shapes without the typo build.
	for _, good := range []map[string]any{
		{"status": map[string]any{"path": "/_edge"}, "principal": map[string]any{"userHeader": "X-Auth-User", "credentialCookies": "session"}},
		{"global": map[string]any{"points": "0"}, "principal": map[string]any{"userHeader": "X-Auth-User"}},
		fromLabels(map[string]string{lbl + "ip.points": "5", lbl + "principal.credentialheaders": "Authorization,Cookie"}),
		{"ip": map[string]any{"points": float64(5), "duration": "1s"}, "dryrun": true, "routes": []any{map[string]any{"name": "a", "paths": []any{"/a"}, "points": float64(1), "duration": "1s"}}},
		withPlans(map[string]any{"pro": map[string]any{"points": "5", "duration": "1s"}, "free": map[string]any{"points": float64(0)}}),
		fromLabels(map[string]string{lbl + "principal.userheader": "X-Auth-User", lbl + "principal.planheader": "X-Auth-Plan",
			lbl + "plans.pro.points": "5", lbl + "plans.pro.duration": "1s", lbl + "plans.free.points": "0"}),
		// dryRun on a layer, the assets, a route and a plan.
		withPlans(map[string]any{"pro": map[string]any{"points": "5", "duration": "1s", "dryRun": "true"}}),
		{"ip": map[string]any{"points": float64(5), "duration": "1s", "dryRun": true}, "assets": map[string]any{"dryRun": true},
			"routes": []any{map[string]any{"name": "a", "paths": []any{"/a"}, "points": float64(1), "duration": "1s", "dryRun": true}}},
		fromLabels(map[string]string{lbl + "ip.points": "5", lbl + "ip.dryrun": "true", lbl + "global.dryRun": "true"}),
	} {
		if got := newError(t, good); got != "" {
			t.Errorf("%v: %s", good, got)
		}
	}
}
