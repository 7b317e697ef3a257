package tierlimit

import (
	"net/http"
	"testing"
)

// TestRoutedFastPathGivesBackWhatARefusalCharged: on serveRoutedFast, a
// route that refuses a request gives the layers charged before it (ip, at
// the route's cost) their points back: the refused request changes no
// count.
func TestRoutedFastPathGivesBackWhatARefusalCharged(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 10, Duration: "1h"}
		c.Routes = []RouteConfig{{Name: "export", Key: "ip", Paths: []string{"/export"}, Points: 5, Duration: "1h", Cost: 3}}
	})

	if !routedFastEligible(h.p) {
		t.Fatal("the instance's route matches are not charged on serveRoutedFast")
	}

	client := "203.0.113.5:1"
	if rec := h.get("/export", client); rec.Code != http.StatusOK {
		t.Fatalf("export 1: %d, want 200", rec.Code)
	}

	// ip would reach 6, export 6 > 5: refused.
	if rec := h.get("/export", client); rec.Code != http.StatusTooManyRequests || refusedLayer(rec) != "export" {
		t.Fatalf("export 2: %d (%s), want 429 by export", rec.Code, refusedLayer(rec))
	}

	// ip holds export 1's 3 points, and now this request's 1.
	if rec := h.get("/api", client); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "6" {
		t.Fatalf("api: %d, remaining %q, want 200 and 6 (ip charged 3 by the allowed export only)", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
}

// TestCountedFastPathLeavesACheckedRouteAlone: on serveCountedFast, a route
// that refuses after a countStatus route was checked gives back only what
// was charged: the countStatus route's count, which the check did not
// raise, stays what its listed answers made it.
func TestCountedFastPathLeavesACheckedRouteAlone(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		loginConfig(c)
		c.Routes = append(c.Routes, RouteConfig{Name: "login_any", Methods: []string{"POST"}, Paths: []string{"/login"}, Points: 2, Duration: "60s"})
	})
	h.p.next = loginBackend

	if !h.p.countedFast {
		t.Fatal("the instance's route matches are not charged on serveCountedFast")
	}

	for i, want := range []int{http.StatusUnauthorized, http.StatusUnauthorized, http.StatusTooManyRequests} {
		if rec := login(h, "bad"); rec.Code != want {
			t.Fatalf("bad login %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	if n := peekCount(h.p.memory, h.clock.Now().UnixNano(), "login", "203.0.113.1"); n != 2 {
		t.Fatalf("login holds %d after two 401s and a refusal by login_any, want 2", n)
	}
}

// TestRouteExactPathMatchesWithATrailingSlash: a route's exact path
// matches the request path with or without a trailing slash, so that
// "/login/" cannot walk around the limit of "/login".
func TestRouteExactPathMatchesWithATrailingSlash(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Routes = []RouteConfig{{Name: "login", Key: "ip", Paths: []string{"/login"}, Points: 1, Duration: "1h"}}
	})

	if rec := h.get("/login", "203.0.113.8:1"); rec.Code != http.StatusOK {
		t.Fatalf("/login: %d, want 200", rec.Code)
	}

	if rec := h.get("/login/", "203.0.113.8:1"); rec.Code != http.StatusTooManyRequests || refusedLayer(rec) != "login" {
		t.Fatalf("/login/ after /login: %d (%s), want 429 by login", rec.Code, refusedLayer(rec))
	}
}
