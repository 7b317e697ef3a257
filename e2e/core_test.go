package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

const ipDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          ip:
            points: 50
            duration: 1s
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

type refusalBody struct {
	Errors []struct {
		Message    string `json:"message"`
		Extensions struct {
			Code  string `json:"code"`
			Limit int    `json:"limit"`
			Reset string `json:"reset"`
			Layer string `json:"layer"`
		} `json:"extensions"`
	} `json:"errors"`
}

// TestIPLimitRefusesThe51stInsideASecond runs the design's default ip layer
// (50/1s) in Traefik. The window is real time here, so an attempt whose 51
// requests straddle two windows (seen from X-RateLimit-Reset) is repeated with
// a fresh client rather than judged.
func TestIPLimitRefusesThe51stInsideASecond(t *testing.T) {
	e := start(t, ipDynamic)
	e.waitRouters("api")

	for attempt := 1; ; attempt++ {
		client := "198.51.100." + strconv.Itoa(attempt)
		hdr := from(client)
		first := e.get(e.traefik.Web+"/api", hdr)
		reset := first.header.Get("X-RateLimit-Reset")
		sameWindow := first.code == http.StatusOK

		for i := 2; i <= 50 && sameWindow; i++ {
			r := e.get(e.traefik.Web+"/api", hdr)
			sameWindow = r.code == http.StatusOK && r.header.Get("X-RateLimit-Reset") == reset

			if sameWindow && r.header.Get("X-RateLimit-Remaining") != strconv.Itoa(50-i) {
				t.Fatalf("request %d: remaining %q", i, r.header.Get("X-RateLimit-Remaining"))
			}
		}

		last := e.get(e.traefik.Web+"/api", hdr)
		if sameWindow && last.header.Get("X-RateLimit-Reset") == reset {
			checkRefusal(t, last, "ip", 50)

			// The refusal was logged once for this client, however many follow.
			for i := 0; i < 5; i++ {
				e.get(e.traefik.Web+"/api", hdr)
			}

			if n := countEvents(e.traefik.Logs(), "ip", client); n != 1 {
				t.Fatalf("%d RATE_LIMIT_TRIGGERED lines for %s, want 1:\n%s", n, client, tail(e.traefik.Logs(), 20))
			}

			return
		}

		if attempt == 5 {
			t.Fatal("5 attempts of 51 requests each straddled a 1s window; the machine is too slow for this test")
		}

		t.Logf("attempt %d straddled two windows; trying again with a fresh client", attempt)
	}
}

func checkRefusal(t *testing.T, r response, layer string, limit int) {
	t.Helper()

	if r.code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429 (body %q)", r.code, r.body)
	}

	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}

	if r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("Content-Type %q", r.header.Get("Content-Type"))
	}

	var body refusalBody
	if err := json.Unmarshal([]byte(r.body), &body); err != nil || len(body.Errors) != 1 {
		t.Fatalf("body %q: %v", r.body, err)
	}

	ext := body.Errors[0].Extensions
	if body.Errors[0].Message != "Hit rate limit" || ext.Code != "REQUESTS_EXCEEDED" || ext.Limit != limit || ext.Layer != layer {
		t.Fatalf("body %q", r.body)
	}

	reset, err := time.Parse(time.RFC3339, ext.Reset)
	if err != nil || strconv.FormatInt(reset.Unix(), 10) != r.header.Get("X-RateLimit-Reset") {
		t.Fatalf("body reset %q vs X-RateLimit-Reset %q (%v)", ext.Reset, r.header.Get("X-RateLimit-Reset"), err)
	}
}

func countEvents(logs, layer, key string) int {
	n := 0

	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "RATE_LIMIT_TRIGGERED") && strings.Contains(line, `"limiter":"`+layer+`"`) &&
			strings.Contains(line, `"key":"`+key+`"`) {
			n++
		}
	}

	return n
}

func TestHeadersOnAllowedAndDownstream404(t *testing.T) {
	e := start(t, ipDynamic)
	e.waitRouters("api")

	for _, path := range []string{"/api", "/missing/page"} {
		r := e.get(e.traefik.Web+path, from("198.51.100.77"))

		want := http.StatusOK
		if strings.HasPrefix(path, "/missing") {
			want = http.StatusNotFound
		}

		if r.code != want {
			t.Fatalf("%s: status %d", path, r.code)
		}

		if r.header.Get("X-RateLimit-Limit") != "50" || r.header.Get("X-RateLimit-Remaining") == "" ||
			r.header.Get("X-RateLimit-Reset") == "" || r.header.Get("RateLimit-Policy") != `"ip";q=50;w=1` ||
			!strings.HasPrefix(r.header.Get("RateLimit"), `"ip";r=`) {
			t.Fatalf("%s: headers %v", path, r.header)
		}

		reset, err := strconv.ParseInt(r.header.Get("X-RateLimit-Reset"), 10, 64)
		if now := time.Now().Unix(); err != nil || reset < now || reset > now+2 {
			t.Fatalf("%s: X-RateLimit-Reset %q is not a Unix time within the window", path, r.header.Get("X-RateLimit-Reset"))
		}
	}
}

const forwardedDynamic = `
http:
  routers:
    trusted:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
    untrusted:
      entryPoints: [insecure]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [strict]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          ip: {points: 5, duration: 60s}
    strict:
      plugin:
        tierlimit:
          trustedProxies: [10.0.0.0/8]
          ip: {points: 5, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

func TestClientsBehindATrustedProxyGetSeparateBuckets(t *testing.T) {
	e := start(t, forwardedDynamic)
	e.waitRouters("trusted", "untrusted")

	for i := 1; i <= 5; i++ {
		if r := e.get(e.traefik.Web+"/", from("198.51.100.1")); r.code != http.StatusOK {
			t.Fatalf("client A request %d: %d", i, r.code)
		}
	}

	checkRefusal(t, e.get(e.traefik.Web+"/", from("198.51.100.1")), "ip", 5)

	// The trusted proxy (127.0.0.1) forwards client B: a bucket of its own.
	r := e.get(e.traefik.Web+"/", from("198.51.100.2"))
	if r.code != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != "4" {
		t.Fatalf("client B: %d remaining %q", r.code, r.header.Get("X-RateLimit-Remaining"))
	}

	// A chain: the rightmost untrusted address is the client, not the spoofed leftmost.
	r = e.get(e.traefik.Web+"/", from("198.51.100.1, 198.51.100.3, 10.0.0.5"))
	if r.code != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != "4" {
		t.Fatalf("client C behind two proxies: %d remaining %q", r.code, r.header.Get("X-RateLimit-Remaining"))
	}
}

func TestUntrustedPeerCannotChangeItsBucket(t *testing.T) {
	e := start(t, forwardedDynamic)
	e.waitRouters("trusted", "untrusted")

	for i := 1; i <= 5; i++ {
		fake := "203.0.113." + strconv.Itoa(i)

		r := e.get(e.traefik.Insecure+"/", from(fake))
		if r.code != http.StatusOK {
			t.Fatalf("request %d: %d", i, r.code)
		}

		// The header did reach the plugin's position in the chain (and the backend).
		if !strings.Contains(r.body, fake) {
			t.Fatalf("X-Forwarded-For %s did not pass the insecure entrypoint: %q", fake, r.body)
		}
	}

	checkRefusal(t, e.get(e.traefik.Insecure+"/", from("203.0.113.200")), "ip", 5)
}

const routesDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 20, duration: 60s}
          assets: {points: 3, duration: 60s, pathPrefixes: [/assets/]}
          routes:
            - name: auth_login
              methods: [POST]
              paths: [/auth/login]
              key: ip
              points: 10
              duration: 60s
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

func TestLoginRouteLimit(t *testing.T) {
	e := start(t, routesDynamic)
	e.waitRouters("api")

	client := from("198.51.100.10")

	for i := 1; i <= 10; i++ {
		if r := e.do(http.MethodPost, e.traefik.Web+"/auth/login", client); r.code != http.StatusOK {
			t.Fatalf("login %d: %d", i, r.code)
		}
	}

	r := e.do(http.MethodPost, e.traefik.Web+"/auth/login", client)
	checkRefusal(t, r, "auth_login", 10)

	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra > 60 {
		t.Fatalf("Retry-After %d > 60", ra)
	}

	// Other paths still pass for the same client, and other clients may log in.
	if r := e.get(e.traefik.Web+"/dashboard", client); r.code != http.StatusOK {
		t.Fatalf("other path: %d", r.code)
	}

	if r := e.do(http.MethodPost, e.traefik.Web+"/auth/login", from("198.51.100.11")); r.code != http.StatusOK {
		t.Fatalf("other client's login: %d", r.code)
	}
}

func TestAssetsHaveTheirOwnBudget(t *testing.T) {
	e := start(t, routesDynamic)
	e.waitRouters("api")

	client := from("198.51.100.20")

	for i := 1; i <= 3; i++ {
		r := e.get(e.traefik.Web+"/assets/app.js", client)
		if r.code != http.StatusOK || r.header.Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("asset %d: %d limit %q", i, r.code, r.header.Get("X-RateLimit-Limit"))
		}
	}

	checkRefusal(t, e.get(e.traefik.Web+"/assets/app.js", client), "assets", 3)

	// The ip budget was not touched by the asset requests.
	r := e.get(e.traefik.Web+"/api/items", client)
	if r.code != http.StatusOK || r.header.Get("X-RateLimit-Limit") != "20" || r.header.Get("X-RateLimit-Remaining") != "19" {
		t.Fatalf("api after assets: %d limit %q remaining %q", r.code, r.header.Get("X-RateLimit-Limit"), r.header.Get("X-RateLimit-Remaining"))
	}
}

const sharedDynamic = `
http:
  routers:
    one:
      entryPoints: [web]
      rule: PathPrefix(` + "`/one`" + `)
      middlewares: [shared]
      service: backend
    two:
      entryPoints: [web]
      rule: PathPrefix(` + "`/two`" + `)
      middlewares: [shared]
      service: backend
{{extraRouter}}
  middlewares:
    shared:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: {{points}}, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

func sharedConfig(points int, extra bool) string {
	router := ""
	if extra {
		router = `    three:
      entryPoints: [web]
      rule: PathPrefix(` + "`/three`" + `)
      middlewares: [shared]
      service: backend`
	}

	s := strings.ReplaceAll(sharedDynamic, "{{points}}", strconv.Itoa(points))

	return strings.ReplaceAll(s, "{{extraRouter}}", router)
}

// TestTwoRoutersShareOneBudgetAcrossReloads: both routers use the middleware
// "shared", so they count against one budget; a reload that changes the
// configuration (new router, new points) rebuilds every handler but keeps the counts.
func TestTwoRoutersShareOneBudgetAcrossReloads(t *testing.T) {
	e := start(t, sharedConfig(10, false))
	e.waitRouters("one", "two")

	client := from("198.51.100.30")

	for i := 1; i <= 6; i++ {
		path := "/one"
		if i%2 == 0 {
			path = "/two"
		}

		r := e.get(e.traefik.Web+path, client)
		if r.code != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != strconv.Itoa(10-i) {
			t.Fatalf("request %d to %s: %d remaining %q", i, path, r.code, r.header.Get("X-RateLimit-Remaining"))
		}
	}

	if err := e.traefik.WriteDynamic(e.render(sharedConfig(12, true))); err != nil {
		t.Fatal(err)
	}

	e.waitRouters("one", "two", "three")

	// Wait until the rebuilt handlers (limit 12) serve, probing with other clients.
	deadline := time.Now().Add(30 * time.Second)
	for probe := 1; ; probe++ {
		if r := e.get(e.traefik.Web+"/three", from("192.0.2."+strconv.Itoa(probe))); r.header.Get("X-RateLimit-Limit") == "12" {
			break
		}

		if time.Now().After(deadline) || probe == 250 {
			t.Fatal("the reloaded configuration never served")
		}
	}

	// 6 counted before the reload: 6 more fit in 12, on any of the three routers.
	for i := 7; i <= 12; i++ {
		r := e.get(e.traefik.Web+[]string{"/one", "/two", "/three"}[i%3], client)
		if r.code != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != strconv.Itoa(12-i) {
			t.Fatalf("request %d after reload: %d remaining %q (counters reset by the reload?)", i, r.code, r.header.Get("X-RateLimit-Remaining"))
		}
	}

	checkRefusal(t, e.get(e.traefik.Web+"/one", client), "ip", 12)
}

// TestLoadsWithManifestTestData configures the middleware with nothing but the
// testData of .traefik.yml, as the plugin catalog does, and checks that its
// limits are the ones applied: each layer's policy and a refusal of the route
// at its count.
func TestLoadsWithManifestTestData(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), ".traefik.yml"))
	if err != nil {
		t.Fatal(err)
	}

	var manifest struct {
		TestData map[string]interface{} `yaml:"testData"`
	}
	if err := yaml.Unmarshal(raw, &manifest); err != nil {
		t.Fatal(err)
	}

	if len(manifest.TestData) == 0 {
		t.Fatal(".traefik.yml has no testData")
	}

	type limit struct {
		Name         string   `yaml:"name"`
		Methods      []string `yaml:"methods"`
		Paths        []string `yaml:"paths"`
		PathPrefixes []string `yaml:"pathPrefixes"`
		Points       int      `yaml:"points"`
		Duration     string   `yaml:"duration"`
	}

	var want struct {
		TestData struct {
			IP     limit   `yaml:"ip"`
			Assets limit   `yaml:"assets"`
			Routes []limit `yaml:"routes"`
		} `yaml:"testData"`
	}
	if err := yaml.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}

	td := want.TestData
	if td.IP.Points == 0 || td.Assets.Points == 0 || len(td.Assets.PathPrefixes) == 0 || len(td.Routes) == 0 ||
		len(td.Routes[0].Methods) == 0 || len(td.Routes[0].Paths) == 0 || td.Routes[0].Points == 0 {
		t.Fatalf("testData without the ip, assets and route limits this test checks: %+v", td)
	}

	dynamic := map[string]interface{}{
		"http": map[string]interface{}{
			"routers": map[string]interface{}{
				"api": map[string]interface{}{
					"entryPoints": []string{"web"}, "rule": "PathPrefix(`/`)",
					"middlewares": []string{"catalog"}, "service": "backend",
				},
			},
			"middlewares": map[string]interface{}{
				"catalog": map[string]interface{}{"plugin": map[string]interface{}{"tierlimit": manifest.TestData}},
			},
			"services": map[string]interface{}{
				"backend": map[string]interface{}{
					"loadBalancer": map[string]interface{}{"servers": []map[string]string{{"url": "{{backend}}"}}},
				},
			},
		},
	}

	out, err := yaml.Marshal(dynamic)
	if err != nil {
		t.Fatal(err)
	}

	e := start(t, string(out))
	e.waitRouters("api")

	// The first request of a window shows the layer's limit and policy.
	check := func(r response, l limit, name string) {
		t.Helper()

		d, err := time.ParseDuration(l.Duration)
		if err != nil {
			t.Fatalf("testData %s.duration %q: %v", name, l.Duration, err)
		}

		policy := fmt.Sprintf(`"%s";q=%d;w=%d`, name, l.Points, int64((d+time.Second-1)/time.Second))
		if r.code != http.StatusOK || r.header.Get("X-RateLimit-Limit") != strconv.Itoa(l.Points) ||
			r.header.Get("X-RateLimit-Remaining") != strconv.Itoa(l.Points-1) || r.header.Get("RateLimit-Policy") != policy {
			t.Fatalf("%s: %d %v, want limit %d and policy %s", name, r.code, r.header, l.Points, policy)
		}
	}

	check(e.get(e.traefik.Web+"/", from("198.51.100.40")), td.IP, "ip")
	check(e.get(e.traefik.Web+td.Assets.PathPrefixes[0]+"app.js", from("198.51.100.41")), td.Assets, "assets")

	route := td.Routes[0]
	client := from("198.51.100.42")

	for i := 1; i <= route.Points; i++ {
		r := e.do(route.Methods[0], e.traefik.Web+route.Paths[0], client)
		if i == 1 {
			check(r, route, route.Name)
		}

		if r.code != http.StatusOK {
			t.Fatalf("%s request %d of %d: %d", route.Name, i, route.Points, r.code)
		}
	}

	checkRefusal(t, e.do(route.Methods[0], e.traefik.Web+route.Paths[0], client), route.Name, route.Points)
}
