package storetest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/config"
)

// costInstance is a Redis instance on m: ip a layer of 5 of algorithm, an
// export route of cost 3 and a login route of 2 that counts 401s, both of
// algorithm, behind a backend that answers 401 to a request with X-Bad.
func costInstance(t *testing.T, m *miniredis.Miniredis, algorithm, name string) http.Handler {
	t.Helper()

	cfg := tierlimit.CreateConfig()
	cfg.Store = "redis"
	cfg.Redis.Address = m.Addr()
	cfg.Redis.Timeout = "1s"
	cfg.Global = layerOf(algorithm, false)
	ip := layerOf(algorithm, false)
	ip.Points, ip.Burst = 5, 0
	if algorithm == "tokenbucket" {
		ip.Points, ip.Burst = 1, 5
	}
	cfg.IP = ip
	export := layerOf(algorithm, false)
	login := layerOf(algorithm, true)
	cfg.Routes = []config.RouteConfig{
		{Name: "export", Paths: []string{"/export"}, Points: export.Points, Duration: "1h", Algorithm: algorithm, Burst: export.Burst, Cost: 3},
		{Name: "login", Paths: []string{"/login"}, Points: login.Points, Duration: "1h", Algorithm: algorithm, Burst: login.Burst, CountStatus: []int{401}},
	}

	h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if req.Header.Get("X-Bad") != "" {
			rw.WriteHeader(http.StatusUnauthorized)
		}
	}), cfg, name)
	if err != nil {
		t.Fatal(err)
	}

	return h
}

func send(h http.Handler, path string, bad bool) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, nil)
	req.RemoteAddr = "203.0.113.1:1"
	if bad {
		req.Header.Set("X-Bad", "1")
	}

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	return rec
}

// TestCostIsChargedWholeOrRefusedWholeAgainstMiniredis: an export of cost 3
// takes 3 of ip's 5 (the headers show 2 left), a second does not fit and
// leaves every key as it was, and plain requests still take the 2 left, for
// each algorithm.
func TestCostIsChargedWholeOrRefusedWholeAgainstMiniredis(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		m := miniredis.RunT(t)
		m.SetTime(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC))
		h := costInstance(t, m, algorithm, "cost-"+algorithm+"@test")

		if rec := send(h, "/export", false); rec.Code != http.StatusOK || rec.Header().Get("X-Ratelimit-Remaining") != "2" {
			t.Fatalf("%s: export: %d, remaining %q, want 200 and 2", algorithm, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"))
		}

		before := keyState(t, m)
		if rec := send(h, "/export", false); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("%s: second export: %d, want 429", algorithm, rec.Code)
		}

		if after := keyState(t, m); after != before {
			t.Fatalf("%s: the refused export changed Redis:\nbefore\n%safter\n%s", algorithm, before, after)
		}

		for i, want := range []int{200, 200, 429} {
			if rec := send(h, "/api", false); rec.Code != want {
				t.Fatalf("%s: plain request %d: %d, want %d", algorithm, i+1, rec.Code, want)
			}
		}
	}
}

// TestCheckOnlyLayerIsNeverWrittenAgainstMiniredis: requests to a route that
// counts 401s are checked against it in the script without writing its key;
// only the 401s are charged to it, and once they spend it, a good request is
// refused and changes nothing.
func TestCheckOnlyLayerIsNeverWrittenAgainstMiniredis(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		m := miniredis.RunT(t)
		m.SetTime(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC))
		name := "check-" + algorithm + "@test"
		h := costInstance(t, m, algorithm, name)
		key := "ratelimit:" + name + ":login:203.0.113.1"

		// Two good and two bad logins fit ip's 5: the refusal is the route's.
		for i := 0; i < 2; i++ {
			if rec := send(h, "/login", false); rec.Code != http.StatusOK {
				t.Fatalf("%s: good login %d: %d", algorithm, i+1, rec.Code)
			}
		}

		if m.Exists(key) {
			t.Fatalf("%s: good logins wrote the route's key:\n%s", algorithm, keyState(t, m))
		}

		if !strings.Contains(keyState(t, m), ":global:global") {
			t.Fatalf("%s: the other layers were not charged:\n%s", algorithm, keyState(t, m))
		}

		for i := 0; i < 2; i++ {
			if rec := send(h, "/login", true); rec.Code != http.StatusUnauthorized {
				t.Fatalf("%s: bad login %d: %d, want the backend's 401", algorithm, i+1, rec.Code)
			}
		}

		if !m.Exists(key) {
			t.Fatalf("%s: the 401s were not charged to the route:\n%s", algorithm, keyState(t, m))
		}

		before := keyState(t, m)
		if rec := send(h, "/login", false); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"layer":"login"`) {
			t.Fatalf("%s: good login after two failures: %d %s, want the route's 429", algorithm, rec.Code, rec.Body.String())
		}

		if after := keyState(t, m); after != before {
			t.Fatalf("%s: the refused login changed Redis:\nbefore\n%safter\n%s", algorithm, before, after)
		}
	}
}
