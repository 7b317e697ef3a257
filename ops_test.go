package tierlimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/request"
)

// TestExemptClientsAreNotCharged: an exempt IP (through a trusted proxy) and an
// exempt principal send ten times a layer's points without a refusal while
// others are limited; the global layer still counts them unless exempt.global.
func TestExemptClientsAreNotCharged(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global = LayerConfig{Points: 1000, Duration: "1s"}
		c.IP = LayerConfig{Points: 5, Duration: "1s"}
		c.User = LayerConfig{Points: 5, Duration: "1s"}
		c.Principal.UserHeader = "X-Auth-User"
		c.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 1, Duration: "1s"}}
		c.Exempt = ExemptConfig{IPs: []string{"198.51.100.0/24"}, Principals: []string{"health-bot"}}
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
		c.Global = LayerConfig{Points: 3, Duration: "1s"}
		c.Exempt = ExemptConfig{IPs: []string{"::1/128", "192.0.2.1"}, Global: true}
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
		c.IP = LayerConfig{Points: 3, Duration: "1s", Key: "header:x-api-key"}
		c.Routes = []RouteConfig{{Name: "export", Paths: []string{"/export"}, Points: 1, Duration: "1s", Key: "header:X-Api-Key"}}
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
		c.Response = ResponseConfig{
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
		c.IP = LayerConfig{Points: 4, Duration: "10s", Algorithm: "sliding"}
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
