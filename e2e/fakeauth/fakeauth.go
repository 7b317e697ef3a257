// Package fakeauth is the ForwardAuth server of the tests, the demo and
// docker-compose.yml: standard library only, so it runs anywhere.
package fakeauth

import (
	"net/http"
	"strings"
)

// Handler is a ForwardAuth server for the recommended chain. It judges only
// Bearer tokens: "Bearer user-<id>" is user <id>, "Bearer user-<id>@<plan>"
// is user <id> on plan <plan> (X-Auth-Plan), "Bearer svc-<id>" is service
// account <id>, any other Bearer token is invalid (401). A request
// without Authorization, or with a scheme it does not handle ("Basic x", a
// bare token), is a guest: 200 without principal headers, as many real auth
// servers answer, so the edge instance must charge it to the client IP.
func Handler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		scheme, token, _ := strings.Cut(req.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") {
			rw.WriteHeader(http.StatusOK)
			return
		}

		switch {
		case strings.HasPrefix(token, "user-") && len(token) > len("user-") && !strings.HasPrefix(token, "user-@"):
			id, plan, _ := strings.Cut(strings.TrimPrefix(token, "user-"), "@")
			rw.Header().Set("X-Auth-User", id)
			if plan != "" {
				rw.Header().Set("X-Auth-Plan", plan)
			}
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
