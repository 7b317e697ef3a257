package e2e

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// concurrencyDynamic is an instance whose ip layer admits 2 requests in
// flight per client, with a lease of lease; on Redis when redisAddr is set.
func concurrencyDynamic(redisAddr, lease string) string {
	store := ""
	if redisAddr != "" {
		store = `
          store: redis
          redis: {address: "` + redisAddr + `", timeout: 2s}`
	}

	return `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [inflight]
      service: backend
  middlewares:
    inflight:
      plugin:
        tierlimit:` + store + `
          global: {points: 0}
          ip: {points: 2, duration: ` + lease + `, algorithm: concurrency}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`
}

// slowReq is a request the backend holds (/sse) until released.
type slowReq struct {
	id   string
	code int
	hdr  http.Header
	body io.ReadCloser // open while admitted
}

// sendSlow sends a request from ip that the backend holds until released
// (/sse-release); it returns once the response's headers are in: 200
// while the request is in flight, or the refusal.
func sendSlow(t *testing.T, e *env, base, ip, id string) *slowReq {
	t.Helper()

	req, _ := http.NewRequest(http.MethodGet, base+"/sse?id="+id, nil)
	req.Header.Set("X-Forwarded-For", ip)

	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("slow request %s: %v", id, err)
	}

	s := &slowReq{id: id, code: resp.StatusCode, hdr: resp.Header, body: resp.Body}
	if s.code != http.StatusOK {
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		s.body = nil
	}

	return s
}

// endSlow lets the backend answer an admitted slow request and reads its
// response to the end.
func endSlow(t *testing.T, e *env, s *slowReq) {
	t.Helper()

	if r, err := e.client.Get(e.backend + "/sse-release?id=" + s.id); err == nil {
		r.Body.Close()
	}

	_, _ = io.ReadAll(s.body)
	s.body.Close()
}

// sendSlowAll sends n slow requests from ip at once.
func sendSlowAll(t *testing.T, e *env, ip, prefix string, n int) (admitted, refused []*slowReq) {
	t.Helper()

	out := make([]*slowReq, n)
	var wg sync.WaitGroup

	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			out[i] = sendSlow(t, e, e.traefik.Web, ip, prefix+strconv.Itoa(i))
		}(i)
	}

	wg.Wait()

	for _, s := range out {
		if s.code == http.StatusOK {
			admitted = append(admitted, s)
		} else {
			refused = append(refused, s)
		}
	}

	return admitted, refused
}

func checkConcurrencyRefusal(t *testing.T, s *slowReq) {
	t.Helper()

	if s.code != http.StatusTooManyRequests || s.hdr.Get("Retry-After") != "1" ||
		!strings.Contains(s.hdr.Get("RateLimit-Policy"), `"ip";q=2;w=`) ||
		!strings.Contains(s.hdr.Get("RateLimit-Policy"), `qu="concurrent-requests"`) {
		t.Fatalf("request %s: %d, Retry-After %q, RateLimit-Policy %q; want 429, 1 and ip's concurrent-requests policy",
			s.id, s.code, s.hdr.Get("Retry-After"), s.hdr.Get("RateLimit-Policy"))
	}
}

// admitSoon sends slow requests from ip until one is admitted (a release
// follows the client's end of the response by a moment), failing after 5s.
func admitSoon(t *testing.T, e *env, ip, id string) *slowReq {
	t.Helper()

	deadline := time.Now().Add(5 * time.Second)
	for n := 0; ; n++ {
		s := sendSlow(t, e, e.traefik.Web, ip, id+"-"+strconv.Itoa(n))
		if s.code == http.StatusOK {
			return s
		}

		if time.Now().After(deadline) {
			t.Fatalf("no request from %s admitted within 5s: the slots were not released (last: %d)", ip, s.code)
		}

		time.Sleep(20 * time.Millisecond)
	}
}

// TestConcurrencyInTraefik: of five simultaneous slow requests from one
// client two are admitted and three refused (429, Retry-After: 1, the
// concurrent-requests policy); another client is admitted meanwhile; once
// the two have ended, two more are admitted, and a third is refused again.
func TestConcurrencyInTraefik(t *testing.T) {
	e := start(t, concurrencyDynamic("", "60s"))
	e.waitRouters("api")

	admitted, refused := sendSlowAll(t, e, "198.51.100.7", "a", 5)
	if len(admitted) != 2 || len(refused) != 3 {
		t.Fatalf("%d admitted and %d refused of five in flight, want 2 and 3", len(admitted), len(refused))
	}

	for _, s := range refused {
		checkConcurrencyRefusal(t, s)
	}

	other := sendSlow(t, e, e.traefik.Web, "198.51.100.8", "other")
	if other.code != http.StatusOK {
		t.Fatalf("another client got %d while the first held its slots, want 200", other.code)
	}

	for _, s := range append(admitted, other) {
		endSlow(t, e, s)
	}

	c := admitSoon(t, e, "198.51.100.7", "c")
	d := admitSoon(t, e, "198.51.100.7", "d")

	third := sendSlow(t, e, e.traefik.Web, "198.51.100.7", "third")
	checkConcurrencyRefusal(t, third)

	endSlow(t, e, c)
	endSlow(t, e, d)
}

// TestConcurrencySharedOnRedisAndFreedAfterACrash: two Traefik processes on
// one Redis share a client's 2 slots (2 in flight on A: B refuses); a
// process killed while it holds 2 slots leaves them held until their lease
// (3s) ends: B refuses right after the kill, admits again once the lease has
// run out, and not before.
func TestConcurrencySharedOnRedisAndFreedAfterACrash(t *testing.T) {
	r := startRedis(t)
	a := start(t, concurrencyDynamic(r.Addr, "3s"))
	b := start(t, concurrencyDynamic(r.Addr, "3s"))
	a.waitRouters("api")
	b.waitRouters("api")

	const ip = "198.51.100.9"
	const lease = 3 * time.Second

	x := admitSoon(t, a, ip, "x")
	y := admitSoon(t, a, ip, "y")
	checkConcurrencyRefusal(t, sendSlow(t, b, b.traefik.Web, ip, "z"))
	endSlow(t, a, x)
	endSlow(t, a, y)

	// Released on A, admitted on B.
	endSlow(t, b, admitSoon(t, b, ip, "w"))

	sent := time.Now()
	p := admitSoon(t, a, ip, "p")
	q := admitSoon(t, a, ip, "q")
	a.traefik.Kill()
	p.body.Close()
	q.body.Close()

	if got := b.get(b.traefik.Web+"/api", from(ip)); got.code != http.StatusTooManyRequests {
		t.Fatalf("right after A was killed holding 2 slots, B answered %d, want 429", got.code)
	}

	if time.Since(sent) >= lease {
		t.Fatalf("the machine took %v to get here, past the lease: the test proves nothing", time.Since(sent))
	}

	for {
		got := b.get(b.traefik.Web+"/api", from(ip))
		if got.code == http.StatusOK {
			if took := time.Since(sent); took < lease {
				t.Fatalf("B admitted the client %v after A's slots were taken, before their %v lease ended", took, lease)
			}

			break
		}

		if time.Since(sent) > lease+5*time.Second {
			t.Fatalf("B still refuses %v after the dead process's slots were taken: their lease never ended", time.Since(sent))
		}

		time.Sleep(25 * time.Millisecond)
	}
}

// clusterConcurrencyDynamic is clusterDynamic's instance with concurrency
// layers: global 3 and ip 2 requests in flight, in keys of other slots.
func clusterConcurrencyDynamic(seeds ...string) string {
	return strings.NewReplacer(
		"global: {points: 100000000, duration: 60s}", "global: {points: 3, duration: 60s, algorithm: concurrency}",
		"ip: {points: "+strconv.Itoa(clusterLimit)+", duration: 60s}", "ip: {points: 2, duration: 60s, algorithm: concurrency}",
	).Replace(clusterDynamic(seeds...))
}

// TestConcurrencyOnACluster: on a Redis Cluster, two processes share the
// slots, global's and ip's keys in slots of their own; a request global
// refuses after its ip slot was taken in another slot's call gets that
// slot back.
func TestConcurrencyOnACluster(t *testing.T) {
	c, err := harness.StartCluster(t.TempDir(), 3, 0)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(c.Kill)
	grantACL(t, c.Nodes()...)

	a := start(t, clusterConcurrencyDynamic(c.Primaries[0].Addr))
	b := start(t, clusterConcurrencyDynamic(c.Primaries[1].Addr))
	a.waitRouters("api")
	b.waitRouters("api")

	x := admitSoon(t, a, "198.51.100.20", "x")
	y1 := admitSoon(t, a, "198.51.100.21", "y1")
	y2 := admitSoon(t, a, "198.51.100.21", "y2")

	// global is full: refused on B, after Z's ip slot was taken in its own
	// slot's call.
	z := sendSlow(t, b, b.traefik.Web, "198.51.100.22", "z")
	if z.code != http.StatusTooManyRequests || !strings.Contains(z.hdr.Get("RateLimit-Policy"), `"global";q=3`) {
		t.Fatalf("a fourth request in flight on B: %d, policy %q; want global's 429", z.code, z.hdr.Get("RateLimit-Policy"))
	}

	for _, s := range []*slowReq{x, y1, y2} {
		endSlow(t, a, s)
	}

	// Z's ip slot was given back: two in flight from Z fit.
	z1 := admitSoon(t, b, "198.51.100.22", "z1")
	z2 := admitSoon(t, b, "198.51.100.22", "z2")
	checkConcurrencyRefusal(t, sendSlow(t, a, a.traefik.Web, "198.51.100.22", "z3"))
	endSlow(t, b, z1)
	endSlow(t, b, z2)
}

// TestConcurrencyHeldByAWebSocket: a WebSocket connection holds its slot for
// its whole life; one more is refused with 1013, and once one closes another
// connects.
func TestConcurrencyHeldByAWebSocket(t *testing.T) {
	e := start(t, strings.Replace(wsConfig(2, 0), "ip: {points: 2, duration: 60s}", "ip: {points: 2, duration: 60s, algorithm: concurrency}", 1))
	e.waitRouters("ws")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var conns []*websocket.Conn
	for i := 0; i < 2; i++ {
		c := e.dialUntilAccepted(ctx, "198.51.100.30")
		conns = append(conns, c)
	}

	// Both still open and echoing: their slots are held.
	for i, c := range conns {
		if err := echo(ctx, c, "still "+strconv.Itoa(i)); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}

	e.refusedWith1013(ctx, "198.51.100.30")

	conns[0].Close(websocket.StatusNormalClosure, "")
	c := e.dialUntilAccepted(ctx, "198.51.100.30")
	c.Close(websocket.StatusNormalClosure, "")
	conns[1].Close(websocket.StatusNormalClosure, "")
}

// TestConcurrencyReleasedWhenTheClientGoesAway: a client that hangs up on a
// request in flight frees its slot, though the backend never answered.
func TestConcurrencyReleasedWhenTheClientGoesAway(t *testing.T) {
	e := start(t, concurrencyDynamic("", "60s"))
	e.waitRouters("api")

	x := admitSoon(t, e, "198.51.100.40", "x")
	y := admitSoon(t, e, "198.51.100.40", "y")
	checkConcurrencyRefusal(t, sendSlow(t, e, e.traefik.Web, "198.51.100.40", "z"))

	// Hang up on x without its response having ended.
	x.body.Close()

	began := time.Now()
	w := admitSoon(t, e, "198.51.100.40", "w")
	t.Logf("admitted %v after the hang-up", time.Since(began))
	endSlow(t, e, w)
	endSlow(t, e, y)
}
