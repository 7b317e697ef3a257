package e2e

import (
	"strings"
	"testing"
	"time"
)

// typoDynamic has one middleware with a typo at the top level, one with a
// typo inside a layer, one inside a plan, and a router without any.
const typoDynamic = `
http:
  routers:
    typo-top:
      entryPoints: [web]
      rule: PathPrefix(` + "`/top`" + `)
      middlewares: [typo-top]
      service: backend
    typo-nested:
      entryPoints: [web]
      rule: PathPrefix(` + "`/nested`" + `)
      middlewares: [typo-nested]
      service: backend
    typo-plan:
      entryPoints: [web]
      rule: PathPrefix(` + "`/plan`" + `)
      middlewares: [typo-plan]
      service: backend
    fine:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      priority: 1
      middlewares: [fine]
      service: backend
  middlewares:
    typo-top:
      plugin:
        tierlimit:
          ipp: {points: 5, duration: 1s}
    typo-nested:
      plugin:
        tierlimit:
          ip: {point: 5, duration: 1s}
          redis: {adress: "127.0.0.1:6379"}
    typo-plan:
      plugin:
        tierlimit:
          principal: {userHeader: X-Auth-User, planHeader: X-Auth-Plan}
          plans:
            pro: {points: 5, duraton: 60s}
    fine:
      plugin:
        tierlimit:
          ip: {points: 5, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestTypoInConfigurationRefusesTheRouter: Traefik decodes the plugin's
// configuration into its struct and New refuses keys no field took, naming the
// key and the closest field; the routers of other middlewares keep serving.
func TestTypoInConfigurationRefusesTheRouter(t *testing.T) {
	e := start(t, typoDynamic)

	states, err := e.traefik.WaitRouters(30*time.Second, "typo-top", "typo-nested", "typo-plan", "fine")
	if err != nil {
		t.Fatal(err)
	}

	for router, want := range map[string]string{
		"typo-top":    `invalid configuration: unknown field "ipp" (did you mean "ip"?)`,
		"typo-nested": `invalid configuration: unknown field "ip.point" (did you mean "ip.points"?)`,
		"typo-plan":   `invalid configuration: unknown field "plans.pro.duraton" (did you mean "plans.pro.duration"?)`,
	} {
		s := states[router]
		if s.Status == "enabled" || !strings.Contains(strings.Join(s.Error, "\n"), want) {
			t.Fatalf("router %s: %q %q, want an error with %s", router, s.Status, s.Error, want)
		}
	}

	if s := states["fine"]; s.Status != "enabled" {
		t.Fatalf("router fine: %q %v", s.Status, s.Error)
	}

	// The typo routers are not built, so their paths fall to the fine router,
	// which serves and limits them under its own settings.
	for i := 1; i <= 5; i++ {
		if r := e.get(e.traefik.Web+"/top", nil); r.code != 200 || r.header.Get("X-RateLimit-Limit") != "5" {
			t.Fatalf("request %d: %d %v", i, r.code, r.header)
		}
	}

	checkRefusal(t, e.get(e.traefik.Web+"/nested", nil), "ip", 5)
}
