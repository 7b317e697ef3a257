package tierlimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestCanonicalPath(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"/auth/login", "/auth/login"},
		{"/", "/"},
		{"", "/"},
		{"*", "/*"},
		{"/auth/login/", "/auth/login/"},
		{"/auth/login//", "/auth/login/"},
		{"/AUTH/LOGIN", "/AUTH/LOGIN"},
		{"/Auth/Login", "/Auth/Login"},
		{"/auth/login;jsessionid=1", "/auth/login"},
		{"/auth;x=1/login;y", "/auth/login"},
		{"/auth/login;/", "/auth/login/"},
		{"/;x/auth/login", "/auth/login"},
		// Go has decoded %2F already: the request /assets/..%2Fauth/login.
		{"/assets/../auth/login", "/auth/login"},
		{"/assets/..;/auth/login", "/auth/login"},
		{"//auth/login", "/auth/login"},
		{"/auth/./login", "/auth/login"},
		{"/auth//login", "/auth/login"},
		{"/auth/login/.", "/auth/login"},
		{"/auth/x/../login", "/auth/login"},
		{"/../../auth/login", "/auth/login"},
		{`/auth\login`, "/auth/login"},
		// Encoded once more, and twice more.
		{"/assets/..%2Fauth/login", "/auth/login"},
		{"/assets/..%252Fauth/login", "/auth/login"},
		{"/auth/%2e%2e/auth/login", "/auth/login"},
		{"/auth/%6Cogin", "/auth/login"},
		{"/auth/login%3Bx=1", "/auth/login"},
		{"/auth/%25%36%63ogin", "/auth/login"},
		// An escape Go would refuse: the valid ones around it still decode.
		{"/auth/%zz/%2e%2e/login", "/auth/login"},
		{"/a%", "/a%"},
		{"/a/%0%0X/%2e%2e/b", "/a/b"},
		{"/a/%%41", "/a/%A"},
		{"/.hidden", "/.hidden"},
		{"/a/..b", "/a/..b"},
		{"/auth/loginx", "/auth/loginx"},
	}

	for _, tt := range tests {
		if got := canonicalPath(tt.in, false); got != tt.want {
			t.Errorf("canonicalPath(%q, false) = %q, want %q", tt.in, got, tt.want)
		}

		if got, want := canonicalPath(tt.in, true), strings.ToLower(tt.want); got != want {
			t.Errorf("canonicalPath(%q, true) = %q, want %q", tt.in, got, want)
		}
	}

	if got := canonicalPath("/Caf\u00c9/", true); got != "/caf\u00e9/" {
		t.Errorf("canonicalPath folds %q, want %q", got, "/caf\u00e9/")
	}
}

// A path with nothing to canonicalise comes back as it is, unallocated.
func TestCanonicalPathFastPath(t *testing.T) {
	for _, p := range []string{"/api/v1/items/42", "/api/v1/items/"} {
		if n := testing.AllocsPerRun(100, func() { _ = canonicalPath(p, true) }); n != 0 {
			t.Errorf("canonicalPath(%q) allocates %v times, want 0", p, n)
		}
	}
}

func TestCanonicalPattern(t *testing.T) {
	tests := []struct {
		in            string
		caseSensitive bool
		want          string
	}{
		{"/auth/login", false, "/auth/login"},
		{"/Auth/Login/", false, "/auth/login/"},
		{"/Auth/Login/", true, "/Auth/Login/"},
		{"/assets/", false, "/assets/"},
		{"//static//", false, "/static/"},
		{"/", false, "/"},
		{"/static", false, "/static"},
	}

	for _, tt := range tests {
		if got := canonicalPattern(tt.in, tt.caseSensitive); got != tt.want {
			t.Errorf("canonicalPattern(%q, %v) = %q, want %q", tt.in, tt.caseSensitive, got, tt.want)
		}
	}
}

func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{
		"/auth/login", "/auth/login/", "/AUTH/LOGIN", "/auth/login;jsessionid=1", "/assets/../auth/login",
		"//auth/login", "/auth/./login", "/auth//login", "/a/%2e%2e/%252F;x\\y", "", "%", "/\u0130\u212a", "/%000;x%0%0X",
	} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, in string) {
		got := canonicalPath(in, false)

		if !strings.HasPrefix(got, "/") {
			t.Fatalf("canonicalPath(%q) = %q: want it to start with /", in, got)
		}

		// Rooted: at most the "/" it adds longer than its input.
		if len(got) > len(in)+1 {
			t.Fatalf("canonicalPath(%q) = %q: longer than its input", in, got)
		}

		if again := canonicalPath(got, false); again != got {
			t.Fatalf("canonicalPath not idempotent: %q -> %q -> %q", in, got, again)
		}

		folded := canonicalPath(in, true)
		if again := canonicalPath(folded, true); again != folded {
			t.Fatalf("canonicalPath(_, true) not idempotent: %q -> %q -> %q", in, folded, again)
		}
	})
}

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
