package e2e

import (
	"strings"
	"testing"

	"github.com/traefik/traefik/v3/pkg/config/label"
)

// TestDockerLabelsDecodeToTheFileChain decodes examples/docker/labels.yml with
// Traefik's own label parser (what the docker provider runs) and compares the
// plugin settings it hands the plugin with the file example's.
func TestDockerLabelsDecodeToTheFileChain(t *testing.T) {
	labels := map[string]string{}

	for _, l := range readYAML(t, "examples/docker/labels.yml")[0]["labels"].([]interface{}) {
		k, v, _ := strings.Cut(l.(string), "=")
		labels[k] = v
	}

	conf, err := label.DecodeConfiguration(labels)
	if err != nil {
		t.Fatalf("Traefik cannot decode the labels: %v", err)
	}

	got := map[string]string{}

	for _, name := range []string{"ratelimit-edge", "ratelimit-principal"} {
		mw := conf.HTTP.Middlewares[name]
		if mw == nil || mw.Plugin == nil {
			t.Fatalf("labels define no plugin middleware %s", name)
		}

		flatten("middlewares."+name+".plugin.tierlimit", map[string]interface{}(mw.Plugin["tierlimit"]), got)
	}

	want := fileChain(t)
	for k := range want {
		if !strings.HasPrefix(k, "middlewares.ratelimit-") {
			delete(want, k)
		}
	}

	if diff := diffSettings(want, got); diff != "" {
		t.Fatalf("the plugin settings Traefik decodes from the labels differ from the file example:\n%s", diff)
	}

	auth := conf.HTTP.Middlewares["auth"]
	if auth == nil || auth.ForwardAuth == nil || strings.Join(auth.ForwardAuth.AuthResponseHeaders, ",") != "X-Auth-User,X-Auth-Service-Account,X-Auth-Plan" {
		t.Fatalf("forwardAuth from labels: %+v", auth)
	}

	if r := conf.HTTP.Routers["api"]; r == nil || strings.Join(r.Middlewares, ",") != "ratelimit-edge,auth,ratelimit-principal" {
		t.Fatalf("router from labels: %+v", r)
	}
}
