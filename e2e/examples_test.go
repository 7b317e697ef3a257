package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

func readYAML(t *testing.T, rel string) []map[string]interface{} {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}

	var docs []map[string]interface{}

	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var doc map[string]interface{}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}

		docs = append(docs, doc)
	}

	return docs
}

// flatten writes v as lower-cased dotted keys with string values, lists of
// scalars joined by "," (as Docker labels write them), lists of maps indexed.
func flatten(prefix string, v interface{}, out map[string]string) {
	switch t := v.(type) {
	case map[string]interface{}:
		for k, x := range t {
			flatten(prefix+"."+strings.ToLower(k), x, out)
		}
	case []interface{}:
		scalars := []string{}

		for i, x := range t {
			if _, ok := x.(map[string]interface{}); ok {
				flatten(fmt.Sprintf("%s[%d]", prefix, i), x, out)
				continue
			}

			scalars = append(scalars, fmt.Sprint(x))
		}

		if len(scalars) > 0 || len(t) == 0 {
			out[prefix] = strings.Join(scalars, ",")
		}
	case nil:
		out[prefix] = ""
	default:
		out[prefix] = fmt.Sprint(t)
	}
}

func get(m map[string]interface{}, path ...string) interface{} {
	var cur interface{} = m

	for _, p := range path {
		mm, ok := cur.(map[string]interface{})
		if !ok {
			return nil
		}

		cur = mm[p]
	}

	return cur
}

// chainSettings reads the three example forms into one shape: the flattened
// middlewares, plus "router.middlewares".
func fileChain(t *testing.T) map[string]string {
	doc := readYAML(t, "examples/file/dynamic.yml")[0]
	out := map[string]string{}
	flatten("middlewares", get(doc, "http", "middlewares"), out)
	flatten("router.middlewares", get(doc, "http", "routers", "api", "middlewares"), out)

	return out
}

// kubernetesChain reads the Kubernetes form with its cluster-only differences
// undone: addresses are <service>.<namespace>.svc.cluster.local, the Redis
// password a urn:k8s:secret: reference (examplecheck checks both).
func kubernetesChain(t *testing.T) map[string]string {
	out := map[string]string{}
	defer func() {
		for k, v := range out {
			if strings.HasSuffix(k, ".redis.password") && strings.HasPrefix(v, "urn:k8s:secret:") {
				delete(out, k)
				continue
			}

			out[k] = strings.Replace(v, ".tierlimit.svc.cluster.local", "", 1)
		}
	}()

	for _, doc := range readYAML(t, "examples/kubernetes/chain.yaml") {
		name, _ := get(doc, "metadata", "name").(string)

		switch doc["kind"] {
		case "Middleware":
			flatten("middlewares."+name, doc["spec"], out)
		case "IngressRoute":
			routes, _ := get(doc, "spec", "routes").([]interface{})
			if len(routes) != 1 {
				t.Fatalf("IngressRoute %s: %d routes", name, len(routes))
			}

			var names []string
			for _, m := range routes[0].(map[string]interface{})["middlewares"].([]interface{}) {
				names = append(names, m.(map[string]interface{})["name"].(string))
			}

			out["router.middlewares"] = strings.Join(names, ",")
		}
	}

	return out
}

func labelsChain(t *testing.T, labels []interface{}) map[string]string {
	out := map[string]string{}

	for _, l := range labels {
		k, v, _ := strings.Cut(l.(string), "=")
		k = strings.ToLower(strings.TrimPrefix(k, "traefik.http."))

		switch {
		case strings.HasPrefix(k, "middlewares."):
			out[k] = v
		case k == "routers.api.middlewares":
			out["router.middlewares"] = v
		}
	}

	return out
}

// TestExamplesDescribeOneChain: the file, Kubernetes and Docker-label examples
// and docker-compose.yml configure the same chain, setting for setting.
func TestExamplesDescribeOneChain(t *testing.T) {
	file := fileChain(t)

	labelDoc := readYAML(t, "examples/docker/labels.yml")[0]
	compose := readYAML(t, "docker-compose.yml")[0]
	composeLabels, _ := get(compose, "services", "whoami", "labels").([]interface{})

	if fmt.Sprint(composeLabels) != fmt.Sprint(labelDoc["labels"]) {
		t.Fatal("docker-compose.yml's whoami labels differ from examples/docker/labels.yml")
	}

	forms := map[string]map[string]string{
		"kubernetes": kubernetesChain(t),
		"labels":     labelsChain(t, labelDoc["labels"].([]interface{})),
	}

	for name, other := range forms {
		if diff := diffSettings(file, other); diff != "" {
			t.Errorf("examples/file and %s differ:\n%s", name, diff)
		}
	}

	// ForwardAuth overwrites only the headers it lists: an unlisted
	// X-Auth-Service-Account: true from a client would reach the principal
	// instance and promote a user to the service tier, an unlisted
	// X-Auth-Plan: pro would buy him the pro plan.
	forms["file"] = file
	for name, form := range forms {
		listed := strings.Split(form["middlewares.auth.forwardauth.authresponseheaders"], ",")
		for _, h := range append([]string{"X-Auth-User", "X-Auth-Service-Account"}, principalHeadersSet(form)...) {
			if !contains(listed, h) {
				t.Errorf("%s example: authResponseHeaders %v lacks %s", name, listed, h)
			}
		}
	}

	if file["middlewares.ratelimit-principal.plugin.tierlimit.principal.planheader"] != "X-Auth-Plan" {
		t.Errorf("the file example sets no plan header: %v", file)
	}

	if file["middlewares.ratelimit-edge.plugin.tierlimit.principal.credentialheaders"] != "Authorization" ||
		file["middlewares.ratelimit-principal.plugin.tierlimit.principal.userheader"] != "X-Auth-User" ||
		file["router.middlewares"] != "ratelimit-edge,auth,ratelimit-principal" {
		t.Fatalf("the file example is not the recommended chain: %v", file)
	}
}

// principalHeadersSet lists the principal and plan headers that some plugin
// instance of a flattened form reads: each must come from ForwardAuth.
func principalHeadersSet(form map[string]string) []string {
	var out []string

	for k, v := range form {
		if v != "" && (strings.HasSuffix(k, ".principal.userheader") || strings.HasSuffix(k, ".principal.planheader")) {
			out = append(out, v)
		}
	}

	sort.Strings(out)

	return out
}

func diffSettings(a, b map[string]string) string {
	var lines []string

	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			lines = append(lines, fmt.Sprintf("  %s: %q vs %q", k, v, b[k]))
		}
	}

	for k, w := range b {
		if _, ok := a[k]; !ok {
			lines = append(lines, fmt.Sprintf("  %s: missing vs %q", k, w))
		}
	}

	sort.Strings(lines)

	return strings.Join(lines, "\n")
}

// TestFileExampleRunsInTraefik loads examples/file/dynamic.yml as it is, with
// only the backend and auth server addresses pointed at the test's.
func TestFileExampleRunsInTraefik(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "examples/file/dynamic.yml"))
	if err != nil {
		t.Fatal(err)
	}

	r := startRedis(t)
	dynamic := strings.NewReplacer("http://whoami:80", "{{backend}}", "http://auth:9000", "{{auth}}", "redis:6379", r.Addr).Replace(string(raw))

	e := start(t, dynamic)
	e.waitRouters("api")

	for i := 1; i <= 60; i++ {
		if r := e.get(e.traefik.Web+"/auth/me", bearer("user-alice")); r.code != http.StatusOK {
			t.Fatalf("alice %d: %d", i, r.code)
		}
	}

	if r := e.get(e.traefik.Web+"/", bearer("svc-batch")); r.header.Get("RateLimit-Policy") != `"service";q=10000;w=60` {
		t.Fatalf("service account: %v", r.header)
	}

	if r := e.get(e.traefik.Web+"/", bearer("user-pat@pro")); r.header.Get("RateLimit-Policy") != `"pro";q=1000;w=60` {
		t.Fatalf("pro user: %v", r.header)
	}

	if r := e.get(e.traefik.Web+"/", merge(bearer("user-sly"), map[string]string{"X-Auth-Plan": "pro"})); r.header.Get("RateLimit-Policy") != `"user";q=300;w=60` {
		t.Fatalf("a user naming his own plan: %v", r.header)
	}

	if r := e.get(e.traefik.Web+"/", bearer("garbage")); r.code != http.StatusUnauthorized || r.header.Get("RateLimit-Policy") != `"ip";q=50;w=1` {
		t.Fatalf("garbage: %d %v", r.code, r.header)
	}

	// The counters are in Redis, where every replica sees them.
	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	if v := redisDo(t, admin, "GET", "ratelimit:ratelimit-principal@file:user:alice"); v.Str != "60" {
		t.Fatalf("alice's counter in Redis: %q, want 60", v.Str)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}

	return false
}
