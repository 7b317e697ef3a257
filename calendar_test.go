package tierlimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// calendarConfig: ip of 2 per calendar period in UTC, and a route /tz of
// 2 per day at UTC+7.
func calendarConfig(cal string) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 2, Calendar: cal}
		c.Routes = []RouteConfig{{Name: "tz", Paths: []string{"/tz"}, Key: "ip", Points: 2, Calendar: "day", UtcOffset: "+07:00"}}
	}
}

// crossBoundary: from 1.5 s before the boundary, two requests pass, the
// third is refused until the boundary, with every header and the JSON reset
// saying so; after it, a new window of the next period starts. w is the
// policy window the period's headers show.
func crossBoundary(t *testing.T, h *harness, before, boundary, next time.Time, w int64) {
	t.Helper()

	h.clock.mu.Lock()
	h.clock.now = before
	h.clock.mu.Unlock()

	client := "203.0.113.9:1234"
	for i := 1; i <= 2; i++ {
		if rec := h.get("/x", client); rec.Code != 200 || rec.Header().Get("X-Ratelimit-Reset") != strconv.FormatInt(boundary.Unix(), 10) {
			t.Fatalf("%v: request %d: %d, reset %s, want 200 and %d", before, i, rec.Code, rec.Header().Get("X-Ratelimit-Reset"), boundary.Unix())
		}
	}

	rec := h.get("/x", client)
	secs := int64(boundary.Sub(before).Seconds() + 0.999)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != strconv.FormatInt(secs, 10) || rec.Header().Get("X-Ratelimit-Reset") != strconv.FormatInt(boundary.Unix(), 10) {
		t.Fatalf("%v: 3rd: %d, Retry-After %s, reset %s; want 429, %d, %d", before, rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("X-Ratelimit-Reset"), secs, boundary.Unix())
	}

	if want := `w=` + strconv.FormatInt(w, 10); !strings.Contains(rec.Header().Get("Ratelimit-Policy"), want) {
		t.Errorf("%v: policy %q, want %s", before, rec.Header().Get("Ratelimit-Policy"), want)
	}

	if want := boundary.UTC().Format(time.RFC3339); !strings.Contains(rec.Body.String(), want) {
		t.Errorf("%v: body %s, want reset %s", before, rec.Body.String(), want)
	}

	h.clock.Add(boundary.Sub(before) + 10*time.Millisecond)

	rec = h.get("/x", client)
	if rec.Code != 200 || rec.Header().Get("X-Ratelimit-Remaining") != "1" || rec.Header().Get("X-Ratelimit-Reset") != strconv.FormatInt(next.Unix(), 10) {
		t.Fatalf("after %v: %d, remaining %s, reset %s; want 200, 1, %d", boundary, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"), rec.Header().Get("X-Ratelimit-Reset"), next.Unix())
	}

	if want := `"ip";q=2;w=` + strconv.FormatInt(int64(next.Sub(boundary)/time.Second), 10); rec.Header().Get("Ratelimit-Policy") != want {
		t.Errorf("after %v: policy %q, want %s", boundary, rec.Header().Get("Ratelimit-Policy"), want)
	}
}

func utc(y int, m time.Month, d, hh, mm, ss int, ns ...int) time.Time {
	n := 0
	if len(ns) > 0 {
		n = ns[0]
	}

	return time.Date(y, m, d, hh, mm, ss, n, time.UTC)
}

type calendarCase struct {
	name, cal              string
	before, boundary, next time.Time
	w                      int64
}

var calendarCases = []calendarCase{
	{"day", "day", utc(2026, 6, 15, 23, 59, 58, 500e6), utc(2026, 6, 16, 0, 0, 0), utc(2026, 6, 17, 0, 0, 0), 86400},
	// 2026-06-21 is a Sunday.
	{"week", "week", utc(2026, 6, 21, 23, 59, 58, 500e6), utc(2026, 6, 22, 0, 0, 0), utc(2026, 6, 29, 0, 0, 0), 7 * 86400},
	// A month's policy window is that month's length: February of 28 and
	// of 29 days, April of 30, December of 31 (and after each boundary
	// the next month's, which crossBoundary checks too).
	{"month28", "month", utc(2026, 2, 28, 23, 59, 58, 500e6), utc(2026, 3, 1, 0, 0, 0), utc(2026, 4, 1, 0, 0, 0), 28 * 86400},
	{"month29", "month", utc(2028, 2, 29, 23, 59, 58, 500e6), utc(2028, 3, 1, 0, 0, 0), utc(2028, 4, 1, 0, 0, 0), 29 * 86400},
	{"month30", "month", utc(2026, 4, 30, 23, 59, 58, 500e6), utc(2026, 5, 1, 0, 0, 0), utc(2026, 6, 1, 0, 0, 0), 30 * 86400},
	{"month31", "month", utc(2026, 12, 31, 23, 59, 58, 500e6), utc(2027, 1, 1, 0, 0, 0), utc(2027, 2, 1, 0, 0, 0), 31 * 86400},
	// Into a February: the policy changes to 28 days at the boundary.
	{"month31to28", "month", utc(2027, 1, 31, 23, 59, 58, 500e6), utc(2027, 2, 1, 0, 0, 0), utc(2027, 3, 1, 0, 0, 0), 31 * 86400},
}

func TestCalendarWindowsInMemory(t *testing.T) {
	for _, c := range calendarCases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, calendarConfig(c.cal))
			if h.p.mode != modeGeneral {
				t.Errorf("mode %d, want the general path", h.p.mode)
			}

			crossBoundary(t, h, c.before, c.boundary, c.next, c.w)
		})
	}
}

func TestCalendarWindowsOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	for _, c := range calendarCases {
		t.Run(c.name, func(t *testing.T) {
			h, _ := redisHarness(t, addr, calendarConfig(c.cal))
			crossBoundary(t, h, c.before, c.boundary, c.next, c.w)

			// The key names its window: the period's start in Unix seconds.
			l := h.p.layers[layerIndex(h, "ip")]
			key := l.RedisKey + "203.0.113.9:" + strconv.FormatInt(c.boundary.Unix(), 10)
			if v := redisDo(t, admin, "GET", key).Str; v != "1" {
				t.Errorf("GET %s = %q, want 1", key, v)
			}
		})
	}
}

// offsetConfig: the route /tz of 2 a day at UTC+7 under an ip layer of 100 a month.
func offsetConfig(c *Config) {
	calendarConfig("month")(c)
	c.IP.Points = 100
}

// utcOffsetScenario: the route of UTC+7 resets at 17:00 UTC.
func utcOffsetScenario(t *testing.T, h *harness) {
	t.Helper()

	h.clock.mu.Lock()
	h.clock.now = utc(2026, 6, 15, 16, 59, 59)
	h.clock.mu.Unlock()

	want := strconv.FormatInt(utc(2026, 6, 15, 17, 0, 0).Unix(), 10)
	for i := 1; i <= 3; i++ {
		rec := h.get("/tz", "203.0.113.7:1")
		if code := map[bool]int{true: 429, false: 200}[i == 3]; rec.Code != code || rec.Header().Get("X-Ratelimit-Reset") != want {
			t.Fatalf("request %d: %d, reset %s; want %d, %s", i, rec.Code, rec.Header().Get("X-Ratelimit-Reset"), code, want)
		}
	}

	h.clock.Add(1500 * time.Millisecond)

	if rec := h.get("/tz", "203.0.113.7:1"); rec.Code != 200 || rec.Header().Get("X-Ratelimit-Reset") != strconv.FormatInt(utc(2026, 6, 16, 17, 0, 0).Unix(), 10) {
		t.Fatalf("after 17:00 UTC: %d, reset %s", rec.Code, rec.Header().Get("X-Ratelimit-Reset"))
	}
}

func TestCalendarUtcOffsetInMemory(t *testing.T) {
	utcOffsetScenario(t, newHarness(t, offsetConfig))
}

func TestCalendarUtcOffsetOnRedisServer(t *testing.T) {
	addr, _ := redisServer(t)
	h, _ := redisHarness(t, addr, offsetConfig)
	utcOffsetScenario(t, h)
}

func TestCalendarConfigErrors(t *testing.T) {
	for _, c := range []struct {
		mutate func(c *Config)
		want   string
	}{
		{func(c *Config) { c.IP.Calendar = "year" }, `ip.calendar = "year"`},
		{func(c *Config) { c.IP.Calendar, c.IP.Duration = "day", "60s" }, `ip.duration = "60s"`},
		// The built-in default spelled out is a duration written too.
		{func(c *Config) { c.IP.Calendar, c.IP.Duration = "day", "1s" }, `ip.duration = "1s": cannot be set together with ip.calendar`},
		{func(c *Config) { c.Assets.Calendar, c.Assets.Duration = "month", "1s" }, `assets.duration = "1s": cannot be set together with assets.calendar`},
		{func(c *Config) { c.User.Calendar, c.User.Duration = "week", "60s" }, `user.duration = "60s": cannot be set together with user.calendar`},
		{func(c *Config) { c.IP.Calendar, c.IP.Algorithm = "day", "sliding" }, `ip.calendar = "day"`},
		{func(c *Config) { c.User.Calendar, c.User.Algorithm = "week", "tokenbucket" }, `user.calendar = "week"`},
		{func(c *Config) { c.IP.Calendar, c.IP.UtcOffset = "day", "Asia/Bangkok" }, `ip.utcOffset = "Asia/Bangkok"`},
		{func(c *Config) { c.IP.Calendar, c.IP.UtcOffset = "day", "+15:00" }, `ip.utcOffset = "+15:00"`},
		{func(c *Config) { c.IP.UtcOffset = "+07:00" }, `ip.utcOffset = "+07:00"`},
		{func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/r"}, Points: 1, Duration: "1s", Calendar: "month"}}
		}, `routes[0].duration = "1s"`},
		{func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-User", "X-Plan"
			c.Plans = map[string]PlanConfig{"pro": {Points: 1, Calendar: "day", UtcOffset: "7"}}
		}, `utcOffset = "7"`},
	} {
		cfg := CreateConfig()
		c.mutate(cfg)

		_, err := parse(cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want one naming %s", err, c.want)
		}
	}

	cfg := CreateConfig()
	cfg.IP.Calendar, cfg.IP.UtcOffset = "month", "-03:30"
	cfg.Principal.UserHeader, cfg.Principal.PlanHeader = "X-User", "X-Plan"
	cfg.Plans = map[string]PlanConfig{"pro": {Points: 1, Calendar: "day", UtcOffset: "+07:00"}}

	s, err := parse(cfg)
	if err != nil {
		t.Fatal(err)
	}

	if m := chooseMode(s); m != modeGeneral {
		t.Errorf("mode %d with calendar layers, want general", m)
	}
}

// The ip charge of an invalid credential (after.go) shows a month ip
// layer's policy of the current month too, allowed and refused.
func TestMonthPolicyOnAnInvalidCredentialsCharge(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 2, Calendar: "month"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
		c.Principal.InvalidCredentialStatus = []int{404}
	})
	h.clock.mu.Lock()
	h.clock.now = utc(2026, 2, 10, 12, 0, 0)
	h.clock.mu.Unlock()

	for i := 1; i <= 3; i++ {
		req := httptest.NewRequest(http.MethodGet, "/missing/x", nil)
		req.RemoteAddr = "203.0.113.9:1"
		req.Header.Set("Authorization", "Bearer garbage")
		rec := httptest.NewRecorder()
		h.h.ServeHTTP(rec, req)

		want := map[bool]int{true: 429, false: 404}[i == 3]
		if got := rec.Header().Get("Ratelimit-Policy"); rec.Code != want || got != `"ip";q=2;w=2419200` {
			t.Fatalf("request %d: %d, policy %q; want %d and February's 28 days", i, rec.Code, got, want)
		}
	}
}
