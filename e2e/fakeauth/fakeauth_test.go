package fakeauth

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestHandler(t *testing.T) {
	for _, tc := range []struct {
		authorization       string
		code                int
		user, service, plan string
	}{
		{"", http.StatusOK, "", "", ""},
		{"Basic eDp5", http.StatusOK, "", "", ""},       // a scheme it does not handle: guest
		{"opaque-token-123", http.StatusOK, "", "", ""}, // no scheme at all: guest
		{"Token user-alice", http.StatusOK, "", "", ""}, // not Bearer, even with a user-looking token
		{"Bearer garbage", http.StatusUnauthorized, "", "", ""},
		{"Bearer user-", http.StatusUnauthorized, "", "", ""},
		{"Bearer", http.StatusUnauthorized, "", "", ""},
		{"Bearer user-alice", http.StatusOK, "alice", "", ""},
		{"bearer user-alice", http.StatusOK, "alice", "", ""}, // the scheme is case-insensitive (RFC 9110)
		{"Bearer svc-batch", http.StatusOK, "batch", "true", ""},
		{"Bearer user-alice@pro", http.StatusOK, "alice", "", "pro"},
		{"Bearer user-bob@", http.StatusOK, "bob", "", ""},
		{"Bearer user-@pro", http.StatusUnauthorized, "", "", ""},
	} {
		req := httptest.NewRequest(http.MethodGet, "/auth", nil)
		if tc.authorization != "" {
			req.Header.Set("Authorization", tc.authorization)
		}

		rec := httptest.NewRecorder()
		Handler().ServeHTTP(rec, req)

		if rec.Code != tc.code || rec.Header().Get("X-Auth-User") != tc.user || rec.Header().Get("X-Auth-Service-Account") != tc.service ||
			rec.Header().Get("X-Auth-Plan") != tc.plan {
			t.Errorf("Authorization %q: %d user %q service %q plan %q, want %d %q %q %q", tc.authorization, rec.Code,
				rec.Header().Get("X-Auth-User"), rec.Header().Get("X-Auth-Service-Account"), rec.Header().Get("X-Auth-Plan"),
				tc.code, tc.user, tc.service, tc.plan)
		}
	}
}
