package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// The test of this file runs a per-rule dry run (dryRun on a route) through the real
// Traefik, on the memory store and on a redis-server of its own. Windows
// last 60s: none ends during the test.

const dryRunDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          {{store}}
          global: {points: 10000, duration: 60s}
          ip: {points: 1000, duration: 60s}
          routes:
            - {name: auth_login, methods: [POST], paths: [/auth/login], key: ip, points: 2, duration: 60s, dryRun: true}
            - {name: email, methods: [POST], paths: [/auth/password/request], key: ip, points: 2, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestDryRunRoute: a login route of 2/60s in dry run lets 5 logins reach
// the backend and logs one RATE_LIMIT_TRIGGERED line for it with
// "dryRun":true, while the enforced e-mail route of 2/60s on the same
// instance refuses the 3rd and 4th e-mail, and logs its refusal as one.
func TestDryRunRoute(t *testing.T) {
	eachStore(t, func(t *testing.T, store string, _ *harness.Redis) {
		e := start(t, strings.ReplaceAll(dryRunDynamic, "{{store}}", store))
		e.waitRouters("api")

		client := "198.51.100.30"

		for i := 1; i <= 5; i++ {
			r := e.do(http.MethodPost, e.traefik.Web+"/auth/login", from(client))
			if r.code != http.StatusOK {
				t.Fatalf("login %d: %d %s", i, r.code, r.body)
			}

			// A dry-run rule never shows in the headers: ip's do.
			if !strings.HasPrefix(r.header.Get("RateLimit"), `"ip";`) {
				t.Fatalf("login %d: RateLimit %q", i, r.header.Get("RateLimit"))
			}
		}

		for i, want := range []string{"200", "200", "429 email", "429 email"} {
			if got := e.answer(http.MethodPost, e.traefik.Web+"/auth/password/request", from(client)); got != want {
				t.Fatalf("e-mail %d: %s, want %s", i+1, got, want)
			}
		}

		var login, email []string

		for _, line := range strings.Split(e.traefik.Logs(), "\n") {
			if !strings.Contains(line, "RATE_LIMIT_TRIGGERED") || !strings.Contains(line, `"key":"`+client+`"`) {
				continue
			}

			switch {
			case strings.Contains(line, `"limiter":"auth_login"`):
				login = append(login, line)
			case strings.Contains(line, `"limiter":"email"`):
				email = append(email, line)
			}
		}

		if len(login) != 1 || !strings.Contains(login[0], `"dryRun":true`) {
			t.Errorf("login events %q, want one with \"dryRun\":true", login)
		}

		if len(email) != 1 || strings.Contains(email[0], "dryRun") {
			t.Errorf("e-mail events %q, want one refusal", email)
		}
	})
}
