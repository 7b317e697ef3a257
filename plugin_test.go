package tierlimit

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/request"
)

// clock is a manual clock for the plugin.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

var instanceSeq atomic.Int64

// harness is a plugin instance with a manual clock, an event buffer and a
// backend that answers 200, or 404 under /missing.
type harness struct {
	t      *testing.T
	p      *Plugin
	h      http.Handler // what New returned: p, or its mode's handler
	clock  *clock
	events *bytes.Buffer
	calls  atomic.Int64
	// backend, when set, answers in place of the default backend ("ok",
	// or 404 under /missing).
	backend http.Handler
	// cancel cancels the context New was given, as Traefik's next reload
	// does (reloaded).
	cancel context.CancelFunc
	// front, when set, is the server the instance runs behind, before
	// Traefik's proxy (newProxiedHarness): do goes over the network.
	front *front
}

func newHarness(t *testing.T, mutate func(c *Config)) *harness {
	t.Helper()

	cfg := CreateConfig()
	if mutate != nil {
		mutate(cfg)
	}

	h := &harness{t: t, clock: &clock{now: time.Date(2026, 6, 15, 10, 0, 0, 200e6, time.UTC)}, events: &bytes.Buffer{}}
	next := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		h.calls.Add(1)

		if h.backend != nil {
			h.backend.ServeHTTP(rw, req)
			return
		}

		if strings.HasPrefix(req.URL.Path, "/missing") {
			http.NotFound(rw, req)
			return
		}

		_, _ = rw.Write([]byte("ok"))
	})

	name := t.Name() + "-" + strconv.FormatInt(instanceSeq.Add(1), 10) + "@test"

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	handler, err := New(ctx, next, cfg, name)
	if err != nil {
		t.Fatalf("New: %v", err)
	}

	h.cancel = cancel
	h.h = handler
	h.p = pluginOf(handler)
	h.p.now = h.clock.Now
	logEventsTo(h.p, h.events, name, h.clock.Now)

	return h
}

// logEventsTo makes p write its events to w, timed by now, and its status
// page (which New handed p's log) too.
func logEventsTo(p *Plugin, w io.Writer, name string, now func() time.Time) {
	p.events = events.NewEventLog(w, name)
	p.events.Now = now

	if p.status != nil {
		p.status.Events = p.events
	}
}

func (h *harness) do(method, target, remote string, hdr map[string]string) *httptest.ResponseRecorder {
	if h.front != nil {
		return doFront(h, method, target, remote, hdr)
	}

	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = remote

	for k, v := range hdr {
		req.Header.Set(k, v)
	}

	rec := httptest.NewRecorder()
	h.h.ServeHTTP(rec, req)

	return rec
}

func (h *harness) get(target, remote string) *httptest.ResponseRecorder {
	return h.do(http.MethodGet, target, remote, nil)
}

func onlyIP(points int, duration string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: points, Duration: duration}
	}
}

func TestIPLayerRefusesThe51st(t *testing.T) {
	h := newHarness(t, nil)

	for i := 1; i <= 50; i++ {
		rec := h.get("/api", "203.0.113.9:1234")
		if rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}

		if got := rec.Header().Get("X-RateLimit-Remaining"); got != strconv.Itoa(50-i) {
			t.Fatalf("request %d: remaining %q", i, got)
		}
	}

	rec := h.get("/api", "203.0.113.9:1234")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("51st: %d", rec.Code)
	}

	if h.calls.Load() != 50 {
		t.Fatalf("backend called %d times, want 50", h.calls.Load())
	}

	// Another client is unaffected.
	if rec := h.get("/api", "203.0.113.10:1234"); rec.Code != http.StatusOK {
		t.Fatalf("other client: %d", rec.Code)
	}

	// The window ends at first hit + 1s.
	h.clock.Add(time.Second)

	if rec := h.get("/api", "203.0.113.9:1234"); rec.Code != http.StatusOK {
		t.Fatalf("after reset: %d", rec.Code)
	}
}

func TestRefusalResponse(t *testing.T) {
	h := newHarness(t, onlyIP(2, "5s"))
	h.get("/", "203.0.113.9:1")
	h.clock.Add(1500 * time.Millisecond)
	h.get("/", "203.0.113.9:1")

	rec := h.get("/", "203.0.113.9:1")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d", rec.Code)
	}

	// First hit at 10:00:00.2, window 5s: reset 10:00:05.2, 3.5s from now.
	want := map[string]string{
		"Retry-After":           "4",
		"Content-Type":          "application/json",
		"X-RateLimit-Limit":     "2",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     strconv.FormatInt(time.Date(2026, 6, 15, 10, 0, 6, 0, time.UTC).Unix(), 10),
		"RateLimit-Policy":      `"ip";q=2;w=5`,
		"RateLimit":             `"ip";r=0;t=4`,
	}
	for k, v := range want {
		if got := rec.Header().Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}

	var body struct {
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
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}

	if len(body.Errors) != 1 {
		t.Fatalf("body %q", rec.Body.String())
	}

	e := body.Errors[0]
	if e.Message != "Hit rate limit" || e.Extensions.Code != "REQUESTS_EXCEEDED" || e.Extensions.Limit != 2 ||
		e.Extensions.Reset != "2026-06-15T10:00:06Z" || e.Extensions.Layer != "ip" {
		t.Fatalf("body %q", rec.Body.String())
	}
}

func TestRetryAfterIsNeverZero(t *testing.T) {
	h := newHarness(t, onlyIP(1, "1s"))
	h.get("/", "203.0.113.9:1")
	h.clock.Add(time.Second - time.Nanosecond)

	rec := h.get("/", "203.0.113.9:1")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("status %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
}

func TestHeadersOnAllowedAndDownstreamErrors(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Global = config.LayerConfig{Points: 1000, Duration: "1s"} })

	for _, path := range []string{"/ok", "/missing"} {
		rec := h.get(path, "203.0.113.9:1")

		for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"} {
			if rec.Header().Get(k) == "" {
				t.Errorf("%s (%d): no %s", path, rec.Code, k)
			}
		}
	}

	// The most restrictive layer is shown: ip (50) rather than global (1000).
	rec := h.get("/ok", "203.0.113.9:1")
	if rec.Header().Get("X-RateLimit-Limit") != "50" || rec.Header().Get("X-RateLimit-Remaining") != "47" ||
		rec.Header().Get("RateLimit-Policy") != `"ip";q=50;w=1` || rec.Header().Get("RateLimit") != `"ip";r=47;t=1` {
		t.Fatalf("headers %v", rec.Header())
	}
}

func TestMostRestrictiveIsTheLowestRemaining(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 5, Duration: "1s"}
		c.IP = config.LayerConfig{Points: 50, Duration: "1s"}
	})

	for i := 0; i < 3; i++ {
		h.get("/", "203.0.113."+strconv.Itoa(i)+":1")
	}

	rec := h.get("/", "203.0.113.99:1")
	if rec.Header().Get("X-RateLimit-Limit") != "5" || rec.Header().Get("X-RateLimit-Remaining") != "1" {
		t.Fatalf("headers %v", rec.Header())
	}
}

func TestHeadersOff(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Headers = false; c.IP.Points = 1 })

	if rec := h.get("/", "203.0.113.9:1"); rec.Header().Get("X-RateLimit-Limit") != "" || rec.Header().Get("RateLimit") != "" {
		t.Fatalf("headers sent with headers: false: %v", rec.Header())
	}

	if rec := h.get("/", "203.0.113.9:1"); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("refusal without headers: %d %v", rec.Code, rec.Header())
	}
}

func TestGlobalLayerCountsEveryone(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Global = config.LayerConfig{Points: 3, Duration: "1s"} })

	for i := 0; i < 3; i++ {
		if rec := h.get("/", "203.0.113."+strconv.Itoa(i)+":1"); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}

	rec := h.get("/", "198.51.100.1:1")
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"layer":"global"`) {
		t.Fatalf("4th client: %d %s", rec.Code, rec.Body.String())
	}

	// Refused at global: not charged to ip.
	if got := peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", "198.51.100.1"); got != 0 {
		t.Fatalf("ip charged after global refused: %d", got)
	}
}

func TestAssetsHaveTheirOwnBudget(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 2, Duration: "1s"}
		c.Assets = config.AssetsConfig{Points: 5, Duration: "1s", PathPrefixes: []string{"/assets/", "/static/"}}
	})

	for i := 0; i < 5; i++ {
		path := "/assets/app.js"
		if i%2 == 1 {
			path = "/static/logo.png"
		}

		if rec := h.get(path, "203.0.113.9:1"); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "5" {
			t.Fatalf("asset %d: %d limit %q", i, rec.Code, rec.Header().Get("X-RateLimit-Limit"))
		}
	}

	if rec := h.get("/assets/app.js", "203.0.113.9:1"); rec.Code != http.StatusTooManyRequests ||
		!strings.Contains(rec.Body.String(), `"layer":"assets"`) {
		t.Fatalf("6th asset: %d %s", rec.Code, rec.Body.String())
	}

	// The API budget is untouched by assets.
	for i := 0; i < 2; i++ {
		if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusOK {
			t.Fatalf("api %d: %d", i, rec.Code)
		}
	}

	if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("3rd api: %d", rec.Code)
	}

	// The refused 3rd is not counted.
	if got := peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", "203.0.113.9"); got != 2 {
		t.Fatalf("ip count %d, want 2", got)
	}
}

func TestRoutes(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1000, Duration: "1s"}
		c.Routes = []config.RouteConfig{
			{Name: "auth_login", Methods: []string{"post"}, Paths: []string{"/auth/login"}, Key: "ip", Points: 10, Duration: "60s"},
			{Name: "email", Methods: []string{"POST"}, Paths: []string{"/auth/password/request", "/users/invite/"}, Points: 2, Duration: "60s"},
			{Name: "exports", Paths: []string{"/export"}, Key: "global", Points: 1, Duration: "60s"},
		}
	})

	for i := 1; i <= 10; i++ {
		if rec := h.do(http.MethodPost, "/auth/login", "203.0.113.9:1", nil); rec.Code != http.StatusOK {
			t.Fatalf("login %d: %d", i, rec.Code)
		}
	}

	rec := h.do(http.MethodPost, "/auth/login", "203.0.113.9:1", nil)
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"layer":"auth_login"`) {
		t.Fatalf("11th login: %d %s", rec.Code, rec.Body.String())
	}

	if ra, _ := strconv.Atoi(rec.Header().Get("Retry-After")); ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q", rec.Header().Get("Retry-After"))
	}

	// Other methods, other paths and other clients pass.
	for _, c := range []struct{ method, path, remote string }{
		{http.MethodGet, "/auth/login", "203.0.113.9:1"},
		{http.MethodPost, "/auth/login/x", "203.0.113.9:1"},
		{http.MethodPost, "/api", "203.0.113.9:1"},
		{http.MethodPost, "/auth/login", "203.0.113.10:1"},
	} {
		if rec := h.do(c.method, c.path, c.remote, nil); rec.Code != http.StatusOK {
			t.Fatalf("%s %s from %s: %d", c.method, c.path, c.remote, rec.Code)
		}
	}

	// Prefix paths end with "/"; routes with several paths share one budget.
	h.do(http.MethodPost, "/auth/password/request", "203.0.113.9:1", nil)
	h.do(http.MethodPost, "/users/invite/42", "203.0.113.9:1", nil)

	if rec := h.do(http.MethodPost, "/users/invite/43", "203.0.113.9:1", nil); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("3rd email: %d", rec.Code)
	}

	// A globally keyed route is shared by all clients; no methods means all.
	if rec := h.do(http.MethodDelete, "/export", "203.0.113.1:1", nil); rec.Code != http.StatusOK {
		t.Fatalf("first export: %d", rec.Code)
	}

	if rec := h.get("/export", "203.0.113.2:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second export from another client: %d", rec.Code)
	}
}

func TestCredentialedRequestsAreNotChargedToIPUpFront(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1, Duration: "1s"}
		c.Principal.CredentialHeaders = []string{"authorization"}
		c.Principal.CredentialCookies = []string{"session"}
		c.Principal.CredentialQueryParams = []string{"access_token"}
	})

	credentialed := []*http.Request{
		httptest.NewRequest(http.MethodGet, "/api", nil),
		httptest.NewRequest(http.MethodGet, "/api", nil),
		httptest.NewRequest(http.MethodGet, "/api?x=1&access_token=abc", nil),
	}
	credentialed[0].Header.Set("Authorization", "Bearer abc")
	credentialed[1].AddCookie(&http.Cookie{Name: "session", Value: "s1"})

	for i, req := range credentialed {
		for n := 0; n < 3; n++ {
			req.RemoteAddr = "203.0.113.9:1"
			rec := httptest.NewRecorder()
			h.h.ServeHTTP(rec, req)

			if rec.Code != http.StatusOK {
				t.Fatalf("credentialed request %d/%d: %d", i, n, rec.Code)
			}
		}
	}

	// Empty credentials are no credentials.
	for _, req := range []*http.Request{
		httptest.NewRequest(http.MethodGet, "/api?access_token=", nil),
		httptest.NewRequest(http.MethodGet, "/api", nil),
	} {
		req.Header.Set("Authorization", " ")
		req.RemoteAddr = "198.51.100.1:1"
		rec := httptest.NewRecorder()
		h.h.ServeHTTP(rec, req)

		if rec.Header().Get("X-RateLimit-Limit") != "1" {
			t.Fatalf("empty credential not charged to ip: %v", rec.Header())
		}
	}

	// The first is allowed, the second refused and not counted.
	if got := peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", "198.51.100.1"); got != 1 {
		t.Fatalf("ip count %d, want 1", got)
	}
}

func TestDryRunNeverRefuses(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.DryRun = true
		c.Global = config.LayerConfig{Points: 3, Duration: "1s"}
		c.IP = config.LayerConfig{Points: 2, Duration: "1s"}
		c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 1, Duration: "1s"}}
	})

	for i := 1; i <= 10; i++ {
		rec := h.get("/login", "203.0.113.9:1")
		if rec.Code != http.StatusOK {
			t.Fatalf("dry run refused request %d: %d", i, rec.Code)
		}

		if i > 1 && rec.Header().Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("request %d: remaining %q", i, rec.Header().Get("X-RateLimit-Remaining"))
		}
	}

	if h.calls.Load() != 10 {
		t.Fatalf("backend saw %d of 10", h.calls.Load())
	}

	// Every layer was counted and reported once.
	for _, layer := range []string{"global", "ip", "login"} {
		if n := strings.Count(h.events.String(), `"limiter":"`+layer+`"`); n != 1 {
			t.Errorf("%s reported %d times in dry run:\n%s", layer, n, h.events.String())
		}
	}
}

func TestDisabledPassesEverything(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Enabled = false; c.IP.Points = 1 })

	for i := 0; i < 5; i++ {
		rec := h.get("/", "203.0.113.9:1")
		if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "" {
			t.Fatalf("disabled plugin acted: %d %v", rec.Code, rec.Header())
		}
	}
}

func TestAllLayersOffPassesWithoutHeaders(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Global.Points = 0; c.IP.Points = 0 })

	rec := h.get("/", "203.0.113.9:1")
	if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
}

func TestEventsOncePerLayerKeyAndWindow(t *testing.T) {
	h := newHarness(t, onlyIP(1, "1s"))

	for i := 0; i < 20; i++ {
		h.get("/", "203.0.113.9:1")
		h.get("/", "[2001:db8::1]:1")
	}

	lines := strings.Split(strings.TrimSpace(h.events.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d event lines for 2 refused keys:\n%s", len(lines), h.events.String())
	}

	var ev map[string]string
	if err := json.Unmarshal([]byte(lines[0]), &ev); err != nil {
		t.Fatalf("event %q: %v", lines[0], err)
	}

	want := map[string]string{
		"event": "RATE_LIMIT_TRIGGERED", "severity": "warning", "limiter": "ip",
		"key": "203.0.113.9", "ip": "203.0.113.9", "middleware": h.p.name,
	}
	for k, v := range want {
		if ev[k] != v {
			t.Errorf("event %s = %q, want %q", k, ev[k], v)
		}
	}

	if !strings.Contains(lines[1], `"key":"2001:db8::/64"`) {
		t.Errorf("second event %q", lines[1])
	}

	h.clock.Add(time.Second)
	h.get("/", "203.0.113.9:1")
	h.get("/", "203.0.113.9:1")

	if n := strings.Count(h.events.String(), "\n"); n != 3 {
		t.Fatalf("%d event lines after the next window, want 3", n)
	}
}

func TestInstancesWithOneNameShareCounters(t *testing.T) {
	cfg := CreateConfig()
	cfg.Global.Points = 0
	cfg.IP.Points = 3
	cfg.IP.Duration = "60s"

	ok := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {})
	name := "shared-" + strconv.FormatInt(instanceSeq.Add(1), 10) + "@file"

	var handlers []http.Handler

	for i := 0; i < 2; i++ {
		// Two routers, or a reload: New runs again with the same name.
		hd, err := New(context.Background(), ok, cfg, name)
		if err != nil {
			t.Fatal(err)
		}

		handlers = append(handlers, hd)
	}

	codes := []int{}

	for i := 0; i < 4; i++ {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "203.0.113.9:1"
		rec := httptest.NewRecorder()
		handlers[i%2].ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}

	if codes[3] != http.StatusTooManyRequests || codes[2] != http.StatusOK {
		t.Fatalf("codes %v: instances do not share one budget", codes)
	}
}

// pluginOf returns the Plugin behind a handler New returned.
func pluginOf(h http.Handler) *Plugin {
	switch v := h.(type) {
	case *anonymousPath:
		return (*Plugin)(v)
	case *principalPath:
		return (*Plugin)(v)
	case *syncedPath:
		return (*Plugin)(v)
	case *principalPlansPath:
		return (*Plugin)(v)
	case *classifyPath:
		return (*Plugin)(v)
	case *redisPath:
		return (*Plugin)(v)
	case *mixedPath:
		return (*Plugin)(v)
	case *clusterPath:
		return (*Plugin)(v)
	case *generalPath:
		return (*Plugin)(v)
	}

	return h.(*Plugin)
}

// TestExemptClientsAreNotCharged: an exempt IP (through a trusted proxy) and an
// exempt principal send ten times a layer's points without a refusal while
// others are limited; the global layer still counts them unless exempt.global.
func TestExemptClientsAreNotCharged(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 1000, Duration: "1s"}
		c.IP = config.LayerConfig{Points: 5, Duration: "1s"}
		c.User = config.LayerConfig{Points: 5, Duration: "1s"}
		c.Principal.UserHeader = "X-Auth-User"
		c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 1, Duration: "1s"}}
		c.Exempt = config.ExemptConfig{IPs: []string{"198.51.100.0/24"}, Principals: []string{"health-bot"}}
	})

	send := func(remote string, hdr map[string]string, path string) (ok int) {
		for i := 0; i < 50; i++ {
			if h.do(http.MethodGet, path, remote, hdr).Code == http.StatusOK {
				ok++
			}
		}

		return ok
	}

	if got := send("127.0.0.1:5", map[string]string{"X-Forwarded-For": "198.51.100.7"}, "/api"); got != 50 {
		t.Fatalf("exempt IP: %d of 50 allowed", got)
	}

	if got := send("127.0.0.1:5", map[string]string{"X-Forwarded-For": "198.51.100.7"}, "/login"); got != 50 {
		t.Fatalf("exempt IP on a route: %d of 50 allowed", got)
	}

	if got := send("203.0.113.9:5", map[string]string{"X-Auth-User": "health-bot"}, "/api"); got != 50 {
		t.Fatalf("exempt principal: %d of 50 allowed", got)
	}

	if got := send("203.0.113.9:5", map[string]string{"X-Auth-User": "alice"}, "/api"); got != 5 {
		t.Fatalf("another principal: %d of 50 allowed, want 5", got)
	}

	// The exempt address is not a proxy's word from an untrusted peer.
	if got := send("203.0.113.10:5", map[string]string{"X-Forwarded-For": "198.51.100.7"}, "/api"); got != 5 {
		t.Fatalf("spoofed exempt address: %d of 50 allowed, want 5", got)
	}

	// The 160 allowed counted globally (a refused request spends nothing), and
	// shown to the exempt client.
	rec := h.do(http.MethodGet, "/api", "127.0.0.1:5", map[string]string{"X-Forwarded-For": "198.51.100.7"})
	if rec.Header().Get("RateLimit-Policy") != `"global";q=1000;w=1` || rec.Header().Get("X-RateLimit-Remaining") != "839" {
		t.Fatalf("exempt client's headers: %v", rec.Header())
	}

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "ip", "198.51.100.7"); n != 0 {
		t.Fatalf("the exempt IP has an ip counter of %d", n)
	}
}

func TestExemptGlobal(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 3, Duration: "1s"}
		c.Exempt = config.ExemptConfig{IPs: []string{"::1/128", "192.0.2.1"}, Global: true}
	})

	for i := 0; i < 30; i++ {
		rec := h.get("/", "[::1]:80")
		if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "" {
			t.Fatalf("request %d: %d %v", i, rec.Code, rec.Header())
		}
	}

	if rec := h.get("/", "[::ffff:192.0.2.1]:80"); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "" {
		t.Fatalf("IPv4-mapped exempt address: %d %v", rec.Code, rec.Header())
	}

	for i := 0; i < 3; i++ {
		h.get("/", "192.0.2.2:80")
	}

	if rec := h.get("/", "192.0.2.2:80"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a client that is not exempt: %d", rec.Code)
	}
}

// TestHeaderKeys: two API keys from one IP have separate budgets, a request
// without the header falls back to its IP, and the key is kept hashed.
func TestHeaderKeys(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 3, Duration: "1s", Key: "header:x-api-key"}
		c.Routes = []config.RouteConfig{{Name: "export", Paths: []string{"/export"}, Points: 1, Duration: "1s", Key: "header:X-Api-Key"}}
	})

	count := func(path, key, remote string) (ok int) {
		hdr := map[string]string{}
		if key != "" {
			hdr["X-Api-Key"] = key
		}

		for i := 0; i < 10; i++ {
			if h.do(http.MethodGet, path, remote, hdr).Code == http.StatusOK {
				ok++
			}
		}

		return ok
	}

	if a, b := count("/api", "key-a", "203.0.113.5:1"), count("/api", "key-b", "203.0.113.5:1"); a != 3 || b != 3 {
		t.Fatalf("two keys from one IP: %d and %d allowed, want 3 each", a, b)
	}

	if n := count("/api", "", "203.0.113.5:1"); n != 3 {
		t.Fatalf("no key: %d allowed, want the IP's own 3", n)
	}

	if n := count("/api", "", "203.0.113.6:1"); n != 3 {
		t.Fatalf("no key, another IP: %d allowed, want 3", n)
	}

	if n := count("/api", "   ", "203.0.113.5:1"); n != 0 {
		t.Fatalf("a blank key is no key: %d allowed, want 0 (the IP's budget is spent)", n)
	}

	if a, b := count("/export", "key-c", "203.0.113.7:1"), count("/export", "key-d", "203.0.113.7:1"); a != 1 || b != 1 {
		t.Fatalf("route keyed by header: %d and %d allowed, want 1 each", a, b)
	}

	now := h.clock.Now().UnixNano()
	if n, _ := h.p.memory.Peek(now, "ip", request.HashKey("key-a")); n != 3 {
		t.Fatalf("hashed key-a counter %d, want 3 (its allowed requests)", n)
	}

	if n, _ := h.p.memory.Peek(now, "ip", "key-a"); n != 0 {
		t.Fatal("the API key is kept in clear")
	}

	if strings.Contains(h.events.String(), "key-a") {
		t.Fatalf("the API key is logged in clear: %s", h.events)
	}
}

// TestConfiguredRefusal: the status, content type and body placeholders.
func TestConfiguredRefusal(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		onlyIP(2, "90s")(c)
		c.Response = config.ResponseConfig{
			StatusCode:  http.StatusServiceUnavailable,
			ContentType: "application/problem+json",
			Body: `{"error":"rate_limited","layer":"{layer}","limit":{limit},"remaining":{remaining},` +
				`"reset":"{reset}","resetUnix":{resetUnix},"retryAfter":{retryAfter},"literal":"{not a placeholder}"}`,
		}
	})

	h.get("/", "203.0.113.1:1")
	h.clock.Add(30 * time.Second)
	h.get("/", "203.0.113.1:1")

	rec := h.get("/", "203.0.113.1:1")
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}

	// The window opened at 10:00:00.2 and resets 90s later: 10:01:30.2, shown
	// rounded up; 60s are left.
	reset := time.Date(2026, 6, 15, 10, 1, 31, 0, time.UTC)
	want := `{"error":"rate_limited","layer":"ip","limit":2,"remaining":0,"reset":"2026-06-15T10:01:31Z",` +
		`"resetUnix":` + strconv.FormatInt(reset.Unix(), 10) + `,"retryAfter":60,"literal":"{not a placeholder}"}`

	if rec.Body.String() != want {
		t.Fatalf("body\n%s\nwant\n%s", rec.Body, want)
	}

	if !json.Valid(rec.Body.Bytes()) || rec.Header().Get("Retry-After") != "60" {
		t.Fatalf("invalid JSON or Retry-After %q", rec.Header().Get("Retry-After"))
	}
}

// TestSeedStyleBody: a fixed body without placeholders is sent as it is.
func TestSeedStyleBody(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		onlyIP(1, "1s")(c)
		c.Response.Body = `{"error":"rate_limited","message":"too many requests"}`
	})

	h.get("/", "203.0.113.1:1")

	rec := h.get("/", "203.0.113.1:1")
	if rec.Code != http.StatusTooManyRequests || rec.Body.String() != `{"error":"rate_limited","message":"too many requests"}` ||
		rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("%d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}

// TestSlidingThroughThePlugin: a sliding layer through ServeHTTP, with the
// headers of the estimate.
func TestSlidingThroughThePlugin(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 4, Duration: "10s", Algorithm: "sliding"}
	})

	for i := 0; i < 4; i++ {
		h.get("/", "203.0.113.1:1")
	}

	h.clock.Add(11 * time.Second)

	// 4 x 9/10 = 3.6 of the previous window still count (3, rounded down):
	// one fits.
	if rec := h.get("/", "203.0.113.1:1"); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("first of the next window: %d %v", rec.Code, rec.Header())
	}

	rec := h.get("/", "203.0.113.1:1")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second of the next window: %d", rec.Code)
	}

	// It fits again once the previous window weighs under 3: 1.5s later.
	if got := rec.Header().Get("Retry-After"); got != "2" {
		t.Fatalf("Retry-After %q, want 2", got)
	}

	h.clock.Add(1400 * time.Millisecond)

	if rec := h.get("/", "203.0.113.1:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("1.4s later: %d, want still refused", rec.Code)
	}

	h.clock.Add(101 * time.Millisecond)

	if rec := h.get("/", "203.0.113.1:1"); rec.Code != http.StatusOK {
		t.Fatalf("1.501s later: %d, want allowed", rec.Code)
	}
}

func resolverFor(t *testing.T, proxies []string, hops, v6 int) *request.Resolver {
	t.Helper()

	r := &request.Resolver{Hops: hops, IPv6Prefix: v6, Cache: request.NewKeyCache()}

	for _, raw := range proxies {
		p, err := config.ParsePrefix(raw)
		if err != nil {
			t.Fatalf("prefix %q: %v", raw, err)
		}

		r.Proxies = append(r.Proxies, p)
	}

	return r
}

func TestClientKey(t *testing.T) {
	cases := []struct {
		name    string
		proxies []string // nil: the defaults
		hops    int
		v6      int
		remote  string
		xff     []string
		want    string
	}{
		{name: "plain peer", remote: "203.0.113.9:5555", want: "203.0.113.9"},
		{name: "untrusted peer cannot pick its bucket", remote: "203.0.113.9:5555", xff: []string{"198.51.100.1"}, want: "203.0.113.9"},
		{name: "untrusted peer, many entries", remote: "203.0.113.9:5555", xff: []string{"1.1.1.1, 2.2.2.2", "3.3.3.3"}, want: "203.0.113.9"},
		{name: "trusted peer, one hop", remote: "10.0.0.2:80", xff: []string{"198.51.100.1"}, want: "198.51.100.1"},
		{name: "trusted chain skips trusted hops", remote: "10.0.0.2:80", xff: []string{"198.51.100.1, 192.168.1.1, 10.0.0.7"}, want: "198.51.100.1"},
		{name: "client spoofs left of the real client", remote: "10.0.0.2:80", xff: []string{"6.6.6.6, 198.51.100.1, 10.0.0.7"}, want: "198.51.100.1"},
		{name: "multiple header lines are one list", remote: "10.0.0.2:80", xff: []string{"6.6.6.6, 198.51.100.1", "10.0.0.7"}, want: "198.51.100.1"},
		{name: "all trusted: the leftmost", remote: "127.0.0.1:80", xff: []string{"10.1.1.1, 192.168.0.5"}, want: "10.1.1.1"},
		{name: "trusted peer, no header", remote: "127.0.0.1:80", want: "127.0.0.1"},
		{name: "malformed rightmost: the peer", remote: "10.0.0.2:80", xff: []string{"198.51.100.1, garbage"}, want: "10.0.0.2"},
		{name: "malformed after trusted: last good", remote: "10.0.0.2:80", xff: []string{"198.51.100.1, not-an-ip, 10.0.0.9"}, want: "10.0.0.9"},
		{name: "empty entry is malformed", remote: "10.0.0.2:80", xff: []string{"198.51.100.1, , 10.0.0.9"}, want: "10.0.0.9"},
		{name: "empty header value", remote: "10.0.0.2:80", xff: []string{""}, want: "10.0.0.2"},
		{name: "entry with port", remote: "10.0.0.2:80", xff: []string{"198.51.100.1:4444"}, want: "198.51.100.1"},
		{name: "bracketed ipv6 entry with port", remote: "10.0.0.2:80", xff: []string{"[2001:db8:1:2::5]:4444"}, want: "2001:db8:1:2::/64"},
		{name: "overlong chain stops at the bound", remote: "10.0.0.2:80", xff: []string{"198.51.100.1" + repeat(", 10.0.0.1", 40)}, want: "10.0.0.1"},
		{name: "ipv6 grouped by /64", remote: "[2001:db8:aa:bb:1:2:3:4]:443", want: "2001:db8:aa:bb::/64"},
		{name: "ipv6 same /64 same key", remote: "[2001:db8:aa:bb:ffff::1]:443", want: "2001:db8:aa:bb::/64"},
		{name: "ipv6 /48", v6: 48, remote: "[2001:db8:aa:bb::1]:443", want: "2001:db8:aa::/48"},
		{name: "ipv6 /128 keeps the address", v6: 128, remote: "[2001:db8::1]:443", want: "2001:db8::1"},
		{name: "ipv6 zone dropped", remote: "[fe80::1%eth0]:443", want: "fe80::/64"},
		{name: "ipv4-mapped peer keyed as ipv4", remote: "[::ffff:203.0.113.9]:80", want: "203.0.113.9"},
		{name: "ipv4-mapped peer is trusted as ipv4", remote: "[::ffff:10.0.0.2]:80", xff: []string{"198.51.100.1"}, want: "198.51.100.1"},
		{name: "ipv4-mapped entry keyed as ipv4", remote: "10.0.0.2:80", xff: []string{"::ffff:198.51.100.1"}, want: "198.51.100.1"},
		{name: "trusted ipv6 proxy", remote: "[fd00::1]:80", xff: []string{"2001:db8::1"}, want: "2001:db8::/64"},
		{name: "custom proxies: loopback untrusted", proxies: []string{"10.0.0.0/8"}, remote: "127.0.0.1:80", xff: []string{"198.51.100.1"}, want: "127.0.0.1"},
		{name: "no proxies: nothing trusted", proxies: []string{}, remote: "10.0.0.2:80", xff: []string{"198.51.100.1"}, want: "10.0.0.2"},
		{name: "unparsable peer never empty", remote: "@", want: request.UnknownClient},
		{name: "empty peer never empty", remote: "", xff: []string{"198.51.100.1"}, want: request.UnknownClient},
		{name: "bare address peer", remote: "203.0.113.9", want: "203.0.113.9"},
		{name: "hops 1: rightmost", hops: 1, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, 198.51.100.1"}, want: "198.51.100.1"},
		{name: "hops 2: second from right", hops: 2, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, 198.51.100.1, 10.0.0.7"}, want: "198.51.100.1"},
		{name: "hops across header lines", hops: 2, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, 198.51.100.1", "10.0.0.7"}, want: "198.51.100.1"},
		{name: "hops: fewer entries gives the peer", hops: 3, remote: "203.0.113.9:1", xff: []string{"198.51.100.1, 10.0.0.7"}, want: "203.0.113.9"},
		{name: "hops: no header gives the peer", hops: 1, remote: "203.0.113.9:1", want: "203.0.113.9"},
		{name: "hops: malformed before the nth ends at last good", hops: 3, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, bad, 10.0.0.7"}, want: "10.0.0.7"},
		{name: "hops: malformed rightmost gives the peer", hops: 1, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, bad"}, want: "203.0.113.9"},
	}

	for _, tc := range cases {
		proxies := tc.proxies
		if proxies == nil && tc.hops == 0 {
			proxies = CreateConfig().TrustedProxies
		}

		v6 := tc.v6
		if v6 == 0 {
			v6 = 64
		}

		r := resolverFor(t, proxies, tc.hops, v6)
		req := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}

		for _, v := range tc.xff {
			req.Header.Add("X-Forwarded-For", v)
		}

		if got := clientKey(r, req); got != tc.want {
			t.Errorf("%s: key %q, want %q", tc.name, got, tc.want)
		}

		// The same with the cache, missed then hit.
		r.Cache = request.NewKeyCache()
		for pass := 0; pass < 2; pass++ {
			if got := clientKey(r, req); got != tc.want {
				t.Errorf("%s, cached (pass %d): key %q, want %q", tc.name, pass, got, tc.want)
			}
		}
	}
}

func repeat(s string, n int) string {
	out := ""
	for i := 0; i < n; i++ {
		out += s
	}

	return out
}

// TestRateLimitEventCarriesTime: a refusal's line has "time", RFC 3339 in
// UTC, from the event log's clock (here a clock in another zone).
func TestRateLimitEventCarriesTime(t *testing.T) {
	h := newHarness(t, onlyIP(1, "1s"))

	zone := time.FixedZone("UTC+2", 2*3600)
	at := time.Date(2026, 6, 15, 12, 0, 0, 250e6, zone)
	h.p.events.Now = func() time.Time { return at }

	h.get("/", "203.0.113.9:1")
	h.get("/", "203.0.113.9:1")

	line := strings.TrimSpace(h.events.String())

	var ev map[string]string
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatalf("event %q: %v", line, err)
	}

	if ev["event"] != "RATE_LIMIT_TRIGGERED" || ev["time"] != "2026-06-15T10:00:00.250Z" {
		t.Fatalf("event %q: want RATE_LIMIT_TRIGGERED at 2026-06-15T10:00:00.250Z", line)
	}

	if _, err := time.Parse(time.RFC3339, ev["time"]); err != nil {
		t.Fatalf("time %q is not RFC 3339: %v", ev["time"], err)
	}
}
