package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/fakeauth"
	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
	"sigs.k8s.io/yaml"
)

// The CRDs Traefik's providers read, from the modules the Go module proxy serves.
const (
	traefikCRDs = "docs/content/reference/dynamic-configuration/kubernetes-crd-definition-v1.yml"
	gatewayAPI  = "sigs.k8s.io/gateway-api@v1.4.0"
	gatewayCRDs = "config/crd/standard"
)

// kubeEnv is a kube-apiserver holding examples/kubernetes, and a Traefik
// reading it through its kubernetesCRD and kubernetesGateway providers.
type kubeEnv struct {
	*env
	kube     *harness.Kube
	redis    *harness.Redis
	password string
	docs     []map[string]interface{} // chain.yaml's documents as applied
}

// TestKubernetesExamples runs examples/kubernetes as written (minus the
// Deployments: Redis, the auth server and the backend are local processes)
// through a real kube-apiserver and Traefik's CRD and Gateway API providers.
func TestKubernetesExamples(t *testing.T) {
	k := startKubeEnv(t)

	t.Run("router", k.checkRouter)
	t.Run("ip", k.checkIPLimit)
	t.Run("principal", k.checkPrincipalLimit)
	t.Run("route", k.checkRouteLimit)
	t.Run("secret", k.checkRedisHoldsTheCounts)
	t.Run("update", k.checkUpdateTakesEffect)
	t.Run("gateway", k.checkGatewayRoute)
}

func startKubeEnv(t *testing.T) *kubeEnv {
	t.Helper()

	dir := t.TempDir()

	kube, err := harness.StartKube(dir)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		kube.Stop()

		if t.Failed() {
			t.Logf("kube-apiserver and kine output:\n%s", tail(kube.Logs(), 20))
		}
	})

	applyCRDs(t, kube)

	k := &kubeEnv{kube: kube}
	k.applyChain(t, dir)

	traefik, err := harness.Start(harness.Options{
		Dir: filepath.Join(dir, "traefik"), Dynamic: "# everything comes from Kubernetes\n",
		ProvidersThrottle: "0s", Providers: kubeProviders(kube),
		PluginSource: k.pluginFromConfigMaps(t, filepath.Join(dir, "volume")),
	})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		traefik.Stop()

		if t.Failed() {
			full := filepath.Join(os.TempDir(), "tierlimit-e2e-"+strings.ReplaceAll(t.Name(), "/", "_")+".log")
			_ = os.WriteFile(full, []byte(traefik.Logs()), 0o644)
			t.Logf("traefik output (all of it in %s):\n%s", full, tail(traefik.Logs(), 30))
		}
	})

	k.env = &env{t: t, traefik: traefik, client: &http.Client{Timeout: 10 * time.Second}}
	k.applyGateway(t)

	return k
}

func kubeProviders(k *harness.Kube) string {
	conn := fmt.Sprintf("    endpoint: %s\n    token: %s\n    certAuthFilePath: %s\n    throttleDuration: 0s\n", k.URL, k.Token, k.CAFile)

	return "  kubernetesCRD:\n" + conn + "  kubernetesGateway:\n" + conn
}

// applyCRDs applies Traefik v3.6.12's CRDs and Gateway API v1.4.0's standard
// channel, from the module cache, and waits until they are served.
func applyCRDs(t *testing.T, kube *harness.Kube) {
	t.Helper()

	traefikDir := moduleDir(t, "github.com/traefik/traefik/v3@"+harness.TraefikVersion)
	files := []string{filepath.Join(traefikDir, traefikCRDs)}

	gw, err := filepath.Glob(filepath.Join(moduleDir(t, gatewayAPI), gatewayCRDs, "*.yaml"))
	if err != nil || len(gw) == 0 {
		t.Fatalf("gateway API CRDs: %v", err)
	}

	for _, f := range append(files, gw...) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}

		if err := kube.ApplyYAML(raw); err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
	}

	if err := kube.WaitServed(60*time.Second, "traefik.io/v1alpha1/middlewares", "traefik.io/v1alpha1/ingressroutes",
		"gateway.networking.k8s.io/v1/gateways", "gateway.networking.k8s.io/v1/httproutes"); err != nil {
		t.Fatal(err)
	}
}

// moduleDir returns a module's directory in the module cache, downloading it if needed.
func moduleDir(t *testing.T, mod string) string {
	t.Helper()

	cmd := exec.Command("go", "mod", "download", "-json", mod)
	cmd.Dir = harness.E2EDir()

	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v\n%s", mod, err, out)
	}

	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", mod, err, out)
	}

	return info.Dir
}

// applyChain starts what the Deployments would run and applies the rest of
// examples/kubernetes/chain.yaml as written, but for the addresses the plugin
// and ForwardAuth dial: <service>.<ns>.svc.cluster.local:<port> of a Service
// of the file becomes the local process standing for that Service. whoami,
// which Traefik reaches through the Service, gets an EndpointSlice to the
// backend on this machine's address (EndpointSlices refuse loopback).
func (k *kubeEnv) applyChain(t *testing.T, dir string) {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "examples", "kubernetes", "chain.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	docs, err := harness.SplitYAML(raw)
	if err != nil {
		t.Fatal(err)
	}

	k.password = secretValue(t, docs, "redis")

	k.redis, err = harness.StartRedis(dir, "--requirepass", k.password)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(k.redis.Kill)

	auth, stopAuth, err := harness.Serve("127.0.0.1:0", fakeauth.Handler())
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(stopAuth)

	hostIP, err := harness.HostIP()
	if err != nil {
		t.Fatal(err)
	}

	backend, stopBackend, err := harness.ServeBackend(net.JoinHostPort(hostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(stopBackend)

	local := map[string]string{"redis": k.redis.Addr, "auth": strings.TrimPrefix(auth, "http://")}
	replacer := clusterAddresses(docs, local)

	for _, d := range docs {
		if d["kind"] == "Deployment" {
			continue
		}

		if d["kind"] == "Middleware" {
			d = rewrite(t, d, replacer)
		}

		if err := k.kube.Apply(d); err != nil {
			t.Fatal(err)
		}

		k.docs = append(k.docs, d)

		if d["kind"] == "Service" && metaName(d) == "whoami" {
			if err := k.kube.Apply(endpointSlice(d, hostIP, strings.TrimPrefix(backend, "http://"+hostIP+":"))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// secretValue returns the one value of the named Secret's stringData: the
// Redis password, whatever key the example gives it.
func secretValue(t *testing.T, docs []map[string]interface{}, name string) string {
	t.Helper()

	for _, d := range docs {
		if d["kind"] == "Secret" && metaName(d) == name {
			data, _ := d["stringData"].(map[string]interface{})
			for _, v := range data {
				if s, ok := v.(string); ok && len(data) == 1 {
					return s
				}
			}
		}
	}

	t.Fatalf("examples/kubernetes/chain.yaml: no Secret %s with one stringData key", name)

	return ""
}

// clusterAddresses maps <service>.<ns>.svc.cluster.local:<port>, for every
// port of every Service of docs that a local process stands for, to that process.
func clusterAddresses(docs []map[string]interface{}, local map[string]string) *strings.Replacer {
	var pairs []string

	for _, d := range docs {
		addr, ok := local[metaName(d)]
		if d["kind"] != "Service" || !ok {
			continue
		}

		meta, _ := d["metadata"].(map[string]interface{})
		spec, _ := d["spec"].(map[string]interface{})
		ports, _ := spec["ports"].([]interface{})

		for _, p := range ports {
			port, _ := p.(map[string]interface{})["port"].(float64)
			pairs = append(pairs, fmt.Sprintf("%s.%s.svc.cluster.local:%d", metaName(d), meta["namespace"], int(port)), addr)
		}
	}

	return strings.NewReplacer(pairs...)
}

func rewrite(t *testing.T, d map[string]interface{}, r *strings.Replacer) map[string]interface{} {
	t.Helper()

	raw, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}

	var out map[string]interface{}
	if err := json.Unmarshal([]byte(r.Replace(string(raw))), &out); err != nil {
		t.Fatal(err)
	}

	return out
}

// endpointSlice points Service svc at port on ip, under each of its port names.
func endpointSlice(svc map[string]interface{}, ip, port string) map[string]interface{} {
	meta, _ := svc["metadata"].(map[string]interface{})
	spec, _ := svc["spec"].(map[string]interface{})
	p, _ := strconv.Atoi(port)

	var ports []interface{}

	for _, sp := range spec["ports"].([]interface{}) {
		ports = append(ports, map[string]interface{}{"name": sp.(map[string]interface{})["name"], "port": p, "protocol": "TCP"})
	}

	return map[string]interface{}{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata": map[string]interface{}{
			"name": metaName(svc) + "-local", "namespace": meta["namespace"],
			"labels": map[string]interface{}{"kubernetes.io/service-name": metaName(svc)},
		},
		"addressType": "IPv4",
		"ports":       ports,
		"endpoints":   []interface{}{map[string]interface{}{"addresses": []interface{}{ip}, "conditions": map[string]interface{}{"ready": true}}},
	}
}

func metaName(d map[string]interface{}) string {
	meta, _ := d["metadata"].(map[string]interface{})
	name, _ := meta["name"].(string)

	return name
}

// applyGateway creates what the Helm chart creates for Gateway API (the
// GatewayClass and the Gateway "traefik-gateway" in namespace traefik, its
// listener "web" on the web entrypoint's port, routes from all namespaces),
// then applies examples/kubernetes/gateway.yaml as written.
func (k *kubeEnv) applyGateway(t *testing.T) {
	t.Helper()

	_, port, _ := net.SplitHostPort(strings.TrimPrefix(k.traefik.Web, "http://"))
	chart := `apiVersion: v1
kind: Namespace
metadata: {name: traefik}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: traefik}
spec: {controllerName: traefik.io/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: traefik-gateway, namespace: traefik}
spec:
  gatewayClassName: traefik
  listeners:
    - name: web
      port: ` + port + `
      protocol: HTTP
      allowedRoutes: {namespaces: {from: All}}
`

	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "examples", "kubernetes", "gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	if err := k.kube.ApplyYAML(append([]byte(chart+"---\n"), raw...)); err != nil {
		t.Fatal(err)
	}
}

// routerInfo is a router as Traefik's API reports it.
type routerInfo struct {
	Name        string   `json:"name"`
	Provider    string   `json:"provider"`
	Status      string   `json:"status"`
	Rule        string   `json:"rule"`
	Middlewares []string `json:"middlewares"`
	Error       []string `json:"error"`
}

// waitRouter waits until a router of provider whose name starts with prefix
// is reported, and returns it.
func (k *kubeEnv) waitRouter(t *testing.T, provider, prefix string) routerInfo {
	t.Helper()

	deadline := time.Now().Add(60 * time.Second)

	var seen []string

	for {
		var list []routerInfo

		resp, err := k.client.Get(k.traefik.API + "/api/http/routers")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
		}

		seen = seen[:0]

		for _, r := range list {
			seen = append(seen, r.Name+" "+r.Status)

			if r.Provider == provider && strings.HasPrefix(r.Name, prefix) {
				return r
			}
		}

		if time.Now().After(deadline) {
			t.Fatalf("no %s router %s* within 60s (last error %v); routers: %v", provider, prefix, err, seen)
		}

		time.Sleep(100 * time.Millisecond)
	}
}

// checkRouter: the IngressRoute's router runs the three Middlewares of the
// chain under the names Traefik's CRD provider gives them.
func (k *kubeEnv) checkRouter(t *testing.T) {
	r := k.waitRouter(t, "kubernetescrd", "tierlimit-api-")

	want := []string{"tierlimit-ratelimit-edge@kubernetescrd", "tierlimit-auth@kubernetescrd", "tierlimit-ratelimit-principal@kubernetescrd"}
	if r.Status != "enabled" || strings.Join(r.Middlewares, ",") != strings.Join(want, ",") {
		t.Fatalf("router %s: status %q, middlewares %v, errors %v; want enabled with %v", r.Name, r.Status, r.Middlewares, r.Error, want)
	}
}

// windows counts a burst's answers by window (X-RateLimit-Reset): allowed
// ones, and refusals with the layer and limit of their body.
type windows struct {
	mu      sync.Mutex
	ok      map[string]int
	refused map[string]int
	bad     []string
}

func (w *windows) add(r response, layer string, limit int) {
	w.mu.Lock()
	defer w.mu.Unlock()

	reset := r.header.Get("X-RateLimit-Reset")

	switch r.code {
	case http.StatusOK:
		w.ok[reset]++
	case http.StatusTooManyRequests:
		var body refusalBody
		if err := json.Unmarshal([]byte(r.body), &body); err != nil || len(body.Errors) != 1 ||
			body.Errors[0].Extensions.Layer != layer || body.Errors[0].Extensions.Limit != limit {
			w.bad = append(w.bad, r.body)
		}

		w.refused[reset]++
	default:
		w.bad = append(w.bad, strconv.Itoa(r.code)+" "+r.body)
	}
}

// burstLimit sends bursts of n requests with hdr (and host, when set) until
// one window sees more than limit of them, then checks that exactly limit were
// allowed in it and the rest refused by layer; no window allows more than limit.
func (k *kubeEnv) burstLimit(t *testing.T, host, target, layer string, limit, n int, hdr func(attempt int) map[string]string) {
	t.Helper()

	for attempt := 1; attempt <= 3; attempt++ {
		w := &windows{ok: map[string]int{}, refused: map[string]int{}}
		h := hdr(attempt)

		k.hostBurst(n, host, target, h, func(r response) { w.add(r, layer, limit) })

		if len(w.bad) > 0 {
			t.Fatalf("%v: unexpected answers: %q", h, w.bad[:1])
		}

		full := false

		for reset, ok := range w.ok {
			if ok > limit {
				t.Fatalf("%v: %d allowed in the window ending %s, limit %d (%v)", h, ok, reset, limit, w.ok)
			}

			full = full || (ok == limit && w.refused[reset] > 0)
		}

		if full {
			return
		}

		t.Logf("attempt %d: no window saw more than %d requests (%v allowed, %v refused); again", attempt, limit, w.ok, w.refused)
	}

	t.Fatalf("%s: three bursts and no refusal by %s at %d", host, layer, limit)
}

// hostBurst is env.burst of target ("<method> <path>") with a Host header (host empty: none) on 8 workers.
func (k *kubeEnv) hostBurst(n int, host, target string, hdr map[string]string, check func(response)) {
	method, path, _ := strings.Cut(target, " ")

	var wg sync.WaitGroup

	jobs := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		jobs <- struct{}{}
	}

	close(jobs)

	for w := 0; w < 8; w++ {
		wg.Add(1)

		go func() {
			defer wg.Done()

			for range jobs {
				check(k.hostDo(host, method, path, hdr))
			}
		}()
	}

	wg.Wait()
}

func (k *kubeEnv) hostGet(host, path string, hdr map[string]string) response {
	return k.hostDo(host, http.MethodGet, path, hdr)
}

func (k *kubeEnv) hostDo(host, method, path string, hdr map[string]string) response {
	req, _ := http.NewRequest(method, k.traefik.Web+path, nil)
	if host != "" {
		req.Host = host
	}

	for name, v := range hdr {
		req.Header.Set(name, v)
	}

	resp, err := k.client.Do(req)
	if err != nil {
		return response{code: -1, body: err.Error()}
	}
	defer resp.Body.Close()

	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)

	return response{code: resp.StatusCode, header: resp.Header, body: buf.String()}
}

// checkIPLimit: an anonymous client gets ip's 50/s of ratelimit-edge, and
// another client's budget is its own.
func (k *kubeEnv) checkIPLimit(t *testing.T) {
	k.burstLimit(t, "", "GET /api", "ip", 50, 120, func(attempt int) map[string]string {
		return from("203.0.113." + strconv.Itoa(attempt))
	})

	if r := k.hostGet("", "/api", from("203.0.113.99")); !reachedBackend(r, "/api") {
		t.Fatalf("another client: %d %q", r.code, r.body)
	}
}

// checkPrincipalLimit: a user on plan free gets the plan's 100 a minute (layer "free") of
// ratelimit-principal (ForwardAuth's X-Auth-User and X-Auth-Plan reached it),
// and another user of the same plan is not charged for it.
func (k *kubeEnv) checkPrincipalLimit(t *testing.T) {
	k.burstLimit(t, "", "GET /api", "free", 100, 130, func(attempt int) map[string]string {
		return bearer("user-carol" + strconv.Itoa(attempt) + "@free")
	})

	if r := k.hostGet("", "/api", bearer("user-dave@free")); !reachedBackend(r, "/api") || !strings.Contains(r.body, "X-Auth-User: dave\n") {
		t.Fatalf("another user: %d %q", r.code, r.body)
	}
}

// checkRouteLimit: the route auth_login of ratelimit-edge (a list of maps
// holding lists, as the API server stores them) limits POST /auth/login to 10
// a minute per ip, and leaves GET of the same path to the ip layer.
func (k *kubeEnv) checkRouteLimit(t *testing.T) {
	k.burstLimit(t, "", "POST /auth/login", "auth_login", 10, 25, func(attempt int) map[string]string {
		return from("192.0.2." + strconv.Itoa(100+attempt))
	})

	if r := k.hostGet("", "/auth/login", from("192.0.2.101")); !reachedBackend(r, "/auth/login") || r.header.Get("X-RateLimit-Limit") != "50" {
		t.Fatalf("GET /auth/login: %d, X-RateLimit-Limit %q, %q", r.code, r.header.Get("X-RateLimit-Limit"), r.body)
	}
}

// checkRedisHoldsTheCounts: both instances counted in the Redis whose
// password is the Secret's (requirepass), under their CRD provider names: the
// urn:k8s:secret reference reached the plugin (with a wrong password it
// would count in memory, with a wrong key the router would not be built).
func (k *kubeEnv) checkRedisHoldsTheCounts(t *testing.T) {
	p := k.redis.Client(redisresp.Options{Password: k.password})
	defer p.Close()

	v, err := p.Do("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}

	var keys []string
	for _, e := range v.Array {
		keys = append(keys, e.Str)
	}

	sort.Strings(keys)

	for _, name := range []string{"tierlimit-ratelimit-edge@kubernetescrd", "tierlimit-ratelimit-principal@kubernetescrd"} {
		found := false

		for _, key := range keys {
			found = found || strings.Contains(key, name)
		}

		if !found {
			t.Fatalf("no key of %s in Redis: %v", name, keys)
		}
	}
}

// checkUpdateTakesEffect: a Middleware applied again with another user.points
// changes the limit without a restart of Traefik, and the user's count goes on.
func (k *kubeEnv) checkUpdateTakesEffect(t *testing.T) {
	before := k.userPoints(t)

	for attempt, points := range []int{240, 230, 220} {
		user := bearer("user-erin" + strconv.Itoa(attempt))
		sent := 1

		first := k.hostGet("", "/api", user)
		reset := first.header.Get("X-RateLimit-Reset")

		if !reachedBackend(first, "/api") || first.header.Get("X-RateLimit-Limit") != strconv.Itoa(before) {
			t.Fatalf("first request: %d, X-RateLimit-Limit %q (want user.points %d) %q", first.code, first.header.Get("X-RateLimit-Limit"), before, first.body)
		}

		before = points

		k.setUserPoints(t, points)

		deadline := time.Now().Add(30 * time.Second)
		last := first

		for last.header.Get("X-RateLimit-Limit") != strconv.Itoa(points) {
			if time.Now().After(deadline) {
				t.Fatalf("user.points %d applied; 30s later X-RateLimit-Limit is still %q", points, last.header.Get("X-RateLimit-Limit"))
			}

			time.Sleep(100 * time.Millisecond)

			last = k.hostGet("", "/api", user)
			sent++
		}

		if last.header.Get("X-RateLimit-Reset") != reset {
			t.Logf("attempt %d: the window turned during the update; again", attempt+1)
			continue
		}

		if got, want := last.header.Get("X-RateLimit-Remaining"), strconv.Itoa(points-sent); got != want {
			t.Fatalf("after the update: remaining %s, want %s (%d requests sent in this window)", got, want, sent)
		}

		return
	}

	t.Fatal("three attempts straddled a window")
}

// userPoints returns ratelimit-principal's user.points as last applied.
func (k *kubeEnv) userPoints(t *testing.T) int {
	t.Helper()

	for _, d := range k.docs {
		if d["kind"] == "Middleware" && metaName(d) == "ratelimit-principal" {
			conf := d["spec"].(map[string]interface{})["plugin"].(map[string]interface{})["tierlimit"].(map[string]interface{})
			if p, ok := conf["user"].(map[string]interface{})["points"].(float64); ok {
				return int(p)
			}

			if p, ok := conf["user"].(map[string]interface{})["points"].(int); ok {
				return p
			}
		}
	}

	t.Fatal("no user.points in Middleware ratelimit-principal")

	return 0
}

// setUserPoints applies ratelimit-principal again, as `kubectl apply` of the
// edited file would, with user.points changed.
func (k *kubeEnv) setUserPoints(t *testing.T, points int) {
	t.Helper()

	for _, d := range k.docs {
		if d["kind"] != "Middleware" || metaName(d) != "ratelimit-principal" {
			continue
		}

		spec := d["spec"].(map[string]interface{})
		conf := spec["plugin"].(map[string]interface{})["tierlimit"].(map[string]interface{})
		conf["user"].(map[string]interface{})["points"] = points

		if err := k.kube.Apply(d); err != nil {
			t.Fatal(err)
		}

		return
	}

	t.Fatal("no Middleware ratelimit-principal")
}

// checkGatewayRoute: examples/kubernetes/gateway.yaml's HTTPRoute runs
// ratelimit-edge through its ExtensionRef filter, alone (no ForwardAuth: an
// invalid token passes), and limits by ip.
func (k *kubeEnv) checkGatewayRoute(t *testing.T) {
	r := k.waitRouter(t, "kubernetesgateway", "httproute-tierlimit-api-gateway-")
	if r.Status != "enabled" || strings.Join(r.Middlewares, ",") != "tierlimit-ratelimit-edge@kubernetescrd" {
		t.Fatalf("router %s: status %q, middlewares %v, errors %v", r.Name, r.Status, r.Middlewares, r.Error)
	}

	const host = "gateway.example.com"

	if r := k.hostGet(host, "/api", merge(from("198.51.100.200"), bearer("garbage"))); !reachedBackend(r, "/api") || r.header.Get("X-RateLimit-Limit") == "" {
		t.Fatalf("through the HTTPRoute: %d %v %q", r.code, r.header, r.body)
	}

	k.burstLimit(t, host, "GET /api", "ip", 50, 120, func(attempt int) map[string]string {
		return from("198.51.100." + strconv.Itoa(attempt))
	})
}

// pluginFromConfigMaps runs the local-mode recipe of examples/kubernetes/helm-values.yaml as far
// as no kubelet is needed: the ConfigMaps its header's `kubectl create configmap` commands make
// (the root's, then one per sub-package; keys are file names) go into the API server, and the files of its projected volume are
// laid out in dir from what the API server returns, as the kubelet would mount them. Traefik
// loads the plugin from that layout.
func (k *kubeEnv) pluginFromConfigMaps(t *testing.T, dir string) string {
	t.Helper()

	root := harness.RepoRoot()
	configMaps := map[string][]string{
		"tierlimit-plugin": append([]string{filepath.Join(root, ".traefik.yml"), filepath.Join(root, "go.mod")}, nonTestGo(t, root)...),
	}

	pkgs, err := harness.PluginSubPackages()
	if err != nil {
		t.Fatal(err)
	}

	for pkg := range pkgs {
		configMaps["tierlimit-plugin-"+strings.ReplaceAll(pkg, "/", "-")] = nonTestGo(t, filepath.Join(root, filepath.FromSlash(pkg)))
	}

	if err := k.kube.Apply(map[string]interface{}{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]interface{}{"name": "traefik"}}); err != nil {
		t.Fatal(err)
	}

	for name, files := range configMaps {
		data := map[string]interface{}{}

		for _, f := range files {
			content, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}

			data[filepath.Base(f)] = string(content)
		}

		cm := map[string]interface{}{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]interface{}{"name": name, "namespace": "traefik"}, "data": data}
		if err := k.kube.Apply(cm); err != nil {
			t.Fatal(err)
		}
	}

	for _, src := range helmPluginVolume(t) {
		code, out, err := k.kube.Do(http.MethodGet, "/api/v1/namespaces/traefik/configmaps/"+src.ConfigMap.Name, "", nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("ConfigMap %s: %d %v %s", src.ConfigMap.Name, code, err, out)
		}

		var cm struct{ Data map[string]string }
		if err := json.Unmarshal(out, &cm); err != nil {
			t.Fatal(err)
		}

		mountConfigMap(t, dir, src.ConfigMap.Name, cm.Data, src.ConfigMap.Items)
	}

	return dir
}

// projectedItem is a key of a ConfigMap placed at a path of a projected volume.
type projectedItem struct {
	Key  string `json:"key"`
	Path string `json:"path"`
}

type projectedSource struct {
	ConfigMap struct {
		Name  string          `json:"name"`
		Items []projectedItem `json:"items"`
	} `json:"configMap"`
}

// helmPluginVolume returns the sources of the volume that helm-values.yaml's local plugin mounts.
func helmPluginVolume(t *testing.T) []projectedSource {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "examples", "kubernetes", "helm-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	var v struct {
		Experimental struct {
			LocalPlugins map[string]struct {
				VolumeName string `json:"volumeName"`
			} `json:"localPlugins"`
		} `json:"experimental"`
		Deployment struct {
			AdditionalVolumes []struct {
				Name      string `json:"name"`
				Projected struct {
					Sources []projectedSource `json:"sources"`
				} `json:"projected"`
			} `json:"additionalVolumes"`
		} `json:"deployment"`
	}

	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}

	name := v.Experimental.LocalPlugins["tierlimit"].VolumeName
	for _, vol := range v.Deployment.AdditionalVolumes {
		if vol.Name == name && name != "" {
			return vol.Projected.Sources
		}
	}

	t.Fatalf("helm-values.yaml: no volume %q for localPlugins.tierlimit", name)

	return nil
}

// mountConfigMap writes a ConfigMap's keys as a projected volume does: every
// key at the top without items, else each listed key at its path.
func mountConfigMap(t *testing.T, dir, name string, data map[string]string, items []projectedItem) {
	t.Helper()

	if len(items) == 0 {
		for key := range data {
			items = append(items, projectedItem{Key: key, Path: key})
		}
	}

	for _, it := range items {
		content, ok := data[it.Key]
		if !ok {
			t.Fatalf("ConfigMap %s has no key %s", name, it.Key)
		}

		path := filepath.Join(dir, filepath.FromSlash(it.Path))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}

		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// nonTestGo lists dir's Go files but tests, as the header's find commands do.
func nonTestGo(t *testing.T, dir string) []string {
	t.Helper()

	all, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}

	var out []string

	for _, f := range all {
		if !strings.HasSuffix(f, "_test.go") {
			out = append(out, f)
		}
	}

	return out
}
