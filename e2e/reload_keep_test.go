package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// keepDynamic is the middleware rl on /api with the ip layer {{ip}}, and a
// router /marker-{{n}} that tells which configuration serves. {{extra}} is
// one more line of rl's configuration (a typo); {{rl}} is empty to remove rl
// and its router.
const keepDynamic = `
http:
  routers:
    marker:
      entryPoints: [web]
      rule: Path(` + "`/marker-{{n}}`" + `)
      service: backend
{{rl}}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

const keepMiddleware = `    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/api`" + `)
      middlewares: [rl]
      service: backend
  middlewares:
    rl:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {{ip}}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
{{extra}}`

// keepConfig renders keepDynamic: rl with the ip layer ip and the extra
// line, or without rl when ip is empty.
func keepConfig(n int, ip, extra string) string {
	rl := ""
	if ip != "" {
		rl = strings.NewReplacer("{{ip}}", ip, "{{extra}}", extra).Replace(keepMiddleware)
	}

	return strings.NewReplacer("{{n}}", strconv.Itoa(n), "{{rl}}", rl).Replace(keepDynamic)
}

// keepGrace is how long the tests leave the middleware disabled or removed:
// past the plugin's 10 s release grace (lifetime.go), after which an
// unused middleware's counters used to be dropped. It waits for the
// registry's timer, not for a window.
const keepGrace = 15 * time.Second

const (
	keepSpender = "198.51.100.41" // spends 2 of its 5
	keepLimited = "198.51.100.42" // spends its 5 and is refused
)

// spendBudgets spends part of one client's budget and all of another's.
func spendBudgets(t *testing.T, e *env) {
	t.Helper()

	for i := 1; i <= 2; i++ {
		if r := e.get(e.traefik.Web+"/api", from(keepSpender)); r.code != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != strconv.Itoa(5-i) {
			t.Fatalf("spender's request %d: %d, remaining %q", i, r.code, r.header.Get("X-RateLimit-Remaining"))
		}
	}

	for i := 1; i <= 5; i++ {
		if r := e.get(e.traefik.Web+"/api", from(keepLimited)); r.code != http.StatusOK {
			t.Fatalf("limited client's request %d: %d", i, r.code)
		}
	}

	if r := e.get(e.traefik.Web+"/api", from(keepLimited)); r.code != http.StatusTooManyRequests {
		t.Fatalf("limited client's 6th request: %d, want 429", r.code)
	}
}

// reloadTo writes configuration n and waits until it serves (its marker).
func reloadTo(t *testing.T, e *env, n int, dynamic string) {
	t.Helper()

	if err := e.traefik.WriteDynamic(e.render(dynamic)); err != nil {
		t.Fatal(err)
	}

	e.waitServed("/marker-" + strconv.Itoa(n))
}

// budgetsKept checks, once rl serves again, that both clients go on where
// they were: the spender has 2 left after its 3rd request, the limited
// client is still refused.
func budgetsKept(t *testing.T, e *env) {
	t.Helper()

	e.waitRouters("api", "marker")

	if r := e.get(e.traefik.Web+"/api", from(keepSpender)); r.code != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != "2" {
		t.Errorf("spender after the reloads: %d, remaining %q, want 200 with 2 left (its counter was dropped)", r.code, r.header.Get("X-RateLimit-Remaining"))
	}

	if r := e.get(e.traefik.Web+"/api", from(keepLimited)); r.code != http.StatusTooManyRequests {
		t.Errorf("limited client after the reloads: %d, want 429 (its spent budget was given back)", r.code)
	}
}

// noonOffset is a utcOffset at which it is about noon now, so that a test
// of a day's quota does not cross midnight.
func noonOffset() string {
	h := 12 - time.Now().UTC().Hour() // -11 .. 12

	sign := "+"
	if h < 0 {
		sign, h = "-", -h
	}

	return fmt.Sprintf("%s%02d:00", sign, h)
}

// TestCountersSurviveAReloadWithATypo: a daily quota (calendar: day) is
// partly spent; a reload with an unknown key disables the router (Traefik
// answers 404), and stays past the release grace; once the configuration is
// fixed, the clients go on with the quotas they had, not fresh ones.
func TestCountersSurviveAReloadWithATypo(t *testing.T) {
	ip := `{points: 5, calendar: day, utcOffset: "` + noonOffset() + `"}`

	e := startWith(t, keepConfig(0, ip, ""), harness.Options{ProvidersThrottle: "20ms"})
	e.waitRouters("api", "marker")
	spendBudgets(t, e)

	reloadTo(t, e, 1, keepConfig(1, ip, "          maxTraked: 1000"))

	states, err := e.traefik.WaitRouters(10*time.Second, "api")
	if err != nil {
		t.Fatal(err)
	}

	if s := states["api"]; s.Status == "enabled" || !strings.Contains(strings.Join(s.Error, " "), "maxTraked") {
		t.Fatalf("router with the typo: %q %v, want disabled naming maxTraked", s.Status, s.Error)
	}

	if r := e.get(e.traefik.Web+"/api", from(keepSpender)); r.code != http.StatusNotFound {
		t.Fatalf("disabled router answered %d, want Traefik's 404", r.code)
	}

	time.Sleep(keepGrace) // the release grace, not a window

	reloadTo(t, e, 2, keepConfig(2, ip, ""))
	budgetsKept(t, e)
}

// TestCountersSurviveRemovingAndAddingBackAMiddleware: the middleware and
// its router are removed, then added back after the release grace, within
// the clients' windows: their counts are where they were.
func TestCountersSurviveRemovingAndAddingBackAMiddleware(t *testing.T) {
	ip := `{points: 5, duration: 10m}`

	e := startWith(t, keepConfig(0, ip, ""), harness.Options{ProvidersThrottle: "20ms"})
	e.waitRouters("api", "marker")
	spendBudgets(t, e)

	reloadTo(t, e, 1, keepConfig(1, "", ""))

	if r := e.get(e.traefik.Web+"/api", from(keepSpender)); r.code != http.StatusNotFound {
		t.Fatalf("removed router answered %d, want 404", r.code)
	}

	time.Sleep(keepGrace) // the release grace, not a window

	reloadTo(t, e, 2, keepConfig(2, ip, ""))
	budgetsKept(t, e)
}
