package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// delayRulesDynamic gives maxDelay to each kind of rule README names, each
// on a router of its own (the memory store, every other layer off or out
// of reach): a route, a sliding ip window, a plan and a route's plan of a
// principal behind ForwardAuth, user and service, assets, global; two
// layers of which one waits and the other refuses, either way round; a
// WebSocket upgrade; a rule in dry run and the top-level dryRun; a client
// that goes away while waiting. The routers bad-* use a maxDelay that README
// forbids or cannot read: Traefik must refuse them, naming the field.
const delayRulesDynamic = `
http:
  routers:
    route:     {entryPoints: [web], rule: "PathPrefix(` + "`/route/`" + `)", middlewares: [route], service: backend}
    sliding:   {entryPoints: [web], rule: "PathPrefix(` + "`/sliding/`" + `)", middlewares: [sliding], service: backend}
    plan:      {entryPoints: [web], rule: "PathPrefix(` + "`/plan/`" + `)", middlewares: [auth, plan], service: backend}
    routeplan: {entryPoints: [web], rule: "PathPrefix(` + "`/routeplan/`" + `)", middlewares: [auth, routeplan], service: backend}
    tiers:     {entryPoints: [web], rule: "PathPrefix(` + "`/tiers/`" + `)", middlewares: [auth, tiers], service: backend}
    assets:    {entryPoints: [web], rule: "PathPrefix(` + "`/assets/`" + `)", middlewares: [assets], service: backend}
    global:    {entryPoints: [web], rule: "PathPrefix(` + "`/global/`" + `)", middlewares: [global], service: backend}
    mix:       {entryPoints: [web], rule: "PathPrefix(` + "`/mix/`" + `)", middlewares: [mix], service: backend}
    mix2:      {entryPoints: [web], rule: "PathPrefix(` + "`/mix2/`" + `)", middlewares: [mix2], service: backend}
    ws:        {entryPoints: [web], rule: "Path(` + "`/ws`" + `)", middlewares: [ws], service: backend}
    dry:       {entryPoints: [web], rule: "PathPrefix(` + "`/dry/`" + `)", middlewares: [dry], service: backend}
    dryall:    {entryPoints: [web], rule: "PathPrefix(` + "`/dryall/`" + `)", middlewares: [dryall], service: backend}
    gone:      {entryPoints: [web], rule: "PathPrefix(` + "`/gone/`" + `)", middlewares: [gone], service: backend}
    bad-negative:    {entryPoints: [web], rule: "PathPrefix(` + "`/bad-negative/`" + `)", middlewares: [bad-negative], service: backend}
    bad-unparsable:  {entryPoints: [web], rule: "PathPrefix(` + "`/bad-unparsable/`" + `)", middlewares: [bad-unparsable], service: backend}
    bad-concurrency: {entryPoints: [web], rule: "PathPrefix(` + "`/bad-concurrency/`" + `)", middlewares: [bad-concurrency], service: backend}
    bad-countstatus: {entryPoints: [web], rule: "PathPrefix(` + "`/bad-countstatus/`" + `)", middlewares: [bad-countstatus], service: backend}
    bad-costfrom:    {entryPoints: [web], rule: "PathPrefix(` + "`/bad-costfrom/`" + `)", middlewares: [bad-costfrom], service: backend}
  middlewares:
    auth:
      forwardAuth:
        address: "{{auth}}/auth"
        authResponseHeaders: [X-Auth-User, X-Auth-Service-Account, X-Auth-Plan]
    route:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          routes:
            - {name: slow, paths: [/route/], key: ip, points: 1, duration: 2s, maxDelay: 1999ms}
    sliding:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 1, duration: 1s, algorithm: sliding, maxDelay: 1500ms}
    plan:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          user: {points: 1000, duration: 60s}
          principal: {userHeader: X-Auth-User, planHeader: X-Auth-Plan}
          plans:
            pro: ` + bucketDelay + `
    routeplan:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          user: {points: 1000, duration: 60s}
          principal: {userHeader: X-Auth-User, planHeader: X-Auth-Plan}
          routes:
            - name: reports
              paths: [/routeplan/]
              key: principal
              points: 1000
              duration: 60s
              plans:
                team: ` + windowDelay + `
    tiers:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 0}
          assets: {points: 0}
          user: ` + windowDelay + `
          service: ` + bucketDelay + `
          principal: {userHeader: X-Auth-User}
    assets:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 0}
          assets: ` + windowDelay + `
    global:
      plugin:
        tierlimit:
          global: ` + bucketDelay + `
          ip: {points: 0}
          assets: {points: 0}
    mix:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: ` + windowDelay + `
          routes:
            - {name: strict, paths: [/mix/strict], key: ip, points: 1, duration: 60s}
    mix2:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 1, duration: 60s}
          routes:
            - {name: shared, paths: [/mix2/], key: global, points: 1, duration: 2s, maxDelay: 1999ms}
    ws:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: ` + windowDelay + `
    dry:
      plugin:
        tierlimit:
          global: {points: 0}
          assets: {points: 0}
          ip: {points: 1, duration: 60s, maxDelay: 60s, dryRun: true}
    dryall:
      plugin:
        tierlimit:
          dryRun: true
          global: {points: 0}
          ip: {points: 1, duration: 60s, maxDelay: 60s}
    gone:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: ` + windowDelay + `
    bad-negative:
      plugin:
        tierlimit:
          ip: {points: 5, duration: 1s, maxDelay: -1s}
    bad-unparsable:
      plugin:
        tierlimit:
          global: {points: 100, duration: 1s, maxDelay: abc}
    bad-concurrency:
      plugin:
        tierlimit:
          user: {points: 2, duration: 30s, algorithm: concurrency, maxDelay: 1s}
          principal: {userHeader: X-Auth-User}
    bad-countstatus:
      plugin:
        tierlimit:
          routes:
            - {name: login, paths: [/login], points: 5, duration: 60s, countStatus: [401], maxDelay: 1s}
    bad-costfrom:
      plugin:
        tierlimit:
          principal: {userHeader: X-Auth-User, planHeader: X-Auth-Plan}
          routes:
            - name: llm
              paths: [/v1/]
              points: 500
              duration: 60s
              costFrom: "header:X-Cost"
              plans:
                pro: {points: 5000, duration: 60s, maxDelay: 2s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`

// TestMaxDelayOnEveryRuleThroughTraefik: in the real Traefik on the memory
// store, maxDelay holds on every kind of rule README lists, as a Traefik
// user reads it: a request within maxDelay of its place waits and is
// answered 200, with the headers of its place; one beyond is refused at
// once with the Retry-After of the moment it fits without waiting; a
// request one layer refuses reserves nothing in a layer that would have
// let it wait; a WebSocket upgrade waits too, or is closed with 1013; a
// rule in dry run waits for nothing; a client that goes away gives its
// place back; and a maxDelay README forbids or cannot read refuses the
// router, naming the field.
func TestMaxDelayOnEveryRuleThroughTraefik(t *testing.T) {
	e := start(t, delayRulesDynamic)

	good := []string{"route", "sliding", "plan", "routeplan", "tiers", "assets", "global", "mix", "mix2", "ws", "dry", "dryall", "gone"}
	bad := map[string]string{
		"bad-negative":    `ip.maxDelay = "-1s"`,
		"bad-unparsable":  `global.maxDelay = "abc"`,
		"bad-concurrency": `user.maxDelay = "1s"`,
		"bad-countstatus": `routes[0].maxDelay = "1s"`,
		"bad-costfrom":    `routes[0].plans.pro.maxDelay = "2s"`,
	}

	names := append([]string(nil), good...)
	for n := range bad {
		names = append(names, n)
	}

	states, err := e.traefik.WaitRouters(30*time.Second, names...)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a bad maxDelay refuses its router, naming the field", func(t *testing.T) {
		for _, n := range good {
			if s := states[n]; s.Status != "enabled" {
				t.Fatalf("router %s is %q: %v", n, s.Status, s.Error)
			}
		}

		for n, want := range bad {
			if s := states[n]; s.Status == "enabled" || !strings.Contains(strings.Join(s.Error, "\n"), want) {
				t.Errorf("router %s: %q %q, want an error naming %s", n, s.Status, s.Error, want)
			}
		}
	})

	// Each rule alone: the client's first request, then two at once, one
	// waiting for its place, the other refused.
	for _, c := range []struct {
		name, method, path string
		hdr                map[string]string
		retryAfter         string
		minWait            time.Duration
		// rate is the waiting one's RateLimit, counted from its place
		// ("": not checked).
		rate string
	}{
		// A 2s window: the refused one fits when the window after next
		// starts, 4s after the first (Retry-After rounds up from 3.95s).
		{"routes[].maxDelay", http.MethodGet, "/route/x", from("203.0.113.101"), "4", 1500 * time.Millisecond, `"slow";r=0;t=2`},
		// 1 a second, sliding: the second fits once the next window starts;
		// the refused one once the window after starts (the second's then
		// weighs less than a point), 2s after the first.
		{"ip.maxDelay, sliding", http.MethodGet, "/sliding/x", from("203.0.113.102"), "2", 700 * time.Millisecond, ""},
		{"plans.<name>.maxDelay", http.MethodGet, "/plan/x", bearer("user-alice@pro"), "1", 300 * time.Millisecond, ""},
		{"routes[].plans.<name>.maxDelay", http.MethodGet, "/routeplan/x", bearer("user-carol@team"), "4", 1500 * time.Millisecond, `"reports.team";r=0;t=2`},
		{"user.maxDelay", http.MethodGet, "/tiers/x", bearer("user-dave"), "4", 1500 * time.Millisecond, `"user";r=0;t=2`},
		{"service.maxDelay", http.MethodGet, "/tiers/x", bearer("svc-bot"), "1", 300 * time.Millisecond, ""},
		{"assets.maxDelay, HEAD", http.MethodHead, "/assets/logo.png", from("203.0.113.103"), "4", 1500 * time.Millisecond, `"assets";r=0;t=2`},
		{"global.maxDelay", http.MethodGet, "/global/x", from("203.0.113.104"), "1", 300 * time.Millisecond, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := e.as(t)
			waited := delayHoldsAt(t, e, c.method, e.traefik.Web+c.path, c.hdr, c.retryAfter, c.minWait)

			if c.method == http.MethodHead && waited.r.body != "" {
				t.Fatalf("HEAD answered with a body: %q", waited.r.body)
			}

			if c.rate != "" && waited.r.header.Get("RateLimit") != c.rate {
				t.Fatalf("the waiting one's RateLimit %q (X-RateLimit-Remaining %q, RateLimit-Policy %q), want %s: as of its place",
					waited.r.header.Get("RateLimit"), waited.r.header.Get("X-RateLimit-Remaining"), waited.r.header.Get("RateLimit-Policy"), c.rate)
			}
		})
	}

	t.Run("a route refuses where ip would wait: ip keeps its next window", func(t *testing.T) {
		e := e.as(t)
		client := from("203.0.113.105")

		if r := e.get(e.traefik.Web+"/mix/strict", client); r.code != http.StatusOK {
			t.Fatalf("first: %d", r.code)
		}

		time.Sleep(50 * time.Millisecond) // into the window: see delayHolds

		checkRefusal(t, e.get(e.traefik.Web+"/mix/strict", client), "strict", 1)

		// ip's next window is free: the next request waits for it.
		sent := time.Now()
		if r := e.get(e.traefik.Web+"/mix/api", client); r.code != http.StatusOK || time.Since(sent) < 1500*time.Millisecond {
			t.Fatalf("after the refusal: %d after %v, want 200 after ip's window (the refusal reserved nothing)", r.code, time.Since(sent))
		}
	})

	t.Run("ip refuses where a route would wait: the route keeps its next window", func(t *testing.T) {
		e := e.as(t)
		a, b := from("203.0.113.106"), from("203.0.113.107")

		if r := e.get(e.traefik.Web+"/mix2/x", a); r.code != http.StatusOK {
			t.Fatalf("first: %d", r.code)
		}

		time.Sleep(50 * time.Millisecond)

		checkRefusal(t, e.get(e.traefik.Web+"/mix2/x", a), "ip", 1)

		sent := time.Now()
		if r := e.get(e.traefik.Web+"/mix2/x", b); r.code != http.StatusOK || time.Since(sent) < 1500*time.Millisecond {
			t.Fatalf("another client: %d after %v, want 200 after the route's window (the refusal reserved nothing)", r.code, time.Since(sent))
		}
	})

	t.Run("a WebSocket upgrade waits for its place, or is closed with 1013", func(t *testing.T) {
		e := e.as(t)
		const client = "203.0.113.108"

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		c, _, err := e.dialWS(ctx, client)
		if err != nil {
			t.Fatalf("first upgrade: %v", err)
		}

		if err := echo(ctx, c, "first"); err != nil {
			t.Fatalf("first upgrade: %v", err)
		}

		c.Close(websocket.StatusNormalClosure, "")
		time.Sleep(50 * time.Millisecond)

		type outcome struct {
			err  error
			took time.Duration
		}

		outcomes := make(chan outcome, 2)
		sent := time.Now()

		for i := 0; i < 2; i++ {
			go func() {
				c, _, err := e.dialWS(ctx, client)
				if err == nil {
					err = echo(ctx, c, "again")
					c.CloseNow()
				}
				outcomes <- outcome{err, time.Since(sent)}
			}()
		}

		var echoed, closed int

		for i := 0; i < 2; i++ {
			o := <-outcomes

			switch {
			case o.err == nil && o.took >= 1500*time.Millisecond:
				echoed++
			case websocket.CloseStatus(o.err) == websocket.StatusTryAgainLater:
				closed++
			default:
				t.Fatalf("an upgrade: %v after %v, want an echo after its wait or a 1013 close", o.err, o.took)
			}
		}

		if echoed != 1 || closed != 1 {
			t.Fatalf("%d upgrades echoed after their wait, %d closed with 1013; want one of each", echoed, closed)
		}
	})

	t.Run("a rule in dry run waits for nothing", func(t *testing.T) {
		e := e.as(t)

		// A 60s window whose maxDelay reaches the next one: a request that
		// waited would outlast the client's 10s timeout.
		for _, path := range []string{"/dry/x", "/dryall/x"} {
			for i := 1; i <= 3; i++ {
				if r := e.get(e.traefik.Web+path, from("203.0.113.109")); r.code != http.StatusOK {
					t.Fatalf("%s, request %d: %d, want 200 at once", path, i, r.code)
				}
			}
		}
	})

	t.Run("a client gone while waiting gives its place back", func(t *testing.T) {
		e := e.as(t)
		client := from("203.0.113.110")

		first := time.Now()
		if r := e.get(e.traefik.Web+"/gone/x", client); r.code != http.StatusOK {
			t.Fatalf("first: %d", r.code)
		}

		time.Sleep(50 * time.Millisecond)

		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.traefik.Web+"/gone/x", nil)
		req.Header.Set("X-Forwarded-For", client["X-Forwarded-For"])

		answered := make(chan string, 1)
		go func() {
			resp, err := e.client.Do(req)
			if err != nil {
				answered <- "no answer"
				return
			}
			resp.Body.Close()
			answered <- resp.Status
		}()

		time.Sleep(200 * time.Millisecond) // it has reached the plugin and waits

		select {
		case a := <-answered:
			t.Fatalf("the second, whose place is the next window: %s, want it waiting", a)
		default:
		}

		cancel()
		<-answered

		// Until Traefik sees the client gone, the place is the second's and
		// the third is refused; then the third takes it, and waits.
		for {
			sent := time.Now()
			r := e.get(e.traefik.Web+"/gone/x", client)

			if r.code == http.StatusOK && time.Since(sent) >= 500*time.Millisecond {
				return
			}

			if r.code != http.StatusTooManyRequests || time.Since(first) > 1400*time.Millisecond {
				t.Fatalf("the third: %d after %v, want 200 after waiting for the place given back", r.code, time.Since(sent))
			}

			time.Sleep(20 * time.Millisecond) // not an assertion: Traefik's read of the close
		}
	})
}

// as is e for a subtest: its failures are t's.
func (e *env) as(t *testing.T) *env {
	c := *e
	c.t = t

	return &c
}
