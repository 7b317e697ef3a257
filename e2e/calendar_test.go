package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// calendarDynamic: an ip layer of 2 a UTC day, and a route /tz of 2 a day
// at UTC+7 under it (the route has its own client, so the ip layer of 100
// a day does not refuse it first).
const calendarDynamic = `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [edge]
      service: backend
    tz:
      entryPoints: [web]
      rule: PathPrefix(` + "`/tz`" + `)
      middlewares: [tzlimit]
      service: backend
  middlewares:
    edge:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 2, calendar: day}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
    tzlimit:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 100, calendar: day}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
          routes:
            - {name: tz, paths: ["/tz"], key: ip, points: 2, calendar: day, utcOffset: "+07:00"}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// nextMidnight is the next 00:00 at offset east of UTC, after now.
func nextMidnight(now time.Time, offset time.Duration) time.Time {
	local := now.UTC().Add(offset)
	y, m, d := local.Date()

	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC).Add(-offset)
}

// TestCalendarDayThroughTraefik: the 3rd request of a day is refused until
// the next 00:00 UTC, and a route at UTC+7 resets at 00:00 of UTC+7.
func TestCalendarDayThroughTraefik(t *testing.T) {
	e := start(t, calendarDynamic)
	e.waitRouters("api", "tz")

	const client = "203.0.113.61"
	for i := 1; i <= 2; i++ {
		if r := e.get(e.traefik.Web+"/api", from(client)); r.code != http.StatusOK {
			t.Fatalf("request %d: %d", i, r.code)
		}
	}

	r := e.get(e.traefik.Web+"/api", from(client))
	now := time.Now()
	midnight := nextMidnight(now, 0)

	if r.code != http.StatusTooManyRequests {
		t.Fatalf("3rd request: %d", r.code)
	}

	ra, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
	if want := midnight.Sub(now).Seconds(); err != nil || float64(ra) < want-2 || float64(ra) > want+2 {
		t.Fatalf("Retry-After %q, want %.0f (to %v)", r.header.Get("Retry-After"), want, midnight)
	}

	if got := r.header.Get("X-Ratelimit-Reset"); got != strconv.FormatInt(midnight.Unix(), 10) {
		t.Fatalf("X-RateLimit-Reset %s, want %d (%v)", got, midnight.Unix(), midnight)
	}

	if !strings.Contains(r.body, midnight.Format(time.RFC3339)) {
		t.Fatalf("body %s, want reset %s", r.body, midnight.Format(time.RFC3339))
	}

	tzMidnight := nextMidnight(time.Now(), 7*time.Hour)
	for i := 1; i <= 3; i++ {
		r := e.get(e.traefik.Web+"/tz", from("203.0.113.62"))
		want := http.StatusOK
		if i == 3 {
			want = http.StatusTooManyRequests
		}

		if r.code != want || r.header.Get("X-Ratelimit-Reset") != strconv.FormatInt(tzMidnight.Unix(), 10) {
			t.Fatalf("/tz request %d: %d, X-RateLimit-Reset %s; want %d, %d (%v)", i, r.code, r.header.Get("X-Ratelimit-Reset"), want, tzMidnight.Unix(), tzMidnight)
		}
	}
}
