package tierlimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisstore"
)

// waitsOrEnds reports how a request just opened went on: the wait it
// asked for (the n-th wait of d), or -1 when its handler ended without
// one (answered at once, or refused).
func waitsOrEnds(t *testing.T, d *delays, o *openRequest, n int) time.Duration {
	t.Helper()

	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		d.mu.Lock()
		asked := append([]time.Duration(nil), d.asked...)
		d.mu.Unlock()

		if len(asked) >= n {
			return asked[n-1]
		}

		select {
		case <-o.ended:
			return -1
		case <-time.After(5 * time.Millisecond): // polling the two, not a window
		}
	}

	t.Fatalf("%s neither waited nor ended", o.what)

	return 0
}

// placeKey is the Redis key that holds the places of a fixed or calendar
// case's third and fourth requests from client ("" for the others).
func placeKey(h *harness, tc delayCase, client string) string {
	ip := strings.Split(client, ":")[0]
	key := "ratelimit:" + h.p.name + ":ip:" + ip

	switch {
	case tc.layer.Calendar != "":
		now := h.clock.Now()
		midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)

		return key + ":" + strconv.FormatInt(midnight.Unix(), 10)
	case tc.layer.Algorithm == "":
		return key
	}

	return ""
}

// TestMaxDelayFallbackKeepsThePlacesRedisReserved: Redis reserves the
// third request of a burst a place (the next window, the next day, tokens
// ahead) and then becomes unreachable while it waits. The memory fallback
// starts the key from what Redis reported of it: the fourth request may
// not be admitted before its place (the one Redis would have given it, or
// later), and the fifth is refused: never more than the points in a
// window, from either store. When Redis answers again, what the fallback
// admitted is paid to the key of its place. The third goes on at its moment.
func TestMaxDelayFallbackKeepsThePlacesRedisReserved(t *testing.T) {
	addr, admin := redisServer(t)

	for _, store := range []string{"redis", "synced"} {
		for _, tc := range delayCases(true) {
			t.Run(store+"/"+tc.name, func(t *testing.T) {
				proxy := newSwitchProxy(t, addr)
				h := ipDelayHarness(t, store, proxy.l.Addr().String(), tc.layer)
				d := manualDelays(t, h)
				rs := h.p.stores.redis
				const client = "203.0.113.7:1234"

				for i := 1; i <= 2; i++ {
					if rec := h.get("/api", client); rec.Code != http.StatusOK {
						t.Fatalf("request %d: %d", i, rec.Code)
					}
				}

				if tc.age != nil {
					tc.age(t, h, admin)
				}

				third := h.open(http.MethodGet, "/third", client, nil)
				if waits := d.waiting(1); !closeTo(waits[0], tc.waits[0], true) {
					t.Fatalf("third waits %v on Redis, want %v", waits[0], tc.waits[0])
				}

				proxy.cut()

				fourth := h.open(http.MethodGet, "/fourth", client, nil)
				wait := waitsOrEnds(t, d, fourth, 2)
				if !rs.Backend.Down.Load() {
					t.Fatal("the fourth was decided in Redis, want the memory fallback")
				}

				if wait < 0 {
					fourth.wait()
					if n := h.calls.Load(); n != 2 {
						t.Fatalf("fourth, in the fallback: answered at once (backend called %d times), want it to wait for its place (%v) or be refused", n, tc.waits[1])
					}
				} else if wait < tc.waits[1]-time.Second {
					t.Fatalf("fourth waits %v in the fallback, want at least its place in Redis, %v", wait, tc.waits[1])
				}

				rec := h.get("/api", client)
				if rec.Code != http.StatusTooManyRequests {
					t.Fatalf("fifth, in the fallback: %d, want 429", rec.Code)
				}

				// What the fallback admitted is paid to the key of its place:
				// the next window (the same key), the next day's key.
				proxy.restore()
				owed := rs
				if owed.Exact != nil {
					owed = owed.Exact
				}
				redisstore.PayOwed(owed)

				if key := placeKey(h, tc, client); key != "" {
					if got := redisDo(t, admin, "GET", key); got.Str != "2" {
						t.Fatalf("%s after the recovery: %q, want 2 (the third and the fourth)", key, got.Str)
					}
				}

				d.advance(tc.waits[0])
				if res := third.head(); res.StatusCode != http.StatusOK {
					t.Fatalf("third, its place reserved before the outage: %d", res.StatusCode)
				}

				third.wait()
				d.advance(366 * 24 * time.Hour)
				fourth.wait()
			})
		}
	}

}

// TestMaxDelayAPlaceGivenBackIsTakenAfterARefusal: a burst takes the places
// within maxDelay and the next request is refused (its place beyond it);
// then the client of the last place goes away, giving it back. The next
// request takes that place and waits for it, as the memory store lets it:
// the refusal before the give-back does not keep refusing the key (on
// Redis, the block list) until the old place comes within maxDelay.
func TestMaxDelayAPlaceGivenBackIsTakenAfterARefusal(t *testing.T) {
	addr, admin := redisServer(t)
	clusterAddr, _ := clusterNode(t)

	for _, store := range []string{"memory", "redis", "synced", "cluster"} {
		for _, tc := range delayCases(store != "memory") {
			if store == "cluster" && tc.keyed {
				continue
			}

			t.Run(store+"/"+tc.name, func(t *testing.T) {
				at := addr
				if store == "cluster" {
					at = clusterAddr
				}

				h := ipDelayHarness(t, store, at, tc.layer)
				d := manualDelays(t, h)
				const client = "203.0.113.7:1234"

				for i := 1; i <= 2; i++ {
					if rec := h.get("/api", client); rec.Code != http.StatusOK {
						t.Fatalf("request %d: %d", i, rec.Code)
					}
				}

				if tc.age != nil {
					if store == "memory" {
						tc.age(t, h, nil)
					} else {
						tc.age(t, h, admin)
					}
				}

				third := h.open(http.MethodGet, "/third", client, nil)
				d.waiting(1)
				fourth := h.open(http.MethodGet, "/fourth", client, nil)
				d.waiting(2)

				if rec := h.get("/api", client); rec.Code != http.StatusTooManyRequests {
					t.Fatalf("fifth, beyond maxDelay: %d, want 429", rec.Code)
				}

				fourth.hangUp()
				fourth.wait()

				sixth := h.open(http.MethodGet, "/sixth", client, nil)
				if wait := waitsOrEnds(t, d, sixth, 3); !closeTo(wait, tc.waits[1], store != "memory") {
					sixth.wait()
					t.Fatalf("sixth, after the fourth gave its place back: wait %v (-1: none, refused), want the fourth's place, %v", wait, tc.waits[1])
				}

				d.advance(tc.waits[1])
				third.wait()
				sixth.wait()

				if n := h.calls.Load(); n != 4 {
					t.Fatalf("backend called %d times, want 4", n)
				}
			})
		}
	}
}
