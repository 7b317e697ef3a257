package storetest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/config"
)

// keyState is every key of m with its type, value and TTL, as one string:
// what a request that changes nothing must leave exactly as it was.
func keyState(t *testing.T, m *miniredis.Miniredis) string {
	t.Helper()

	var b strings.Builder

	keys := m.Keys()
	sort.Strings(keys)

	for _, k := range keys {
		b.WriteString(k + " " + m.Type(k) + " ttl=" + m.TTL(k).String() + ":")

		switch m.Type(k) {
		case "string":
			v, err := m.Get(k)
			if err != nil {
				t.Fatalf("GET %s: %v", k, err)
			}

			b.WriteString(" " + v)
		case "hash":
			fields, err := m.HKeys(k)
			if err != nil {
				t.Fatalf("HKEYS %s: %v", k, err)
			}

			sort.Strings(fields)

			for _, f := range fields {
				b.WriteString(" " + f + "=" + m.HGet(k, f))
			}
		default:
			t.Fatalf("key %s of type %s", k, m.Type(k))
		}

		b.WriteString("\n")
	}

	return b.String()
}

// layerOf is a layer that refuses the third request (tight) or none of the
// first hundred, with algorithm; a token bucket's burst is its budget.
func layerOf(algorithm string, tight bool) config.LayerConfig {
	points := 100
	if tight {
		points = 2
	}

	if algorithm == "tokenbucket" {
		return config.LayerConfig{Points: 1, Duration: "1h", Algorithm: algorithm, Burst: points}
	}

	return config.LayerConfig{Points: points, Duration: "1h", Algorithm: algorithm}
}

// TestRefusedRequestLeavesEveryKeyAgainstMiniredis: for each algorithm, and
// for plans that mix them, a request refused by the first, the middle or the
// last of its three layers (global, ip, a route keyed by ip) leaves every
// key in Redis as it was: counts, fields and TTLs. The time stands still
// (miniredis's clock is set), so that a TTL or a token bucket's TAT moves
// only if the script writes.
func TestRefusedRequestLeavesEveryKeyAgainstMiniredis(t *testing.T) {
	plans := [][3]string{
		{"fixed", "fixed", "fixed"},
		{"sliding", "sliding", "sliding"},
		{"tokenbucket", "tokenbucket", "tokenbucket"},
		{"fixed", "sliding", "tokenbucket"},
		{"tokenbucket", "fixed", "sliding"},
		{"sliding", "tokenbucket", "fixed"},
	}

	for n, algorithms := range plans {
		for refusing := 0; refusing < 3; refusing++ {
			m := miniredis.RunT(t)
			m.SetTime(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC))

			cfg := tierlimit.CreateConfig()
			cfg.Store = "redis"
			cfg.Redis.Address = m.Addr()
			cfg.Redis.Timeout = "1s"
			cfg.Global = layerOf(algorithms[0], refusing == 0)
			cfg.IP = layerOf(algorithms[1], refusing == 1)
			route := layerOf(algorithms[2], refusing == 2)
			cfg.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip",
				Points: route.Points, Duration: route.Duration, Algorithm: route.Algorithm, Burst: route.Burst}}

			name := "nospend" + strconv.Itoa(n) + "-" + strconv.Itoa(refusing) + "@test"

			h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, name)
			if err != nil {
				t.Fatal(err)
			}

			what := strings.Join(algorithms[:], "/") + ", refused by layer " + strconv.Itoa(refusing)
			send := func() int {
				req := httptest.NewRequest(http.MethodPost, "/login", nil)
				req.RemoteAddr = "203.0.113.1:1"
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)

				return rec.Code
			}

			for i := 0; i < 2; i++ {
				if code := send(); code != http.StatusOK {
					t.Fatalf("%s: request %d: %d", what, i+1, code)
				}
			}

			before := keyState(t, m)
			if strings.Count(before, "\n") != 3 {
				t.Fatalf("%s: keys after two requests:\n%s", what, before)
			}

			if code := send(); code != http.StatusTooManyRequests {
				t.Fatalf("%s: request 3: %d, want 429", what, code)
			}

			if after := keyState(t, m); after != before {
				t.Fatalf("%s: the refused request changed Redis:\nbefore\n%safter\n%s", what, before, after)
			}
		}
	}
}

// TestExhaustedIPDoesNotSpendGlobalAgainstMiniredis: a client refused by its
// own ip bucket, on and on, leaves global's count where its allowed requests
// put it, for everyone else.
func TestExhaustedIPDoesNotSpendGlobalAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)

	cfg := tierlimit.CreateConfig()
	cfg.Store = "redis"
	cfg.Redis.Address = m.Addr()
	cfg.Redis.Timeout = "1s"
	cfg.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
	cfg.IP = config.LayerConfig{Points: 3, Duration: "1h"}

	h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, "exhausted@test")
	if err != nil {
		t.Fatal(err)
	}

	refused := 0

	for i := 0; i < 10; i++ {
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.RemoteAddr = "203.0.113.1:1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		if rec.Code == http.StatusTooManyRequests {
			refused++
		}
	}

	global, _ := m.Get("ratelimit:exhausted@test:global:global")
	ip, _ := m.Get("ratelimit:exhausted@test:ip:203.0.113.1")

	if refused != 7 || global != "3" || ip != "3" {
		t.Fatalf("%d refused, global %q, ip %q: want 7 refused and both at the 3 allowed", refused, global, ip)
	}
}

// TestRaisedPointsLetABlockedClientInAgainstMiniredis: a client refused at 5
// points is refused locally afterwards (the block list, no script call), but
// once a reload raises the points to 8 in the same window, the entry made
// under 5 refuses nothing and Redis, whose counter stayed at 5, lets it in.
func TestRaisedPointsLetABlockedClientInAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)

	newPlugin := func(points int) http.Handler {
		cfg := tierlimit.CreateConfig()
		cfg.Store = "redis"
		cfg.Redis.Address = m.Addr()
		cfg.Redis.Timeout = "1s"
		cfg.Global.Points = 0
		cfg.IP = config.LayerConfig{Points: points, Duration: "1h"}

		// The same name: the reloaded instance shares the block list.
		h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, "raised@test")
		if err != nil {
			t.Fatal(err)
		}

		return h
	}

	send := func(h http.Handler) int {
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.RemoteAddr = "203.0.113.1:1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		return rec.Code
	}

	h := newPlugin(5)
	for i := 0; i < 6; i++ {
		send(h)
	}

	// The first block of a backend starts its reset subscriber, whose own
	// commands are not the requests': let it subscribe before counting (a
	// rerun in one process finds the block made already, and no subscriber).
	for deadline := time.Now().Add(time.Second); m.PubSubNumSub("ratelimit:resets")["ratelimit:resets"] == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}

	calls := m.CommandCount()
	if code := send(h); code != http.StatusTooManyRequests || m.CommandCount() != calls {
		t.Fatalf("blocked client: %d after %d commands, %d now: want a local refusal", code, calls, m.CommandCount())
	}

	// A reload with the same limits still refuses locally.
	if code := send(newPlugin(5)); code != http.StatusTooManyRequests || m.CommandCount() != calls {
		t.Fatalf("reloaded with the same points: %d, %d commands after %d", code, m.CommandCount(), calls)
	}

	h = newPlugin(8)
	for i := 1; i <= 3; i++ {
		if code := send(h); code != http.StatusOK {
			t.Fatalf("request %d after points 5 -> 8: %d", i, code)
		}
	}

	if code := send(h); code != http.StatusTooManyRequests {
		t.Fatalf("the 9th request under 8 points: %d", code)
	}

	if v, _ := m.Get("ratelimit:raised@test:ip:203.0.113.1"); v != "8" {
		t.Fatalf("counter %q, want 8", v)
	}
}

// TestDryRunChargesEveryLayerAgainstMiniredis: in a dry run nothing is
// refused and every layer is charged, the one over its points included.
func TestDryRunChargesEveryLayerAgainstMiniredis(t *testing.T) {
	m := miniredis.RunT(t)

	cfg := tierlimit.CreateConfig()
	cfg.Store = "redis"
	cfg.Redis.Address = m.Addr()
	cfg.Redis.Timeout = "1s"
	cfg.DryRun = true
	cfg.Global = config.LayerConfig{Points: 2, Duration: "1h"}
	cfg.IP = config.LayerConfig{Points: 100, Duration: "1h"}

	h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, "dryrun@test")
	if err != nil {
		t.Fatal(err)
	}

	for i := 0; i < 5; i++ {
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.RemoteAddr = "203.0.113.1:1"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		if rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d in a dry run", i+1, rec.Code)
		}
	}

	global, _ := m.Get("ratelimit:dryrun@test:global:global")
	ip, _ := m.Get("ratelimit:dryrun@test:ip:203.0.113.1")

	if global != "5" || ip != "5" {
		t.Fatalf("global %q, ip %q, want both charged 5 times", global, ip)
	}
}
