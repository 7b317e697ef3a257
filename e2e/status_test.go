package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
)

// statusDynamic has three middlewares, each with its status endpoint:
// edge (ip 5/60s, default allowedIPs: loopback), restricted (allowedIPs
// replaced by 192.0.2.0/24) and keyed (ip keyed by the X-Api-Key header).
const statusDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
    restricted:
      entryPoints: [web]
      rule: PathPrefix(` + "`/restricted`" + `)
      middlewares: [restricted]
      service: backend
    keyed:
      entryPoints: [web]
      rule: PathPrefix(` + "`/keyed`" + `)
      middlewares: [keyed]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 5, duration: 60s}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
          status: {path: /_ratelimit}
    restricted:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 5, duration: 60s}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
          status:
            path: /restricted/_ratelimit
            allowedIPs: [192.0.2.0/24]
    keyed:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 2, duration: 60s, key: "header:X-Api-Key"}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
          status: {path: /keyed/_ratelimit}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

type statusDoc struct {
	Middleware    string `json:"middleware"`
	Store         string `json:"store"`
	RedisFallback bool   `json:"redisFallback"`
	Evictions     int64  `json:"evictions"`
	Layers        []struct {
		Name        string `json:"name"`
		Points      int64  `json:"points"`
		Duration    string `json:"duration"`
		Algorithm   string `json:"algorithm"`
		TrackedKeys int    `json:"trackedKeys"`
		Allowed     int64  `json:"allowed"`
		Refused     int64  `json:"refused"`
	} `json:"layers"`
	Keys struct {
		Total  int `json:"total"`
		Offset int `json:"offset"`
		Limit  int `json:"limit"`
		Items  []struct {
			Layer     string `json:"layer"`
			Key       string `json:"key"`
			Count     int64  `json:"count"`
			Limit     int64  `json:"limit"`
			Limited   bool   `json:"limited"`
			Refused   int64  `json:"refused"`
			Reset     string `json:"reset"`
			ResetUnix int64  `json:"resetUnix"`
		} `json:"items"`
	} `json:"keys"`
}

func (d statusDoc) keys() string {
	var out []string
	for _, it := range d.Keys.Items {
		out = append(out, it.Key)
	}

	return strings.Join(out, " ")
}

// status reads the status document as a loopback client (no X-Forwarded-For).
func (e *env) status(url string) statusDoc {
	e.t.Helper()

	r := e.get(url, nil)
	if r.code != http.StatusOK || r.header.Get("Content-Type") != "application/json" || r.header.Get("Cache-Control") != "no-store" {
		e.t.Fatalf("GET %s: %d %v %q", url, r.code, r.header, r.body)
	}

	var doc statusDoc
	if err := json.Unmarshal([]byte(r.body), &doc); err != nil {
		e.t.Fatalf("GET %s: %v\n%s", url, err, r.body)
	}

	e.t.Logf("GET %s:\n%s", url, r.body)

	return doc
}

// reachedBackend tells the backend's answer (see harness.Backend) from the plugin's.
func reachedBackend(r response, path string) bool {
	return r.code == http.StatusOK && strings.HasPrefix(r.body, "ok GET "+path+"\n")
}

func TestStatusEndpointThroughTraefik(t *testing.T) {
	e := start(t, statusDynamic)
	e.waitRouters("api", "restricted", "keyed")

	web := e.traefik.Web

	// A client outside allowedIPs, through the trusted loopback proxy, gets
	// the path passed on like any request, and charged.
	if r := e.get(web+"/_ratelimit", from("198.51.100.9")); !reachedBackend(r, "/_ratelimit") || r.header.Get("X-RateLimit-Remaining") != "4" {
		t.Fatalf("outside client: %d %v %q", r.code, r.header, r.body)
	}

	for i := 1; i <= 8; i++ {
		r := e.get(web+"/api", from("203.0.113.7"))
		if (i <= 5) != (r.code == http.StatusOK) {
			t.Fatalf("request %d: %d", i, r.code)
		}
	}

	for i := 0; i < 2; i++ {
		e.get(web+"/api", from("203.0.113.8"))
	}

	e.get(web+"/api", from("203.0.113.70"))

	before := time.Now()
	doc := e.status(web + "/_ratelimit")

	if doc.Middleware != "edge@file" || doc.Store != "memory" || doc.RedisFallback || len(doc.Layers) != 1 {
		t.Fatalf("document %+v", doc)
	}

	if l := doc.Layers[0]; l.Name != "ip" || l.Points != 5 || l.Duration != "1m0s" || l.Algorithm != "fixed" ||
		l.TrackedKeys != 4 || l.Allowed != 9 || l.Refused != 3 {
		t.Fatalf("layer %+v", l)
	}

	if doc.keys() != "203.0.113.7 203.0.113.8 198.51.100.9 203.0.113.70" || doc.Keys.Total != 4 {
		t.Fatalf("keys %q, total %d", doc.keys(), doc.Keys.Total)
	}

	refused := doc.Keys.Items[0]
	reset, err := time.Parse(time.RFC3339, refused.Reset)

	if err != nil || refused.Layer != "ip" || refused.Count != 5 || refused.Refused != 3 || refused.Limit != 5 || !refused.Limited ||
		reset.Unix() != refused.ResetUnix || !reset.After(before) || reset.After(before.Add(62*time.Second)) {
		t.Fatalf("refused key %+v (%v)", refused, err)
	}

	if doc.Keys.Items[1].Limited || doc.Keys.Items[1].Count != 2 {
		t.Fatalf("second key %+v", doc.Keys.Items[1])
	}

	// The status requests were not charged: loopback is not a tracked key.
	if d := e.status(web + "/_ratelimit"); d.Layers[0].TrackedKeys != 4 || d.Layers[0].Allowed != 9 {
		t.Fatalf("a status request was charged: %+v", d.Layers)
	}

	for query, want := range map[string]string{
		"?limited=true":       "203.0.113.7",
		"?q=203.0.113.7":      "203.0.113.7 203.0.113.70",
		"?offset=1&limit=2":   "203.0.113.8 198.51.100.9",
		"?limit=1":            "203.0.113.7", // a page of a quarter or less: one-pass selection
		"?offset=1&limit=1":   "203.0.113.8",
		"?limited=true&q=198": "",
	} {
		if d := e.status(web + "/_ratelimit" + query); d.keys() != want {
			t.Errorf("%s: keys %q, want %q", query, d.keys(), want)
		}
	}

	if d := e.status(web + "/_ratelimit?offset=1&limit=2"); d.Keys.Total != 4 || d.Keys.Offset != 1 || d.Keys.Limit != 2 {
		t.Errorf("paging %+v", d.Keys)
	}

	if r := e.get(web+"/_ratelimit?limit=1001", nil); r.code != http.StatusBadRequest || !strings.Contains(r.body, `"limit"`) {
		t.Errorf("limit=1001: %d %q", r.code, r.body)
	}

	if r := e.do(http.MethodPost, web+"/_ratelimit", nil); r.code != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d %v", r.code, r.header)
	}

	// A client resolved to ::1 (the leftmost of trusted proxies) is in the
	// default list, like the loopback peer itself.
	if r := e.get(web+"/_ratelimit", from("::1")); r.code != http.StatusOK || !strings.Contains(r.body, `"middleware":"edge@file"`) {
		t.Fatalf("edge, from ::1: %d %q", r.code, r.body)
	}

	// allowedIPs replaces the default list: neither loopback address is let in
	// by the restricted middleware (::1 is reached as the leftmost of trusted
	// proxies), while its own network is.
	for _, hdr := range []map[string]string{nil, from("::1"), from("127.0.0.1")} {
		if r := e.get(web+"/restricted/_ratelimit", hdr); !reachedBackend(r, "/restricted/_ratelimit") {
			t.Errorf("restricted, %v: %d %q", hdr, r.code, r.body)
		}
	}

	if r := e.get(web+"/restricted/_ratelimit", from("192.0.2.5")); r.code != http.StatusOK || !strings.Contains(r.body, `"middleware":"restricted@file"`) {
		t.Errorf("restricted, from its own network: %d %q", r.code, r.body)
	}

	// A header-keyed layer lists the key hashed, never in clear.
	for i := 0; i < 3; i++ {
		e.get(web+"/keyed/api", map[string]string{"X-Api-Key": "e2e-secret-api-key"})
	}

	if r := e.get(web+"/keyed/_ratelimit", nil); strings.Contains(r.body, "e2e-secret-api-key") {
		t.Fatalf("raw API key in the status: %q", r.body)
	}

	kd := e.status(web + "/keyed/_ratelimit?limited=true")
	if len(kd.Keys.Items) != 1 || !strings.HasPrefix(kd.Keys.Items[0].Key, "sha256:") || kd.Keys.Items[0].Count != 2 || kd.Keys.Items[0].Refused != 1 {
		t.Fatalf("keyed %+v", kd.Keys)
	}
}

func TestMetricsThroughTraefik(t *testing.T) {
	e := start(t, statusDynamic)
	e.waitRouters("api")

	web := e.traefik.Web

	for i := 0; i < 8; i++ {
		e.get(web+"/api", from("203.0.113.7"))
	}

	for i := 0; i < 2; i++ {
		e.get(web+"/api", from("203.0.113.8"))
	}

	e.get(web+"/_ratelimit/metrics", from("198.51.100.9")) // outside: an ordinary request

	r := e.get(web+"/_ratelimit/metrics", nil)
	if r.code != http.StatusOK || r.header.Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("%d %v %q", r.code, r.header, r.body)
	}

	t.Logf("metrics:\n%s", r.body)

	var parser expfmt.TextParser

	families, err := parser.TextToMetricFamilies(strings.NewReader(r.body))
	if err != nil {
		t.Fatalf("not the Prometheus text format: %v", err)
	}

	want := []struct {
		family, decision string
		value            float64
	}{
		{"tierlimit_requests_total", "allowed", 8},
		{"tierlimit_requests_total", "refused", 3},
		{"tierlimit_tracked_keys", "", 3},
		{"tierlimit_limited_keys", "", 1},
		{"tierlimit_layer_limit", "", 5},
		{"tierlimit_layer_window_seconds", "", 60},
		{"tierlimit_redis_fallback", "", 0},
	}

	for _, w := range want {
		mf := families[w.family]
		if mf == nil || len(mf.GetMetric()) == 0 {
			t.Errorf("%s: missing", w.family)
			continue
		}

		found := false

		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}

			if labels["middleware"] != "edge@file" {
				t.Errorf("%s: labels %v", w.family, labels)
			}

			if w.family != "tierlimit_redis_fallback" && labels["layer"] != "ip" || labels["decision"] != w.decision {
				continue
			}

			value := m.GetGauge().GetValue()
			if w.family == "tierlimit_requests_total" {
				value = m.GetCounter().GetValue()
			}

			found = true

			if value != w.value {
				t.Errorf("%s %v = %v, want %v", w.family, labels, value, w.value)
			}
		}

		if !found {
			t.Errorf("%s{decision=%q}: no sample", w.family, w.decision)
		}
	}

	if got := families["tierlimit_requests_total"].GetType().String(); got != "COUNTER" {
		t.Errorf("tierlimit_requests_total is a %s", got)
	}
}

// With the Redis store, the keys Redis reported over their limit are listed
// (count unknown: points+1), and an outage shows as redisFallback, with the
// fallback's keys listed from memory.
func TestStatusWithRedisThroughTraefik(t *testing.T) {
	redis := startRedis(t)
	e := start(t, strings.ReplaceAll(`
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(`+"`/`"+`)
      middlewares: [shared]
      service: backend
  middlewares:
    shared:
      plugin:
        tierlimit:
          store: redis
          redis: {address: "{{redis}}"}
          global: {points: 0}
          ip: {points: 5, duration: 60s}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
          status: {path: /_ratelimit}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`, "{{redis}}", redis.Addr))
	e.waitRouters("api")

	web := e.traefik.Web

	for i := 1; i <= 7; i++ {
		if r := e.get(web+"/api", from("203.0.113.7")); (i <= 5) != (r.code == http.StatusOK) {
			t.Fatalf("request %d: %d", i, r.code)
		}
	}

	doc := e.status(web + "/_ratelimit")
	if doc.Store != "redis" || doc.RedisFallback || doc.keys() != "203.0.113.7" || doc.Keys.Items[0].Count != 5 || !doc.Keys.Items[0].Limited {
		t.Fatalf("redis store: %+v", doc)
	}

	redis.Kill()

	if r := e.get(web+"/api", from("203.0.113.8")); r.code != http.StatusOK {
		t.Fatalf("during the outage: %d", r.code)
	}

	doc = e.status(web + "/_ratelimit")
	if !doc.RedisFallback || doc.keys() != "203.0.113.7 203.0.113.8" || doc.Layers[0].Allowed != 6 || doc.Layers[0].Refused != 2 {
		t.Fatalf("during the outage: %+v", doc)
	}

	if r := e.get(web+"/_ratelimit/metrics", nil); !strings.Contains(r.body, `tierlimit_redis_fallback{middleware="shared@file"} 1`+"\n") {
		t.Fatalf("metrics during the outage:\n%s", r.body)
	}
}
