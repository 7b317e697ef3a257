package e2e

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// The tests of this file run a costed route (routes[].cost) and a failed-login limit (routes[].countStatus)
// through the real Traefik, on the memory store and on a redis-server of
// their own. Windows last 60s: none ends during a test.

const exportDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [costed]
      service: backend
  middlewares:
    costed:
      plugin:
        tierlimit:
          {{store}}
          global: {points: 10000, duration: 60s}
          ip: {points: 25, duration: 60s}
          routes:
            - {name: export, paths: [/export], key: ip, points: 100000, duration: 60s, cost: 10}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestCostedRoute: exports cost 10 of the client's 25: three get 200, 200,
// 429 (the third does not fit, and spends nothing), then its 6 plain GETs
// get 5 then 429.
func TestCostedRoute(t *testing.T) {
	eachStore(t, func(t *testing.T, store string, _ *harness.Redis) {
		e := start(t, strings.ReplaceAll(exportDynamic, "{{store}}", store))
		e.waitRouters("api")

		client := from("198.51.100.20")

		for i, want := range []string{"200", "200", "429 ip"} {
			if got := e.answer(http.MethodGet, e.traefik.Web+"/export", client); got != want {
				t.Fatalf("export %d: %s, want %s", i+1, got, want)
			}
		}

		for i := 1; i <= 6; i++ {
			want := "200"
			if i == 6 {
				want = "429 ip"
			}

			if got := e.answer(http.MethodGet, e.traefik.Web+"/api", client); got != want {
				t.Fatalf("plain GET %d after the exports: %s, want %s", i, got, want)
			}
		}
	})
}

const failedLoginDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: login
  middlewares:
    edge:
      plugin:
        tierlimit:
          {{store}}
          global: {points: 10000, duration: 60s}
          ip: {points: 1000, duration: 60s}
          routes:
            - {name: auth_login, methods: [POST], paths: [/auth/login], key: ip, points: 3, duration: 60s, countStatus: [401]}
  services:
    login:
      loadBalancer:
        servers:
          - url: "{{login}}"
`

// loginServer answers 200 to the password "good" and 401 to any other.
var loginServer = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
	if req.Header.Get("X-Password") != "good" {
		http.Error(rw, "bad password", http.StatusUnauthorized)
		return
	}

	_, _ = rw.Write([]byte("welcome\n"))
})

// TestFailedLoginLimit: a login route of 3/60s that counts 401s: 10 good
// logins pass, 3 bad ones get the backend's 401 and the 4th the route's 429,
// and a good login after that gets 429 too.
func TestFailedLoginLimit(t *testing.T) {
	eachStore(t, func(t *testing.T, store string, _ *harness.Redis) {
		login, stop, err := harness.Serve("127.0.0.1:0", loginServer)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)

		e := start(t, strings.NewReplacer("{{store}}", store, "{{login}}", login).Replace(failedLoginDynamic))
		e.waitRouters("api")

		as := func(password string) map[string]string {
			return map[string]string{"X-Forwarded-For": "198.51.100.21", "X-Password": password}
		}

		for i := 1; i <= 10; i++ {
			if got := e.answer(http.MethodPost, e.traefik.Web+"/auth/login", as("good")); got != "200" {
				t.Fatalf("good login %d: %s, want 200", i, got)
			}
		}

		for i := 1; i <= 4; i++ {
			want := "401"
			if i == 4 {
				want = "429 auth_login"
			}

			if got := e.answer(http.MethodPost, e.traefik.Web+"/auth/login", as("bad")); got != want {
				t.Fatalf("bad login %d: %s, want %s", i, got, want)
			}
		}

		if got := e.answer(http.MethodPost, e.traefik.Web+"/auth/login", as("good")); got != "429 auth_login" {
			t.Fatalf("good login after three failures: %s, want 429 auth_login", got)
		}

		// Another client's logins are its own.
		other := map[string]string{"X-Forwarded-For": "198.51.100.22", "X-Password": "good"}
		if got := e.answer(http.MethodPost, e.traefik.Web+"/auth/login", other); got != "200" {
			t.Fatalf("another client's login: %s, want 200", got)
		}

	})
}

const countedStreamsDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 1000, duration: 60s}
          routes:
            - {name: streams, paths: [/sse, /ws], key: ip, points: 1, duration: 60s, countStatus: [401]}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestStreamsThroughACountStatusRoute: a countStatus route watches its
// responses' status; server-sent events still arrive as they are sent, a
// WebSocket still echoes, and neither (200, 101: not listed) spends the
// route's one point.
func TestStreamsThroughACountStatusRoute(t *testing.T) {
	e := start(t, countedStreamsDynamic)
	e.waitRouters("api")

	req, _ := http.NewRequest(http.MethodGet, e.traefik.Web+"/sse?id=counted", nil)
	req.Header.Set("Accept", "text/event-stream")

	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()

	events := bufio.NewScanner(resp.Body)
	if first := readEvent(events); resp.StatusCode != http.StatusOK || first != "one" {
		t.Fatalf("%d, first event %q", resp.StatusCode, first)
	}

	// Event one arrived while the backend still waits: release it.
	if r := e.get(e.backend+"/sse-release?id=counted", nil); r.code != http.StatusOK {
		t.Fatalf("release: %d", r.code)
	}

	if second := readEvent(events); second != "two" {
		t.Fatalf("second event %q: the first was held back until the stream ended", second)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for i := 0; i < 2; i++ {
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.traefik.Web, "http")+"/ws", nil)
		if err != nil {
			t.Fatalf("upgrade %d through the route: %v", i+1, err)
		}

		if err := echo(ctx, c, "hello"); err != nil {
			t.Fatalf("echo %d: %v", i+1, err)
		}

		c.Close(websocket.StatusNormalClosure, "")
	}
}
