package e2e

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

// The tests here place requests at chosen moments of a window through the real
// Traefik binary. A window starts at its key's first hit, which the test
// brackets between the client's clock before sending and after the answer
// (Traefik runs on the same machine and clock): every expectation is computed
// from those bounds, so none depends on how fast the machine is, only on the
// bounds staying narrow. When a request lands later than planned (a loaded
// machine), the attempt is repeated with a fresh client, a bounded number of times.

const boundaryDynamic = `
http:
  routers:
    fixed:
      entryPoints: [web]
      rule: PathPrefix(` + "`/fixed`" + `)
      middlewares: [fixed]
      service: backend
    sliding:
      entryPoints: [web]
      rule: PathPrefix(` + "`/sliding`" + `)
      middlewares: [sliding]
      service: backend
  middlewares:
    fixed:
      plugin:
        tierlimit:
          global:
            points: 0
          ip:
            points: 1
            duration: 3s
    sliding:
      plugin:
        tierlimit:
          global:
            points: 0
          ip:
            points: 10
            duration: 2s
            algorithm: sliding
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// timed is a response and the client's clock around it: the plugin saw the
// request at some moment in [before, after].
type timed struct {
	response
	before, after time.Time
}

func (e *env) timedGet(url string, hdr map[string]string) timed {
	e.t.Helper()

	before := time.Now()
	r := e.get(url, hdr)

	return timed{response: r, before: before, after: time.Now()}
}

// waitUntil blocks until at, which the tests derive from a window they just
// opened: never more than a few seconds away.
func waitUntil(t *testing.T, at time.Time) {
	t.Helper()

	d := time.Until(at)
	if d > 10*time.Second {
		t.Fatalf("waiting %s for a moment of a window of seconds", d)
	}

	if d > 0 {
		<-time.NewTimer(d).C
	}
}

// ceilSec is the number of whole seconds in d, rounded up.
func ceilSec(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// unixCeil is t in Unix seconds, rounded up, as X-RateLimit-Reset shows it.
func unixCeil(t time.Time) int64 {
	return ceilSec(time.Duration(t.UnixNano()))
}

// inRange reports whether header h of r is an integer in [lo, hi].
func inRange(r response, h string, lo, hi int64) bool {
	v, err := strconv.ParseInt(r.header.Get(h), 10, 64)
	return err == nil && lo <= v && v <= hi
}

// TestRetryAfterRoundsUpThroughTraefik refuses a client at three moments of a
// 3s window, about 2.99s, 1.3s and 0.4s before its reset: Retry-After is the
// time left rounded up (3, 2, 1), where rounding down or to the nearest would
// answer 2, 1, 0, and X-RateLimit-Reset is the reset in Unix seconds, rounded up.
func TestRetryAfterRoundsUpThroughTraefik(t *testing.T) {
	e := start(t, boundaryDynamic)
	e.waitRouters("fixed")

	const window = 3 * time.Second

	url := e.traefik.Web + "/fixed"

	for attempt := 1; ; attempt++ {
		client := from("203.0.113." + strconv.Itoa(60+attempt))

		first := e.timedGet(url, client)
		if first.code != http.StatusOK {
			t.Fatalf("first request: %d", first.code)
		}

		// The window ends somewhere in [earliest, latest].
		earliest, latest := first.before.Add(window), first.after.Add(window)

		if !inRange(first.response, "X-RateLimit-Reset", unixCeil(earliest), unixCeil(latest)) {
			t.Fatalf("X-RateLimit-Reset %q, want the window's end %s..%s rounded up",
				first.header.Get("X-RateLimit-Reset"), earliest.Format(time.StampMilli), latest.Format(time.StampMilli))
		}

		onTime := true

		for _, before := range []time.Duration{0, 1300 * time.Millisecond, 400 * time.Millisecond} {
			if before > 0 {
				waitUntil(t, earliest.Add(-before))
			}

			r := e.timedGet(url, client)

			// A refusal is planned at least 0.3s from a whole second of time
			// left; a request that took longer than 0.2s may have crossed one.
			if r.after.Sub(r.before) > 200*time.Millisecond || !r.after.Before(earliest) {
				onTime = false
				break
			}

			if r.code != http.StatusTooManyRequests {
				t.Fatalf("%s before the reset: %d, want 429", before, r.code)
			}

			lo, hi := ceilSec(earliest.Sub(r.after)), ceilSec(latest.Sub(r.before))
			if lo < 1 {
				lo = 1
			}

			if !inRange(r.response, "Retry-After", lo, hi) {
				t.Fatalf("%s before the reset: Retry-After %q, want the %s..%s left rounded up (%d..%d)", before,
					r.header.Get("Retry-After"), earliest.Sub(r.after), latest.Sub(r.before), lo, hi)
			}

			if !inRange(r.response, "X-RateLimit-Reset", unixCeil(earliest), unixCeil(latest)) {
				t.Fatalf("%s before the reset: X-RateLimit-Reset %q, want the window's end rounded up", before, r.header.Get("X-RateLimit-Reset"))
			}
		}

		if onTime {
			return
		}

		if attempt == 3 {
			t.Fatal("3 attempts had a request take over 0.2s; the machine is too slow for this test")
		}

		t.Logf("attempt %d: a request took too long to place it in the window; trying again with a fresh client", attempt)
	}
}

// TestSlidingBoundaryThroughTraefik is the boundary case of the sliding
// window (points 10 per 2s): one request opens the window, nine more come late
// in it, and a burst of ten early in the next window gets only what the
// previous window's weight leaves (10 - floor(10 x left / 2s), about 1), where
// a fixed window, or a sliding one that forgot the previous window, allows all ten.
func TestSlidingBoundaryThroughTraefik(t *testing.T) {
	e := start(t, boundaryDynamic)
	e.waitRouters("sliding")

	const (
		window = 2 * time.Second
		points = 10
	)

	url := e.traefik.Web + "/sliding"

	// weight is what the previous window's points weigh with left to go.
	weight := func(left time.Duration) int {
		if left < 0 {
			left = 0
		}

		return int(points * int64(left) / int64(window))
	}

	for attempt := 1; ; attempt++ {
		client := from("203.0.113." + strconv.Itoa(80+attempt))

		first := e.timedGet(url, client)
		if first.code != http.StatusOK {
			t.Fatalf("first request: %d", first.code)
		}

		// The first window ends in [earliest, latest], the second a window later.
		earliest, latest := first.before.Add(window), first.after.Add(window)

		if !inRange(first.response, "X-RateLimit-Reset", unixCeil(earliest), unixCeil(latest)) {
			t.Fatalf("X-RateLimit-Reset %q, want the window's end rounded up", first.header.Get("X-RateLimit-Reset"))
		}

		// Late in the first window: the other nine of its points.
		waitUntil(t, earliest.Add(-400*time.Millisecond))

		var last timed

		for i := 0; i < points-1; i++ {
			last = e.timedGet(url, client)
			if last.after.Before(earliest) && last.code != http.StatusOK {
				t.Fatalf("late in the first window: request %d of 9: %d", i+1, last.code)
			}
		}

		if !last.after.Before(earliest) {
			t.Logf("attempt %d: the late burst ran past the window's end; trying again with a fresh client", attempt)
		} else {
			if last.header.Get("X-RateLimit-Remaining") != "0" {
				t.Fatalf("after 10 of 10: X-RateLimit-Remaining %q", last.header.Get("X-RateLimit-Remaining"))
			}

			// Early in the next window: a burst of ten.
			waitUntil(t, latest.Add(100*time.Millisecond))

			allowed := 0

			var burst []timed

			for i := 0; i < points; i++ {
				r := e.timedGet(url, client)
				burst = append(burst, r)

				if r.code == http.StatusOK {
					allowed++
				}
			}

			// The burst's first request saw at most leftFirst of the second
			// window left, its last at least leftLast: the weight only falls
			// in between, so the count allowed is bounded by both ends.
			end := burst[len(burst)-1]
			leftFirst := latest.Add(window).Sub(burst[0].before)
			leftLast := earliest.Add(window).Sub(end.after)
			lo, hi := points-weight(leftFirst), points-weight(leftLast)

			if hi < points {
				if allowed < lo || allowed > hi {
					t.Fatalf("early in the next window: %d of 10 allowed, want %d..%d (the previous window weighs %d..%d of 10)",
						allowed, lo, hi, weight(leftLast), weight(leftFirst))
				}

				// The next request fits once the weight falls by one, within
				// 0.2s: Retry-After is that rounded up, 1.
				if end.code != http.StatusTooManyRequests || end.header.Get("Retry-After") != "1" {
					t.Fatalf("refusal in the next window: %d, Retry-After %q", end.code, end.header.Get("Retry-After"))
				}

				if !inRange(burst[0].response, "X-RateLimit-Reset", unixCeil(earliest.Add(window)), unixCeil(latest.Add(window))) {
					t.Fatalf("next window: X-RateLimit-Reset %q, want its end rounded up", burst[0].header.Get("X-RateLimit-Reset"))
				}

				return
			}

			t.Logf("attempt %d: the next-window burst lasted until %s before its end, too late to tell the weight; trying again",
				attempt, leftLast)
		}

		if attempt == 3 {
			t.Fatal("3 attempts could not place the bursts in their windows; the machine is too slow for this test")
		}
	}
}
