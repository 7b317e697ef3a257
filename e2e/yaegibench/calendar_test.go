package yaegibench

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// TestMonthPolicyUnderYaegi: a month layer's RateLimit-Policy window is the
// current month's length under Traefik's interpreter, on the general path
// and on a countStatus route's charge (stores.month, reportTally), and the
// refusal's events still come out once.
func TestMonthPolicyUnderYaegi(t *testing.T) {
	cfg := map[string]any{
		"global": map[string]any{"points": "0"},
		"ip":     map[string]any{"points": "1000", "calendar": "month"},
		"routes": []any{
			map[string]any{"name": "login", "methods": []any{"POST"}, "paths": []any{"/login"}, "key": "ip", "points": "2", "calendar": "month", "countStatus": []any{"401"}},
		},
	}
	h := build(t, "tierlimit", cfg, "monthpolicy@budget")

	now := time.Now().UTC()
	start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	w := strconv.FormatInt(int64(start.AddDate(0, 1, 0).Sub(start)/time.Second), 10)

	req := httptest.NewRequest(http.MethodGet, "http://example.com/x", nil)
	req.RemoteAddr = "198.51.100.1:1234"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	if got := rec.Header().Get("Ratelimit-Policy"); got != `"ip";q=1000;w=`+w {
		t.Errorf("ip: policy %q, want w=%s", got, w)
	}

	for i := 1; i <= 3; i++ {
		login := httptest.NewRequest(http.MethodPost, "http://example.com/login", nil)
		login.RemoteAddr = "198.51.100.2:1234"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, login)

		if got, want := rec.Header().Get("Ratelimit-Policy"), `"login";q=2;w=`+w; got != want {
			t.Errorf("login %d (%d): policy %q, want %q", i, rec.Code, got, want)
		}
	}
}
