package tierlimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisstore"
)

// Calendar windows on Redis: a calendar key names its period, and its count
// holds whatever the clocks of the callers and of Redis say about the time
// left in it.

// calendarQuotas are the periods tried: a day, a week, a month, and a day
// at UTC+7.
var calendarQuotas = []struct{ name, cal, offset string }{
	{"day", "day", ""}, {"week", "week", ""}, {"month", "month", ""}, {"day+07:00", "day", "+07:00"},
}

// TestADailyQuotaOnRedisKeepsItsCount: ten fresh keys of a calendar quota
// of 1000 on exact Redis (a layer, or a route), four requests each 100 ms
// apart on the plugin's clock (which runs apart from Redis's, as any
// replica's does by some milliseconds): each key reads 999 998 997 996, as
// in memory.
func TestADailyQuotaOnRedisKeepsItsCount(t *testing.T) {
	addr, _ := redisServer(t)

	for _, q := range calendarQuotas {
		for _, route := range []bool{false, true} {
			t.Run(q.name+map[bool]string{false: " layer", true: " route"}[route], func(t *testing.T) {
				h, _ := redisHarness(t, addr, func(c *Config) {
					quota := LayerConfig{Points: 1000, Calendar: q.cal, UtcOffset: q.offset, Key: "header:X-K"}
					if route {
						c.IP.Points = 0
						c.Routes = []RouteConfig{{Name: "quota", Paths: []string{"/api"}, Key: quota.Key, Points: quota.Points, Calendar: quota.Calendar, UtcOffset: quota.UtcOffset}}
					} else {
						c.IP = quota
					}
				})

				dailyQuota(t, h, q.name)
			})
		}
	}
}

// dailyQuota sends four requests 100 ms apart for each of ten keys, and
// checks what remains after each.
func dailyQuota(t *testing.T, h *harness, name string) {
	t.Helper()

	lost := 0
	for k := 0; k < 10; k++ {
		var got []string
		for i := 0; i < 4; i++ {
			rec := h.do("GET", "/api", "203.0.113.9:1", map[string]string{"X-K": name + "-" + strconv.Itoa(k)})
			got = append(got, rec.Header().Get("X-Ratelimit-Remaining"))
			h.clock.Add(100 * time.Millisecond)
		}

		if strings.Join(got, " ") != "999 998 997 996" {
			t.Errorf("key %d: remaining %v, want 999 998 997 996", k, got)
			lost++
		}
	}

	if lost > 0 {
		t.Errorf("%d of 10 keys lost counts", lost)
	}
}

// TestADailyCostFromRouteOnRedisCountsAsItsMinuteTwin: a costFrom route of
// a calendar day beside its per-minute twin on one path, on exact Redis,
// reserve 100, responses reporting 10 to 190 points, 100 ms apart on the
// plugin's clock: the day's key ends with what the minute's holds, every
// cost reported.
func TestADailyCostFromRouteOnRedisCountsAsItsMinuteTwin(t *testing.T) {
	addr, admin := redisServer(t)

	for _, q := range calendarQuotas {
		t.Run(q.name, func(t *testing.T) {
			h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 100), func(c *Config) {
				asACLUser(c)
				tpd := c.Routes[0]
				tpd.Name, tpd.Duration, tpd.Calendar, tpd.UtcOffset, tpd.Points = "tpd", "", q.cal, q.offset, 100000
				c.Routes[0].Points = 100000
				c.Routes = append(c.Routes, tpd)
			}))
			h.backend = reportsAsAsked

			want := 0
			for i := 0; i < 30; i++ {
				cost := 10 + 60*(i%4)
				want += cost
				if rec := h.do("POST", "/v1/x", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1", "X-Cost": strconv.Itoa(cost)}); rec.Code != 200 {
					t.Fatalf("request %d: %d", i+1, rec.Code)
				}
				h.clock.Add(100 * time.Millisecond)
			}

			keys := redisDo(t, admin, "KEYS", h.p.stores.redis.Prefix+"*")
			counts := map[string]string{}
			for _, k := range keys.Array {
				counts[k.Str] = redisDo(t, admin, "GET", k.Str).Str
			}

			if len(counts) != 2 {
				t.Fatalf("keys %v, want the minute's and the day's", counts)
			}

			for k, v := range counts {
				if v != strconv.Itoa(want) {
					t.Errorf("%s holds %s, want the %d reported", k, v, want)
				}
			}
		})
	}
}

// TestACalendarCountStatusRouteOnRedisChargesOnlyItsStatuses: a login
// route of 2 a day that counts 401s only, on exact Redis as in memory:
// five successful logins 100 ms apart charge nothing, then two failures
// are charged and the next login is refused.
func TestACalendarCountStatusRouteOnRedisChargesOnlyItsStatuses(t *testing.T) {
	addr, _ := redisServer(t)
	conf := func(c *Config) {
		c.Global.Points, c.IP.Points = 0, 0
		c.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 2, Calendar: "day", CountStatus: []int{401}}}
	}

	for _, store := range []string{"memory", "redis"} {
		h := newHarness(t, conf)
		if store == "redis" {
			h, _ = redisHarness(t, addr, with(conf, asACLUser))
		}

		status := http.StatusOK
		h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(status) })

		var got []string
		for i := 0; i < 8; i++ {
			if i == 5 {
				status = http.StatusUnauthorized
			}

			rec := h.get("/login", "203.0.113.9:1")
			got = append(got, strconv.Itoa(rec.Code)+"/"+rec.Header().Get("X-Ratelimit-Remaining"))
			h.clock.Add(100 * time.Millisecond)
		}

		if want := "200/2 200/2 200/2 200/2 200/2 401/1 401/0 429/0"; strings.Join(got, " ") != want {
			t.Errorf("%s: %s, want %s", store, strings.Join(got, " "), want)
		}
	}
}

// TestAnOutageOfACalendarQuotaIsPaidAndKept: a calendar quota of 10 on
// Redis, 4 requests before a flap and 3 during it (decided in memory), one
// 100 ms apart on the plugin's clock: once Redis answers again it holds the
// 8 (the probe's included) and keeps them, so 2 more get through, 10 in
// all. After an empty restart instead, the outage's 3 are created in Redis
// and kept: 7 more, the 4 before the outage lost with Redis's data.
func TestAnOutageOfACalendarQuotaIsPaidAndKept(t *testing.T) {
	for _, q := range calendarQuotas {
		for _, empty := range []bool{false, true} {
			calendarFlap(t, q.name, q.cal, q.offset, empty)
		}
	}
}

func calendarFlap(t *testing.T, name, cal, offset string, empty bool) {
	t.Helper()

	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h, _ := redisHarness(t, proxy.l.Addr().String(), func(c *Config) {
		asACLUser(c)
		c.IP = LayerConfig{Points: 10, Calendar: cal, UtcOffset: offset}
		c.Redis.DialTimeout = "1s"
	})
	f := &flap{h: h, proxy: proxy, admin: admin, client: "203.0.113.7"}

	send := func(n int) {
		for i := 0; i < n; i++ {
			f.send(1)
			h.clock.Add(100 * time.Millisecond)
		}
	}

	l := h.p.layers[0]
	start, _ := limit.Period(h.clock.Now().UnixNano(), l.Calendar, l.UtcOffset)
	key := l.RedisKey + f.client + ":" + strconv.FormatInt(start/int64(time.Second), 10)

	send(4)
	proxy.cut()
	send(3)

	if f.allowed != 7 || !h.p.stores.redis.Backend.Down.Load() {
		t.Fatalf("%s: %d allowed, down %v; want 7, decided in memory", name, f.allowed, h.p.stores.redis.Backend.Down.Load())
	}

	want, more := "8", 2
	if empty {
		redisDo(t, admin, "FLUSHALL")
		redisDo(t, admin, "SCRIPT", "FLUSH")
		want, more = "3", 7
	}

	// The back-off ends; the next request probes Redis, which then takes the
	// outage's 3 off the request.
	proxy.restore()
	h.clock.Add(time.Second)
	if empty {
		redisstore.PayOwed(h.p.stores.redis)
	} else {
		send(1)
	}

	if got := waitRedis(t, f, want, "GET", key); got != want {
		t.Fatalf("%s (empty restart %v): Redis holds %q after the outage, want %s", name, empty, got, want)
	}

	// A key created by the payment lives as a take makes it: to the period's
	// end on the plugin's clock (at the outage's last charge, 1.1 s ago),
	// and the grace.
	if _, end := limit.Period(h.clock.Now().UnixNano(), l.Calendar, l.UtcOffset); empty {
		left := (end - h.clock.Now().UnixNano()) / int64(time.Millisecond)
		grace := int64(redisstore.KeyGrace / time.Millisecond)
		if ttl := redisDo(t, admin, "PTTL", key).Int; ttl <= left+grace || ttl > left+grace+2000 {
			t.Errorf("%s: the created key's PTTL %d ms, want the period's %d left and the grace, %d", name, ttl, left, grace)
		}
	}

	before := f.allowed
	send(20)

	if got := f.allowed - before; got != more {
		t.Errorf("%s (empty restart %v): %d more allowed after the outage, want %d (Redis holds %s)", name, empty, got, more, redisDo(t, admin, "GET", key).Str)
	}
}
