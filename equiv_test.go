package tierlimit

import (
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// TestPathsAgree runs one seeded script of requests through every
// configuration shape twice: on the path chooseMode picks and on the general
// path (for the Redis shape, whose Redis is down: on its memory twin's fast
// path, since the fallback must decide as memory does). Status, body, every
// rate-limit header, the backend calls and the events must agree.
func TestPathsAgree(t *testing.T) {
	for i, sh := range shapes {
		if sh.mode == modeOff {
			continue
		}

		a, b := newHarness(t, sh.cfg), newHarness(t, sh.cfg)

		if sh.name == "redis" {
			cfg := CreateConfig()
			sh.cfg(cfg)
			cfg.Redis.Address = closedPort(t)

			s, err := parse(cfg)
			if err != nil {
				t.Fatal(err)
			}

			pool := redisresp.NewPool(s.Redis)
			redisStoreOf(a.p).Backend = &redisBackend{Pool: pool, Single: pool, Address: cfg.Redis.Address, Log: io.Discard}
			b = newHarness(t, with(sh.cfg, func(c *Config) { c.Store = "memory" }))
		} else {
			b.p.mode = modeGeneral
			b.h = b.p
		}

		if sh.mode != modeGeneral && a.p.mode != sh.mode {
			t.Fatalf("%s: mode %d", sh.name, a.p.mode)
		}

		runScript(t, sh.name, int64(i+1), a, b)
	}
}

var (
	scriptMethods = []string{http.MethodGet, http.MethodGet, http.MethodPost, http.MethodPut, http.MethodHead}
	scriptPaths   = []string{
		"/api", "/api", "/assets/a.js", "/auth/login", "/users/7", "/export", "/missing/x", "/_tierlimit",
		"/Auth/Login;x=1/", "/USERS//7", "/assets/../auth/login", "/ASSETS/a.js", "/assets//b.css", "/assetsx",
	}
	scriptClients = []struct{ remote, forwarded string }{
		{"203.0.113.1:1", ""},
		{"203.0.113.7:2", ""},
		{"[2001:db8::1]:1", ""},
		{"[2001:db8::2]:3", ""}, // the same /64 as the one above
		{"10.0.0.1:5", "198.51.100.4"},
		{"10.0.0.1:5", "198.51.100.9, 10.0.0.2"},
		{"127.0.0.1:9", ""}, // allowed to see the status endpoint
	}
	scriptCredentials = []func(req *http.Request){
		nil, nil,
		func(req *http.Request) { req.Header.Set("Authorization", "Bearer good") },
		func(req *http.Request) { req.Header.Set("Authorization", " ") },
		func(req *http.Request) { req.AddCookie(&http.Cookie{Name: "session", Value: "s1"}) },
		func(req *http.Request) { req.URL.RawQuery = "token=t1" },
		func(req *http.Request) { req.Header.Set("X-Api-Key", "k1") },
	}
	scriptPrincipals = []map[string]string{
		nil, nil,
		{"X-Auth-User": "alice"},
		{"X-Auth-User": "bob"},
		{"X-Auth-User": "batch", "X-Auth-Service-Account": "true"},
		{"X-Auth-User": "carol", "X-Auth-Plan": "pro"},
		{"X-Auth-User": "dave", "X-Auth-Plan": "free"},
		{"X-Auth-User": "erin", "X-Auth-Plan": "gold"}, // no such plan: user
		{"X-Auth-User": "frank", "X-Auth-Plan": "open"},
		{"X-Auth-User": "batch", "X-Auth-Service-Account": "true", "X-Auth-Plan": "pro"},
		{"X-Auth-Plan": "pro"}, // no principal: ip
	}
	rateLimitHeaders = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit", "Retry-After", "Content-Type"}
)

func runScript(t *testing.T, name string, seed int64, a, b *harness) {
	t.Helper()

	rng := rand.New(rand.NewSource(seed))
	refusals := 0

	for i := 0; i < 500; i++ {
		method := scriptMethods[rng.Intn(len(scriptMethods))]
		path := scriptPaths[rng.Intn(len(scriptPaths))]
		client := scriptClients[rng.Intn(len(scriptClients))]
		cred := scriptCredentials[rng.Intn(len(scriptCredentials))]
		principal := scriptPrincipals[rng.Intn(len(scriptPrincipals))]

		send := func(h *harness) *httptest.ResponseRecorder {
			req := httptest.NewRequest(method, path, nil)
			req.RemoteAddr = client.remote

			if client.forwarded != "" {
				req.Header.Set("X-Forwarded-For", client.forwarded)
			}

			if cred != nil {
				cred(req)
			}

			for k, v := range principal {
				req.Header.Set(k, v)
			}

			rec := httptest.NewRecorder()
			h.h.ServeHTTP(rec, req)

			return rec
		}

		ra, rb := send(a), send(b)
		what := name + ": request " + strconv.Itoa(i) + " (" + method + " " + path + " from " + client.remote + ")"

		bodyA := strings.ReplaceAll(ra.Body.String(), a.p.name, "")
		bodyB := strings.ReplaceAll(rb.Body.String(), b.p.name, "")

		if ra.Code != rb.Code || bodyA != bodyB {
			t.Fatalf("%s: %d %q vs %d %q", what, ra.Code, bodyA, rb.Code, bodyB)
		}

		for _, k := range rateLimitHeaders {
			if ra.Header().Get(k) != rb.Header().Get(k) {
				t.Fatalf("%s: %s %q vs %q", what, k, ra.Header().Get(k), rb.Header().Get(k))
			}
		}

		if ra.Code == http.StatusTooManyRequests {
			refusals++
		}

		if rng.Intn(6) == 0 {
			step := time.Duration(rng.Intn(700)) * time.Millisecond
			a.clock.Add(step)
			b.clock.Add(step)
		}
	}

	if a.calls.Load() != b.calls.Load() {
		t.Fatalf("%s: backend called %d vs %d times", name, a.calls.Load(), b.calls.Load())
	}

	evA := strings.ReplaceAll(a.events.String(), a.p.name, "")
	evB := strings.ReplaceAll(b.events.String(), b.p.name, "")

	if evA != evB {
		t.Fatalf("%s: events differ:\n%s\nvs\n%s", name, evA, evB)
	}

	if len(a.p.layers) > 0 && (evA == "" || refusals == 0 && !a.p.dryRun) {
		t.Fatalf("%s: %d refusals, events %q: the script does not reach a refusal", name, refusals, evA)
	}
}
