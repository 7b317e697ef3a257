// Package fakeauth is the ForwardAuth server of the tests, the demo and
// docker-compose.yml: standard library only, so it runs anywhere.
package fakeauth

import (
	"net/http"
	"strings"
)

// Handler is a ForwardAuth server for the recommended chain: no
// Authorization header, or a scheme other than Bearer (such as "Basic x"), is
// anonymous (200, no principal headers), as many auth servers treat guests;
// "Bearer user-<id>" is user <id>; "Bearer svc-<id>" is service account <id>;
// any other bearer token is invalid (401).
func Handler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		authz := req.Header.Get("Authorization")
		token := strings.TrimPrefix(authz, "Bearer ")

		switch {
		case !strings.HasPrefix(authz, "Bearer "):
			rw.WriteHeader(http.StatusOK)
		case strings.HasPrefix(token, "user-") && len(token) > len("user-"):
			rw.Header().Set("X-Auth-User", strings.TrimPrefix(token, "user-"))
			rw.WriteHeader(http.StatusOK)
		case strings.HasPrefix(token, "svc-") && len(token) > len("svc-"):
			rw.Header().Set("X-Auth-User", strings.TrimPrefix(token, "svc-"))
			rw.Header().Set("X-Auth-Service-Account", "true")
			rw.WriteHeader(http.StatusOK)
		default:
			rw.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusUnauthorized)
			_, _ = rw.Write([]byte(`{"error":"invalid_token"}`))
		}
	})
}
