package tierlimit

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
)

func onlyBucket(points, burst int, duration string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: points, Duration: duration, Algorithm: "tokenbucket", Burst: burst}
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
		c.IP = config.LayerConfig{Points: 1000, Duration: "1s"}
		c.Assets = config.AssetsConfig{Points: 2, Duration: "1s", Algorithm: "tokenbucket", Burst: 4, PathPrefixes: []string{"/static/"}}
		c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 1, Duration: "1s", Algorithm: "tokenbucket"}}
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
		cfg.IP = config.LayerConfig{Points: points, Duration: "60s", Algorithm: algorithm}

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
		c.Status = config.StatusConfig{Path: "/_status", AllowedIPs: []string{"192.0.2.1/32"}}
	})

	h.get("/", "203.0.113.3:1")
	h.get("/", "203.0.113.3:1")
	h.get("/", "203.0.113.3:1")
	h.get("/", "203.0.113.4:1")

	rec := h.get("/_status", "192.0.2.1:1")

	var doc struct {
		Layers []struct {
			Algorithm string `json:"algorithm"`
			Points    int64  `json:"points"`
			Burst     int64  `json:"burst"`
			Allowed   int64  `json:"allowed"`
			Refused   int64  `json:"refused"`
		} `json:"layers"`
		Keys struct {
			Items []keyItem `json:"items"`
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

// TestKeyHost keys a layer and a route by the request's host.
func TestKeyHost(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 2, Duration: "60s", Key: "host"}
		c.Routes = []config.RouteConfig{{Name: "upload", Paths: []string{"/upload"}, Key: "host", Points: 1, Duration: "60s", Algorithm: "tokenbucket"}}
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
		{func(c *Config) {
			c.IP = config.LayerConfig{Points: 5, Duration: "1s", Algorithm: "tokenbucket", Burst: -1}
		}, `ip.burst = "-1"`},
		{func(c *Config) { c.IP = config.LayerConfig{Points: 5, Duration: "1s", Burst: 3} }, `ip.burst = "3": only algorithm "tokenbucket" takes a burst`},
		{func(c *Config) { c.IP = config.LayerConfig{Points: 5, Duration: "1s", Algorithm: "sliding", Burst: 3} }, `ip.burst = "3"`},
		{func(c *Config) { c.IP = config.LayerConfig{Points: 5, Duration: "1s", Algorithm: "leaky"} }, `ip.algorithm = "leaky": must be "fixed", "sliding", "tokenbucket" or "concurrency"`},
		{func(c *Config) { c.IP = config.LayerConfig{Points: 2000, Duration: "1ms", Algorithm: "tokenbucket"} }, `ip.points = "2000": a token bucket refills at most one point per microsecond`},
		{func(c *Config) {
			c.IP = config.LayerConfig{Points: 1, Duration: "8760h", Algorithm: "tokenbucket", Burst: 1000000}
		}, `ip.burst = "1000000": too large`},
		{func(c *Config) {
			c.Assets = config.AssetsConfig{Points: 1, Duration: "1s", Burst: 2, PathPrefixes: []string{"/s/"}}
		}, `assets.burst = "2"`},
		{func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/r"}, Points: 1, Duration: "1s", Burst: 2}}
		}, `routes[0].burst = "2"`},
		{func(c *Config) { c.Global.Key = "host" }, `global.key = "host"`},
		{func(c *Config) { c.IP.Key = "hostname" }, `ip.key = "hostname": must be empty, "host" or "header:<Name>"`},
		{func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/r"}, Points: 1, Duration: "1s", Key: "hosts"}}
		}, `routes[0].key = "hosts": must be "ip", "principal", "global", "host", "header:<Name>", "json:<path>", or sources joined by commas`},
	} {
		cfg := CreateConfig()
		tc.mutate(cfg)

		_, err := parse(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want it to contain %s", err, tc.want)
		}
	}

	cfg := CreateConfig()
	cfg.IP = config.LayerConfig{Points: 5, Duration: "1s", Algorithm: " tokenbucket "}

	s, err := parse(cfg)
	if err != nil || s.Spec(config.LayerIP).Algorithm != limit.TokenBucket || s.Spec(config.LayerIP).Burst != 5 {
		t.Fatalf("default burst: %+v %v", s.Spec(config.LayerIP), err)
	}
}

var t0 = time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixNano()

func testLayer(s *memstore.WindowStore, name string, points int64, d time.Duration) *rule.Layer {
	return newLayer(s, config.Rule{Name: name, Points: points, Duration: d}, keyOfClient)
}

// takeIn runs take on s (storeOf) and returns the tally.
func takeIn(s interface{}, now int64, layers []*rule.Layer, client, principal string, all bool) rule.Tally {
	var t rule.Tally

	take(storeOf(s), &t, chargeOf(layers, client, principal, nil, now, all))

	return t
}

func peekCount(s *memstore.WindowStore, now int64, layer, key string) int64 {
	count, _ := s.Peek(now, layer, key)
	return count
}

// The general path and the fast path keep the same rule.
func TestEvictionSparesTheRequestsCountersOnEveryPath(t *testing.T) {
	for _, headers := range []bool{true, false} {
		h := newHarness(t, func(c *Config) {
			c.MaxTracked = 2
			c.Global = config.LayerConfig{Points: 5, Duration: "60s"}
			c.IP = config.LayerConfig{Points: 50, Duration: "60s"}
			c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0
			c.Headers = headers // off: serveGeneral
		})

		if (h.p.mode == modeAnonymous) != headers {
			t.Fatalf("headers %v: mode %d", headers, h.p.mode)
		}

		allowed := 0

		for i := 0; i < 10; i++ {
			if rec := h.get("/api", "198.51.100."+strconv.Itoa(i)+":1"); rec.Code == http.StatusOK {
				allowed++
			}
		}

		if allowed != 5 {
			t.Fatalf("headers %v: %d of 10 allowed through global 5 at maxTracked 2", headers, allowed)
		}
	}
}

// TestEvictionKeepsLimitedKeys: at maxTracked, a client over its limit is
// not evicted by others filling the table, on the fast and the general
// path; evictions count (when every key is limited, the oldest goes:
// memstore's TestEvictionTakesTheOldestWhenEveryKeyIsLimited).
func TestEvictionKeepsLimitedKeys(t *testing.T) {
	for _, headers := range []bool{true, false} {
		h := newHarness(t, func(c *Config) {
			c.MaxTracked = 1000
			c.Global.Points = 0
			c.IP = config.LayerConfig{Points: 5, Duration: "60s"}
			c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0
			c.Headers = headers // off: serveGeneral
		})

		for i := 0; i < 6; i++ {
			h.get("/api", "203.0.113.9:1")
		}

		for i := 0; i < 3000; i++ {
			h.get("/api", "10."+strconv.Itoa(i/65536)+"."+strconv.Itoa(i/256%256)+"."+strconv.Itoa(i%256)+":1")
		}

		for i := 0; i < 3; i++ {
			if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusTooManyRequests {
				t.Fatalf("headers %v: the limited client after 3000 others: %d, want 429", headers, rec.Code)
			}
		}

		if n := h.p.memory.Evicted(); n != 2001 {
			t.Fatalf("headers %v: %d evictions, want 2001", headers, n)
		}
	}
}

// storeOf is what take and refund (stores.go) charge for a store the test
// holds: a memory store alone, or a Redis store with its fallback.
func storeOf(s interface{}) *stores {
	switch v := s.(type) {
	case *memstore.WindowStore:
		return &stores{memory: v}
	case *redisstore.RedisStore:
		return &stores{memory: v.Local, redis: v, blocks: v.Blocks}
	case *stores:
		return v
	}

	panic(fmt.Sprintf("storeOf(%T)", s))
}

// calendarConfig: ip of 2 per calendar period in UTC, and a route /tz of
// 2 per day at UTC+7.
func calendarConfig(cal string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 2, Calendar: cal}
		c.Routes = []config.RouteConfig{{Name: "tz", Paths: []string{"/tz"}, Key: "ip", Points: 2, Calendar: "day", UtcOffset: "+07:00"}}
	}
}

// crossBoundary: from 1.5 s before the boundary, two requests pass, the
// third is refused until the boundary, with every header and the JSON reset
// saying so; after it, a new window of the next period starts. w is the
// policy window the period's headers show.
func crossBoundary(t *testing.T, h *harness, before, boundary, next time.Time, w int64) {
	t.Helper()

	h.clock.mu.Lock()
	h.clock.now = before
	h.clock.mu.Unlock()

	client := "203.0.113.9:1234"
	for i := 1; i <= 2; i++ {
		if rec := h.get("/x", client); rec.Code != 200 || rec.Header().Get("X-Ratelimit-Reset") != strconv.FormatInt(boundary.Unix(), 10) {
			t.Fatalf("%v: request %d: %d, reset %s, want 200 and %d", before, i, rec.Code, rec.Header().Get("X-Ratelimit-Reset"), boundary.Unix())
		}
	}

	rec := h.get("/x", client)
	secs := int64(boundary.Sub(before).Seconds() + 0.999)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != strconv.FormatInt(secs, 10) || rec.Header().Get("X-Ratelimit-Reset") != strconv.FormatInt(boundary.Unix(), 10) {
		t.Fatalf("%v: 3rd: %d, Retry-After %s, reset %s; want 429, %d, %d", before, rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("X-Ratelimit-Reset"), secs, boundary.Unix())
	}

	if want := `w=` + strconv.FormatInt(w, 10); !strings.Contains(rec.Header().Get("Ratelimit-Policy"), want) {
		t.Errorf("%v: policy %q, want %s", before, rec.Header().Get("Ratelimit-Policy"), want)
	}

	if want := boundary.UTC().Format(time.RFC3339); !strings.Contains(rec.Body.String(), want) {
		t.Errorf("%v: body %s, want reset %s", before, rec.Body.String(), want)
	}

	h.clock.Add(boundary.Sub(before) + 10*time.Millisecond)

	rec = h.get("/x", client)
	if rec.Code != 200 || rec.Header().Get("X-Ratelimit-Remaining") != "1" || rec.Header().Get("X-Ratelimit-Reset") != strconv.FormatInt(next.Unix(), 10) {
		t.Fatalf("after %v: %d, remaining %s, reset %s; want 200, 1, %d", boundary, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"), rec.Header().Get("X-Ratelimit-Reset"), next.Unix())
	}

	if want := `"ip";q=2;w=` + strconv.FormatInt(int64(next.Sub(boundary)/time.Second), 10); rec.Header().Get("Ratelimit-Policy") != want {
		t.Errorf("after %v: policy %q, want %s", boundary, rec.Header().Get("Ratelimit-Policy"), want)
	}
}

func utc(y int, m time.Month, d, hh, mm, ss int, ns ...int) time.Time {
	n := 0
	if len(ns) > 0 {
		n = ns[0]
	}

	return time.Date(y, m, d, hh, mm, ss, n, time.UTC)
}

type calendarCase struct {
	name, cal              string
	before, boundary, next time.Time
	w                      int64
}

var calendarCases = []calendarCase{
	{"day", "day", utc(2026, 6, 15, 23, 59, 58, 500e6), utc(2026, 6, 16, 0, 0, 0), utc(2026, 6, 17, 0, 0, 0), 86400},
	// 2026-06-21 is a Sunday.
	{"week", "week", utc(2026, 6, 21, 23, 59, 58, 500e6), utc(2026, 6, 22, 0, 0, 0), utc(2026, 6, 29, 0, 0, 0), 7 * 86400},
	// A month's policy window is that month's length: February of 28 and
	// of 29 days, April of 30, December of 31 (and after each boundary
	// the next month's, which crossBoundary checks too).
	{"month28", "month", utc(2026, 2, 28, 23, 59, 58, 500e6), utc(2026, 3, 1, 0, 0, 0), utc(2026, 4, 1, 0, 0, 0), 28 * 86400},
	{"month29", "month", utc(2028, 2, 29, 23, 59, 58, 500e6), utc(2028, 3, 1, 0, 0, 0), utc(2028, 4, 1, 0, 0, 0), 29 * 86400},
	{"month30", "month", utc(2026, 4, 30, 23, 59, 58, 500e6), utc(2026, 5, 1, 0, 0, 0), utc(2026, 6, 1, 0, 0, 0), 30 * 86400},
	{"month31", "month", utc(2026, 12, 31, 23, 59, 58, 500e6), utc(2027, 1, 1, 0, 0, 0), utc(2027, 2, 1, 0, 0, 0), 31 * 86400},
	// Into a February: the policy changes to 28 days at the boundary.
	{"month31to28", "month", utc(2027, 1, 31, 23, 59, 58, 500e6), utc(2027, 2, 1, 0, 0, 0), utc(2027, 3, 1, 0, 0, 0), 31 * 86400},
}

func TestCalendarWindowsInMemory(t *testing.T) {
	for _, c := range calendarCases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, calendarConfig(c.cal))
			if h.p.mode != modeGeneral {
				t.Errorf("mode %d, want the general path", h.p.mode)
			}

			crossBoundary(t, h, c.before, c.boundary, c.next, c.w)
		})
	}
}

func TestCalendarWindowsOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	for _, c := range calendarCases {
		t.Run(c.name, func(t *testing.T) {
			h, _ := redisHarness(t, addr, calendarConfig(c.cal))
			crossBoundary(t, h, c.before, c.boundary, c.next, c.w)

			// The key names its window: the period's start in Unix seconds.
			l := h.p.layers[layerIndex(h, "ip")]
			key := l.RedisKey + "203.0.113.9:" + strconv.FormatInt(c.boundary.Unix(), 10)
			if v := redisDo(t, admin, "GET", key).Str; v != "1" {
				t.Errorf("GET %s = %q, want 1", key, v)
			}
		})
	}
}

// offsetConfig: the route /tz of 2 a day at UTC+7 under an ip layer of 100 a month.
func offsetConfig(c *Config) {
	calendarConfig("month")(c)
	c.IP.Points = 100
}

// utcOffsetScenario: the route of UTC+7 resets at 17:00 UTC.
func utcOffsetScenario(t *testing.T, h *harness) {
	t.Helper()

	h.clock.mu.Lock()
	h.clock.now = utc(2026, 6, 15, 16, 59, 59)
	h.clock.mu.Unlock()

	want := strconv.FormatInt(utc(2026, 6, 15, 17, 0, 0).Unix(), 10)
	for i := 1; i <= 3; i++ {
		rec := h.get("/tz", "203.0.113.7:1")
		if code := map[bool]int{true: 429, false: 200}[i == 3]; rec.Code != code || rec.Header().Get("X-Ratelimit-Reset") != want {
			t.Fatalf("request %d: %d, reset %s; want %d, %s", i, rec.Code, rec.Header().Get("X-Ratelimit-Reset"), code, want)
		}
	}

	h.clock.Add(1500 * time.Millisecond)

	if rec := h.get("/tz", "203.0.113.7:1"); rec.Code != 200 || rec.Header().Get("X-Ratelimit-Reset") != strconv.FormatInt(utc(2026, 6, 16, 17, 0, 0).Unix(), 10) {
		t.Fatalf("after 17:00 UTC: %d, reset %s", rec.Code, rec.Header().Get("X-Ratelimit-Reset"))
	}
}

func TestCalendarUtcOffsetInMemory(t *testing.T) {
	utcOffsetScenario(t, newHarness(t, offsetConfig))
}

func TestCalendarUtcOffsetOnRedisServer(t *testing.T) {
	addr, _ := redisServer(t)
	h, _ := redisHarness(t, addr, offsetConfig)
	utcOffsetScenario(t, h)
}

func TestCalendarConfigErrors(t *testing.T) {
	for _, c := range []struct {
		mutate func(c *Config)
		want   string
	}{
		{func(c *Config) { c.IP.Calendar = "year" }, `ip.calendar = "year"`},
		{func(c *Config) { c.IP.Calendar, c.IP.Duration = "day", "60s" }, `ip.duration = "60s"`},
		// The built-in default spelled out is a duration written too.
		{func(c *Config) { c.IP.Calendar, c.IP.Duration = "day", "1s" }, `ip.duration = "1s": cannot be set together with ip.calendar`},
		{func(c *Config) { c.Assets.Calendar, c.Assets.Duration = "month", "1s" }, `assets.duration = "1s": cannot be set together with assets.calendar`},
		{func(c *Config) { c.User.Calendar, c.User.Duration = "week", "60s" }, `user.duration = "60s": cannot be set together with user.calendar`},
		{func(c *Config) { c.IP.Calendar, c.IP.Algorithm = "day", "sliding" }, `ip.calendar = "day"`},
		{func(c *Config) { c.User.Calendar, c.User.Algorithm = "week", "tokenbucket" }, `user.calendar = "week"`},
		{func(c *Config) { c.IP.Calendar, c.IP.UtcOffset = "day", "Asia/Bangkok" }, `ip.utcOffset = "Asia/Bangkok"`},
		{func(c *Config) { c.IP.Calendar, c.IP.UtcOffset = "day", "+15:00" }, `ip.utcOffset = "+15:00"`},
		{func(c *Config) { c.IP.UtcOffset = "+07:00" }, `ip.utcOffset = "+07:00"`},
		{func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/r"}, Points: 1, Duration: "1s", Calendar: "month"}}
		}, `routes[0].duration = "1s"`},
		{func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-User", "X-Plan"
			c.Plans = map[string]config.PlanConfig{"pro": {Points: 1, Calendar: "day", UtcOffset: "7"}}
		}, `utcOffset = "7"`},
	} {
		cfg := CreateConfig()
		c.mutate(cfg)

		_, err := parse(cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want one naming %s", err, c.want)
		}
	}

	cfg := CreateConfig()
	cfg.IP.Calendar, cfg.IP.UtcOffset = "month", "-03:30"
	cfg.Principal.UserHeader, cfg.Principal.PlanHeader = "X-User", "X-Plan"
	cfg.Plans = map[string]config.PlanConfig{"pro": {Points: 1, Calendar: "day", UtcOffset: "+07:00"}}

	s, err := parse(cfg)
	if err != nil {
		t.Fatal(err)
	}

	if m := chooseMode(s); m != modeGeneral {
		t.Errorf("mode %d with calendar layers, want general", m)
	}
}

// The ip charge of an invalid credential (after.go) shows a month ip
// layer's policy of the current month too, allowed and refused.
func TestMonthPolicyOnAnInvalidCredentialsCharge(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 2, Calendar: "month"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
		c.Principal.InvalidCredentialStatus = []int{404}
	})
	h.clock.mu.Lock()
	h.clock.now = utc(2026, 2, 10, 12, 0, 0)
	h.clock.mu.Unlock()

	for i := 1; i <= 3; i++ {
		req := httptest.NewRequest(http.MethodGet, "/missing/x", nil)
		req.RemoteAddr = "203.0.113.9:1"
		req.Header.Set("Authorization", "Bearer garbage")
		rec := httptest.NewRecorder()
		h.h.ServeHTTP(rec, req)

		want := map[bool]int{true: 429, false: 404}[i == 3]
		if got := rec.Header().Get("Ratelimit-Policy"); rec.Code != want || got != `"ip";q=2;w=2419200` {
			t.Fatalf("request %d: %d, policy %q; want %d and February's 28 days", i, rec.Code, got, want)
		}
	}
}

// Calendar windows on Redis: a calendar key names its period, and its count
// holds whatever the clocks of the callers and of Redis say about the time
// left in it.

// calendarQuotas are the periods tried: a day, a week, a month, and a day
// at UTC+7.
var calendarQuotas = []struct{ name, cal, offset string }{
	{"day", "day", ""}, {"week", "week", ""}, {"month", "month", ""}, {"day+07:00", "day", "+07:00"},
}

// TestADailyQuotaOnRedisKeepsItsCount: ten fresh keys of a calendar quota
// of 1000 on exact Redis (a layer, or a route), four requests each 100 ms
// apart on the plugin's clock (which runs apart from Redis's, as any
// replica's does by some milliseconds): each key reads 999 998 997 996, as
// in memory.
func TestADailyQuotaOnRedisKeepsItsCount(t *testing.T) {
	addr, _ := redisServer(t)

	for _, q := range calendarQuotas {
		for _, route := range []bool{false, true} {
			t.Run(q.name+map[bool]string{false: " layer", true: " route"}[route], func(t *testing.T) {
				h, _ := redisHarness(t, addr, func(c *Config) {
					quota := config.LayerConfig{Points: 1000, Calendar: q.cal, UtcOffset: q.offset, Key: "header:X-K"}
					if route {
						c.IP.Points = 0
						c.Routes = []config.RouteConfig{{Name: "quota", Paths: []string{"/api"}, Key: quota.Key, Points: quota.Points, Calendar: quota.Calendar, UtcOffset: quota.UtcOffset}}
					} else {
						c.IP = quota
					}
				})

				dailyQuota(t, h, q.name)
			})
		}
	}
}

// dailyQuota sends four requests 100 ms apart for each of ten keys, and
// checks what remains after each.
func dailyQuota(t *testing.T, h *harness, name string) {
	t.Helper()

	lost := 0
	for k := 0; k < 10; k++ {
		var got []string
		for i := 0; i < 4; i++ {
			rec := h.do("GET", "/api", "203.0.113.9:1", map[string]string{"X-K": name + "-" + strconv.Itoa(k)})
			got = append(got, rec.Header().Get("X-Ratelimit-Remaining"))
			h.clock.Add(100 * time.Millisecond)
		}

		if strings.Join(got, " ") != "999 998 997 996" {
			t.Errorf("key %d: remaining %v, want 999 998 997 996", k, got)
			lost++
		}
	}

	if lost > 0 {
		t.Errorf("%d of 10 keys lost counts", lost)
	}
}

// TestADailyCostFromRouteOnRedisCountsAsItsMinuteTwin: a costFrom route of
// a calendar day beside its per-minute twin on one path, on exact Redis,
// reserve 100, responses reporting 10 to 190 points, 100 ms apart on the
// plugin's clock: the day's key ends with what the minute's holds, every
// cost reported.
func TestADailyCostFromRouteOnRedisCountsAsItsMinuteTwin(t *testing.T) {
	addr, admin := redisServer(t)

	for _, q := range calendarQuotas {
		t.Run(q.name, func(t *testing.T) {
			h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 100), func(c *Config) {
				asACLUser(c)
				tpd := c.Routes[0]
				tpd.Name, tpd.Duration, tpd.Calendar, tpd.UtcOffset, tpd.Points = "tpd", "", q.cal, q.offset, 100000
				c.Routes[0].Points = 100000
				c.Routes = append(c.Routes, tpd)
			}))
			h.backend = reportsAsAsked

			want := 0
			for i := 0; i < 30; i++ {
				cost := 10 + 60*(i%4)
				want += cost
				if rec := h.do("POST", "/v1/x", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1", "X-Cost": strconv.Itoa(cost)}); rec.Code != 200 {
					t.Fatalf("request %d: %d", i+1, rec.Code)
				}
				h.clock.Add(100 * time.Millisecond)
			}

			keys := redisDo(t, admin, "KEYS", h.p.stores.redis.Prefix+"*")
			counts := map[string]string{}
			for _, k := range keys.Array {
				counts[k.Str] = redisDo(t, admin, "GET", k.Str).Str
			}

			if len(counts) != 2 {
				t.Fatalf("keys %v, want the minute's and the day's", counts)
			}

			for k, v := range counts {
				if v != strconv.Itoa(want) {
					t.Errorf("%s holds %s, want the %d reported", k, v, want)
				}
			}
		})
	}
}

// TestACalendarCountStatusRouteOnRedisChargesOnlyItsStatuses: a login
// route of 2 a day that counts 401s only, on exact Redis as in memory:
// five successful logins 100 ms apart charge nothing, then two failures
// are charged and the next login is refused.
func TestACalendarCountStatusRouteOnRedisChargesOnlyItsStatuses(t *testing.T) {
	addr, _ := redisServer(t)
	conf := func(c *Config) {
		c.Global.Points, c.IP.Points = 0, 0
		c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 2, Calendar: "day", CountStatus: []int{401}}}
	}

	for _, store := range []string{"memory", "redis"} {
		h := newHarness(t, conf)
		if store == "redis" {
			h, _ = redisHarness(t, addr, with(conf, asACLUser))
		}

		status := http.StatusOK
		h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(status) })

		var got []string
		for i := 0; i < 8; i++ {
			if i == 5 {
				status = http.StatusUnauthorized
			}

			rec := h.get("/login", "203.0.113.9:1")
			got = append(got, strconv.Itoa(rec.Code)+"/"+rec.Header().Get("X-Ratelimit-Remaining"))
			h.clock.Add(100 * time.Millisecond)
		}

		if want := "200/2 200/2 200/2 200/2 200/2 401/1 401/0 429/0"; strings.Join(got, " ") != want {
			t.Errorf("%s: %s, want %s", store, strings.Join(got, " "), want)
		}
	}
}

// TestAnOutageOfACalendarQuotaIsPaidAndKept: a calendar quota of 10 on
// Redis, 4 requests before a flap and 3 during it (decided in memory), one
// 100 ms apart on the plugin's clock: once Redis answers again it holds the
// 8 (the probe's included) and keeps them, so 2 more get through, 10 in
// all. After an empty restart instead, the outage's 3 are created in Redis
// and kept: 7 more, the 4 before the outage lost with Redis's data.
func TestAnOutageOfACalendarQuotaIsPaidAndKept(t *testing.T) {
	for _, q := range calendarQuotas {
		for _, empty := range []bool{false, true} {
			calendarFlap(t, q.name, q.cal, q.offset, empty)
		}
	}
}

func calendarFlap(t *testing.T, name, cal, offset string, empty bool) {
	t.Helper()

	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h, _ := redisHarness(t, proxy.l.Addr().String(), func(c *Config) {
		asACLUser(c)
		c.IP = config.LayerConfig{Points: 10, Calendar: cal, UtcOffset: offset}
		c.Redis.DialTimeout = "1s"
	})
	f := &flap{h: h, proxy: proxy, admin: admin, client: "203.0.113.7"}

	send := func(n int) {
		for i := 0; i < n; i++ {
			f.send(1)
			h.clock.Add(100 * time.Millisecond)
		}
	}

	l := h.p.layers[0]
	start, _ := limit.Period(h.clock.Now().UnixNano(), l.Calendar, l.UtcOffset)
	key := l.RedisKey + f.client + ":" + strconv.FormatInt(start/int64(time.Second), 10)

	send(4)
	proxy.cut()
	send(3)

	if f.allowed != 7 || !h.p.stores.redis.Backend.Down.Load() {
		t.Fatalf("%s: %d allowed, down %v; want 7, decided in memory", name, f.allowed, h.p.stores.redis.Backend.Down.Load())
	}

	want, more := "8", 2
	if empty {
		redisDo(t, admin, "FLUSHALL")
		redisDo(t, admin, "SCRIPT", "FLUSH")
		want, more = "3", 7
	}

	// The back-off ends; the next request probes Redis, which then takes the
	// outage's 3 off the request.
	proxy.restore()
	h.clock.Add(time.Second)
	if empty {
		redisstore.PayOwed(h.p.stores.redis)
	} else {
		send(1)
	}

	if got := waitRedis(t, f, want, "GET", key); got != want {
		t.Fatalf("%s (empty restart %v): Redis holds %q after the outage, want %s", name, empty, got, want)
	}

	// A key created by the payment lives as a take makes it: to the period's
	// end on the plugin's clock (at the outage's last charge, 1.1 s ago),
	// and the grace.
	if _, end := limit.Period(h.clock.Now().UnixNano(), l.Calendar, l.UtcOffset); empty {
		left := (end - h.clock.Now().UnixNano()) / int64(time.Millisecond)
		grace := int64(redisstore.KeyGrace / time.Millisecond)
		if ttl := redisDo(t, admin, "PTTL", key).Int; ttl <= left+grace || ttl > left+grace+2000 {
			t.Errorf("%s: the created key's PTTL %d ms, want the period's %d left and the grace, %d", name, ttl, left, grace)
		}
	}

	before := f.allowed
	send(20)

	if got := f.allowed - before; got != more {
		t.Errorf("%s (empty restart %v): %d more allowed after the outage, want %d (Redis holds %s)", name, empty, got, more, redisDo(t, admin, "GET", key).Str)
	}
}
