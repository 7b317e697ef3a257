package e2e

import (
	"context"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// delayRedisDynamic routes each path prefix to a middleware of its own
// with a maxDelay counted in Redis: {{exact}} is the redis settings of the
// shared server, {{outage}} those of a server the test kills, {{cluster}}
// those of a Redis Cluster.
func delayRedisDynamic(exact, outage, cluster string) string {
	routers, middlewares := "", ""

	for _, m := range []struct{ name, conf string }{
		// 2 per 1s, sliding: the third's place is the next window's start,
		// the fourth's half a window later, the fifth's beyond 1800ms.
		{"sliding", `store: redis
          redis: ` + exact + `
          global: {points: 0}
          ip: {points: 2, duration: 1s, algorithm: sliding, maxDelay: 1800ms}`},
		// The same beside synced counters (global leased, ip counted by
		// the script).
		{"syncedsliding", `store: redis
          redis: ` + strings.Replace(exact, "}", ", syncInterval: 100ms}", 1) + `
          global: {points: 1000, duration: 1s}
          ip: {points: 2, duration: 1s, algorithm: sliding, maxDelay: 1800ms}`},
		// A route of 1 per 2s whose next window is a place, beside ip.
		{"routed", `store: redis
          redis: ` + exact + `
          global: {points: 0}
          ip: {points: 100, duration: 60s}
          routes:
            - {name: slow, paths: [/routed/], key: ip, points: 1, duration: 2s, maxDelay: 1999ms}`},
		// A plan of 1 per 2s with the same.
		{"planned", `store: redis
          redis: ` + exact + `
          global: {points: 0}
          ip: {points: 0}
          user: {points: 0}
          principal: {userHeader: X-User, planHeader: X-Plan}
          plans:
            pro: {points: 1, duration: 2s, maxDelay: 1999ms}`},
		// A token each 500ms, burst 1: places 500ms, 1s and 1.5s on.
		{"twin", `store: redis
          redis: ` + exact + `
          global: {points: 0}
          ip: {points: 4, duration: 2s, algorithm: tokenbucket, burst: 1, maxDelay: 1600ms}`},
		// 2 per 2s on the server that dies.
		{"outage", `store: redis
          redis: ` + outage + `
          global: {points: 0}
          ip: {points: 2, duration: 2s, maxDelay: 1999ms}`},
		// On a Cluster, two slots: global (a token a second) and the
		// client's ip (1 per 2s).
		{"clustered", `store: redis
          redis: ` + cluster + `
          global: {points: 2, duration: 2s, algorithm: tokenbucket, burst: 1, maxDelay: 1500ms}
          ip: {points: 1, duration: 2s, maxDelay: 1999ms}`},
	} {
		routers += `
    ` + m.name + `:
      entryPoints: [web]
      rule: PathPrefix(` + "`/" + m.name + "/`" + `)
      middlewares: [` + m.name + `]
      service: backend`
		middlewares += `
    ` + m.name + `:
      plugin:
        tierlimit:
          ` + m.conf + `
          assets: {points: 0}`
	}

	return `
http:
  routers:` + routers + `
  middlewares:` + middlewares + `
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`
}

// sent is a request sent in the background: its answer (code 0 when it
// got none) and when it came, counted from the scenario's start.
type sent struct {
	done   chan struct{}
	code   int
	header http.Header
	at     time.Duration
	cancel context.CancelFunc
}

func send(e *env, path string, hdr map[string]string, start time.Time) *sent {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sent{done: make(chan struct{}), cancel: cancel}

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.traefik.Web+path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}

	go func() {
		defer close(s.done)

		resp, err := http.DefaultClient.Do(req)
		s.at = time.Since(start)

		if err != nil {
			return
		}

		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		s.code, s.header = resp.StatusCode, resp.Header
	}()

	return s
}

func (s *sent) wait(t *testing.T) *sent {
	t.Helper()

	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		t.Fatal("no answer within 15s")
	}

	return s
}

// answered reports whether the request has its answer yet.
func (s *sent) answered() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// until polls Redis (or anything) quickly, for the moment a request
// reserved its place: waits are counted from the requests' own moments,
// so the polling may not take long.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	pollEvery(t, 5*time.Second, 5*time.Millisecond, cond, func() string { return what })
}

// beyondMaxDelay checks a refusal of a request whose place is beyond a
// maxDelay of maxDelaySec seconds (rounded up): a 429 whose Retry-After,
// when it fits without waiting, is no sooner.
func beyondMaxDelay(t *testing.T, what string, code int, header http.Header, maxDelaySec int) {
	t.Helper()

	ra, err := strconv.Atoi(header.Get("Retry-After"))
	if code != http.StatusTooManyRequests || err != nil || ra < maxDelaySec {
		t.Fatalf("%s, beyond maxDelay: %d, Retry-After %q, want 429 and at least %d", what, code, header.Get("Retry-After"), maxDelaySec)
	}
}

// oneWaitsOneRefused checks two requests sent together after a first one
// whose window has one place left within a maxDelay of 2s: one of them is
// answered 200 at its place, 2s after the first, the other refused beyond
// the maxDelay.
func oneWaitsOneRefused(t *testing.T, x, y *sent, place string) {
	t.Helper()

	x.wait(t)
	y.wait(t)

	if x.code != http.StatusOK {
		x, y = y, x
	}

	if x.code != http.StatusOK || x.at < 2*time.Second {
		t.Fatalf("of the two after the first, one: %d after %v, want 200 at %s, 2s after the first", x.code, x.at, place)
	}

	beyondMaxDelay(t, "the other", y.code, y.header, 2)
}

// TestMaxDelayOnRedisThroughTraefik: maxDelay counted in Redis, in the
// real Traefik (Yaegi), two processes sharing the servers:
//   - a sliding window on exact Redis, and beside synced counters: the third
//     and fourth requests wait for their places in order (the next window's
//     start, half a window later), the fifth is refused with a Retry-After
//     beyond maxDelay;
//   - a route's maxDelay beside ip: the second waits in the route's next
//     window (its key moved on, with a TTL); a third refused charges
//     neither layer; the second's client giving up gives its place back to
//     both keys, and the next request takes it;
//   - a plan's maxDelay: one waits for its place, one is refused;
//   - a token bucket shared by the two Traefiks: requests sent to either
//     queue in one order (each answered no sooner than its place), and a
//     burst on both admits no request before its token;
//   - a Redis server killed while a request waits in the next window: that
//     request goes on at its moment, and the memory fallback admits no
//     request of the burst that follows before that window starts;
//   - a Cluster: a request waits for the longest of its slots' places;
//   - every key written has a TTL.
func TestMaxDelayOnRedisThroughTraefik(t *testing.T) {
	rs, rk := startRedis(t), startRedis(t)

	cl, err := harness.StartCluster(t.TempDir(), 3, 0)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(cl.Kill)
	grantACL(t, cl.Nodes()...)

	dynamic := delayRedisDynamic(`{address: "`+rs.Addr+`"}`, `{address: "`+rk.Addr+`", timeout: 100ms}`,
		`{cluster: {addresses: ["`+strings.Join(cl.Seeds(), `", "`)+`"]}, username: `+aclUser+`, password: `+aclPassword+`, timeout: 1s, dialTimeout: 1s}`)
	a, b := start(t, dynamic), start(t, dynamic)
	names := []string{"sliding", "syncedsliding", "routed", "planned", "twin", "outage", "clustered"}
	a.waitRouters(names...)
	b.waitRouters(names...)

	admin := rs.Client(redisresp.Options{})
	defer admin.Close()

	key := func(mw, layer, k string) string { return "ratelimit:" + mw + "@file:" + layer + ":" + k }
	pttl := func(p *redisresp.Pool, k string) int64 { return redisDo(t, p, "PTTL", k).Int }

	for _, mw := range []string{"sliding", "syncedsliding"} {
		t.Run(mw, func(t *testing.T) {
			client := from("203.0.113.70")
			k := key(mw, "ip", "203.0.113.70")
			start := time.Now()

			for i := 1; i <= 2; i++ {
				if r := a.get(a.traefik.Web+"/"+mw+"/", client); r.code != http.StatusOK {
					t.Fatalf("request %d: %d", i, r.code)
				}
			}

			// The third is charged to the next window (the key then lives
			// past one window), the fourth to it too.
			third := send(a, "/"+mw+"/3", client, start)
			until(t, "the third charged to the next window", func() bool {
				return redisDo(t, admin, "HGET", k, "c").Str == "1" && pttl(admin, k) > 1000
			})
			fourth := send(a, "/"+mw+"/4", client, start)
			until(t, "the fourth charged", func() bool { return redisDo(t, admin, "HGET", k, "c").Str == "2" })

			r := a.get(a.traefik.Web+"/"+mw+"/5", client)
			beyondMaxDelay(t, "the fifth", r.code, r.header, 2)

			third.wait(t)
			fourth.wait(t)

			if third.code != http.StatusOK || fourth.code != http.StatusOK {
				t.Fatalf("third and fourth: %d %d, want 200 after their waits", third.code, fourth.code)
			}

			// Their places: the next window's start (a window after the
			// first request), half a window later.
			if third.at < time.Second || fourth.at < 1500*time.Millisecond {
				t.Fatalf("third answered %v and fourth %v after the first was sent, want at least 1s and 1.5s", third.at, fourth.at)
			}
		})
	}

	t.Run("route", func(t *testing.T) {
		client := from("203.0.113.71")
		slow, ip := key("routed", "slow", "203.0.113.71"), key("routed", "ip", "203.0.113.71")
		start := time.Now()

		if r := a.get(a.traefik.Web+"/routed/1", client); r.code != http.StatusOK {
			t.Fatalf("first: %d", r.code)
		}

		time.Sleep(50 * time.Millisecond) // the next window within 1999ms: from the first millisecond on

		second := send(a, "/routed/2", client, start)
		until(t, "the second charged to the route's next window", func() bool { return pttl(admin, slow) > 2000 })

		if got := redisDo(t, admin, "MGET", slow, ip); got.Array[0].Str != "1" || got.Array[1].Str != "2" {
			t.Fatalf("route and ip keys with the second waiting: %q %q, want 1 (in the next window) and 2", got.Array[0].Str, got.Array[1].Str)
		}

		// The window after next is beyond maxDelay: refused, and ip is
		// not charged.
		r := a.get(a.traefik.Web+"/routed/3", client)
		beyondMaxDelay(t, "the third", r.code, r.header, 2)

		if got := redisDo(t, admin, "GET", ip); got.Str != "2" {
			t.Fatalf("ip after the route's refusal: %q, want 2 (a refused request charges no layer)", got.Str)
		}

		if second.answered() {
			t.Fatalf("the second answered %d before its place", second.code)
		}

		second.cancel()
		second.wait(t)

		until(t, "the second's place given back to both keys", func() bool {
			got := redisDo(t, admin, "MGET", slow, ip)
			return got.Array[0].Str == "0" && got.Array[1].Str == "1"
		})

		// The place is free: the next request takes it.
		if r := a.get(a.traefik.Web+"/routed/4", client); r.code != http.StatusOK || time.Since(start) < 2*time.Second {
			t.Fatalf("the fourth: %d after %v, want 200 at the next window (2s after the first)", r.code, time.Since(start))
		}
	})

	t.Run("plan", func(t *testing.T) {
		principal := map[string]string{"X-User": "u-72", "X-Plan": "pro"}
		start := time.Now()

		if r := a.get(a.traefik.Web+"/planned/1", principal); r.code != http.StatusOK {
			t.Fatalf("first: %d", r.code)
		}

		time.Sleep(50 * time.Millisecond) // the next window within 1999ms

		oneWaitsOneRefused(t, send(a, "/planned/2", principal, start), send(a, "/planned/3", principal, start), "the next window")

		if got := pttl(admin, key("planned", "pro", "u-72")); got <= 0 {
			t.Fatalf("the plan's key: PTTL %d, want a TTL", got)
		}
	})

	t.Run("two replicas", func(t *testing.T) {
		client := from("203.0.113.73")
		k := key("twin", "ip", "203.0.113.73")
		start := time.Now()

		if r := a.get(a.traefik.Web+"/twin/1", client); r.code != http.StatusOK {
			t.Fatalf("first: %d", r.code)
		}

		// Each place reserved moves the bucket's full time (its TTL) on by
		// a token: 500ms, 1s, 1.5s from the first request.
		var queued []*sent
		for i, e := range []*env{a, b, a} {
			queued = append(queued, send(e, "/twin/"+strconv.Itoa(i+2), client, start))
			full := int64(600 + 500*i)
			until(t, "request "+strconv.Itoa(i+2)+"'s place reserved", func() bool { return pttl(admin, k) > full })
		}

		r := b.get(b.traefik.Web+"/twin/5", client)
		beyondMaxDelay(t, "the fifth, on the second Traefik", r.code, r.header, 2)

		for i, s := range queued {
			s.wait(t)

			place := time.Duration(i+1) * 500 * time.Millisecond
			if s.code != http.StatusOK || s.at < place {
				t.Fatalf("request %d: %d after %v, want 200 no sooner than its token (%v after the first)", i+2, s.code, s.at, place)
			}

			if i > 0 && s.at < queued[i-1].at {
				t.Fatalf("request %d answered at %v, before request %d (%v): the replicas did not queue in one order", i+2, s.at, i+1, queued[i-1].at)
			}
		}

		// A burst on both at once: however Redis orders it, the k-th request
		// admitted is answered no sooner than k tokens after the burst.
		burstStart := time.Now()

		var all []*sent
		for i := 0; i < 8; i++ {
			all = append(all, send([]*env{a, b}[i%2], "/twin/burst", from("203.0.113.74"), burstStart))
		}

		var admitted []time.Duration
		for _, s := range all {
			s.wait(t)

			switch s.code {
			case http.StatusOK:
				admitted = append(admitted, s.at)
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("burst: %d", s.code)
			}
		}

		sort.Slice(admitted, func(i, j int) bool { return admitted[i] < admitted[j] })

		if len(admitted) < 2 || len(admitted) > 8-2 {
			t.Fatalf("burst of 8 on two Traefiks: %d admitted, want some waiting and some refused", len(admitted))
		}

		for i, at := range admitted {
			if place := time.Duration(i) * 500 * time.Millisecond; at < place {
				t.Fatalf("burst: the %d-th admitted answered %v after the burst, before its token (%v): %v", i+1, at, place, admitted)
			}
		}
	})

	t.Run("Redis killed while a request waits", func(t *testing.T) {
		client := from("203.0.113.75")
		k := key("outage", "ip", "203.0.113.75")
		start := time.Now()

		outage := rk.Client(redisresp.Options{})
		defer outage.Close()

		for i := 1; i <= 2; i++ {
			if r := a.get(a.traefik.Web+"/outage/", client); r.code != http.StatusOK {
				t.Fatalf("request %d: %d", i, r.code)
			}
		}

		time.Sleep(50 * time.Millisecond) // the next window within 1999ms

		third := send(a, "/outage/3", client, start)
		until(t, "the third charged to the next window", func() bool { return pttl(outage, k) > 2000 })

		outage.Close()
		rk.Kill()

		// The fallback starts from what Redis reported: the window full, the
		// next one holding the third. One more may wait for it; none may go
		// on before it starts.
		var burst []*sent
		for i := 0; i < 4; i++ {
			burst = append(burst, send(a, "/outage/burst", client, start))
		}

		admitted := 0
		for _, s := range burst {
			s.wait(t)

			switch {
			// memory's clock and Redis's milliseconds may round the window's
			// start a little early: 1.9s, where the fault answers at once.
			case s.code == http.StatusOK && s.at < 1900*time.Millisecond:
				t.Fatalf("during the outage a request was admitted %v after the first, before the next window (2s): the fallback ignored the place Redis reserved", s.at)
			case s.code == http.StatusOK:
				admitted++
			case s.code == http.StatusTooManyRequests && s.header.Get("Retry-After") != "":
			default:
				t.Fatalf("during the outage: %d, Retry-After %q", s.code, s.header.Get("Retry-After"))
			}
		}

		if admitted > 1 {
			t.Fatalf("during the outage %d of the burst admitted, want at most 1 (the next window's last point)", admitted)
		}

		if third.wait(t); third.code != http.StatusOK || third.at < 2*time.Second {
			t.Fatalf("the third, waiting when Redis died: %d after %v, want 200 at its place", third.code, third.at)
		}
	})

	t.Run("cluster", func(t *testing.T) {
		client := from("203.0.113.76")
		start := time.Now()

		if r := a.get(a.traefik.Web+"/clustered/1", client); r.code != http.StatusOK {
			t.Fatalf("first: %d", r.code)
		}

		time.Sleep(50 * time.Millisecond) // ip's next window within 1999ms

		// global's place is a second on, ip's two: the longest.
		oneWaitsOneRefused(t, send(a, "/clustered/2", client, start), send(a, "/clustered/3", client, start), "the longest of its slots' places (ip's next window)")
	})

	// Every key the scenarios wrote has a TTL, on the server and on the
	// Cluster's nodes.
	pools, clusterKeys := []*redisresp.Pool{admin}, 0
	for _, n := range cl.Primaries {
		p := n.Client(redisresp.Options{})
		defer p.Close()

		pools = append(pools, p)
	}

	for i, p := range pools {
		found := keys(t, p, "ratelimit:")
		if i > 0 {
			clusterKeys += len(found)
		}

		for _, k := range found {
			if got := pttl(p, k); got <= 0 || got > 61000 {
				t.Errorf("key %s: PTTL %d, want a TTL within its window (60s at most here)", k, got)
			}
		}
	}

	if clusterKeys == 0 {
		t.Error("no key on the Cluster's nodes")
	}
}
