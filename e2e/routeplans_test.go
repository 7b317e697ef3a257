package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/redisresp"
)

// routePlansChain is the recommended chain with a chat route of 2 requests
// a minute per API key on the principal instance, 5 for principals on the
// pro plan (routes[].plans), the plan named by the auth server (fakeauth:
// "Bearer user-<id>@<plan>"). {{store}} is the principal instance's store
// settings.
const routePlansChain = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [ratelimit-edge, auth, ratelimit-principal]
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
    ratelimit-principal:
      plugin:
        tierlimit:
          {{store}}
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          user: {points: 100, duration: 60s}
          principal:
            userHeader: X-Auth-User
            planHeader: X-Auth-Plan
          routes:
            - name: chat
              paths: [/v1/chat]
              key: "header:X-Api-Key"
              points: 2
              duration: 60s
              plans:
                pro: {points: 5, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestRoutePlansThroughTheChain: through edge, ForwardAuth and the
// principal instance, in memory and in Redis, a pro principal gets the chat
// route's pro window (5, layer chat.pro), a free one and one without a plan
// the route's own (2, chat), each per API key.
func TestRoutePlansThroughTheChain(t *testing.T) {
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

			e := start(t, strings.ReplaceAll(routePlansChain, "{{store}}", settings))
			e.waitRouters("api")

			for _, tc := range []struct {
				what, token, key string
				allowed          int
				layer            string
			}{
				{"pro", "user-pat@pro", "key-pat", 5, "chat.pro"},
				{"free", "user-fay@free", "key-fay", 2, "chat"},
				{"no plan", "user-nob", "key-nob", 2, "chat"},
			} {
				hdr := merge(bearer(tc.token), map[string]string{"X-Api-Key": tc.key})

				for i := 1; i <= tc.allowed; i++ {
					r := e.get(e.traefik.Web+"/v1/chat", hdr)
					if r.code != http.StatusOK || !reachedBackend(r, "/v1/chat") {
						t.Fatalf("%s, request %d: %d %q", tc.what, i, r.code, r.body)
					}

					if i == 1 && !strings.HasPrefix(r.header.Get("RateLimit-Policy"), `"`+tc.layer+`";`) {
						t.Fatalf("%s: RateLimit-Policy %q, want %s's", tc.what, r.header.Get("RateLimit-Policy"), tc.layer)
					}
				}

				checkRefusal(t, e.get(e.traefik.Web+"/v1/chat", hdr), tc.layer, tc.allowed)
			}

			if admin != nil {
				// API keys are hashed in Redis keys: one key per layer and
				// API key here.
				for layer, want := range map[string]string{"chat.pro": "5", "chat": "2"} {
					ks := keys(t, admin, "ratelimit:ratelimit-principal@file:"+layer+":")
					for _, k := range ks {
						if v := redisDo(t, admin, "GET", k); v.Str != want {
							t.Errorf("GET %s: %q, want %s", k, v.Str, want)
						}
					}

					if want := map[string]int{"chat.pro": 1, "chat": 2}[layer]; len(ks) != want {
						t.Errorf("%s: keys %v in Redis, want %d", layer, ks, want)
					}
				}
			}
		})
	}
}
