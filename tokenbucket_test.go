package tierlimit

import (
	"context"
	"encoding/json"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/request"
)

func onlyBucket(points, burst int, duration string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: points, Duration: duration, Algorithm: "tokenbucket", Burst: burst}
	}
}

// bucketModel is a token bucket written the other way round from drip: a
// level of tokens (scaled by the emission interval, so exact in integers)
// that refills with elapsed time up to burst and loses one token per allowed
// request, as rate.Limiter does.
type bucketModel struct {
	interval, burst, level, last int64
	started                      bool
}

func (m *bucketModel) allow(now int64) (ok bool, left int64) {
	if !m.started {
		m.started = true
		m.level = m.burst * m.interval
	} else {
		m.level += now - m.last
		if m.level > m.burst*m.interval {
			m.level = m.burst * m.interval
		}
	}

	m.last = now

	if m.level < m.interval {
		return false, 0
	}

	m.level -= m.interval

	return true, m.level / m.interval
}

// TestTokenBucketMatchesTheModel sends seeded random request sequences through
// ServeHTTP with a manual clock and checks every answer and every
// X-RateLimit-Remaining against the model.
func TestTokenBucketMatchesTheModel(t *testing.T) {
	cases := []struct {
		points, burst int
		duration      string
		maxGap        time.Duration
	}{
		{points: 10, burst: 0, duration: "1s", maxGap: 150 * time.Millisecond},
		{points: 3, burst: 5, duration: "1s", maxGap: 500 * time.Millisecond},
		{points: 100, burst: 1, duration: "1m", maxGap: 2 * time.Second},
		{points: 1000, burst: 20, duration: "1s", maxGap: 1500 * time.Microsecond},
		{points: 7, burst: 2, duration: "10s", maxGap: 3 * time.Second},
	}

	for _, tc := range cases {
		h := newHarness(t, onlyBucket(tc.points, tc.burst, tc.duration))
		d, _ := config.ParseDuration(tc.duration)
		burst := int64(tc.burst)
		if burst == 0 {
			burst = int64(tc.points)
		}

		m := &bucketModel{interval: int64(d) / int64(tc.points), burst: burst}
		rng := rand.New(rand.NewSource(int64(tc.points*31 + tc.burst)))
		refused := 0

		for i := 0; i < 3000; i++ {
			h.clock.Add(time.Duration(rng.Int63n(int64(tc.maxGap))))
			wantOK, wantLeft := m.allow(h.clock.Now().UnixNano())
			rec := h.get("/", "203.0.113.7:1")

			if got := rec.Code == http.StatusOK; got != wantOK {
				t.Fatalf("%+v request %d: status %d, model allows: %v", tc, i, rec.Code, wantOK)
			}

			if !wantOK {
				refused++
				continue
			}

			if got := rec.Header().Get("X-Ratelimit-Remaining"); got != strconv.FormatInt(wantLeft, 10) {
				t.Fatalf("%+v request %d: remaining %s, model %d", tc, i, got, wantLeft)
			}

			if got := rec.Header().Get("X-Ratelimit-Limit"); got != strconv.FormatInt(burst, 10) {
				t.Fatalf("%+v: limit %s, want the burst %d", tc, got, burst)
			}
		}

		if refused < 100 || refused > 2900 {
			t.Fatalf("%+v: %d of 3000 refused: the sequence does not exercise the bucket", tc, refused)
		}
	}
}

// TestTokenBucketHeaders checks what a bucket tells its clients: the limit is
// the burst, reset is when the bucket is full again, and after a refusal
// Retry-After and reset are when the next token is back.
func TestTokenBucketHeaders(t *testing.T) {
	// 6 per minute: one token every 10s, a bucket of 3.
	h := newHarness(t, onlyBucket(6, 3, "60s"))
	start := h.clock.Now()

	for i := 1; i <= 3; i++ {
		rec := h.get("/", "203.0.113.8:1")
		if rec.Code != http.StatusOK || rec.Header().Get("X-Ratelimit-Remaining") != strconv.Itoa(3-i) {
			t.Fatalf("request %d: %d, remaining %q", i, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"))
		}

		full := start.Add(time.Duration(i) * 10 * time.Second)
		if got := rec.Header().Get("X-Ratelimit-Reset"); got != strconv.FormatInt(limit.CeilSeconds(full.UnixNano()), 10) {
			t.Fatalf("request %d: reset %s, want %d (bucket full again)", i, got, limit.CeilSeconds(full.UnixNano()))
		}

		if got := rec.Header().Get("Ratelimit-Policy"); got != `"ip";q=3;w=30` {
			t.Fatalf("policy %q", got)
		}
	}

	h.clock.Add(4 * time.Second)

	rec := h.get("/", "203.0.113.8:1")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("4th request: %d", rec.Code)
	}

	// The first token is back 10s after start: 6s from now.
	if rec.Header().Get("Retry-After") != "6" || rec.Header().Get("X-Ratelimit-Remaining") != "0" {
		t.Fatalf("refusal: Retry-After %q remaining %q", rec.Header().Get("Retry-After"), rec.Header().Get("X-Ratelimit-Remaining"))
	}

	if !strings.Contains(rec.Body.String(), `"limit":3`) {
		t.Fatalf("body %s", rec.Body.String())
	}

	h.clock.Add(6 * time.Second)

	if rec := h.get("/", "203.0.113.8:1"); rec.Code != http.StatusOK || rec.Header().Get("X-Ratelimit-Remaining") != "0" {
		t.Fatalf("when the token is back: %d remaining %q", rec.Code, rec.Header().Get("X-Ratelimit-Remaining"))
	}

	if h.p.mode != modeGeneral {
		t.Fatal("a token-bucket instance is on the fast path, which knows only fixed windows")
	}
}

// TestTokenBucketOnRoutesAndAssets covers the other layers that take it.
func TestTokenBucketOnRoutesAndAssets(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 1000, Duration: "1s"}
		c.Assets = AssetsConfig{Points: 2, Duration: "1s", Algorithm: "tokenbucket", Burst: 4, PathPrefixes: []string{"/static/"}}
		c.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 1, Duration: "1s", Algorithm: "tokenbucket"}}
	})

	if rec := h.get("/login", "203.0.113.1:1"); rec.Code != http.StatusOK {
		t.Fatalf("first login: %d", rec.Code)
	}

	if rec := h.get("/login", "203.0.113.1:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second login (burst 1 by default): %d", rec.Code)
	}

	for i := 0; i < 4; i++ {
		if rec := h.get("/static/a.css", "203.0.113.1:1"); rec.Code != http.StatusOK {
			t.Fatalf("asset %d: %d", i, rec.Code)
		}
	}

	if rec := h.get("/static/a.css", "203.0.113.1:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("5th asset: %d", rec.Code)
	}

	h.clock.Add(500 * time.Millisecond) // one asset token (2/s), half a login token

	if rec := h.get("/static/a.css", "203.0.113.1:1"); rec.Code != http.StatusOK {
		t.Fatalf("asset after 500ms: %d", rec.Code)
	}

	if rec := h.get("/login", "203.0.113.1:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("login after 500ms: %d", rec.Code)
	}
}

// TestTokenBucketReloadFromAnotherAlgorithm: a reload that turns a fixed
// layer into a bucket starts its keys with full buckets, and back.
func TestTokenBucketReloadFromAnotherAlgorithm(t *testing.T) {
	name := "reload-bucket@test"
	now := time.Unix(5000, 0)
	mk := func(algorithm string, points int) *Plugin {
		cfg := CreateConfig()
		cfg.Global.Points = 0
		cfg.IP = LayerConfig{Points: points, Duration: "60s", Algorithm: algorithm}

		hd, err := New(context.Background(), http.NotFoundHandler(), cfg, name)
		if err != nil {
			t.Fatal(err)
		}

		p := pluginOf(hd)
		p.now = func() time.Time { return now }

		return p
	}

	send := func(p *Plugin) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "203.0.113.2:1"
		p.ServeHTTP(rec, req)

		return rec.Code
	}

	fixed := mk("fixed", 2)
	send(fixed)
	send(fixed)

	if send(fixed) != http.StatusTooManyRequests {
		t.Fatal("fixed: third request allowed")
	}

	bucket := mk("tokenbucket", 2)
	first, second, third := send(bucket), send(bucket), send(bucket)

	if first != http.StatusNotFound || second != http.StatusNotFound || third != http.StatusTooManyRequests {
		t.Fatal("the bucket did not start full after the reload")
	}

	fixed = mk("fixed", 2)
	if send(fixed) != http.StatusNotFound {
		t.Fatal("back to fixed: the bucket's state was taken for a window")
	}
}

// TestTokenBucketStatus shows the bucket in the status endpoint.
func TestTokenBucketStatus(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		onlyBucket(6, 2, "60s")(c)
		c.Status = StatusConfig{Path: "/_status", AllowedIPs: []string{"192.0.2.1/32"}}
	})

	h.get("/", "203.0.113.3:1")
	h.get("/", "203.0.113.3:1")
	h.get("/", "203.0.113.3:1")
	h.get("/", "203.0.113.4:1")

	rec := h.get("/_status", "192.0.2.1:1")

	var doc struct {
		Layers []statusLayer `json:"layers"`
		Keys   struct {
			Items []statusKey `json:"items"`
		} `json:"keys"`
	}

	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("%v: %s", err, rec.Body.String())
	}

	if len(doc.Layers) < 1 || doc.Layers[0].Algorithm != "tokenbucket" || doc.Layers[0].Points != 6 || doc.Layers[0].Burst != 2 ||
		doc.Layers[0].Allowed != 3 || doc.Layers[0].Refused != 1 {
		t.Fatalf("layers %+v", doc.Layers)
	}

	limited := map[string]bool{}
	for _, k := range doc.Keys.Items {
		limited[k.Key] = k.Limited
	}

	if len(limited) != 2 || !limited["203.0.113.3"] || limited["203.0.113.4"] {
		t.Fatalf("keys %s", rec.Body.String())
	}
}

// TestTokenBucketMemoryIsBounded: buckets count against maxTracked, and a full
// bucket's state is dropped as soon as another key needs room.
func TestTokenBucketMemoryIsBounded(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		onlyBucket(10, 0, "1s")(c)
		c.MaxTracked = 50
	})

	for i := 0; i < 500; i++ {
		h.get("/", "198.51.100."+strconv.Itoa(i%250)+":1")
		h.clock.Add(time.Millisecond)
	}

	if n := h.p.memory.Count(); n > 50 {
		t.Fatalf("%d buckets held, cap 50", n)
	}

	// All full again after a second: each new key purges two on its way in
	// (purgePerInsert), least recently used first.
	h.clock.Add(2 * time.Second)

	for i := 0; i < 10; i++ {
		h.get("/", "192.0.2."+strconv.Itoa(i)+":1")
	}

	if n := h.p.memory.Count(); n > 40 {
		t.Fatalf("%d buckets held after they all filled up", n)
	}
}

func TestHostKey(t *testing.T) {
	long := strings.Repeat("a", 200) + ".example"

	for _, tc := range []struct{ host, want string }{
		{"Example.COM:8443", "host:example.com"},
		{"example.com.", "host:example.com"},
		{"[2001:db8::1]:80", "host:2001:db8::1"},
		{"", "203.0.113.5"},
		{":80", "203.0.113.5"},
		{long, request.HashKey(long)},
	} {
		if got := hostKey(tc.host, "203.0.113.5"); got != tc.want {
			t.Errorf("hostKey(%q) = %q, want %q", tc.host, got, tc.want)
		}
	}
}

// TestKeyHost keys a layer and a route by the request's host.
func TestKeyHost(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 2, Duration: "60s", Key: "host"}
		c.Routes = []RouteConfig{{Name: "upload", Paths: []string{"/upload"}, Key: "host", Points: 1, Duration: "60s", Algorithm: "tokenbucket"}}
	})

	do := func(host, remote, path string) int {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Host = host
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.h.ServeHTTP(rec, req)

		return rec.Code
	}

	// Two clients share a host's budget; the port and case do not matter.
	if do("a.example", "203.0.113.1:1", "/") != 200 || do("A.example:443", "203.0.113.2:1", "/") != 200 {
		t.Fatal("first two requests to a.example refused")
	}

	if do("a.example", "203.0.113.3:1", "/") != http.StatusTooManyRequests {
		t.Fatal("third request to a.example from a third client allowed: not keyed by host")
	}

	if do("b.example", "203.0.113.1:1", "/") != 200 {
		t.Fatal("b.example shares a.example's budget")
	}

	if do("c.example", "203.0.113.1:1", "/upload") != 200 || do("c.example", "203.0.113.9:1", "/upload") != http.StatusTooManyRequests {
		t.Fatal("route keyed by host")
	}

	// Without a host, each client has its own bucket, never a shared empty key.
	if do("", "203.0.113.4:1", "/") != 200 || do("", "203.0.113.5:1", "/") != 200 || do("", "203.0.113.5:1", "/") != 200 {
		t.Fatal("requests without a host share a bucket")
	}
}

func TestTokenBucketConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		mutate func(c *Config)
		want   string
	}{
		{func(c *Config) { c.IP = LayerConfig{Points: 5, Duration: "1s", Algorithm: "tokenbucket", Burst: -1} }, `ip.burst = "-1"`},
		{func(c *Config) { c.IP = LayerConfig{Points: 5, Duration: "1s", Burst: 3} }, `ip.burst = "3": only algorithm "tokenbucket" takes a burst`},
		{func(c *Config) { c.IP = LayerConfig{Points: 5, Duration: "1s", Algorithm: "sliding", Burst: 3} }, `ip.burst = "3"`},
		{func(c *Config) { c.IP = LayerConfig{Points: 5, Duration: "1s", Algorithm: "leaky"} }, `ip.algorithm = "leaky": must be "fixed", "sliding", "tokenbucket" or "concurrency"`},
		{func(c *Config) { c.IP = LayerConfig{Points: 2000, Duration: "1ms", Algorithm: "tokenbucket"} }, `ip.points = "2000": a token bucket refills at most one point per microsecond`},
		{func(c *Config) {
			c.IP = LayerConfig{Points: 1, Duration: "8760h", Algorithm: "tokenbucket", Burst: 1000000}
		}, `ip.burst = "1000000": too large`},
		{func(c *Config) {
			c.Assets = AssetsConfig{Points: 1, Duration: "1s", Burst: 2, PathPrefixes: []string{"/s/"}}
		}, `assets.burst = "2"`},
		{func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/r"}, Points: 1, Duration: "1s", Burst: 2}}
		}, `routes[0].burst = "2"`},
		{func(c *Config) { c.Global.Key = "host" }, `global.key = "host"`},
		{func(c *Config) { c.IP.Key = "hostname" }, `ip.key = "hostname": must be empty, "host" or "header:<Name>"`},
		{func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/r"}, Points: 1, Duration: "1s", Key: "hosts"}}
		}, `routes[0].key = "hosts": must be "ip", "principal", "global", "host" or "header:<Name>"`},
	} {
		cfg := CreateConfig()
		tc.mutate(cfg)

		_, err := parse(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want it to contain %s", err, tc.want)
		}
	}

	cfg := CreateConfig()
	cfg.IP = LayerConfig{Points: 5, Duration: "1s", Algorithm: " tokenbucket "}

	s, err := parse(cfg)
	if err != nil || !s.Spec(layerIP).Bucket || s.Spec(layerIP).Burst != 5 {
		t.Fatalf("default burst: %+v %v", s.Spec(layerIP), err)
	}
}
