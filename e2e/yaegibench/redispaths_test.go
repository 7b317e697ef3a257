package yaegibench

import (
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// TestRedisPathsAgree runs one seeded script of requests, under Traefik's
// Yaegi loader and on a real redis-server, through an anonymous Redis
// instance (served by redisPath, whose allowed requests get the script's
// one-integer reply) and through the same instance made to take the general
// path by an exemption no request matches (the script's array reply). Each
// has its own keys (middleware names differ); status, body and headers must
// agree, reset times within the second that separates the two keys' starts.
func TestRedisPathsAgree(t *testing.T) {
	r, err := harness.StartRedis(t.TempDir())
	if err != nil {
		t.Fatalf("starting redis-server (the e2e tests need it installed): %v", err)
	}
	defer r.Kill()

	config := func(general bool) map[string]any {
		cfg := map[string]any{
			"store":  "redis",
			"redis":  map[string]any{"address": r.Addr, "timeout": "2s"},
			"global": map[string]any{"points": "60", "duration": "1h"},
			"ip":     map[string]any{"points": "40", "duration": "1h"},
			"assets": map[string]any{"points": "2", "duration": "30m"},
		}
		if general {
			cfg["exempt"] = map[string]any{"ips": []any{"192.0.2.250"}}
		}

		return cfg
	}

	fast, general := build(t, "tierlimit", config(false), "fast@paths"), build(t, "tierlimit", config(true), "general@paths")

	rng := rand.New(rand.NewSource(7))
	paths := []string{"/api", "/api/items", "/assets/app.js"}
	refusedBy := map[string]int{}

	// The first 30 requests refuse nothing: every key blocked after a
	// refusal sends the fast instance to the general decision.
	for i := 0; i < 120; i++ {
		path := paths[rng.Intn(len(paths))]
		if i < 30 {
			path = paths[i%2]
		}

		remote := "100.64.0." + strconv.Itoa(1+rng.Intn(3)) + ":4000"

		send := func(h http.Handler) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.RemoteAddr = remote
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)

			return rec
		}

		a, b := send(fast), send(general)
		what := "request " + strconv.Itoa(i) + " (" + path + " from " + remote + ")"

		if a.Code != b.Code || !sameBody(a.Body.String(), b.Body.String()) {
			t.Fatalf("%s: %d %q vs %d %q", what, a.Code, a.Body, b.Code, b.Body)
		}

		for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "RateLimit-Policy", "Content-Type", "Cache-Control"} {
			if a.Header().Get(k) != b.Header().Get(k) {
				t.Fatalf("%s: %s %q vs %q", what, k, a.Header().Get(k), b.Header().Get(k))
			}
		}

		for _, k := range []string{"X-RateLimit-Reset", "Retry-After", "RateLimit"} {
			if !withinASecond(a.Header().Get(k), b.Header().Get(k)) {
				t.Fatalf("%s: %s %q vs %q", what, k, a.Header().Get(k), b.Header().Get(k))
			}
		}

		if a.Code == http.StatusTooManyRequests {
			_, layer, _ := strings.Cut(a.Body.String(), `"layer":"`)
			refusedBy[strings.TrimSuffix(layer, `"}}]}`)]++
		} else {
			refusedBy[""]++
		}

		if i < 30 && a.Code != http.StatusOK || i == 29 && a.Header().Get("RateLimit-Policy") != `"global";q=60;w=3600` {
			t.Fatalf("%s: %d %v, want allowed, the last showing global", what, a.Code, a.Header())
		}
	}

	if refusedBy["assets"] == 0 || refusedBy["global"] == 0 || refusedBy[""] < 50 {
		t.Fatalf("outcomes %v: the script does not reach refusals by assets and global", refusedBy)
	}

	// Both counted in Redis: a fallback to memory decides alike.
	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	for _, name := range []string{"fast@paths", "general@paths"} {
		if v := redisDo(t, admin, "GET", "ratelimit:"+name+":global:global"); v.Str != "60" {
			t.Fatalf("%s: global counted %q times in Redis, want 60 (the allowed; a refusal is charged nothing)", name, v.Str)
		}
	}
}

func redisDo(t *testing.T, p *redisresp.Pool, args ...string) redisresp.Value {
	t.Helper()

	v, err := p.Do(args...)
	if err != nil || v.IsError() {
		t.Fatalf("redis %v: %v %v", args, v, err)
	}

	return v
}

// sameBody compares refusal bodies up to their reset time, which withinASecond
// cannot parse; the layer and limit must match.
func sameBody(a, b string) bool {
	cut := func(s string) string {
		if i := strings.Index(s, `"reset":"`); i >= 0 {
			if j := strings.Index(s[i+9:], `"`); j >= 0 {
				return s[:i] + s[i+9+j:]
			}
		}

		return s
	}

	return cut(a) == cut(b)
}

// withinASecond compares two header values whose only number may differ by
// one (a Unix time or seconds; RateLimit's t=).
func withinASecond(a, b string) bool {
	if a == b {
		return true
	}

	na, pa := lastNumber(a)
	nb, pb := lastNumber(b)

	return pa == pb && pa != "" && (na-nb == 1 || nb-na == 1)
}

// lastNumber splits a value into its trailing integer and what precedes it.
func lastNumber(s string) (int64, string) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}

	n, err := strconv.ParseInt(s[i:], 10, 64)
	if err != nil {
		return 0, ""
	}

	return n, s[:i] + "#"
}
