package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// bucketDelay is an ip token bucket of 2 per second (a token each 500ms),
// burst 1, whose requests may wait 800ms for their token.
const bucketDelay = `{points: 2, duration: 1s, algorithm: tokenbucket, burst: 1, maxDelay: 800ms}`

// windowDelay is an ip fixed window of 1 per 2s whose requests may wait
// for the next window when it starts within 1999ms: from the first
// millisecond after a window's first request on.
const windowDelay = `{points: 1, duration: 2s, maxDelay: 1999ms}`

// delayDynamic is the ip layer given, on the memory store or, with
// {{store}} set, on Redis.
func delayDynamic(ip, store string) string {
	return strings.NewReplacer("{{store}}", store, "{{ip}}", ip).Replace(`
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
          ip: {{ip}}
          assets: {points: 0}
          user: {points: 0}
          service: {points: 0}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`)
}

// delayHolds sends a client's first request, then two at once: whichever
// reaches the plugin first waits for its place (the next token, the next
// window) and is answered 200 no sooner than minWait after it was sent; the
// other's place is beyond maxDelay, so it is refused at once with a
// Retry-After (retryAfter, when given) and reserves nothing. Which of the
// two waits is the plugin's order, not the test's.
func delayHolds(t *testing.T, e *env, client, retryAfter string, minWait time.Duration) {
	t.Helper()
	delayHoldsAt(t, e, http.MethodGet, e.traefik.Web+"/api", from(client), retryAfter, minWait)
}

// timedAnswer is a response and how long after its sending it came.
type timedAnswer struct {
	r    response
	took time.Duration
}

// delayHoldsAt is delayHolds for requests of method to url with hdr (the
// client's); it returns the answer of the one that waited.
func delayHoldsAt(t *testing.T, e *env, method, url string, hdr map[string]string, retryAfter string, minWait time.Duration) timedAnswer {
	t.Helper()

	if r := e.do(method, url, hdr); r.code != http.StatusOK {
		t.Fatalf("first: %d", r.code)
	}

	// A fixed window's next one is a place once it starts within maxDelay:
	// 1999ms of a 2s window, from its first millisecond on. Traefik's clock
	// cannot be moved; this pause is that millisecond, with room.
	time.Sleep(50 * time.Millisecond)

	answers := make(chan timedAnswer, 2)
	sent := time.Now()

	for i := 0; i < 2; i++ {
		go func() {
			r := e.do(method, url, hdr)
			answers <- timedAnswer{r, time.Since(sent)}
		}()
	}

	var waited, refused []timedAnswer
	for i := 0; i < 2; i++ {
		a := <-answers
		if a.r.code == http.StatusOK {
			waited = append(waited, a)
		} else {
			refused = append(refused, a)
		}
	}

	if len(waited) != 1 || len(refused) != 1 {
		t.Fatalf("two requests after the first: %d answered 200, %d refused; want one of each", len(waited), len(refused))
	}

	if r := refused[0].r; r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || retryAfter != "" && r.header.Get("Retry-After") != retryAfter {
		t.Fatalf("the one beyond maxDelay: %d, Retry-After %q, want 429 and %q", r.code, r.header.Get("Retry-After"), retryAfter)
	}

	// Its place comes after its wait: it cannot be answered sooner.
	if waited[0].took < minWait {
		t.Fatalf("the one within maxDelay answered after %v, want after its wait (at least %v)", waited[0].took, minWait)
	}

	return waited[0]
}

// TestMaxDelayThroughTraefik: in the real Traefik, a request within
// maxDelay of its place is delayed and answered 200, and one beyond it is
// refused: a token bucket and a fixed window on memory, on exact Redis and
// beside synced counters (redis.syncInterval, where the script counts such
// a layer: config.Rule.Unleased).
func TestMaxDelayThroughTraefik(t *testing.T) {
	rs := startRedis(t)
	exact := `store: redis
          redis: {address: "` + rs.Addr + `"}`
	synced := `store: redis
          redis: {address: "` + rs.Addr + `", syncInterval: 100ms}`

	for i, c := range []struct {
		name, ip, store, retryAfter string
		minWait                     time.Duration
	}{
		{"token bucket in memory", bucketDelay, "", "1", 300 * time.Millisecond},
		{"token bucket on Redis", bucketDelay, exact, "1", 300 * time.Millisecond},
		{"fixed window in memory", windowDelay, "", "", 1500 * time.Millisecond},
		{"fixed window on Redis", windowDelay, exact, "", 1500 * time.Millisecond},
		{"fixed window beside synced counters", windowDelay, synced, "", 1500 * time.Millisecond},
		{"token bucket beside synced counters", bucketDelay, synced, "1", 300 * time.Millisecond},
	} {
		client := "203.0.113." + strconv.Itoa(40+i) // a key of its own in the shared Redis
		t.Run(c.name, func(t *testing.T) {
			e := start(t, delayDynamic(c.ip, c.store))
			e.waitRouters("api")
			delayHolds(t, e, client, c.retryAfter, c.minWait)
		})
	}
}

// TestMaxDelayOnACalendarThroughTraefik: in the real Traefik on exact
// Redis, a daily quota of 2 whose maxDelay (25h) always reaches the next
// day: the third request of the day waits for midnight (UTC), its place
// the next day's key (which Redis shows charged while it waits), and the
// day's key keeps its 2; the client giving up gives the place back to the
// next day's key, not the day's.
func TestMaxDelayOnACalendarThroughTraefik(t *testing.T) {
	rs := startRedis(t)
	now := time.Now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	if time.Until(midnight) < time.Minute {
		time.Sleep(time.Until(midnight) + time.Second) // the test's day must last it out
		now = time.Now().UTC()
		midnight = time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	}

	e := start(t, delayDynamic(`{points: 2, calendar: day, maxDelay: 25h}`, `store: redis
          redis: {address: "`+rs.Addr+`"}`))
	e.waitRouters("api")

	const client = "203.0.113.60"
	for i := 1; i <= 2; i++ {
		if r := e.get(e.traefik.Web+"/api", from(client)); r.code != http.StatusOK {
			t.Fatalf("request %d: %d", i, r.code)
		}
	}

	admin := rs.Client(redisresp.Options{})
	defer admin.Close()

	key := "ratelimit:edge@file:ip:" + client + ":"
	day, next := key+strconv.FormatInt(midnight.Add(-24*time.Hour).Unix(), 10), key+strconv.FormatInt(midnight.Unix(), 10)
	keys := func() string {
		v := redisDo(t, admin, "MGET", day, next)
		return v.Array[0].Str + " " + v.Array[1].Str
	}

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.traefik.Web+"/api", nil)
	req.Header.Set("X-Forwarded-For", client)

	answered := make(chan string, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- "no answer: " + err.Error()
			return
		}
		resp.Body.Close()
		answered <- "answered " + resp.Status
	}()

	waitFor(t, 10*time.Second, func() bool { return keys() == "2 1" }, func() string {
		return "the day's and the next day's keys: " + keys() + ", want 2 1 (the third waiting in the next day)"
	})

	select {
	case a := <-answered:
		t.Fatalf("the third, whose place is at midnight: %s, want it waiting", a)
	default:
	}

	cancel()
	if a := <-answered; !strings.HasPrefix(a, "no answer") {
		t.Fatalf("the third, given up: %s", a)
	}

	waitFor(t, 10*time.Second, func() bool { return keys() == "2 0" }, func() string {
		return "after the client gave up: " + keys() + ", want 2 0 (its place given back to the next day)"
	})
}
