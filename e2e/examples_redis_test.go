package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/mitchellh/mapstructure"

	"github.com/tierlimit/tierlimit"
)

// resolveSecrets replaces "urn:k8s:secret:<name>:<key>" strings as Traefik's
// CRD provider does (loadSecretKeys: nested maps and lists).
func resolveSecrets(t *testing.T, v interface{}, secrets map[string]map[string]string) interface{} {
	switch x := v.(type) {
	case string:
		if !strings.HasPrefix(x, "urn:k8s:secret:") {
			return x
		}

		parts := strings.Split(x, ":")
		if len(parts) != 5 {
			t.Fatalf("malformed secret URN %q", x)
		}

		val, ok := secrets[parts[3]][parts[4]]
		if !ok {
			t.Fatalf("%s: no such secret key in the example", x)
		}

		return val
	case []interface{}:
		for i := range x {
			x[i] = resolveSecrets(t, x[i], secrets)
		}
	case map[string]interface{}:
		for k := range x {
			x[k] = resolveSecrets(t, x[k], secrets)
		}
	}

	return v
}

// TestKubernetesSentinelExample: the example's Middleware, with its
// urn:k8s:secret references resolved from its Secret, JSON round-tripped as
// the CRD provider hands it over and decoded as Traefik's plugin loader does,
// is accepted by New with the secrets in place.
func TestKubernetesSentinelExample(t *testing.T) {
	ca := newCA(t, "k8s")
	secrets := map[string]map[string]string{}

	var plugin interface{}

	for _, doc := range readYAML(t, "examples/kubernetes/redis-sentinel.yaml") {
		name, _ := get(doc, "metadata", "name").(string)

		switch doc["kind"] {
		case "Secret":
			data := map[string]string{}
			for k, v := range doc["stringData"].(map[string]interface{}) {
				data[k] = v.(string)
			}

			// The example holds a placeholder where a CA goes.
			data["ca.crt"] = ca.CAPEM
			secrets[name] = data
		case "Middleware":
			plugin = get(doc, "spec", "plugin", "tierlimit")
		}
	}

	raw, err := json.Marshal(plugin)
	if err != nil {
		t.Fatal(err)
	}

	var settings map[string]interface{}
	if err := json.Unmarshal(raw, &settings); err != nil {
		t.Fatal(err)
	}

	if !strings.Contains(string(raw), "urn:k8s:secret:tierlimit-redis:password") {
		t.Fatal("the example does not read the password from a Secret")
	}

	resolveSecrets(t, settings, secrets)

	cfg := tierlimit.CreateConfig()

	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook: mapstructure.StringToSliceHookFunc(","), WeaklyTypedInput: true, Result: cfg,
	})
	if err != nil {
		t.Fatal(err)
	}

	if err := dec.Decode(settings); err != nil {
		t.Fatal(err)
	}

	if cfg.Redis.Password != "change-me" || cfg.Redis.Sentinel == nil || cfg.Redis.Sentinel.Password != "change-me-too" {
		t.Fatalf("secrets not in place: %+v", cfg.Redis)
	}

	if _, err := tierlimit.New(context.Background(), http.NotFoundHandler(), cfg, "ratelimit@kubernetescrd"); err != nil {
		t.Fatalf("the example is refused: %v", err)
	}
}
