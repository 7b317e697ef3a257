package e2e

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// chainDynamic is the recommended deployment: [ratelimit-edge, auth, ratelimit-principal].
const chainDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [ratelimit-edge, auth, ratelimit-principal]
      service: backend
  middlewares:
    ratelimit-edge:
      plugin:
        tierlimit:
          global: {points: 100000, duration: 1s}
          ip: {points: 50, duration: 1s}
          routes:
            - {name: auth_login, methods: [POST], paths: [/auth/login], key: ip, points: 10, duration: 60s}
            - {name: email, methods: [POST], paths: [/auth/password/request, /users/invite], key: ip, points: 5, duration: 60s}
          principal:
            credentialHeaders: [Authorization]
    auth:
      forwardAuth:
        address: "{{auth}}/auth"
        authResponseHeaders: [X-Auth-User, X-Auth-Service-Account]
    ratelimit-principal:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          principal:
            userHeader: X-Auth-User
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

func bearer(token string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + token}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}

	for k, v := range b {
		out[k] = v
	}

	return out
}

// burst sends n requests on workers goroutines and returns the count of each status.
func (e *env) burst(n, workers int, method, url string, hdr map[string]string, check func(response)) map[int]int {
	e.t.Helper()

	var mu sync.Mutex
	codes := map[int]int{}
	jobs := make(chan struct{}, n)

	for i := 0; i < n; i++ {
		jobs <- struct{}{}
	}

	close(jobs)

	var wg sync.WaitGroup

	for w := 0; w < workers; w++ {
		wg.Add(1)

		go func() {
			defer wg.Done()

			for range jobs {
				req, _ := http.NewRequest(method, url, nil)
				for k, v := range hdr {
					req.Header.Set(k, v)
				}

				resp, err := e.client.Do(req)
				if err != nil {
					mu.Lock()
					codes[-1]++
					mu.Unlock()

					continue
				}

				buf := new(strings.Builder)
				_, _ = bufio.NewReader(resp.Body).WriteTo(buf)
				resp.Body.Close()

				if check != nil {
					check(response{code: resp.StatusCode, header: resp.Header, body: buf.String()})
				}

				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}
		}()
	}

	wg.Wait()

	return codes
}

// TestBFFUsersAreLimitedPerPrincipal: every request comes from the BFF's IP
// (127.0.0.1, no X-Forwarded-For), on behalf of several users.
func TestBFFUsersAreLimitedPerPrincipal(t *testing.T) {
	e := start(t, chainDynamic)
	e.waitRouters("api")

	// A dashboard load: far more than ip's 50/1s from one IP, all allowed.
	for i := 1; i <= 60; i++ {
		r := e.get(e.traefik.Web+"/auth/me", bearer("user-alice"))
		if r.code != http.StatusOK || !strings.Contains(r.body, "X-Auth-User: alice") {
			t.Fatalf("alice /auth/me %d: %d %q", i, r.code, r.body)
		}
	}

	// A fresh user's burst of 400: exactly the user layer's 300.
	var badRefusal string
	var mu sync.Mutex

	codes := e.burst(400, 16, http.MethodGet, e.traefik.Web+"/api/items", bearer("user-carol"), func(r response) {
		if r.code == http.StatusTooManyRequests && !strings.Contains(r.body, `"layer":"user"`) {
			mu.Lock()
			badRefusal = r.body
			mu.Unlock()
		}
	})
	if codes[http.StatusOK] != 300 || codes[http.StatusTooManyRequests] != 100 {
		t.Fatalf("carol's burst of 400: %v, want 300 OK and 100 refused", codes)
	}

	if badRefusal != "" {
		t.Fatalf("refusal not from the user layer: %s", badRefusal)
	}

	// Another user through the same IP is unaffected.
	r := e.get(e.traefik.Web+"/api/items", bearer("user-bob"))
	if r.code != http.StatusOK || r.header.Get("RateLimit-Policy") != `"user";q=300;w=60` || r.header.Get("X-RateLimit-Remaining") != "299" {
		t.Fatalf("bob: %d %v", r.code, r.header)
	}
}

func TestServiceAccountsHaveTheirOwnBudget(t *testing.T) {
	e := start(t, chainDynamic)
	e.waitRouters("api")

	r := e.get(e.traefik.Web+"/api/jobs", bearer("svc-batch"))
	if r.code != http.StatusOK || r.header.Get("RateLimit-Policy") != `"service";q=10000;w=60` {
		t.Fatalf("service account: %d %v", r.code, r.header)
	}

	// Exhaust the default 10000/60s (one already spent).
	codes := e.burst(10000, 32, http.MethodGet, e.traefik.Web+"/api/jobs", bearer("svc-batch"), nil)
	if codes[http.StatusOK] != 9999 || codes[http.StatusTooManyRequests] != 1 {
		t.Fatalf("service burst: %v, want 9999 OK and 1 refused", codes)
	}

	checkRefusal(t, e.get(e.traefik.Web+"/api/jobs", bearer("svc-batch")), "service", 10000)

	// Another account and a user are untouched.
	if r := e.get(e.traefik.Web+"/api/jobs", bearer("svc-etl")); r.code != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != "9999" {
		t.Fatalf("other account: %d %v", r.code, r.header)
	}

	if r := e.get(e.traefik.Web+"/api/jobs", bearer("user-batch")); r.code != http.StatusOK || r.header.Get("RateLimit-Policy") != `"user";q=300;w=60` {
		t.Fatalf("user with the account's id: %d %v", r.code, r.header)
	}
}

// TestGarbageTokensAreChargedToTheIP: invalid tokens from one client IP (behind
// the trusted BFF) get the auth server's 401 until the IP's budget is spent,
// then 429; valid tokens through the same IP in the same window pass. The
// window is real time: an attempt that straddles two windows (seen from
// X-RateLimit-Reset) is repeated with a fresh client.
func TestGarbageTokensAreChargedToTheIP(t *testing.T) {
	e := start(t, chainDynamic)
	e.waitRouters("api")

	for attempt := 1; ; attempt++ {
		client := from("198.51.100." + strconv.Itoa(100+attempt))
		reset := ""
		straddled := false

		for i := 1; i <= 60 && !straddled; i++ {
			r := e.get(e.traefik.Web+"/api/items", merge(client, bearer("garbage-"+strconv.Itoa(i))))

			if reset == "" {
				reset = r.header.Get("X-RateLimit-Reset")
			}

			if straddled = r.header.Get("X-RateLimit-Reset") != reset; straddled {
				break
			}

			switch {
			case i <= 50 && r.code != http.StatusUnauthorized:
				t.Fatalf("garbage %d: %d, want the auth server's 401 (%q)", i, r.code, r.body)
			case i <= 50 && r.header.Get("RateLimit-Policy") != `"ip";q=50;w=1`:
				t.Fatalf("garbage %d: 401 without the ip headers: %v", i, r.header)
			case i > 50:
				checkRefusal(t, r, "ip", 50)
			}
		}

		if !straddled {
			// Valid tokens through the same IP, in the same window, pass.
			for i := 0; i < 5; i++ {
				if r := e.get(e.traefik.Web+"/api/items", merge(client, bearer("user-alice"))); r.code != http.StatusOK {
					t.Fatalf("valid token after garbage: %d", r.code)
				}
			}

			r := e.get(e.traefik.Web+"/api/items", merge(client, bearer("garbage")))
			if r.header.Get("X-RateLimit-Reset") == reset {
				checkRefusal(t, r, "ip", 50)
				return
			}
		}

		if attempt == 5 {
			t.Fatal("5 attempts straddled a 1s window; the machine is too slow for this test")
		}

		t.Logf("attempt %d straddled two windows; trying again with a fresh client", attempt)
	}
}

// TestClientCannotClaimAPrincipal: a client-sent X-Auth-User (or a look-alike)
// never reaches the principal instance as a principal it was not given.
func TestClientCannotClaimAPrincipal(t *testing.T) {
	e := start(t, chainDynamic)
	e.waitRouters("api")

	for _, name := range []string{"X-Auth-User", "X_Auth_User", "x-auth-user"} {
		hdr := merge(from("198.51.100.80"), map[string]string{name: "victim", "X-Auth-Service-Account": "true"})

		r := e.get(e.traefik.Web+"/api", hdr)
		if r.code != http.StatusOK || r.header.Get("RateLimit-Policy") != `"ip";q=50;w=1` || strings.Contains(r.body, "X-Auth-User: victim") {
			t.Fatalf("%s without a token: %d policy %q body %q", name, r.code, r.header.Get("RateLimit-Policy"), r.body)
		}

		// With alice's token the principal is alice, whatever the client claims.
		r = e.get(e.traefik.Web+"/api", merge(hdr, bearer("user-alice")))
		if r.code != http.StatusOK || !strings.Contains(r.body, "X-Auth-User: alice\n") ||
			r.header.Get("RateLimit-Policy") != `"user";q=300;w=60` {
			t.Fatalf("%s with alice's token: %d %v %q", name, r.code, r.header, r.body)
		}
	}

	// The victim's bucket was never charged: a request with its own token sees a fresh window.
	r := e.get(e.traefik.Web+"/api", bearer("user-victim"))
	if r.header.Get("X-RateLimit-Remaining") != "299" {
		t.Fatalf("victim's bucket was charged by spoofed headers: remaining %q", r.header.Get("X-RateLimit-Remaining"))
	}

	// And alice's was charged once per request (3 above, this is the 4th).
	r = e.get(e.traefik.Web+"/api", bearer("user-alice"))
	if r.header.Get("X-RateLimit-Remaining") != "296" {
		t.Fatalf("alice's remaining %q, want 296", r.header.Get("X-RateLimit-Remaining"))
	}
}

func TestLoginBruteForceIsLimitedPerClientIP(t *testing.T) {
	e := start(t, chainDynamic)
	e.waitRouters("api")

	for i := 1; i <= 10; i++ {
		if r := e.do(http.MethodPost, e.traefik.Web+"/auth/login", from("198.51.100.90")); r.code != http.StatusOK {
			t.Fatalf("login %d: %d", i, r.code)
		}
	}

	r := e.do(http.MethodPost, e.traefik.Web+"/auth/login", from("198.51.100.90"))
	checkRefusal(t, r, "auth_login", 10)

	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra > 60 {
		t.Fatalf("Retry-After %d > 60", ra)
	}

	// Another client behind the same trusted BFF is unaffected.
	if r := e.do(http.MethodPost, e.traefik.Web+"/auth/login", from("198.51.100.91")); r.code != http.StatusOK {
		t.Fatalf("other client: %d", r.code)
	}
}

const longWindowChain = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [ratelimit-edge, auth, ratelimit-principal]
      service: backend
  middlewares:
    ratelimit-edge:
      plugin:
        tierlimit:
          global: {points: 100000, duration: 60s}
          ip: {points: 1000, duration: 60s}
          assets: {points: 1000, duration: 60s}
          routes:
            - {name: auth_login, methods: [POST], paths: [/auth/login], key: ip, points: 100000, duration: 60s}
          principal:
            credentialHeaders: [Authorization]
    auth:
      forwardAuth:
        address: "{{auth}}/auth"
        authResponseHeaders: [X-Auth-User, X-Auth-Service-Account]
    ratelimit-principal:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          user: {points: 1000, duration: 60s}
          service: {points: 1000, duration: 60s}
          principal:
            userHeader: X-Auth-User
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestEveryRequestIsChargedToExactlyOneTierBucket sends a mixed run, then
// reads every bucket that any of its requests could have been charged to
// (one probe request each, whose headers show that bucket) and checks that the
// counts add up to the number of requests, bucket by bucket.
func TestEveryRequestIsChargedToExactlyOneTierBucket(t *testing.T) {
	e := start(t, longWindowChain)
	e.waitRouters("api")

	type send struct {
		n            int
		method, path string
		hdr          map[string]string
	}

	const x, y, z = "198.51.100.1", "198.51.100.2", "198.51.100.3"

	mix := []send{
		{7, http.MethodGet, "/api", from(x)},
		{5, http.MethodPost, "/auth/login", from(x)},
		{4, http.MethodGet, "/assets/a.js", from(x)},
		{6, http.MethodGet, "/api", bearer("user-alice")},
		{3, http.MethodGet, "/assets/b.js", bearer("user-alice")},
		{9, http.MethodGet, "/api", bearer("svc-batch")},
		{8, http.MethodGet, "/api", merge(from(y), bearer("garbage"))},
		{3, http.MethodGet, "/api", merge(from(z), map[string]string{"X-Auth-User": "alice"})},
	}

	total := 0

	for _, m := range mix {
		for i := 0; i < m.n; i++ {
			e.do(m.method, e.traefik.Web+m.path, m.hdr)
		}

		total += m.n
	}

	// Each probe is one more request to a bucket; its headers show that bucket.
	probes := []struct {
		bucket, policy string
		method, path   string
		hdr            map[string]string
		want           int
	}{
		{"ip/" + x, `"ip";q=1000;w=60`, http.MethodGet, "/api", from(x), 12},
		{"assets/" + x, `"assets";q=1000;w=60`, http.MethodGet, "/assets/c.js", from(x), 4},
		{"user/alice", `"user";q=1000;w=60`, http.MethodGet, "/api", bearer("user-alice"), 9},
		{"service/batch", `"service";q=1000;w=60`, http.MethodGet, "/api", bearer("svc-batch"), 9},
		{"ip/" + y, `"ip";q=1000;w=60`, http.MethodGet, "/api", merge(from(y), bearer("garbage")), 8},
		{"ip/" + z, `"ip";q=1000;w=60`, http.MethodGet, "/api", from(z), 3},
		// The BFF's own IP (alice's and batch's requests came from it): never charged.
		{"ip/127.0.0.1", `"ip";q=1000;w=60`, http.MethodGet, "/api", nil, 0},
		{"assets/127.0.0.1", `"assets";q=1000;w=60`, http.MethodGet, "/assets/d.js", nil, 0},
	}

	sum := 0

	for _, p := range probes {
		r := e.do(p.method, e.traefik.Web+p.path, p.hdr)
		if r.header.Get("RateLimit-Policy") != p.policy {
			t.Fatalf("probe %s shows %q", p.bucket, r.header.Get("RateLimit-Policy"))
		}

		left, err := strconv.Atoi(r.header.Get("X-RateLimit-Remaining"))
		if err != nil {
			t.Fatalf("probe %s: remaining %q", p.bucket, r.header.Get("X-RateLimit-Remaining"))
		}

		count := 1000 - left - 1
		if count != p.want {
			t.Errorf("bucket %s holds %d of the run's requests, want %d", p.bucket, count, p.want)
		}

		sum += count
	}

	if sum != total {
		t.Fatalf("%d requests, %d tier charges", total, sum)
	}
}

// TestStreamsThroughTheEdgeWithAToken: the edge wraps credentialed requests to
// watch for invalid-credential statuses; streaming must survive it.
func TestStreamsThroughTheEdgeWithAToken(t *testing.T) {
	e := start(t, chainDynamic)
	e.waitRouters("api")

	t.Run("server-sent events arrive before the stream ends", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, e.traefik.Web+"/sse?id=edge", nil)
		req.Header.Set("Authorization", "Bearer user-alice")
		req.Header.Set("Accept", "text/event-stream")

		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()

		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") == "" {
			t.Fatalf("%d %v", resp.StatusCode, resp.Header)
		}

		events := bufio.NewScanner(resp.Body)
		first := readEvent(events)

		if first != "one" {
			t.Fatalf("first event %q", first)
		}

		// Event one arrived while the backend is still waiting: release it.
		if r := e.get(e.backend+"/sse-release?id=edge", nil); r.code != http.StatusOK {
			t.Fatalf("release: %d", r.code)
		}

		if second := readEvent(events); second != "two" {
			t.Fatalf("second event %q: the first was held back until the stream ended", second)
		}
	})

	t.Run("websocket echoes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()

		wsURL := "ws" + strings.TrimPrefix(e.traefik.Web, "http") + "/ws"
		c, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{
			HTTPHeader: http.Header{"Authorization": []string{"Bearer user-alice"}},
		})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.CloseNow()

		if resp.Header.Get("X-RateLimit-Limit") == "" {
			t.Errorf("101 without X-RateLimit headers: %v", resp.Header)
		}

		for i := 0; i < 3; i++ {
			msg := "hello " + strconv.Itoa(i)
			if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatalf("write: %v", err)
			}

			_, got, err := c.Read(ctx)
			if err != nil || string(got) != msg {
				t.Fatalf("echo %q, %v", got, err)
			}
		}

		_ = c.Close(websocket.StatusNormalClosure, "")
	})
}

// readEvent returns the next SSE event name.
func readEvent(sc *bufio.Scanner) string {
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			return name
		}
	}

	return ""
}
