package tierlimit

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// A route with points 0 is off: it matches nothing, so a cost on it would
// charge nothing, not even the other layers. Rather than ignore it silently,
// New refuses it, naming the field and the value; cost 1 (or unset) on such
// a route is accepted.
func TestCostOnARouteThatIsOffIsAnError(t *testing.T) {
	routes := func(cost int) []RouteConfig {
		return []RouteConfig{
			{Name: "login", Paths: []string{"/login"}, Points: 5, Duration: "60s"},
			{Name: "search", Paths: []string{"/search"}, Points: 10, Duration: "60s"},
			{Name: "export", Paths: []string{"/export"}, Points: 0, Duration: "60s", Cost: cost},
		}
	}

	cfg := CreateConfig()
	cfg.Routes = routes(5)

	_, err := New(context.Background(), http.NotFoundHandler(), cfg, "costoff@test")
	if err == nil || !strings.Contains(err.Error(), `routes[2].cost = "5": is ignored on a route with points 0 (off)`) {
		t.Fatalf("cost 5 on a route with points 0: error %v", err)
	}

	for _, cost := range []int{0, 1} {
		cfg := CreateConfig()
		cfg.Routes = routes(cost)

		if _, err := New(context.Background(), http.NotFoundHandler(), cfg, "costoff@test"); err != nil {
			t.Errorf("cost %d on a route with points 0: %v", cost, err)
		}
	}
}
