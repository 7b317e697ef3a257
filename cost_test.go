package tierlimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
)

func TestCostAndCountStatusConfiguration(t *testing.T) {
	route := func(mutate func(r *config.RouteConfig)) func(c *Config) {
		return func(c *Config) {
			r := config.RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 10, Duration: "60s"}
			mutate(&r)
			c.Routes = []config.RouteConfig{r}
		}
	}

	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		want   string // "" when valid
	}{
		{"cost of the points", route(func(r *config.RouteConfig) { r.Cost = 10 }), ""},
		{"cost above the points", route(func(r *config.RouteConfig) { r.Cost = 11 }), `routes[0].cost = "11"`},
		{"negative cost", route(func(r *config.RouteConfig) { r.Cost = -1 }), `routes[0].cost = "-1"`},
		{"cost above a bucket's burst", route(func(r *config.RouteConfig) { r.Algorithm, r.Points, r.Burst, r.Cost = "tokenbucket", 20, 5, 6 }), `routes[0].cost = "6"`},
		{"cost within a bucket's burst", route(func(r *config.RouteConfig) { r.Algorithm, r.Points, r.Burst, r.Cost = "tokenbucket", 1, 5, 5 }), ""},
		{"cost on a route that is off", route(func(r *config.RouteConfig) { r.Points, r.Cost = 0, 3 }), `routes[0].cost = "3": is ignored on a route with points 0`},
		{"countStatus 100 and 599", route(func(r *config.RouteConfig) { r.CountStatus = []int{100, 401, 599} }), ""},
		{"countStatus 99", route(func(r *config.RouteConfig) { r.CountStatus = []int{401, 99} }), `routes[0].countStatus[1] = "99"`},
		{"countStatus 600", route(func(r *config.RouteConfig) { r.CountStatus = []int{600} }), `routes[0].countStatus[0] = "600"`},
	} {
		cfg := CreateConfig()
		tc.mutate(cfg)

		_, err := parse(cfg)

		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.want)
		}
	}
}

// exportConfig is the costed route: ip 25 a minute, exports of cost
// 10 in a route of large points.
func exportConfig(c *Config) {
	c.Global = config.LayerConfig{Points: 1000, Duration: "60s"}
	c.IP = config.LayerConfig{Points: 25, Duration: "60s"}
	c.Routes = []config.RouteConfig{{Name: "export", Paths: []string{"/export"}, Key: "ip", Points: 1000, Duration: "60s", Cost: 10}}
}

// costedScenario: three exports get 200, 200, 429 (the third does not fit
// and spends nothing), then 6 plain reads get 5 then 429; the headers show
// what is left after each cost.
func costedScenario(t *testing.T, h *harness) {
	t.Helper()

	for i, want := range []struct {
		code int
		left string
	}{{200, "15"}, {200, "5"}, {429, "0"}} {
		rec := h.get("/export", "203.0.113.1:1")
		if rec.Code != want.code || rec.Header().Get("X-Ratelimit-Remaining") != want.left {
			t.Fatalf("export %d: %d, remaining %q, want %d and %s", i+1, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"), want.code, want.left)
		}
	}

	for i := 1; i <= 6; i++ {
		want := http.StatusOK
		if i == 6 {
			want = http.StatusTooManyRequests
		}

		rec := h.get("/api", "203.0.113.1:1")
		if rec.Code != want || want == 200 && rec.Header().Get("Ratelimit") != `"ip";r=`+strconv.Itoa(5-i)+";t=60" {
			t.Fatalf("read %d: %d, RateLimit %q", i, rec.Code, rec.Header().Get("Ratelimit"))
		}
	}

	// global spent 10 + 10 + 5: the refused export and read took nothing.
	if rec := h.get("/api", "203.0.113.2:1"); rec.Header().Get("X-Ratelimit-Remaining") != "24" {
		t.Fatalf("another client: remaining %q", rec.Header().Get("X-Ratelimit-Remaining"))
	}
}

func TestCostedRouteInMemory(t *testing.T) {
	costedScenario(t, newHarness(t, exportConfig))
}

func TestCostedRouteOnRedisServer(t *testing.T) {
	addr, _ := redisServer(t)
	h, _ := redisHarness(t, addr, with(exportConfig, asACLUser))
	costedScenario(t, h)

	// The refused export blocked nothing: the reads asked Redis. A read
	// refused at cost 1 blocks the key for everyone's costs.
	if rec := h.get("/export", "203.0.113.1:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("export after the reads: %d", rec.Code)
	}
}

// TestLargestCostOfTheMatchingRoutes: a request matching two routes is
// charged the larger cost in every layer.
func TestLargestCostOfTheMatchingRoutes(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 100, Duration: "60s"}
		c.Routes = []config.RouteConfig{
			{Name: "api", Paths: []string{"/api/"}, Points: 50, Duration: "60s", Cost: 2},
			{Name: "search", Paths: []string{"/api/search"}, Points: 60, Duration: "60s", Cost: 7},
		}
	})

	if rec := h.get("/api/search", "203.0.113.1:1"); rec.Header().Get("X-Ratelimit-Remaining") != "43" {
		t.Fatalf("remaining %q, want api's 50 - 7", rec.Header().Get("X-Ratelimit-Remaining"))
	}

	if rec := h.get("/api/x", "203.0.113.1:1"); rec.Header().Get("X-Ratelimit-Remaining") != "41" {
		t.Fatalf("remaining %q, want api's 43 - 2", rec.Header().Get("X-Ratelimit-Remaining"))
	}
}

// loginConfig is the login limit: 3 a minute, counting 401s only,
// on a backend (loginBackend) that answers 401 to a bad password.
func loginConfig(c *Config) {
	c.Global = config.LayerConfig{Points: 1000, Duration: "60s"}
	c.IP = config.LayerConfig{Points: 1000, Duration: "60s"}
	c.Routes = []config.RouteConfig{{Name: "login", Methods: []string{"POST"}, Paths: []string{"/login"}, Points: 3, Duration: "60s", CountStatus: []int{401}}}
}

var loginBackend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
	if req.Header.Get("X-Password") != "good" {
		http.Error(rw, "bad password", http.StatusUnauthorized)
		return
	}

	_, _ = rw.Write([]byte("welcome"))
})

func login(h *harness, password string) *httptest.ResponseRecorder {
	return h.do(http.MethodPost, "/login", "203.0.113.1:1", map[string]string{"X-Password": password})
}

// loginScenario: 10 good logins pass, 3 bad ones get the backend's 401 (the
// headers showing each charge), the 4th 429, and a good one after it 429.
func loginScenario(t *testing.T, h *harness) {
	t.Helper()

	h.p.next = loginBackend

	for i := 1; i <= 10; i++ {
		if rec := login(h, "good"); rec.Code != http.StatusOK || rec.Header().Get("X-Ratelimit-Remaining") != "3" {
			t.Fatalf("good login %d: %d, remaining %q", i, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"))
		}
	}

	for i := 1; i <= 3; i++ {
		rec := login(h, "bad")
		if rec.Code != http.StatusUnauthorized || rec.Header().Get("X-Ratelimit-Remaining") != strconv.Itoa(3-i) || rec.Body.String() != "bad password\n" {
			t.Fatalf("bad login %d: %d, remaining %q, body %q", i, rec.Code, rec.Header().Get("X-Ratelimit-Remaining"), rec.Body.String())
		}
	}

	for _, password := range []string{"bad", "good"} {
		if rec := login(h, password); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"layer":"login"`) {
			t.Fatalf("%s login after three failures: %d %s", password, rec.Code, rec.Body.String())
		}
	}

	// The route refused; the other layers charged the 13 that went through.
	if rec := h.get("/api", "203.0.113.1:1"); rec.Header().Get("X-Ratelimit-Remaining") != "986" {
		t.Fatalf("ip after the logins: remaining %q, want 1000 - 14", rec.Header().Get("X-Ratelimit-Remaining"))
	}
}

func TestCountStatusRouteInMemory(t *testing.T) {
	loginScenario(t, newHarness(t, loginConfig))
}

func TestCountStatusRouteOnRedisServer(t *testing.T) {
	addr, _ := redisServer(t)
	h, _ := redisHarness(t, addr, with(loginConfig, asACLUser))
	loginScenario(t, h)
}

// TestCountStatusInFlight: logins that passed the check while the budget had
// room are each counted when they fail, while they fit: the count stops at
// the points, so the route refuses no longer than its rule says.
func TestCountStatusInFlight(t *testing.T) {
	h := newHarness(t, loginConfig)

	// Four logins in flight at once: all pass the check (nothing counted yet).
	var fail []func()
	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		done := make(chan struct{})
		fail = append(fail, func() { rw.WriteHeader(http.StatusUnauthorized); close(done) })
		if len(fail) < 4 {
			// The next login arrives while this one waits for its answer.
			login(h, "bad")
		} else {
			for i := len(fail) - 1; i >= 0; i-- {
				fail[i]()
			}
		}
		<-done
	})

	if rec := login(h, "bad"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("first login: %d", rec.Code)
	}

	w := h.p.routes[0].layer.Entries["203.0.113.1"]
	if w == nil || w.Count != 3 {
		t.Fatalf("window %+v: want the 3 points counted, never more", w)
	}

	h.p.next = loginBackend
	if rec := login(h, "good"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("login after: %d", rec.Code)
	}
}

// TestCountStatusWriterKeepsStreamsLive: a countStatus route's response is
// flushed through and hijackable; an upgrade's 101 is not counted unless
// listed.
func TestCountStatusWriterKeepsStreamsLive(t *testing.T) {
	for _, listed := range []bool{false, true} {
		h := newHarness(t, func(c *Config) {
			loginConfig(c)
			c.Routes[0].Methods = nil
			if listed {
				c.Routes[0].CountStatus = append(c.Routes[0].CountStatus, http.StatusSwitchingProtocols)
			}
		})

		h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
			rw.Header().Set("Content-Type", "text/event-stream")
			rw.WriteHeader(http.StatusOK)

			for i := 0; i < 3; i++ {
				_, _ = rw.Write([]byte("data: x\n\n"))
			}
		})

		rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
		h.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/login", nil))

		if rec.flushes != 4 || rec.Body.String() != strings.Repeat("data: x\n\n", 3) {
			t.Fatalf("%d flushes (want 4: headers and each event), body %q", rec.flushes, rec.Body.String())
		}

		h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
			if _, _, err := rw.(http.Hijacker).Hijack(); err != nil {
				t.Errorf("hijack: %v", err)
			}
		})

		req := httptest.NewRequest(http.MethodGet, "/login", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		rec = &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
		h.h.ServeHTTP(rec, req)

		if !rec.hijacked {
			t.Fatal("Hijack did not reach the original writer")
		}

		counted := int64(0)
		if w := h.p.routes[0].layer.Entries["192.0.2.1"]; w != nil {
			counted = w.Count
		}

		if want := map[bool]int64{false: 0, true: 1}[listed]; counted != want {
			t.Fatalf("101 listed %v: counted %d, want %d", listed, counted, want)
		}
	}
}

// TestCostOfAPendingIPCharge: a credentialed export's ip charge, settled on
// the backend's 401, is its cost; when it is refused, the layers charged up
// front get that cost back.
func TestCostOfAPendingIPCharge(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 100, Duration: "60s"}
		c.IP = config.LayerConfig{Points: 15, Duration: "60s"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
		c.Routes = []config.RouteConfig{{Name: "export", Paths: []string{"/export"}, Points: 100, Duration: "60s", Cost: 10}}
	})
	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusUnauthorized) })

	token := map[string]string{"Authorization": "Bearer garbage"}
	for i, want := range []int{http.StatusUnauthorized, http.StatusTooManyRequests} {
		if rec := h.do(http.MethodGet, "/export", "203.0.113.1:1", token); rec.Code != want {
			t.Fatalf("export %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	counts := countsByLayer(h)

	if counts["global"] != 10 || counts["ip"] != 10 || counts["export"] != 10 {
		t.Fatalf("counts %v, want 10 each: the refused export's cost given back", counts)
	}
}

// TestRefusedPendingChargeSkipsWhatADryRunRuleDidNotTake: a dry-run sliding
// route that would refuse takes nothing; when the deferred ip charge then
// refuses the request, the layers charged up front get their point back,
// and that route none.
func TestRefusedPendingChargeSkipsWhatADryRunRuleDidNotTake(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 100, Duration: "60s"}
		c.IP = config.LayerConfig{Points: 1, Duration: "60s"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
		c.Routes = []config.RouteConfig{{Name: "probe", Paths: []string{"/probe"}, Points: 1, Duration: "60s", Algorithm: "sliding", DryRun: true}}
	})
	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusUnauthorized) })

	token := map[string]string{"Authorization": "Bearer garbage"}
	for i, want := range []int{http.StatusUnauthorized, http.StatusTooManyRequests} {
		if rec := h.do(http.MethodGet, "/probe", "203.0.113.1:1", token); rec.Code != want {
			t.Fatalf("request %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	counts := countsByLayer(h)

	if counts["global"] != 1 || counts["ip"] != 1 || counts["probe"] != 1 {
		t.Fatalf("counts %v, want 1 each: the refused request's global point given back, and none to the route that took nothing", counts)
	}
}

// countsByLayer sums each layer's memory counters.
func countsByLayer(h *harness) map[string]int64 {
	counts := map[string]int64{}
	for _, l := range h.p.layers {
		for _, w := range l.Entries {
			counts[l.Name] += w.Count
		}
	}

	return counts
}

// TestListedStatusCountedWhenTheIPChargeRefuses: a credentialed login that
// the backend answers 401, a status the login route counts, is counted on
// the route also when the ip charge of the invalid credential turns the
// answer into a 429.
func TestListedStatusCountedWhenTheIPChargeRefuses(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.IP = config.LayerConfig{Points: 2, Duration: "60s"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
		c.Routes = []config.RouteConfig{{Name: "login", Methods: []string{"POST"}, Paths: []string{"/login"}, Points: 10, Duration: "60s", CountStatus: []int{401}}}
	})
	h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusUnauthorized) })

	token := map[string]string{"Authorization": "Bearer garbage"}
	for i, want := range []int{http.StatusUnauthorized, http.StatusUnauthorized, http.StatusTooManyRequests} {
		if rec := h.do(http.MethodPost, "/login", "203.0.113.1:1", token); rec.Code != want {
			t.Fatalf("login %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	if w := h.p.routes[0].layer.Entries["203.0.113.1"]; w == nil || w.Count != 3 {
		t.Fatalf("login window %+v, want the three 401s counted, the one turned into a 429 included", w)
	}
}

// exportRoute is a route of ip-keyed exports of cost 10, with room for 100
// of them: the ip layer's points decide.
func exportRoute(c *Config) {
	c.Routes = []config.RouteConfig{{Name: "export", Paths: []string{"/export"}, Key: "ip", Points: 1000, Duration: "60s", Cost: 10}}
}

// TestCostedCountStatusRouteChargesTheCost: a login route of 9 points that
// counts failures at a cost of 3 takes three failures, then refuses: each
// 401 is charged its cost, not 1.
func TestCostedCountStatusRouteChargesTheCost(t *testing.T) {
	costed := func(c *Config) {
		loginConfig(c)
		c.Routes[0].Points = 9
		c.Routes[0].Cost = 3
	}

	addr, _ := redisServer(t)
	redis, _ := redisHarness(t, addr, with(costed, asACLUser))

	for _, tc := range []struct {
		name string
		h    *harness
	}{{"memory", newHarness(t, costed)}, {"redis", redis}} {
		name, h := tc.name, tc.h
		h.p.next = loginBackend

		for i, want := range []int{http.StatusUnauthorized, http.StatusUnauthorized, http.StatusUnauthorized, http.StatusTooManyRequests} {
			if rec := login(h, "bad"); rec.Code != want {
				t.Fatalf("%s: bad login %d: %d, want %d", name, i+1, rec.Code, want)
			}
		}

		if name == "memory" {
			if w := h.p.routes[0].layer.Entries["203.0.113.1"]; w == nil || w.Count != 9 {
				t.Fatalf("memory: login window %+v, want count 9", w)
			}
		}
	}
}

// TestRefusedCostGivesATokenBucketItsTokensBack: an export of cost 3 that
// the route refuses gives the ip bucket, charged before the route, all 3
// tokens back: the 4 tokens left before it are there after it.
func TestRefusedCostGivesATokenBucketItsTokensBack(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1, Duration: "1h", Algorithm: "tokenbucket", Burst: 10}
		c.Routes = []config.RouteConfig{{Name: "export", Paths: []string{"/export"}, Key: "ip", Points: 6, Duration: "1h", Cost: 3}}
	})
	client := "203.0.113.1:1"

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/export", client); rec.Code != want || want == http.StatusTooManyRequests && refusedLayer(rec) != "export" {
			t.Fatalf("export %d: %d (%s), want %d", i+1, rec.Code, refusedLayer(rec), want)
		}
	}

	allowed := 0
	for i := 0; i < 10; i++ {
		if h.get("/api", client).Code == http.StatusOK {
			allowed++
		}

		h.clock.Add(time.Millisecond)
	}

	if allowed != 4 {
		t.Fatalf("%d reads allowed after the refused export, want the 4 tokens left before it", allowed)
	}
}
