package tierlimit

import (
	"encoding/json"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/status"
)

// statusDoc is the status JSON as a client reads it (the names are the contract).
type statusDoc struct {
	Middleware    string `json:"middleware"`
	Store         string `json:"store"`
	RedisFallback bool   `json:"redisFallback"`
	Counting      string `json:"counting"`
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
		Total  int       `json:"total"`
		Offset int       `json:"offset"`
		Limit  int       `json:"limit"`
		Items  []keyItem `json:"items"`
	} `json:"keys"`
}

type keyItem struct {
	Layer     string `json:"layer"`
	Key       string `json:"key"`
	Count     int64  `json:"count"`
	Limit     int64  `json:"limit"`
	Limited   bool   `json:"limited"`
	Refused   int64  `json:"refused"`
	Reset     string `json:"reset"`
	ResetUnix int64  `json:"resetUnix"`
}

const local = "127.0.0.1:40000"

// statusHarness is an instance with an ip layer of 5/60s and the status
// endpoint at /_rl.
func statusHarness(t *testing.T, mutate func(c *Config)) *harness {
	t.Helper()

	return newHarness(t, func(c *Config) {
		onlyIP(5, "60s")(c)
		c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0
		c.Status.Path = "/_rl"

		if mutate != nil {
			mutate(c)
		}
	})
}

// burst sends n requests from client (a TCP peer address without port).
func (h *harness) burst(client string, n int) {
	for i := 0; i < n; i++ {
		h.get("/api", client+":1")
	}
}

func (h *harness) status(target string) statusDoc {
	h.t.Helper()

	calls := h.calls.Load()
	rec := h.get(target, local)

	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" ||
		rec.Header().Get("Cache-Control") != "no-store" {
		h.t.Fatalf("GET %s: %d %v %s", target, rec.Code, rec.Header(), rec.Body)
	}

	if h.calls.Load() != calls {
		h.t.Fatalf("GET %s reached the backend", target)
	}

	if rec.Header().Get("X-RateLimit-Limit") != "" {
		h.t.Fatalf("GET %s was charged: %v", target, rec.Header())
	}

	var doc statusDoc
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		h.t.Fatalf("GET %s: %v\n%s", target, err, rec.Body)
	}

	return doc
}

func keysOf(items []keyItem) string {
	var out []string
	for _, it := range items {
		out = append(out, it.Layer+"/"+it.Key+"="+strconv.FormatInt(it.Count, 10))
	}

	return strings.Join(out, " ")
}

func TestStatusListsLayersAndLiveKeysByCount(t *testing.T) {
	h := statusHarness(t, nil)

	h.burst("203.0.113.7", 8) // 5 allowed, 3 refused
	h.burst("203.0.113.8", 2)
	h.burst("203.0.113.10", 2)
	h.burst("198.51.100.1", 1)

	doc := h.status("/_rl")

	if doc.Middleware != h.p.name || doc.Store != "memory" || doc.RedisFallback || !strings.Contains(doc.Counting, "spends nothing") {
		t.Fatalf("header of the document: %+v", doc)
	}

	if len(doc.Layers) != 1 {
		t.Fatalf("layers %+v", doc.Layers)
	}

	l := doc.Layers[0]
	if l.Name != "ip" || l.Points != 5 || l.Duration != "1m0s" || l.Algorithm != "fixed" || l.TrackedKeys != 4 ||
		l.Allowed != 10 || l.Refused != 3 {
		t.Fatalf("layer %+v", l)
	}

	// A refused request is not in the count, only in the key's refusals.
	if got := keysOf(doc.Keys.Items); got != "ip/203.0.113.7=5 ip/203.0.113.10=2 ip/203.0.113.8=2 ip/198.51.100.1=1" {
		t.Fatalf("keys %s", got)
	}

	if doc.Keys.Total != 4 || doc.Keys.Offset != 0 || doc.Keys.Limit != 100 {
		t.Fatalf("paging %+v", doc.Keys)
	}

	first := doc.Keys.Items[0]
	reset := h.clock.Now().Add(60 * time.Second)

	if !first.Limited || first.Limit != 5 || first.Refused != 3 || first.ResetUnix != reset.Unix()+1 ||
		first.Reset != time.Unix(reset.Unix()+1, 0).UTC().Format(time.RFC3339) {
		t.Fatalf("refused key %+v (reset %s)", first, reset)
	}

	if doc.Keys.Items[1].Limited || doc.Keys.Items[1].Refused != 0 {
		t.Fatalf("a key under its limit is limited: %+v", doc.Keys.Items[1])
	}

	// Expired windows are not listed but still tracked until purged.
	h.clock.Add(61 * time.Second)

	doc = h.status("/_rl")
	if len(doc.Keys.Items) != 0 || doc.Keys.Total != 0 || doc.Layers[0].TrackedKeys != 4 {
		t.Fatalf("after the reset: %+v", doc)
	}
}

func TestStatusSortsTiesByLayerThenKey(t *testing.T) {
	h := statusHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.Routes = []config.RouteConfig{{Name: "a_route", Paths: []string{"/api"}, Key: "ip", Points: 10, Duration: "60s"}}
	})

	h.burst("203.0.113.9", 1)
	h.burst("203.0.113.1", 1)

	doc := h.status("/_rl")
	if got := keysOf(doc.Keys.Items); got != "global/global=2 a_route/203.0.113.1=1 a_route/203.0.113.9=1 ip/203.0.113.1=1 ip/203.0.113.9=1" {
		t.Fatalf("order %s", got)
	}

	if len(doc.Layers) != 3 || doc.Layers[0].Name != "global" || doc.Layers[1].Name != "ip" || doc.Layers[2].Name != "a_route" {
		t.Fatalf("layers %+v", doc.Layers)
	}
}

func TestStatusFiltersAndPages(t *testing.T) {
	h := statusHarness(t, nil)

	h.burst("203.0.113.7", 8)
	h.burst("203.0.113.70", 6)
	h.burst("203.0.113.8", 3)
	h.burst("198.51.100.1", 2)

	cases := []struct {
		query string
		want  string
		total int
	}{
		{"?limited=true", "ip/203.0.113.7=5 ip/203.0.113.70=5", 2},
		{"?limited=false", "ip/203.0.113.7=5 ip/203.0.113.70=5 ip/203.0.113.8=3 ip/198.51.100.1=2", 4},
		{"?q=203.0.113.7", "ip/203.0.113.7=5 ip/203.0.113.70=5", 2},
		{"?q=198.", "ip/198.51.100.1=2", 1},
		{"?q=192.0.2.", "", 0},
		{"?offset=1&limit=2", "ip/203.0.113.70=5 ip/203.0.113.8=3", 4},
		{"?offset=3", "ip/198.51.100.1=2", 4},
		{"?offset=9", "", 4},
		{"?limit=0", "", 4},
		{"?limit=1000", "ip/203.0.113.7=5 ip/203.0.113.70=5 ip/203.0.113.8=3 ip/198.51.100.1=2", 4},
		{"?limited=true&q=203.0.113.8", "", 0},
		{"?limited=true&offset=1&limit=1", "ip/203.0.113.70=5", 2},
	}

	for _, c := range cases {
		doc := h.status("/_rl" + c.query)
		if got := keysOf(doc.Keys.Items); got != c.want || doc.Keys.Total != c.total {
			t.Errorf("%s: %q total %d, want %q total %d", c.query, got, doc.Keys.Total, c.want, c.total)
		}

		if doc.Keys.Items == nil {
			t.Errorf("%s: items is null, want []", c.query)
		}
	}
}

func TestStatusRejectsBadParameters(t *testing.T) {
	h := statusHarness(t, nil)

	for query, param := range map[string]string{
		"?limited=yes": "limited", "?limited=": "limited", "?offset=-1": "offset", "?offset=x": "offset",
		"?limit=1001": "limit", "?limit=-1": "limit", "?limit=1e3": "limit", "?offset=1&limit=": "limit",
	} {
		rec := h.get("/_rl"+query, local)

		var body struct {
			Error     string `json:"error"`
			Parameter string `json:"parameter"`
		}

		if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Parameter != param ||
			!strings.Contains(body.Error, param) {
			t.Errorf("%s: %d %s", query, rec.Code, rec.Body)
		}
	}

	if h.calls.Load() != 0 {
		t.Fatal("a bad status request reached the backend")
	}
}

func TestStatusIsOnlyForAllowedClients(t *testing.T) {
	h := statusHarness(t, func(c *Config) {
		c.Status.AllowedIPs = []string{"192.0.2.0/24", "2001:db8::/32"}
	})

	cases := []struct {
		remote, xff string
		allowed     bool
	}{
		{"192.0.2.5:1", "", true},
		{"[2001:db8::1]:1", "", true},
		{"[::ffff:192.0.2.5]:1", "", true},
		{"10.0.0.1:1", "192.0.2.5", true},                // through a trusted proxy
		{"10.0.0.1:1", "192.0.2.5, 10.0.0.2", true},      // two trusted proxies
		{"127.0.0.1:1", "", false},                       // the default list was replaced
		{"203.0.113.1:1", "", false},                     // outside
		{"203.0.113.1:1", "192.0.2.5", false},            // X-Forwarded-For from an untrusted peer
		{"192.0.2.5:1", "198.51.100.9", true},            // X-Forwarded-For from an untrusted peer is ignored
		{"10.0.0.1:1", "198.51.100.9", false},            // resolved client is outside...
		{"10.0.0.1:1", "192.0.2.5, 198.51.100.9", false}, // ...whatever lies left of it
		{"10.0.0.1:1", "198.51.100.9, 192.0.2.5", true},  // the rightmost untrusted decides
		{"10.0.0.1:1", "garbage", false},                 // malformed: the proxy itself
		{"[2001:db9::1]:1", "", false},
	}

	for _, c := range cases {
		hdr := map[string]string{}
		if c.xff != "" {
			hdr["X-Forwarded-For"] = c.xff
		}

		calls := h.calls.Load()
		rec := h.do(http.MethodGet, "/_rl", c.remote, hdr)
		served := rec.Header().Get("Content-Type") == "application/json" && strings.Contains(rec.Body.String(), `"layers"`)
		reached := h.calls.Load() != calls

		if c.allowed && (!served || reached || rec.Code != http.StatusOK) {
			t.Errorf("%s %q: want the status, got %d %q (backend reached: %v)", c.remote, c.xff, rec.Code, rec.Body, reached)
		}

		if !c.allowed && (served || !reached || rec.Header().Get("X-RateLimit-Limit") != "5") {
			t.Errorf("%s %q: want an ordinary charged request, got %d %q %v", c.remote, c.xff, rec.Code, rec.Body, rec.Header())
		}
	}
}

// TestMetricsAreOnlyForAllowedClients: <status.path>/metrics follows the
// status page's address rule; from a peer outside allowedIPs it is an
// ordinary request, charged and passed on, with no metric in the answer.
func TestMetricsAreOnlyForAllowedClients(t *testing.T) {
	h := statusHarness(t, func(c *Config) {
		c.Status.AllowedIPs = []string{"192.0.2.0/24"}
	})

	for _, c := range []struct {
		remote, xff string
		allowed     bool
	}{
		{"192.0.2.5:1", "", true},
		{"203.0.113.1:1", "", false},
		{"203.0.113.1:1", "192.0.2.5", false}, // an address the client wrote
		{"127.0.0.1:1", "", false},            // the default list was replaced
	} {
		hdr := map[string]string{}
		if c.xff != "" {
			hdr["X-Forwarded-For"] = c.xff
		}

		calls := h.calls.Load()
		rec := h.do(http.MethodGet, "/_rl/metrics", c.remote, hdr)
		served := strings.Contains(rec.Body.String(), "tierlimit_")
		reached := h.calls.Load() != calls

		if served == reached || served != c.allowed {
			t.Errorf("%s %q: metrics served %v, backend reached %v; want served %v", c.remote, c.xff, served, reached, c.allowed)
		}
	}
}

// TestStatusIsNotOpenedByAnAddressAClientWrote: with the default trusted
// proxies (every private address) a client on a private address can send
// X-Forwarded-For: 127.0.0.1; a chain of only trusted addresses opens the
// status page only when every address in it is allowed.
func TestStatusIsNotOpenedByAnAddressAClientWrote(t *testing.T) {
	h := statusHarness(t, nil)

	cases := []struct {
		remote, xff string
		allowed     bool
	}{
		{"127.0.0.1:1", "", true},
		{"127.0.0.1:1", "127.0.0.1", true},                 // a local proxy for a local client
		{"192.168.1.9:1", "127.0.0.1", false},              // a private client writes loopback
		{"192.168.1.9:1", "127.0.0.1, 127.0.0.1", false},   // ...twice
		{"127.0.0.1:1", "127.0.0.1, 192.168.1.9", false},   // ...behind a local proxy
		{"127.0.0.1:1", "127.0.0.1, 10.0.0.1, ::1", false}, // one address outside the list
		{"127.0.0.1:1", "203.0.113.1", false},              // the first untrusted address decides
	}

	for _, c := range cases {
		hdr := map[string]string{}
		if c.xff != "" {
			hdr["X-Forwarded-For"] = c.xff
		}

		calls := h.calls.Load()
		h.do(http.MethodGet, "/_rl", c.remote, hdr)

		if reached := h.calls.Load() != calls; reached == c.allowed {
			t.Errorf("%s %q: status served %v, want %v", c.remote, c.xff, !reached, c.allowed)
		}
	}
}

// The untrusted clients' requests to the status path were charged like any
// other: the default allowedIPs let loopback in and nothing else.
func TestStatusRequestsFromOthersAreChargedAndLimited(t *testing.T) {
	h := statusHarness(t, nil)

	for i := 1; i <= 6; i++ {
		rec := h.do(http.MethodGet, "/_rl", "127.0.0.1:1", map[string]string{"X-Forwarded-For": "198.51.100.9"})

		want := http.StatusOK
		if i == 6 {
			want = http.StatusTooManyRequests
		}

		if rec.Code != want || strings.Contains(rec.Body.String(), `"layers"`) {
			t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
		}
	}

	if h.calls.Load() != 5 {
		t.Fatalf("%d requests reached the backend, want 5", h.calls.Load())
	}

	// Allowed clients are never charged, however often they ask.
	for i := 0; i < 20; i++ {
		h.status("/_rl")
		h.get("/_rl/metrics", "[::1]:1")
	}

	doc := h.status("/_rl")
	if l := doc.Layers[0]; l.Allowed != 5 || l.Refused != 1 || l.TrackedKeys != 1 || doc.Keys.Items[0].Key != "198.51.100.9" {
		t.Fatalf("after status requests: %+v", doc)
	}
}

func TestStatusPathsAreExact(t *testing.T) {
	h := statusHarness(t, func(c *Config) { c.IP.Points = 50 })

	for _, path := range []string{"/_rl/", "/_rlx", "/_rl/metricsx", "/_rl/metrics/", "/_r", "/api/_rl", "/_rl/other"} {
		calls := h.calls.Load()

		rec := h.get(path, local)
		if h.calls.Load() != calls+1 || rec.Header().Get("X-RateLimit-Limit") != "50" {
			t.Errorf("%s: not passed on as an ordinary request: %d %v", path, rec.Code, rec.Header())
		}
	}

	// Off by default: the path is an ordinary one.
	off := newHarness(t, onlyIP(5, "60s"))
	if rec := off.get("/_ratelimit", local); off.calls.Load() != 1 || rec.Body.String() != "ok" {
		t.Fatalf("status off: %d %s", rec.Code, rec.Body)
	}
}

func TestStatusMethods(t *testing.T) {
	h := statusHarness(t, nil)
	h.burst("203.0.113.7", 2)

	for _, path := range []string{"/_rl", "/_rl/metrics"} {
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodOptions} {
			rec := h.do(m, path, local, nil)
			if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("%s %s: %d %v", m, path, rec.Code, rec.Header())
			}
		}

		get := h.get(path, local)
		head := h.do(http.MethodHead, path, local, nil)

		if head.Code != http.StatusOK || head.Body.Len() != 0 || head.Header().Get("Content-Type") != get.Header().Get("Content-Type") ||
			head.Header().Get("Content-Length") != strconv.Itoa(get.Body.Len()) || head.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("HEAD %s: %d %v %q (GET: %d bytes)", path, head.Code, head.Header(), head.Body, get.Body.Len())
		}
	}

	if h.calls.Load() != 2 {
		t.Fatalf("%d backend calls, want the burst's 2", h.calls.Load())
	}
}

func TestStatusShowsHeaderKeysHashed(t *testing.T) {
	h := statusHarness(t, func(c *Config) {
		c.IP.Key = "header:X-Api-Key"
	})

	for i := 0; i < 7; i++ {
		h.do(http.MethodGet, "/api", "203.0.113.7:1", map[string]string{"X-Api-Key": "secret-key-123"})
	}

	h.burst("203.0.113.8", 1) // no key: keyed by IP

	rec := h.get("/_rl", local)
	if strings.Contains(rec.Body.String(), "secret-key-123") {
		t.Fatalf("the raw API key is shown: %s", rec.Body)
	}

	doc := h.status("/_rl?limited=true")
	if len(doc.Keys.Items) != 1 || doc.Keys.Items[0].Key != request.HashKey("secret-key-123") || doc.Keys.Items[0].Count != 5 || doc.Keys.Items[0].Refused != 2 ||
		!strings.HasPrefix(doc.Keys.Items[0].Key, "sha256:") {
		t.Fatalf("keys %+v", doc.Keys.Items)
	}

	if doc := h.status("/_rl?q=sha256:"); doc.Keys.Total != 1 {
		t.Fatalf("q=sha256: %+v", doc.Keys)
	}
}

func TestMetricsForAKnownRun(t *testing.T) {
	h := statusHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 1000, Duration: "500ms"}
	})

	h.burst("203.0.113.7", 8)
	h.burst("203.0.113.8", 6)
	h.burst("198.51.100.1", 1)

	rec := h.get("/_rl/metrics", local)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" ||
		rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}

	// The global window is 500ms: at 10:00:00.2 + 15 requests it is still live
	// (the clock does not move).
	mw := `middleware="` + h.p.name + `"`
	want := `# HELP tierlimit_requests_total Requests each layer allowed or refused since the process started.
# TYPE tierlimit_requests_total counter
tierlimit_requests_total{MW,layer="global",decision="allowed"} 15
tierlimit_requests_total{MW,layer="global",decision="refused"} 0
tierlimit_requests_total{MW,layer="ip",decision="allowed"} 11
tierlimit_requests_total{MW,layer="ip",decision="refused"} 4
# HELP tierlimit_tracked_keys Keys held in memory for the layer, live or expired but not yet purged.
# TYPE tierlimit_tracked_keys gauge
tierlimit_tracked_keys{MW,layer="global"} 1
tierlimit_tracked_keys{MW,layer="ip"} 3
# HELP tierlimit_limited_keys Live keys over the layer's limit.
# TYPE tierlimit_limited_keys gauge
tierlimit_limited_keys{MW,layer="global"} 0
tierlimit_limited_keys{MW,layer="ip"} 2
# HELP tierlimit_layer_limit Requests the layer allows per key and window (points).
# TYPE tierlimit_layer_limit gauge
tierlimit_layer_limit{MW,layer="global"} 1000
tierlimit_layer_limit{MW,layer="ip"} 5
# HELP tierlimit_layer_window_seconds The layer's window (duration) in seconds.
# TYPE tierlimit_layer_window_seconds gauge
tierlimit_layer_window_seconds{MW,layer="global"} 0.5
tierlimit_layer_window_seconds{MW,layer="ip"} 60
# HELP tierlimit_redis_fallback 1 while Redis is failing and the in-memory store decides, else 0.
# TYPE tierlimit_redis_fallback gauge
tierlimit_redis_fallback{MW} 0
# HELP tierlimit_evictions_total Live keys dropped from memory at maxTracked since the process started.
# TYPE tierlimit_evictions_total counter
tierlimit_evictions_total{MW} 0
`
	// The registries are the process's, shared with the other tests here:
	// their family comes last, checked for its form only.
	got := rec.Body.String()
	registries := ""

	if i := strings.Index(got, "# HELP tierlimit_registry_entries "); i >= 0 {
		got, registries = got[:i], got[i:]
	}

	if got != strings.ReplaceAll(want, "MW", mw) {
		t.Fatalf("metrics:\n%s\nwant:\n%s", got, strings.ReplaceAll(want, "MW", mw))
	}

	form := regexp.MustCompile(`^# HELP tierlimit_registry_entries .+\n# TYPE tierlimit_registry_entries gauge\n` +
		`tierlimit_registry_entries\{registry="stores"\} [1-9][0-9]*\n` +
		`tierlimit_registry_entries\{registry="blocklists"\} [0-9]+\n` +
		`tierlimit_registry_entries\{registry="connections"\} [0-9]+\n` +
		`tierlimit_registry_entries\{registry="redis"\} [0-9]+\n$`)
	if !form.MatchString(registries) {
		t.Fatalf("registry sizes:\n%s", registries)
	}

	// After the ip windows end, nothing is limited; the counters stay.
	h.clock.Add(time.Minute)

	body := h.get("/_rl/metrics", local).Body.String()
	if !strings.Contains(body, `tierlimit_limited_keys{`+mw+`,layer="ip"} 0`) ||
		!strings.Contains(body, `tierlimit_requests_total{`+mw+`,layer="ip",decision="refused"} 4`) {
		t.Fatalf("after the reset:\n%s", body)
	}
}

func TestStatusListsKeysRedisReportedOverTheirLimit(t *testing.T) {
	// Redis says: count 4 of 3, 30s left.
	srv := newCannedRedis(t, "*2\r\n:4\r\n:30000\r\n")
	h, _ := redisHarness(t, srv.l.Addr().String(), func(c *Config) {
		c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0
		c.Status.Path = "/_rl"
	})

	h.burst("203.0.113.9", 1)

	calls := srv.commands.Load()
	doc := h.status("/_rl")

	if srv.commands.Load() != calls {
		t.Fatal("the status request called Redis")
	}

	if doc.Store != "redis" || doc.RedisFallback || doc.Keys.Total != 1 {
		t.Fatalf("%+v", doc)
	}

	it := doc.Keys.Items[0]
	reset := h.clock.Now().Add(30 * time.Second)

	if it.Layer != "ip" || it.Key != "203.0.113.9" || it.Count != 3 || it.Limit != 3 || !it.Limited || it.ResetUnix != reset.Unix()+1 {
		t.Fatalf("blocked key %+v", it)
	}

	if doc := h.status("/_rl?q=198."); doc.Keys.Total != 0 {
		t.Fatalf("q filters the block list: %+v", doc.Keys)
	}

	if body := h.get("/_rl/metrics", local).Body.String(); !strings.Contains(body, `layer="ip"} 1`+"\n# HELP tierlimit_layer_limit") ||
		!strings.Contains(body, `,layer="ip",decision="refused"} 1`) {
		t.Fatalf("metrics:\n%s", body)
	}

	// After its reset the key is gone.
	h.clock.Add(31 * time.Second)

	if doc := h.status("/_rl"); doc.Keys.Total != 0 {
		t.Fatalf("after the reset: %+v", doc.Keys)
	}
}

func TestStatusMergesTheFallbackAndReportsIt(t *testing.T) {
	h, _ := redisHarness(t, closedPort(t), func(c *Config) {
		c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0
		c.Status.Path = "/_rl"
	})

	h.burst("203.0.113.9", 5) // decided in memory: 3 allowed, 2 refused

	// A key both blocked by Redis earlier and counted in memory is listed once.
	ip := h.p.layers[0].BlockPrefix
	redisStoreOf(h.p).Blocked.Add(ip, "203.0.113.9", h.clock.Now().Add(time.Hour).UnixNano(), h.clock.Now().UnixNano())
	redisStoreOf(h.p).Blocked.Add(ip, "203.0.113.50", h.clock.Now().Add(time.Hour).UnixNano(), h.clock.Now().UnixNano())
	redisStoreOf(h.p).Blocked.Add("gone\x00\x00", "203.0.113.50", h.clock.Now().Add(time.Hour).UnixNano(), h.clock.Now().UnixNano())
	// An entry made under the layer's earlier limits is not listed.
	redisStoreOf(h.p).Blocked.Add("ip\x00"+h.p.layers[0].RedisArgs+"x\x00", "203.0.113.51", h.clock.Now().Add(time.Hour).UnixNano(), h.clock.Now().UnixNano())

	doc := h.status("/_rl")
	if !doc.RedisFallback || keysOf(doc.Keys.Items) != "ip/203.0.113.50=3 ip/203.0.113.9=3" {
		t.Fatalf("%+v", doc)
	}

	if it := doc.Keys.Items[0]; it.ResetUnix != h.clock.Now().Add(time.Hour).Unix()+1 {
		t.Fatalf("merged key keeps the later reset: %+v", it)
	}

	if l := doc.Layers[0]; l.Allowed != 3 || l.Refused != 2 || l.TrackedKeys != 1 {
		t.Fatalf("layer %+v", l)
	}

	if body := h.get("/_rl/metrics", local).Body.String(); !strings.Contains(body, "tierlimit_redis_fallback{middleware=\""+h.p.name+"\"} 1\n") {
		t.Fatalf("metrics:\n%s", body)
	}
}

// A sliding layer lists the weighted count it decides on; a key is limited
// when its next request would be refused.
func TestStatusListsSlidingLayers(t *testing.T) {
	h := statusHarness(t, func(c *Config) {
		c.IP.Algorithm = "sliding"
	})

	h.burst("203.0.113.7", 6) // 5 allowed, the 6th refused
	h.burst("203.0.113.8", 2)

	doc := h.status("/_rl")
	if doc.Layers[0].Algorithm != "sliding" || doc.Layers[0].Allowed != 7 || doc.Layers[0].Refused != 1 {
		t.Fatalf("layer %+v", doc.Layers[0])
	}

	reset := h.clock.Now().Add(60 * time.Second).Unix()
	if got := keysOf(doc.Keys.Items); got != "ip/203.0.113.7=5 ip/203.0.113.8=2" || !doc.Keys.Items[0].Limited ||
		doc.Keys.Items[1].Limited || doc.Keys.Items[0].ResetUnix != reset+1 {
		t.Fatalf("keys %+v", doc.Keys.Items)
	}

	if doc := h.status("/_rl?limited=true"); keysOf(doc.Keys.Items) != "ip/203.0.113.7=5" {
		t.Fatalf("limited: %+v", doc.Keys.Items)
	}

	// Half-way through the next window, the previous one weighs half.
	h.clock.Add(90 * time.Second)

	doc = h.status("/_rl")
	if got := keysOf(doc.Keys.Items); got != "ip/203.0.113.7=2 ip/203.0.113.8=1" || doc.Keys.Items[0].Limited ||
		doc.Keys.Items[0].ResetUnix != reset+60+1 {
		t.Fatalf("next window: %+v", doc.Keys.Items)
	}

	// A window later nothing weighs any more.
	h.clock.Add(31 * time.Second)

	if doc := h.status("/_rl"); doc.Keys.Total != 0 {
		t.Fatalf("expired: %+v", doc.Keys.Items)
	}
}

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
			c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 5, Duration: "60s"}}
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
			c.Plans = map[string]config.PlanConfig{"pro": {Points: 10, Duration: "60s"}, "free": {Points: 0}}
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

// statusOf is p's status page; for an instance without one, the page it
// would have.
func statusOf(p *Plugin) *status.Page {
	if p.status != nil {
		return p.status
	}

	return statusPageOf(p, &config.Settings{})
}
