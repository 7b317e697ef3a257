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
