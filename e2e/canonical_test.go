package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// The login route of the design note, with windows long enough that none
// turns over during the test, served on the default entrypoint (web) and on
// one with sanitizePath: false (raw).
const canonicalDynamic = `
http:
  routers:
    web:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
    raw:
      entryPoints: [raw]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 1000, duration: 1h}
          assets: {points: 100, duration: 1h, pathPrefixes: [/assets/]}
          routes:
            - {name: auth_login, methods: [POST], paths: [/auth/login], key: ip, points: 10, duration: 1h}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// loginSpellings are request targets, sent as they are, that backends read
// as POST /auth/login.
var loginSpellings = []string{
	"/auth/login",
	"/auth/login/",
	"/AUTH/LOGIN",
	"/Auth/Login",
	"/auth/login;jsessionid=1",
	"/assets/..%2Fauth/login",
	"//auth/login",
	"/auth/./login",
	"/auth//login",
	"/auth/login//",
	"/auth/login/.",
	"/auth/x/../login",
	"/assets/../auth/login",
	"/assets/..;/auth/login",
	"/assets/..%252Fauth/login",
	"/auth;x=1/login",
	"/auth/%6cogin",
	"/auth/%6Cogin",
	"/auth%2Flogin",
	"/auth/login%2F",
	"/auth/login%3Bjsessionid=1",
	"/auth/%2e/login",
	"/%2e%2e/auth/login",
	"/AUTH/Login;JSESSIONID=1/",
	`/auth\login`,
}

// TestLoginRouteMatchesEverySpelling: once the login budget is spent, every
// spelling of the login is refused on both entrypoints, a path that only
// shares its prefix is not the login, and /assets/..%2Fauth/login is charged
// to the login and the client's IP, not to assets.
func TestLoginRouteMatchesEverySpelling(t *testing.T) {
	e := start(t, canonicalDynamic)
	e.waitRouters("web", "raw")

	for i, base := range []string{e.traefik.Web, e.traefik.Raw} {
		addr := strings.TrimPrefix(base, "http://")
		client := []string{"198.51.100.21", "198.51.100.22"}[i]
		name := []string{"web", "raw (sanitizePath: false)"}[i]

		// Charged to the login (the headers show its 9 left) and to ip.
		r := rawRequest(t, addr, "POST", "/assets/..%2Fauth/login", client)
		if r.code != http.StatusOK || r.header.Get("X-RateLimit-Limit") != "10" || r.header.Get("X-RateLimit-Remaining") != "9" {
			t.Fatalf("%s: POST /assets/..%%2Fauth/login: %d, limit %q remaining %q, want 200 charged to auth_login",
				name, r.code, r.header.Get("X-RateLimit-Limit"), r.header.Get("X-RateLimit-Remaining"))
		}

		// Not to assets: the first asset request finds 99 of 100 left...
		if r := rawRequest(t, addr, "GET", "/assets/app.js", client); r.code != http.StatusOK || !strings.HasPrefix(r.header.Get("Ratelimit"), `"assets";r=99;`) {
			t.Fatalf("%s: GET /assets/app.js after the login through assets: %d, RateLimit %q, want assets untouched before it", name, r.code, r.header.Get("Ratelimit"))
		}

		// ... and the ip layer has the login's request and this one.
		if r := rawRequest(t, addr, "GET", "/api", client); r.code != http.StatusOK || !strings.HasPrefix(r.header.Get("Ratelimit"), `"ip";r=998;`) {
			t.Fatalf("%s: GET /api: %d, RateLimit %q, want ip charged twice", name, r.code, r.header.Get("Ratelimit"))
		}

		// The request reaches the backend as it came (up to what the
		// entrypoint itself cleans): the middleware only matches a canonical copy.
		r = rawRequest(t, addr, "POST", "/Auth//Login", client)
		want := "ok POST /Auth/Login\n"
		if i == 1 {
			want = "ok POST /Auth//Login\n"
		}

		if r.code != http.StatusOK || !strings.HasPrefix(r.body, want) || r.header.Get("X-RateLimit-Remaining") != "8" {
			t.Fatalf("%s: POST /Auth//Login: %d, remaining %q, body %q; want 200, 8 left, the backend serving %q",
				name, r.code, r.header.Get("X-RateLimit-Remaining"), r.body, want)
		}

		for n := 7; n >= 0; n-- {
			if r := rawRequest(t, addr, "POST", "/auth/login", client); r.code != http.StatusOK {
				t.Fatalf("%s: login with %d left: status %d", name, n+1, r.code)
			}
		}

		for _, target := range loginSpellings {
			r := rawRequest(t, addr, "POST", target, client)
			if r.code != http.StatusTooManyRequests || r.header.Get("X-RateLimit-Limit") != "10" {
				t.Errorf("%s: POST %s after the login budget: status %d, limit %q, body %q; want 429 from auth_login",
					name, target, r.code, r.header.Get("X-RateLimit-Limit"), r.body)
			}
		}

		for _, target := range []string{"/auth/loginx", "/auth/login-x", "/auth/log", "/auth", "/auth/login/x"} {
			if r := rawRequest(t, addr, "POST", target, client); r.code != http.StatusOK {
				t.Errorf("%s: POST %s: status %d, want 200 (not the login)", name, target, r.code)
			}
		}

		if r := rawRequest(t, addr, "GET", "/auth/login", client); r.code != http.StatusOK {
			t.Errorf("%s: GET /auth/login: status %d, want 200 (the route is POST only)", name, r.code)
		}
	}
}

// rawRequest sends target as the request line has it: Go's client would
// clean or re-encode it.
func rawRequest(t *testing.T, addr, method, target, client string) response {
	t.Helper()

	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}

	req := method + " " + target + " HTTP/1.1\r\nHost: example.test\r\nX-Forwarded-For: " + client +
		"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}

	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method, URL: &url.URL{Opaque: target}})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()

	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, target, err)
	}

	return response{code: resp.StatusCode, header: resp.Header, body: string(body)}
}
