package tierlimit

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/request"
)

func principalConfig(c *Config) {
	c.Global.Points = 0
	c.IP.Points = 0
	c.Assets.Points = 0
	c.User = config.LayerConfig{Points: 3, Duration: "60s"}
	c.Service = config.LayerConfig{Points: 5, Duration: "60s"}
	c.Principal.UserHeader = "X-Auth-User"
}

func TestUserAndServiceTiers(t *testing.T) {
	h := newHarness(t, principalConfig)
	alice := map[string]string{"X-Auth-User": "alice"}
	bob := map[string]string{"X-Auth-User": "bob"}

	for i := 1; i <= 3; i++ {
		rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", alice)
		if rec.Code != http.StatusOK || rec.Header().Get("RateLimit-Policy") != `"user";q=3;w=60` {
			t.Fatalf("alice %d: %d %v", i, rec.Code, rec.Header())
		}
	}

	if rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", alice); rec.Code != http.StatusTooManyRequests ||
		!strings.Contains(rec.Body.String(), `"layer":"user"`) {
		t.Fatalf("alice 4th: %d %s", rec.Code, rec.Body.String())
	}

	// Same IP, another user: own bucket.
	if rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", bob); rec.Code != http.StatusOK {
		t.Fatalf("bob: %d", rec.Code)
	}

	// Service accounts: one bucket per account, flagged by "true" or "1".
	for _, flag := range []string{"true", "1", "TRUE", " true "} {
		sa := map[string]string{"X-Auth-User": "svc-" + strings.TrimSpace(flag), "X-Auth-Service-Account": flag}

		rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", sa)
		if rec.Header().Get("RateLimit-Policy") != `"service";q=5;w=60` {
			t.Fatalf("flag %q: policy %q", flag, rec.Header().Get("RateLimit-Policy"))
		}
	}

	// Any other value is a user.
	for _, flag := range []string{"yes", "0", "false", ""} {
		rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", map[string]string{"X-Auth-User": "u-" + flag, "X-Auth-Service-Account": flag})
		if rec.Header().Get("RateLimit-Policy") != `"user";q=3;w=60` {
			t.Fatalf("flag %q: policy %q", flag, rec.Header().Get("RateLimit-Policy"))
		}
	}

	batch := map[string]string{"X-Auth-User": "batch", "X-Auth-Service-Account": "true"}
	for i := 1; i <= 5; i++ {
		h.do(http.MethodGet, "/api", "10.0.0.1:1", batch)
	}

	if rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", batch); rec.Code != http.StatusTooManyRequests ||
		!strings.Contains(rec.Body.String(), `"layer":"service"`) {
		t.Fatalf("batch 6th: %d %s", rec.Code, rec.Body.String())
	}

	// Exhausting one account touches neither another account nor a user.
	other := map[string]string{"X-Auth-User": "etl", "X-Auth-Service-Account": "1"}
	if rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", other); rec.Code != http.StatusOK {
		t.Fatalf("other account: %d", rec.Code)
	}

	// A user with the same id as an account is another bucket only if the layer differs.
	if rec := h.do(http.MethodGet, "/api", "10.0.0.1:1", map[string]string{"X-Auth-User": "batch"}); rec.Code != http.StatusOK {
		t.Fatalf("user batch: %d", rec.Code)
	}
}

func TestPrincipalHeaderIgnoredWithoutUserHeader(t *testing.T) {
	h := newHarness(t, onlyIP(50, "1s"))

	rec := h.do(http.MethodGet, "/api", "203.0.113.9:1", map[string]string{"X-Auth-User": "mallory"})
	if rec.Header().Get("RateLimit-Policy") != `"ip";q=50;w=1` {
		t.Fatalf("client-sent X-Auth-User honoured without userHeader: %v", rec.Header())
	}
}

func TestLookAlikePrincipalHeaderIsNotThePrincipal(t *testing.T) {
	h := newHarness(t, func(c *Config) { principalConfig(c); c.IP = config.LayerConfig{Points: 50, Duration: "1s"} })

	req := httptest.NewRequest(http.MethodGet, "/api", nil)
	req.RemoteAddr = "203.0.113.9:1"
	req.Header["X_auth_user"] = []string{"mallory"}
	req.Header["X-Auth_User"] = []string{"mallory"}

	rec := httptest.NewRecorder()
	h.h.ServeHTTP(rec, req)

	if rec.Header().Get("RateLimit-Policy") != `"ip";q=50;w=1` {
		t.Fatalf("look-alike header taken as the principal: %v", rec.Header())
	}
}

func TestOverlongPrincipalIsHashed(t *testing.T) {
	h := newHarness(t, principalConfig)
	long := strings.Repeat("a", 4096)
	h.do(http.MethodGet, "/api", "10.0.0.1:1", map[string]string{"X-Auth-User": long})

	if got := peekCount(h.p.memory, h.clock.Now().UnixNano(), "user", request.HashKey(long)); got != 1 {
		t.Fatal("overlong principal not keyed by its digest")
	}
}

func TestPrincipalKeyedRoute(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		principalConfig(c)
		c.User.Points = 100
		c.Routes = []config.RouteConfig{{Name: "export", Paths: []string{"/export"}, Key: "principal", Points: 1, Duration: "60s"}}
	})

	if rec := h.do(http.MethodGet, "/export", "10.0.0.1:1", map[string]string{"X-Auth-User": "alice"}); rec.Code != http.StatusOK {
		t.Fatalf("alice: %d", rec.Code)
	}

	if rec := h.do(http.MethodGet, "/export", "10.0.0.1:1", map[string]string{"X-Auth-User": "alice"}); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("alice again: %d", rec.Code)
	}

	if rec := h.do(http.MethodGet, "/export", "10.0.0.1:1", map[string]string{"X-Auth-User": "bob"}); rec.Code != http.StatusOK {
		t.Fatalf("bob from the same IP: %d", rec.Code)
	}
}

// authChain is edge -> fake ForwardAuth -> principal instance -> backend, the
// recommended deployment, in process.
type authChain struct {
	edge, principal *harness
	handler         http.Handler
}

// fakeAuth answers like the ForwardAuth server of the design: no token or a
// scheme other than Bearer 200 anonymous, "Bearer user-<id>" a user, "Bearer
// svc-<id>" a service account, any other bearer token 401. It deletes client-sent principal headers, as ForwardAuth
// does for the headers in authResponseHeaders.
func fakeAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		req.Header.Del("X-Auth-User")
		req.Header.Del("X-Auth-Service-Account")

		authz := req.Header.Get("Authorization")
		token := strings.TrimPrefix(authz, "Bearer ")

		switch {
		case !strings.HasPrefix(authz, "Bearer "):
		case strings.HasPrefix(token, "user-"):
			req.Header.Set("X-Auth-User", strings.TrimPrefix(token, "user-"))
		case strings.HasPrefix(token, "svc-"):
			req.Header.Set("X-Auth-User", strings.TrimPrefix(token, "svc-"))
			req.Header.Set("X-Auth-Service-Account", "true")
		default:
			rw.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			rw.Header().Set("Content-Type", "text/plain")
			rw.Header().Set("Content-Length", "13")
			rw.WriteHeader(http.StatusUnauthorized)
			_, _ = rw.Write([]byte("invalid token"))

			return
		}

		next.ServeHTTP(rw, req)
	})
}

func newAuthChain(t *testing.T, edgeCfg, principalCfg func(c *Config)) *authChain {
	c := &authChain{}
	c.principal = newHarness(t, func(cfg *Config) {
		cfg.Global.Points = 0
		cfg.IP.Points = 0
		cfg.Assets.Points = 0
		cfg.Principal.UserHeader = "X-Auth-User"
		principalCfg(cfg)
	})
	c.edge = newHarness(t, func(cfg *Config) {
		cfg.Principal.CredentialHeaders = []string{"Authorization"}
		edgeCfg(cfg)
	})
	c.edge.p.next = fakeAuth(c.principal.p)
	c.edge.p.now = c.principal.clock.Now
	c.edge.clock = c.principal.clock
	c.handler = c.edge.p

	return c
}

func (c *authChain) do(method, target, remote, token string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = remote

	// A token with a scheme is sent as it is; a bare one as a bearer token.
	if strings.Contains(token, " ") {
		req.Header.Set("Authorization", token)
	} else if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}

	rec := httptest.NewRecorder()
	c.handler.ServeHTTP(rec, req)

	return rec
}

func TestGarbageTokensAreChargedToTheIP(t *testing.T) {
	c := newAuthChain(t, func(cfg *Config) { cfg.IP = config.LayerConfig{Points: 50, Duration: "1s"} }, func(*Config) {})

	for i := 1; i <= 60; i++ {
		rec := c.do(http.MethodGet, "/api", "203.0.113.66:1", "garbage-"+strconv.Itoa(i))

		want := http.StatusUnauthorized
		if i > 50 {
			want = http.StatusTooManyRequests
		}

		if rec.Code != want {
			t.Fatalf("garbage %d: %d, want %d", i, rec.Code, want)
		}

		if i <= 50 && (rec.Header().Get("RateLimit-Policy") != `"ip";q=50;w=1` || rec.Header().Get("X-RateLimit-Remaining") != strconv.Itoa(50-i)) {
			t.Fatalf("garbage %d: 401 without the ip headers: %v", i, rec.Header())
		}

		if i > 50 {
			if rec.Header().Get("Www-Authenticate") != "" || rec.Header().Get("Content-Length") == "13" ||
				!strings.Contains(rec.Body.String(), `"layer":"ip"`) || rec.Header().Get("Retry-After") == "" {
				t.Fatalf("garbage %d: 429 mixed with the 401: %v %q", i, rec.Header(), rec.Body.String())
			}
		}
	}

	// Valid tokens through the same IP in the same second are unaffected.
	for i := 0; i < 5; i++ {
		if rec := c.do(http.MethodGet, "/api", "203.0.113.66:1", "user-alice"); rec.Code != http.StatusOK {
			t.Fatalf("valid token after garbage: %d", rec.Code)
		}
	}

	// One event for the ip key, however many refusals.
	if n := strings.Count(c.edge.events.String(), `"limiter":"ip"`); n != 1 {
		t.Fatalf("%d ip events:\n%s", n, c.edge.events.String())
	}
}

// TestCredentialsPassedAsAnonymousAreChargedToTheIP: an auth server that
// answers 200 without a principal for a credential it does not know (here any
// scheme but Bearer) leaves the request anonymous; the principal instance
// charges it to the edge's ip bucket before the backend, once.
func TestCredentialsPassedAsAnonymousAreChargedToTheIP(t *testing.T) {
	c := newAuthChain(t, func(cfg *Config) { cfg.IP = config.LayerConfig{Points: 50, Duration: "1s"} }, func(*Config) {})

	for _, from := range []struct{ remote, token string }{{"203.0.113.7:1", "Basic x"}, {"203.0.113.8:1", ""}} {
		before := c.edge.calls.Load() + c.principal.calls.Load()
		codes := map[int]int{}

		for i := 1; i <= 60; i++ {
			rec := c.do(http.MethodGet, "/api", from.remote, from.token)
			codes[rec.Code]++

			if i > 50 && (rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"layer":"ip"`)) {
				t.Fatalf("%q request %d: %d %s", from.token, i, rec.Code, rec.Body.String())
			}

			if i <= 50 && rec.Header().Get("X-RateLimit-Remaining") != strconv.Itoa(50-i) {
				t.Fatalf("%q request %d: remaining %q, want %d", from.token, i, rec.Header().Get("X-RateLimit-Remaining"), 50-i)
			}
		}

		if codes[http.StatusOK] != 50 || codes[http.StatusTooManyRequests] != 10 {
			t.Fatalf("%q: %v, want 50 OK then 10 refusals", from.token, codes)
		}

		// The principal harness's backend served the 50, and nothing else did.
		if served := c.edge.calls.Load() + c.principal.calls.Load() - before; served != 50 {
			t.Fatalf("%q: the backend served %d requests, want 50", from.token, served)
		}
	}

	// A BFF's users through one IP are not charged to it.
	for i := 0; i < 60; i++ {
		if rec := c.do(http.MethodGet, "/auth/me", "10.0.0.9:1", "user-alice"); rec.Code != http.StatusOK {
			t.Fatalf("user request %d: %d", i, rec.Code)
		}
	}

	if n := c.edge.p.memory.Maps["ip"]["10.0.0.9"]; n != nil {
		t.Fatalf("the BFF's IP was charged %d times", n.Count)
	}
}

// TestPrincipalRequestsAreNeverChargedToTheIP: a request with a principal that
// the application answers 401 is the application's business, not an invalid
// credential.
func TestPrincipalRequestsAreNeverChargedToTheIP(t *testing.T) {
	c := newAuthChain(t, func(cfg *Config) { cfg.IP = config.LayerConfig{Points: 2, Duration: "1s"} }, func(*Config) {})
	c.principal.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.WriteHeader(http.StatusUnauthorized)
	})

	for i := 0; i < 10; i++ {
		if rec := c.do(http.MethodGet, "/api", "203.0.113.9:1", "user-alice"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("request %d: %d, want the application's 401", i, rec.Code)
		}
	}

	if w := c.edge.p.memory.Maps["ip"]["203.0.113.9"]; w != nil {
		t.Fatalf("a principal's requests were charged to the ip bucket: %d", w.Count)
	}
}

func TestGarbageTokensInDryRunAreCountedNotRefused(t *testing.T) {
	c := newAuthChain(t, func(cfg *Config) { cfg.DryRun = true; cfg.IP = config.LayerConfig{Points: 2, Duration: "1s"} }, func(*Config) {})

	for i := 0; i < 5; i++ {
		if rec := c.do(http.MethodGet, "/api", "203.0.113.66:1", "garbage"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("dry run: %d", rec.Code)
		}
	}

	if !strings.Contains(c.edge.events.String(), `"limiter":"ip"`) {
		t.Fatal("dry run did not report the ip layer")
	}
}

func TestEveryRequestIsChargedToExactlyOneTierBucket(t *testing.T) {
	c := newAuthChain(t, func(cfg *Config) {
		cfg.Global = config.LayerConfig{Points: 100000, Duration: "60s"}
		cfg.IP = config.LayerConfig{Points: 1000, Duration: "60s"}
		cfg.Assets = config.AssetsConfig{Points: 1000, Duration: "60s", PathPrefixes: []string{"/assets/"}}
		cfg.Routes = []config.RouteConfig{{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Points: 1000, Duration: "60s"}}
	}, func(cfg *Config) {
		cfg.User = config.LayerConfig{Points: 1000, Duration: "60s"}
		cfg.Service = config.LayerConfig{Points: 1000, Duration: "60s"}
	})

	mix := []struct {
		n                     int
		method, path, token   string
		remote, layer, bucket string
	}{
		{7, http.MethodGet, "/api", "", "203.0.113.1:1", "ip", "203.0.113.1"},
		{5, http.MethodPost, "/auth/login", "", "203.0.113.1:1", "ip", "203.0.113.1"},
		{4, http.MethodGet, "/assets/a.js", "", "203.0.113.1:1", "assets", "203.0.113.1"},
		{6, http.MethodGet, "/api", "user-alice", "10.0.0.9:1", "user", "alice"},
		{3, http.MethodGet, "/assets/b.js", "user-alice", "10.0.0.9:1", "user", "alice"},
		{9, http.MethodGet, "/api", "svc-batch", "10.0.0.9:1", "service", "batch"},
		{8, http.MethodGet, "/api", "garbage", "203.0.113.2:1", "ip", "203.0.113.2"},
		{6, http.MethodGet, "/api", "Basic x", "203.0.113.3:1", "ip", "203.0.113.3"},
		{2, http.MethodGet, "/assets/c.js", "Basic x", "203.0.113.3:1", "ip", "203.0.113.3"},
	}

	want := map[string]int64{}
	total := 0

	for _, m := range mix {
		for i := 0; i < m.n; i++ {
			c.do(m.method, m.path, m.remote, m.token)
		}

		want[m.layer+"/"+m.bucket] += int64(m.n)
		total += m.n
	}

	got := map[string]int64{}
	var sum int64

	for _, s := range []*memstore.WindowStore{c.edge.p.memory, c.principal.p.memory} {
		for layer, entries := range s.Maps {
			if layer != "ip" && layer != "assets" && layer != "user" && layer != "service" {
				continue
			}

			for key, w := range entries {
				got[layer+"/"+key] += w.Count
				sum += w.Count
			}
		}
	}

	if sum != int64(total) {
		t.Fatalf("%d requests, %d tier charges: %v", total, sum, got)
	}

	for k, v := range want {
		if got[k] != v {
			t.Errorf("bucket %s: %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
}

// flushRecorder counts flushes and can be hijacked.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushes  int
	hijacked bool
}

func (f *flushRecorder) Flush() { f.flushes++ }

func (f *flushRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	f.hijacked = true
	return nil, nil, nil
}

func TestCredentialWriterKeepsStreamsLive(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Principal.CredentialHeaders = []string{"Authorization"} })

	streaming := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(http.StatusOK)

		for i := 0; i < 3; i++ {
			_, _ = rw.Write([]byte("data: x\n\n"))
		}
	})
	h.p.next = streaming

	req := httptest.NewRequest(http.MethodGet, "/events", nil)
	req.Header.Set("Authorization", "Bearer t")
	rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	h.h.ServeHTTP(rec, req)

	if rec.flushes != 4 || rec.Body.String() != strings.Repeat("data: x\n\n", 3) {
		t.Fatalf("%d flushes (want 4: headers and each event), body %q", rec.flushes, rec.Body.String())
	}

	// A response with a length is not flushed write by write.
	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.Header().Set("Content-Length", "2")
		_, _ = rw.Write([]byte("ok"))
	})
	rec = &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	h.h.ServeHTTP(rec, req)

	if rec.flushes != 0 {
		t.Fatalf("%d flushes of a sized response", rec.flushes)
	}

	// Upgrades reach the original connection.
	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if _, _, err := rw.(http.Hijacker).Hijack(); err != nil {
			t.Errorf("hijack: %v", err)
		}
	})
	rec = &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	h.h.ServeHTTP(rec, req)

	if !rec.hijacked {
		t.Fatal("Hijack did not reach the original writer")
	}
}

func TestAnonymousRequestsAreNotWrapped(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Principal.CredentialHeaders = []string{"Authorization"} })

	var got http.ResponseWriter

	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { got = rw })
	rec := httptest.NewRecorder()
	h.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))

	if got != http.ResponseWriter(rec) {
		t.Fatalf("anonymous request got a wrapped writer %T", got)
	}
}

// TestAPendingChargeIsChargedOnce: a credential the auth server passes as
// anonymous, which the application then answers 401, is charged to the
// edge's ip bucket by the principal instance, and not again by the edge's
// writer when it sees the 401 (after.go settle).
func TestAPendingChargeIsChargedOnce(t *testing.T) {
	c := newAuthChain(t, func(cfg *Config) { cfg.IP = config.LayerConfig{Points: 10, Duration: "60s"} }, func(*Config) {})
	c.principal.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.WriteHeader(http.StatusUnauthorized)
	})

	for i := 0; i < 5; i++ {
		if rec := c.do(http.MethodGet, "/api", "203.0.113.9:1", "Basic x"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("request %d: %d, want the application's 401", i, rec.Code)
		}
	}

	if got := peekCount(c.edge.p.memory, c.edge.clock.Now().UnixNano(), "ip", "203.0.113.9"); got != 5 {
		t.Fatalf("5 requests charged %d times to ip, want 5", got)
	}
}

// TestGarbageCredentialsDoNotSpendGlobal: the edge charges global up front
// for a credentialed request; when the client's ip bucket refuses it later,
// global gets its point back, so one client sending garbage tokens cannot
// spend the budget every client shares.
func TestGarbageCredentialsDoNotSpendGlobal(t *testing.T) {
	for _, token := range []string{"garbage", "Basic x"} {
		c := newAuthChain(t, func(cfg *Config) {
			cfg.Global = config.LayerConfig{Points: 50, Duration: "60s"}
			cfg.IP = config.LayerConfig{Points: 5, Duration: "60s"}
		}, func(*Config) {})

		codes := map[int]int{}
		for i := 0; i < 100; i++ {
			codes[c.do(http.MethodGet, "/api", "203.0.113.66:1", token).Code]++
		}

		if codes[http.StatusTooManyRequests] != 95 {
			t.Fatalf("%q: %v, want 5 through and 95 refusals", token, codes)
		}

		for i := 0; i < 10; i++ {
			if rec := c.do(http.MethodGet, "/api", "198.51.100."+strconv.Itoa(i+1)+":1", ""); rec.Code != http.StatusOK {
				t.Fatalf("%q: anonymous client %d after the flood: %d %s", token, i, rec.Code, rec.Body.String())
			}
		}

		if got := peekCount(c.edge.p.memory, c.edge.clock.Now().UnixNano(), "global", "global"); got != 15 {
			t.Fatalf("%q: global count %d, want 15 (5 let through, 10 anonymous)", token, got)
		}
	}
}
