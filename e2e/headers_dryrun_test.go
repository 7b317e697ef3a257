package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// The test of this file checks, through the real Traefik, that a dry-run
// rule never shows in the client's headers: the most restrictive rule that
// enforces does. Windows last 60s: none ends during the test.

const headersDryRunDynamic = `
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
          global: {points: 0}
          ip: {points: 5, duration: 60s}
          routes:
            - {name: probe, paths: [/probe], key: ip, points: 2, duration: 60s, dryRun: true}
          status: {path: /_ratelimit}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestDryRunRouteHeaders: a probe route of 2/60s in dry run, ip enforced at
// 5/60s. Four probes reach the backend, each with ip's headers (5 less
// those spent), also the 3rd and 4th that the route would refuse; the
// metrics count those two as the route's refusals.
func TestDryRunRouteHeaders(t *testing.T) {
	eachStore(t, func(t *testing.T, store string, _ *harness.Redis) {
		e := start(t, strings.ReplaceAll(headersDryRunDynamic, "{{store}}", store))
		e.waitRouters("api")

		for i := 1; i <= 4; i++ {
			r := e.do(http.MethodGet, e.traefik.Web+"/probe", from("198.51.100.40"))
			if r.code != http.StatusOK {
				t.Fatalf("probe %d: %d %s", i, r.code, r.body)
			}

			left := strconv.Itoa(5 - i)
			for k, want := range map[string]string{
				"X-RateLimit-Limit":     "5",
				"X-RateLimit-Remaining": left,
				"RateLimit-Policy":      `"ip";q=5;w=60`,
				"RateLimit":             `"ip";r=` + left + ";t=",
			} {
				if got := r.header.Get(k); !strings.HasPrefix(got, want) {
					t.Errorf("probe %d: %s %q, want %q", i, k, got, want)
				}
			}
		}

		m := e.do(http.MethodGet, e.traefik.Web+"/_ratelimit/metrics", nil)
		want := `tierlimit_requests_total{middleware="edge@file",layer="probe",decision="refused"} 2`
		if m.code != http.StatusOK || !strings.Contains(m.body, want) {
			t.Errorf("metrics %d, want %s in:\n%s", m.code, want, m.body)
		}
	})
}
