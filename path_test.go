package tierlimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// routePlugin is an instance with the login route, an asset prefix
// and an IP tier, on a fixed clock.
func routePlugin(t *testing.T, edit func(*Config)) *harness {
	t.Helper()

	return newHarness(t, func(cfg *Config) {
		cfg.Global.Points = 0
		cfg.IP = LayerConfig{Points: 1000, Duration: "60s"}
		cfg.Assets.PathPrefixes = []string{"/assets/"}
		cfg.Routes = []RouteConfig{{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Key: "ip", Points: 2, Duration: "60s"}}

		if edit != nil {
			edit(cfg)
		}
	})
}

// Every spelling a backend reads as the login is refused once the login's
// budget is spent; the request reaches the backend as it came.
func TestRouteMatchesCanonicalPath(t *testing.T) {
	h := routePlugin(t, nil)

	for i := 0; i < 2; i++ {
		if rec := serveOne(h, "POST", "/auth/login"); rec.Code != http.StatusOK {
			t.Fatalf("login %d: status %d, want 200", i, rec.Code)
		}
	}

	for _, p := range []string{
		"/auth/login", "/auth/login/", "/AUTH/LOGIN", "/Auth/Login", "/auth/login;jsessionid=1",
		"/assets/../auth/login", "//auth/login", "/auth/./login", "/auth//login", `/auth\login`, "/auth/%6Cogin",
	} {
		rec := serveOne(h, "POST", p)
		if rec.Code != http.StatusTooManyRequests {
			t.Errorf("POST %s: status %d, want 429", p, rec.Code)
		}
	}

	for _, p := range []string{"/auth/loginx", "/auth/log", "/auth"} {
		if rec := serveOne(h, "POST", p); rec.Code != http.StatusOK {
			t.Errorf("POST %s: status %d, want 200 (not the login)", p, rec.Code)
		}
	}
}

// With caseSensitive, only the configured case is the route; without, every
// case is, whichever case the asset prefixes (which set the form each
// request's path is canonicalised in) take.
func TestRouteCaseSensitive(t *testing.T) {
	for _, tt := range []struct {
		route, assets bool // caseSensitive
	}{{true, false}, {true, true}, {false, true}, {false, false}} {
		h := routePlugin(t, func(c *Config) {
			c.Routes[0].CaseSensitive = tt.route
			c.Assets.CaseSensitive = tt.assets
		})

		for i := 0; i < 2; i++ {
			serveOne(h, "POST", "/auth/login")
		}

		want := http.StatusTooManyRequests
		if tt.route {
			want = http.StatusOK
		}

		if rec := serveOne(h, "POST", "/AUTH/LOGIN"); rec.Code != want {
			t.Errorf("route caseSensitive %v, assets %v: POST /AUTH/LOGIN: status %d, want %d", tt.route, tt.assets, rec.Code, want)
		}

		if rec := serveOne(h, "POST", "/auth/login/"); rec.Code != http.StatusTooManyRequests {
			t.Errorf("route caseSensitive %v, assets %v: POST /auth/login/: status %d, want 429", tt.route, tt.assets, rec.Code)
		}
	}
}

// An asset prefix is matched on the canonical path: a climb out of it is not
// an asset, a spelling of it is (case-insensitively unless assets.caseSensitive).
func TestAssetsCanonicalPath(t *testing.T) {
	for _, caseSensitive := range []bool{false, true} {
		h := routePlugin(t, func(c *Config) {
			c.Routes = nil
			c.Assets.CaseSensitive = caseSensitive
		})

		tests := []struct {
			path  string
			layer string
		}{
			{"/assets/app.js", "assets"},
			{"/assets//app.js", "assets"},
			{"/assets/;x/app.js", "assets"},
			{"/assets/", "assets"},
			{"/assets", "ip"},
			{"/assets/../auth/login", "ip"},
			{"/assets/..;/auth/login", "ip"},
			{"/assets/x/../../auth/login", "ip"},
			{"/ASSETS/app.js", map[bool]string{false: "assets", true: "ip"}[caseSensitive]},
			{"/assetsx/app.js", "ip"},
		}

		for _, tt := range tests {
			rec := serveOne(h, "GET", tt.path)
			if got := layerOf(rec); got != tt.layer {
				t.Errorf("caseSensitive %v, GET %s: charged to %q, want %q", caseSensitive, tt.path, got, tt.layer)
			}
		}
	}
}

// serveOne serves a request whose decoded path is path, as Go's server
// leaves it (httptest.NewRequest would parse it as a URL).
func serveOne(h *harness, method, path string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "http://example.test/", nil)
	req.URL.Path = path
	req.RemoteAddr = "192.0.2.1:1234"
	rec := httptest.NewRecorder()
	h.h.ServeHTTP(rec, req)

	return rec
}

// layerOf is the layer the rate-limit headers show: `"name";r=...`.
func layerOf(rec *httptest.ResponseRecorder) string {
	v := rec.Header().Get("Ratelimit")
	if i := strings.Index(v, `";`); strings.HasPrefix(v, `"`) && i > 0 {
		return v[1:i]
	}

	return ""
}
