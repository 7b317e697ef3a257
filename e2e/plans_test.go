package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/redisresp"
)

// plansChain is the recommended chain with plans chosen by the auth server
// (fakeauth: "Bearer user-<id>@<plan>"): free 5/60s, pro 20/60s, team a
// token bucket of 4 filled at 60/h, user 3/60s.
// The router /unlisted goes through a ForwardAuth that does not list
// X-Auth-Plan in authResponseHeaders, to a principal instance of its own:
// there a client's own X-Auth-Plan reaches the plugin, which is why README
// asks for the header to be listed. {{store}} is the principal instances'
// store settings.
const plansChain = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [ratelimit-edge, auth, ratelimit-principal]
      service: backend
    unlisted:
      entryPoints: [web]
      rule: PathPrefix(` + "`/unlisted`" + `)
      middlewares: [ratelimit-edge, auth-unlisted, ratelimit-unlisted]
      service: backend
  middlewares:
    ratelimit-edge:
      plugin:
        tierlimit:
          global: {points: 100000, duration: 1s}
          ip: {points: 1000, duration: 60s}
          principal:
            credentialHeaders: [Authorization]
    auth:
      forwardAuth:
        address: "{{auth}}/auth"
        authResponseHeaders: [X-Auth-User, X-Auth-Service-Account, X-Auth-Plan]
    auth-unlisted:
      forwardAuth:
        address: "{{auth}}/auth"
        authResponseHeaders: [X-Auth-User, X-Auth-Service-Account]
    ratelimit-principal:
      plugin:
        tierlimit:
          {{store}}
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          user: {points: 3, duration: 60s}
          principal:
            userHeader: X-Auth-User
            planHeader: X-Auth-Plan
          plans:
            free: {points: 5, duration: 60s}
            pro: {points: 20, duration: 60s}
            team: {points: 60, duration: 1h, algorithm: tokenbucket, burst: 4}
    ratelimit-unlisted:
      plugin:
        tierlimit:
          {{store}}
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          user: {points: 3, duration: 60s}
          principal:
            userHeader: X-Auth-User
            planHeader: X-Auth-Plan
          plans:
            free: {points: 5, duration: 60s}
            pro: {points: 20, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestPlansThroughTheChain: through edge, ForwardAuth and the principal
// instance, in memory and in Redis, a free user gets 5 then 429, a pro user
// 20 then 429, a team user his bucket's 4 then 429, a user with an unknown plan or none 3, and a user without a
// plan who sends X-Auth-Plan: pro himself 3 (ForwardAuth drops the header
// it lists). Behind a ForwardAuth that does not list it, the same client
// gets pro's 20.
func TestPlansThroughTheChain(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			settings := "store: memory"

			var admin *redisresp.Pool

			if store == "redis" {
				r := startRedis(t)
				settings = "store: redis\n          redis: {address: \"" + r.Addr + "\"}"
				admin = r.Client(redisresp.Options{})
				defer admin.Close()
			}

			e := start(t, strings.ReplaceAll(plansChain, "{{store}}", settings))
			e.waitRouters("api", "unlisted")

			for _, tc := range []struct {
				what, path, token string
				hdr               map[string]string
				allowed           int
				layer             string
			}{
				{"free", "/api", "user-fay@free", nil, 5, "free"},
				{"pro", "/api", "user-pat@pro", nil, 20, "pro"},
				{"team (a token bucket)", "/api", "user-tom@team", nil, 4, "team"},
				{"unknown plan", "/api", "user-una@gold", nil, 3, "user"},
				{"no plan", "/api", "user-nob", nil, 3, "user"},
				{"his own X-Auth-Plan", "/api", "user-sly", map[string]string{"X-Auth-Plan": "pro"}, 3, "user"},
				{"his own X-Auth-Plan, header not listed", "/unlisted", "user-sly", map[string]string{"X-Auth-Plan": "pro"}, 20, "pro"},
			} {
				hdr := merge(bearer(tc.token), tc.hdr)

				for i := 1; i <= tc.allowed; i++ {
					r := e.get(e.traefik.Web+tc.path, hdr)
					if r.code != http.StatusOK || !reachedBackend(r, tc.path) {
						t.Fatalf("%s, request %d: %d %q", tc.what, i, r.code, r.body)
					}

					if i == 1 && !strings.HasPrefix(r.header.Get("RateLimit-Policy"), `"`+tc.layer+`";`) {
						t.Fatalf("%s: RateLimit-Policy %q, want %s's", tc.what, r.header.Get("RateLimit-Policy"), tc.layer)
					}
				}

				checkRefusal(t, e.get(e.traefik.Web+tc.path, hdr), tc.layer, tc.allowed)
			}

			if admin != nil {
				for key, want := range map[string]string{
					"ratelimit:ratelimit-principal@file:free:fay": "5",
					"ratelimit:ratelimit-principal@file:pro:pat":  "20",
					"ratelimit:ratelimit-principal@file:user:una": "3",
				} {
					if v := redisDo(t, admin, "GET", key); v.Str != want {
						t.Errorf("GET %s: %q, want %s", key, v.Str, want)
					}
				}
			}
		})
	}
}
