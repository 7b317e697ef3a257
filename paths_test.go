package tierlimit

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
)

// shape is a configuration shape: the table of chooseMode and the script of
// the equivalence test run over the same list.
type shape struct {
	name string
	cfg  func(c *Config)
	mode mode
}

// The layers are small so that a short script meets every refusal.
func smallLayers(c *Config) {
	c.Global = config.LayerConfig{Points: 60, Duration: "2s"}
	c.IP = config.LayerConfig{Points: 6, Duration: "1s"}
	c.Assets = config.AssetsConfig{Points: 8, Duration: "3s", PathPrefixes: []string{"/assets/"}}
	c.User = config.LayerConfig{Points: 4, Duration: "2s"}
	c.Service = config.LayerConfig{Points: 7, Duration: "3s"}
	c.Principal.InvalidCredentialStatus = []int{401, 404}
}

func chainEdge(c *Config) {
	smallLayers(c)
	c.Principal.CredentialHeaders = []string{"Authorization"}
	c.Routes = []config.RouteConfig{
		{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Points: 2, Duration: "3s"},
		{Name: "email", Methods: []string{"POST", "PUT"}, Paths: []string{"/users/"}, Points: 3, Duration: "2s"},
	}
}

func principalInstance(c *Config) {
	smallLayers(c)
	c.Principal.UserHeader = "X-Auth-User"
}

// withPlans is the principal instance with plans: pro fixed, free small, a
// plan that is off.
func withPlans(c *Config) {
	principalInstance(c)
	c.Principal.PlanHeader = "X-Auth-Plan"
	c.Plans = map[string]config.PlanConfig{
		"pro":  {Points: 9, Duration: "2s"},
		"free": {Points: 2, Duration: "3s"},
		"open": {Points: 0},
	}
}

func with(base func(c *Config), more func(c *Config)) func(c *Config) {
	return func(c *Config) {
		base(c)
		more(c)
	}
}

var shapes = []shape{
	{"edge", smallLayers, modeAnonymous},
	{"principal", principalInstance, modePrincipal},
	{"principal, credentials not read after ForwardAuth", with(principalInstance, func(c *Config) {
		c.Principal.CredentialHeaders = []string{"Authorization"}
		c.Principal.CredentialCookies = []string{"session"}
	}), modePrincipal},
	{"chain edge", chainEdge, modeClassify},
	{"chain edge, any-method route", with(chainEdge, func(c *Config) {
		c.Routes = append(c.Routes, config.RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 4, Duration: "2s"})
	}), modeClassify},
	{"routes only", with(smallLayers, func(c *Config) {
		c.Routes = []config.RouteConfig{{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Points: 2, Duration: "3s"}}
	}), modeClassify},
	{"status", with(smallLayers, func(c *Config) { c.Status.Path = "/_tierlimit" }), modeAnonymous},
	{"principal with routes", with(principalInstance, func(c *Config) {
		c.Routes = []config.RouteConfig{{Name: "export", Key: "principal", Paths: []string{"/export"}, Points: 3, Duration: "2s"}}
	}), modeClassify},
	{"redis", with(smallLayers, func(c *Config) { c.Store = "redis" }), modeRedis},
	{"dry run", with(chainEdge, func(c *Config) { c.DryRun = true }), modeGeneral},
	{"headers off", with(smallLayers, func(c *Config) { c.Headers = false }), modeGeneral},
	{"sliding", with(smallLayers, func(c *Config) { c.IP.Algorithm = "sliding" }), modeGeneral},
	{"sliding route", with(chainEdge, func(c *Config) { c.Routes[0].Algorithm = "sliding" }), modeClassify},
	{"header keys", with(smallLayers, func(c *Config) { c.IP.Key = "header:X-Api-Key" }), modeGeneral},
	{"host-keyed route", with(chainEdge, func(c *Config) { c.Routes[0].Key = "host" }), modeClassify},
	{"host-keyed ip layer", with(smallLayers, func(c *Config) { c.IP.Key = "host" }), modeGeneral},
	{"token bucket", with(smallLayers, func(c *Config) { c.IP.Algorithm = "tokenbucket"; c.IP.Burst = 3 }), modeGeneral},
	{"concurrency", with(smallLayers, func(c *Config) { c.IP.Algorithm = "concurrency" }), modeGeneral},
	{"concurrency route of a chain edge", with(chainEdge, func(c *Config) { c.Routes[1].Algorithm = "concurrency" }), modeGeneral},
	{"credential cookie", with(chainEdge, func(c *Config) { c.Principal.CredentialCookies = []string{"session"} }), modeGeneral},
	{"credential query", with(chainEdge, func(c *Config) { c.Principal.CredentialQueryParams = []string{"token"} }), modeGeneral},
	{"exempt ip", with(principalInstance, func(c *Config) { c.Exempt.IPs = []string{"203.0.113.7"} }), modeGeneral},
	{"exempt principal", with(principalInstance, func(c *Config) { c.Exempt.Principals = []string{"bob"} }), modeGeneral},
	{"websocket cap", with(smallLayers, func(c *Config) { c.Websocket.MaxConnectionsPerIP = 2 }), modeGeneral},
	{"websocket cap only", func(c *Config) {
		c.Global.Points, c.IP.Points, c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0, 0, 0
		c.Websocket.MaxConnectionsPerIP = 2
	}, modeGeneral},
	{"assets only: a plan can be empty", func(c *Config) {
		c.Global.Points, c.IP.Points = 0, 0
		c.Assets = config.AssetsConfig{Points: 1, Duration: "10s", PathPrefixes: []string{"/assets/"}}
	}, modeGeneral},
	{"ip only, no asset paths", func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 3, Duration: "1s"}
		c.Assets.PathPrefixes = nil
	}, modeAnonymous},
	{"principal with routes, tiers only", with(principalInstance, func(c *Config) {
		c.Global.Points, c.IP.Points, c.Assets.Points = 0, 0, 0
		c.Routes = []config.RouteConfig{{Name: "export", Key: "principal", Paths: []string{"/export"}, Points: 3, Duration: "2s"}}
	}), modeClassify},
	{"principal with plans", withPlans, modePrincipalPlans},
	{"principal with plans, global off", with(withPlans, func(c *Config) { c.Global.Points = 0 }), modePrincipalPlans},
	{"principal with plans and routes", with(withPlans, func(c *Config) {
		c.Routes = []config.RouteConfig{{Name: "export", Key: "principal", Paths: []string{"/export"}, Points: 3, Duration: "2s"}}
	}), modeGeneral},
	{"principal with a sliding plan", with(withPlans, func(c *Config) { c.Plans["pro"] = config.PlanConfig{Points: 5, Duration: "2s", Algorithm: "sliding"} }), modeGeneral},
	{"principal with a token-bucket plan", with(withPlans, func(c *Config) {
		c.Plans["pro"] = config.PlanConfig{Points: 5, Duration: "2s", Algorithm: "tokenbucket", Burst: 3}
	}), modeGeneral},
	{"principal, plan header without plans", with(principalInstance, func(c *Config) { c.Principal.PlanHeader = "X-Auth-Plan" }), modePrincipal},
	{"costed route", with(chainEdge, func(c *Config) {
		c.Routes = append(c.Routes, config.RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 9, Duration: "2s", Cost: 3})
	}), modeClassify},
	{"costed sliding and token-bucket routes", with(chainEdge, func(c *Config) {
		c.IP.Algorithm = "sliding"
		c.Routes = append(c.Routes,
			config.RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 9, Duration: "2s", Cost: 2, Algorithm: "sliding"},
			config.RouteConfig{Name: "search", Paths: []string{"/export", "/api"}, Points: 1, Duration: "2s", Burst: 6, Cost: 3, Algorithm: "tokenbucket"})
	}), modeGeneral},
	{"countStatus route", with(chainEdge, func(c *Config) {
		c.Routes = append(c.Routes, config.RouteConfig{Name: "missing", Paths: []string{"/missing/"}, Points: 2, Duration: "2s", CountStatus: []int{404}})
	}), modeClassify},
	{"countStatus routes, every algorithm, costed", with(chainEdge, func(c *Config) {
		c.Routes[0].CountStatus = []int{200}
		c.Routes = append(c.Routes,
			config.RouteConfig{Name: "missing", Paths: []string{"/missing/"}, Points: 4, Duration: "2s", CountStatus: []int{404}, Cost: 2, Algorithm: "sliding"},
			config.RouteConfig{Name: "missing_bucket", Paths: []string{"/missing/"}, Points: 1, Duration: "2s", Burst: 3, CountStatus: []int{404, 200}, Algorithm: "tokenbucket"})
	}), modeClassify},
	{"blockDuration on a layer and a costed sliding route", with(chainEdge, func(c *Config) {
		c.IP.BlockDuration = "2h"
		c.Routes = append(c.Routes, config.RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 6, Duration: "2s", Cost: 2, Algorithm: "sliding", BlockDuration: "3h"})
	}), modeGeneral},
	{"dry-run routes, every algorithm", with(chainEdge, func(c *Config) {
		c.Routes[0].DryRun = true
		c.Routes = append(c.Routes,
			config.RouteConfig{Name: "export", Paths: []string{"/export", "/api"}, Points: 3, Duration: "2s", Algorithm: "sliding", DryRun: true},
			config.RouteConfig{Name: "search", Paths: []string{"/export", "/users/"}, Points: 1, Duration: "2s", Burst: 2, Cost: 2, Algorithm: "tokenbucket", DryRun: true},
			config.RouteConfig{Name: "missing", Paths: []string{"/missing/"}, Points: 1, Duration: "2s", CountStatus: []int{404}, DryRun: true},
			config.RouteConfig{Name: "export_cap", Paths: []string{"/export"}, Points: 4, Duration: "2s"})
	}), modeClassify},
	{"dry-run ip layer and plan", with(withPlans, func(c *Config) {
		c.IP.DryRun = true
		c.Plans["free"] = config.PlanConfig{Points: 2, Duration: "3s", DryRun: true}
	}), modeGeneral},
	// Calendar windows, with a block, a dry run and a cost on them.
	{"calendar: a day ip layer that blocks, month and day routes", with(chainEdge, func(c *Config) {
		c.IP = config.LayerConfig{Points: 6, Calendar: "day", BlockDuration: "2h"}
		c.Routes[0] = config.RouteConfig{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Points: 2, Calendar: "day", UtcOffset: "+07:00", DryRun: true}
		c.Routes = append(c.Routes, config.RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 9, Calendar: "month", Cost: 3, BlockDuration: "3h"})
	}), modeGeneral},
	{"calendar plans and routes", with(withPlans, func(c *Config) {
		c.User = config.LayerConfig{Points: 4, Calendar: "month"}
		c.Plans["pro"] = config.PlanConfig{Points: 9, Calendar: "week", UtcOffset: "-03:30"}
		c.Plans["free"] = config.PlanConfig{Points: 2, Calendar: "day", DryRun: true}
		c.Routes = []config.RouteConfig{{Name: "export", Key: "principal", Paths: []string{"/export"}, Points: 3, Calendar: "month", Cost: 2}}
	}), modeGeneral},
	{"disabled", with(smallLayers, func(c *Config) { c.Enabled = false }), modeOff},
	{"every layer off", func(c *Config) {
		c.Global.Points, c.IP.Points, c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0, 0, 0
	}, modeOff},
}

func TestChooseMode(t *testing.T) {
	for _, sh := range shapes {
		cfg := CreateConfig()
		sh.cfg(cfg)

		s, err := parse(cfg)
		if err != nil {
			t.Fatalf("%s: %v", sh.name, err)
		}

		if got := chooseMode(s); got != sh.mode {
			t.Errorf("%s: mode %d, want %d", sh.name, got, sh.mode)
		}
	}
}

// TestNewReturnsTheModesHandler: New hands Traefik the handler of the
// instance's fast mode, with or without a status page, so that its requests
// start on that path; the Plugin itself serves the other modes.
func TestNewReturnsTheModesHandler(t *testing.T) {
	for _, sh := range shapes {
		for _, addStatus := range []bool{false, true} {
			status := addStatus
			h := newHarness(t, with(sh.cfg, func(c *Config) {
				if addStatus {
					c.Status.Path = "/_tierlimit"
				}
				status = c.Status.Path != ""
			}))

			var want http.Handler = h.p
			switch sh.mode {
			case modeAnonymous:
				want = (*anonymousPath)(h.p)
			case modePrincipal:
				want = (*principalPath)(h.p)
			case modePrincipalPlans:
				want = (*principalPlansPath)(h.p)
			case modeClassify:
				want = (*classifyPath)(h.p)
			case modeRedis:
				want = (*redisPath)(h.p)
			case modeGeneral:
				want = (*generalPath)(h.p)
			}

			if h.h != want {
				t.Errorf("%s (status page %v): New returned %T, want %T", sh.name, status, h.h, want)
			}
		}
	}
}

// TestChooseModeRedis: redisPath takes the anonymous instance on one Redis
// server or a Sentinel's primary with an ip layer on every plan; every other
// Redis instance is general.
func TestChooseModeRedis(t *testing.T) {
	redis := with(smallLayers, func(c *Config) { c.Store = "redis" })

	for _, sh := range []shape{
		{"redis", redis, modeRedis},
		{"redis, no global", with(redis, func(c *Config) { c.Global.Points = 0 }), modeRedis},
		{"redis, no asset prefixes", with(redis, func(c *Config) { c.Assets.PathPrefixes = nil }), modeRedis},
		{"redis, assets off with prefixes", with(redis, func(c *Config) { c.Assets.Points = 0 }), modeGeneral},
		{"redis, ip off", with(redis, func(c *Config) { c.IP.Points = 0 }), modeGeneral},
		{"redis sentinel", with(redis, func(c *Config) {
			c.Redis.Sentinel = &config.RedisSentinelConfig{MasterName: "m", Addresses: []string{"127.0.0.1:26379"}}
		}), modeRedis},
		{"redis cluster", with(redis, func(c *Config) { c.Redis.Cluster = &config.RedisClusterConfig{Addresses: []string{"127.0.0.1:7000"}} }), modeRedis},
		{"redis cluster, no global", with(redis, func(c *Config) {
			c.Redis.Cluster = &config.RedisClusterConfig{Addresses: []string{"127.0.0.1:7000"}}
			c.Global.Points = 0
		}), modeGeneral},
		{"redis cluster, synced", with(redis, func(c *Config) {
			c.Redis.Cluster = &config.RedisClusterConfig{Addresses: []string{"127.0.0.1:7000"}}
			c.Redis.SyncInterval = "100ms"
		}), modeRedis},
		{"redis, dry run", with(redis, func(c *Config) { c.DryRun = true }), modeGeneral},
		{"redis, headers off", with(redis, func(c *Config) { c.Headers = false }), modeGeneral},
		{"redis, sliding ip", with(redis, func(c *Config) { c.IP.Algorithm = "sliding" }), modeGeneral},
		{"redis, token bucket global", with(redis, func(c *Config) { c.Global.Algorithm = "tokenbucket"; c.Global.Burst = 3 }), modeGeneral},
		{"redis, header-keyed ip", with(redis, func(c *Config) { c.IP.Key = "header:X-Api-Key" }), modeGeneral},
		{"redis, routes", with(redis, func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Points: 2, Duration: "3s"}}
		}), modeGeneral},
		{"redis, credential header", with(redis, func(c *Config) { c.Principal.CredentialHeaders = []string{"Authorization"} }), modeGeneral},
		{"redis, principal", with(redis, func(c *Config) { c.Principal.UserHeader = "X-Auth-User" }), modeGeneral},
		{"redis, principal with plans", with(withPlans, func(c *Config) { c.Store = "redis" }), modeGeneral},
		{"redis, exempt ip", with(redis, func(c *Config) { c.Exempt.IPs = []string{"203.0.113.7"} }), modeGeneral},
		{"redis, websocket cap", with(redis, func(c *Config) { c.Websocket.MaxConnectionsPerIP = 2 }), modeGeneral},
		{"redis, disabled", with(redis, func(c *Config) { c.Enabled = false }), modeOff},
		{"redis, global in memory", with(redis, func(c *Config) { c.Global.Store = "memory" }), modeRedis},
		{"redis, ip in memory", with(redis, func(c *Config) { c.IP.Store = "memory" }), modeGeneral},
		{"redis synced, global in memory", with(redis, func(c *Config) { c.Global.Store = "memory"; c.Redis.SyncInterval = "100ms" }), modeGeneral},
		{"redis, global in memory but off", with(redis, func(c *Config) { c.Global.Store = "memory"; c.Global.Points = 0 }), modeRedis},
		{"redis, ip in redis", with(redis, func(c *Config) { c.IP.Store = "redis" }), modeRedis},
		{"memory, global in memory", with(smallLayers, func(c *Config) { c.Global.Store = "memory" }), modeAnonymous},
	} {
		cfg := CreateConfig()
		sh.cfg(cfg)

		s, err := parse(cfg)
		if err != nil {
			t.Fatalf("%s: %v", sh.name, err)
		}

		if got := chooseMode(s); got != sh.mode {
			t.Errorf("%s: mode %d, want %d", sh.name, got, sh.mode)
		}
	}
}

// TestFastPlansHoldTwoLayers: refuseFast gives back only the layer charged
// before the refusing one, which holds because every plan of a fast mode is
// global and at most one tier bucket. A catalogue row that charged a plan a
// third layer would break that: this fails first.
func TestFastPlansHoldTwoLayers(t *testing.T) {
	for _, sh := range shapes {
		cfg := CreateConfig()
		sh.cfg(cfg)

		h, err := New(context.Background(), http.NotFoundHandler(), cfg, "twolayers-"+sh.name+"@test")
		if err != nil {
			t.Fatalf("%s: %v", sh.name, err)
		}

		var p *Plugin
		switch v := h.(type) {
		case *Plugin:
			p = v
		case *anonymousPath:
			p = (*Plugin)(v)
		case *principalPath:
			p = (*Plugin)(v)
		case *principalPlansPath:
			p = (*Plugin)(v)
		case *classifyPath:
			p = (*Plugin)(v)
		case *redisPath:
			p = (*Plugin)(v)
		case *generalPath:
			p = (*Plugin)(v)
		}

		if p.mode != modeAnonymous && p.mode != modePrincipal && p.mode != modeClassify && p.mode != modePrincipalPlans {
			continue
		}

		held := map[string][]*rule.Layer{"ip": p.planIP, "assets": p.planAssets, "user": p.planUser, "service": p.planService, "cred": p.planCred}
		for name, plan := range p.planNamed {
			held["plans."+name] = plan
		}

		for name, plan := range held {
			if len(plan) > 2 {
				t.Errorf("%s: plan %s holds %d layers; a fast path's give-back handles two", sh.name, name, len(plan))
			}
		}
	}
}

// compact is takeScript's one-integer reply for an allowed request.
func compact(left, resetMs, window, i int64) string {
	return ":" + strconv.FormatInt((left*(window+1)+resetMs)*16+i, 10) + "\r\n"
}

// TestServeRedisReadsTheOneIntegerReply: redisPath shows the layer, the
// requests left and the reset the integer packs, and sends its plan's call.
func TestServeRedisReadsTheOneIntegerReply(t *testing.T) {
	srv := newCannedRedis(t, compact(1, 42000, 60000, 1))
	h, logs := redisHarness(t, srv.l.Addr().String(), func(c *Config) {
		c.Global = config.LayerConfig{Points: 100, Duration: "10s"}
	})

	if h.p.mode != modeRedis {
		t.Fatalf("mode %d, want modeRedis", h.p.mode)
	}

	rec := h.get("/api", "203.0.113.9:1")
	reset := h.clock.Now().Add(43*time.Second - 1).Unix() // rounded up

	if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "1" || rec.Header().Get("X-RateLimit-Limit") != "3" ||
		rec.Header().Get("X-RateLimit-Reset") != strconv.FormatInt(reset, 10) || rec.Header().Get("RateLimit") != `"ip";r=1;t=42` {
		t.Fatalf("%d %v, want ip with 1 left, reset in 42s", rec.Code, rec.Header())
	}

	sum := sha1.Sum([]byte(redisstore.TakeScript))
	want := []string{"EVALSHA", hex.EncodeToString(sum[:]), "2", h.p.fast.store.Prefix + "global:global", h.p.fast.store.Prefix + "ip:203.0.113.9",
		"2", "1", "100", "10000", "0", "0", "3", "60000", "0", "0"}
	srv.mu.Lock()
	got := srv.last
	srv.mu.Unlock()

	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("command %q, want %q", got, want)
	}

	if logs.Len() != 0 {
		t.Fatalf("decided in memory: %s", logs)
	}

	// The fallback remembers what Redis reported of the layer shown
	// (redisstore/fallback.go): 2 of 3 in use.
	if n := peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", "203.0.113.9"); n != 2 {
		t.Fatalf("memory count %d, want 2, the count Redis reported", n)
	}
}

// TestServeRedisRejectsIntegersOutOfRange: an integer naming no layer of
// the plan, or more requests left than the layer's points, is a bad reply:
// memory decides and Redis is reported unavailable.
func TestServeRedisRejectsIntegersOutOfRange(t *testing.T) {
	for name, reply := range map[string]string{
		"layer beyond the plan": compact(1, 42000, 60000, 2),
		"left at the points":    compact(3, 42000, 60000, 1),
		"negative":              ":-5\r\n",
	} {
		srv := newCannedRedis(t, reply)
		h, logs := redisHarness(t, srv.l.Addr().String(), func(c *Config) {
			c.Global = config.LayerConfig{Points: 100, Duration: "10s"}
		})

		rec := h.get("/api", "203.0.113.9:1")
		if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "2" ||
			peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", "203.0.113.9") != 1 || !strings.Contains(logs.String(), "REDIS_UNAVAILABLE") {
			t.Errorf("%s: %d %v %q, want the memory store's decision", name, rec.Code, rec.Header(), logs)
		}
	}
}

// TestServeRedisWithAKeyBlocked: a blocked client is refused without a
// Redis call while the others keep being served by the script.
func TestServeRedisWithAKeyBlocked(t *testing.T) {
	srv := newCannedRedis(t, "*2\r\n:4\r\n:30000\r\n") // ip: count 4 of 3
	h, _ := redisHarness(t, srv.l.Addr().String(), nil)

	if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("first refusal: %d", rec.Code)
	}

	srv.setReply(compact(1, 5000, 60000, 0)) // memory would leave 2

	for i := 0; i < 2; i++ {
		calls := srv.commands.Load()

		if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusTooManyRequests || srv.commands.Load() != calls {
			t.Fatalf("blocked client: %d after %d Redis calls, want a 429 without one", rec.Code, srv.commands.Load()-calls)
		}

		rec := h.get("/api", "203.0.113.10:1")
		if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "1" || srv.commands.Load() != calls+1 {
			t.Fatalf("other client: %d %v after %d Redis calls, want the script's decision", rec.Code, rec.Header(), srv.commands.Load()-calls)
		}
	}

	// The blocked refusal, from the layer's refusal cache, is the store's own
	// (refuseBlockedGeneral), headers and body, as the seconds to the reset
	// go down (the cache is refreshed) and the second turns.
	for _, step := range []time.Duration{0, 0, 700 * time.Millisecond, 1100 * time.Millisecond, 28 * time.Second} {
		h.clock.Add(step)

		fast := h.get("/api", "203.0.113.9:1")
		general := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.RemoteAddr = "203.0.113.9:1"

		if !refuseBlockedGeneral(h.p, general, req, h.p.planIP, "203.0.113.9", h.p.now().UnixNano()) {
			t.Fatalf("after %v: the store's code does not find the key blocked", step)
		}

		if fast.Code != general.Code || !reflect.DeepEqual(fast.Header(), general.Header()) || fast.Body.String() != general.Body.String() {
			t.Fatalf("after %v: the blocked refusal\n%d %v %s\nwant the store's\n%d %v %s", step,
				fast.Code, fast.Header(), fast.Body, general.Code, general.Header(), general.Body)
		}
	}
}

// TestMixedPathShowsTheLayerWithFewestLeft: on a Redis instance with global
// counted in memory (mixedPath), the headers show the layer of either store
// with the fewest requests left, and of equals the first (global), as one
// take of every layer would (rule.MergeTally).
func TestMixedPathShowsTheLayerWithFewestLeft(t *testing.T) {
	addr, _ := redisServer(t)

	for _, c := range []struct {
		name              string
		global, ip        int
		policy, remaining string
	}{
		{"fewest left in memory", 5, 10, `"global";q=5;`, "4"},
		{"fewest left in Redis", 10, 5, `"ip";q=5;`, "4"},
		{"equal: the first", 10, 10, `"global";q=10;`, "9"},
	} {
		h, _ := redisHarness(t, addr, func(cfg *Config) {
			cfg.Global = config.LayerConfig{Points: c.global, Duration: "1h", Store: "memory"}
			cfg.IP = config.LayerConfig{Points: c.ip, Duration: "1h"}
		})

		if _, ok := h.h.(*mixedPath); !ok {
			t.Fatalf("%s: handler %T, want mixedPath", c.name, h.h)
		}

		rec := h.get("/api", "203.0.113.9:1")
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: %d, want 200", c.name, rec.Code)
		}

		if p := rec.Header().Get("RateLimit-Policy"); !strings.HasPrefix(p, c.policy) || rec.Header().Get("X-RateLimit-Remaining") != c.remaining {
			t.Errorf("%s: RateLimit-Policy %q, X-RateLimit-Remaining %q; want %s..., %s", c.name, p, rec.Header().Get("X-RateLimit-Remaining"), c.policy, c.remaining)
		}
	}
}

// TestMixedPathOnACluster: with global counted in memory, an instance on a
// Redis Cluster takes mixedPath, its call on the node of the client's slot:
// ip is counted in Redis under the key the general path uses (the client
// its hash tag), global in memory, and ip's refusal gives global its point
// back.
func TestMixedPathOnACluster(t *testing.T) {
	addr, admin := clusterNode(t)

	h := newHarness(t, func(c *Config) {
		c.Store = "redis"
		c.Redis.Cluster = &config.RedisClusterConfig{Addresses: []string{addr}}
		c.Redis.Timeout = "2s"
		c.Global = config.LayerConfig{Points: 100, Duration: "1h", Store: "memory"}
		c.IP = config.LayerConfig{Points: 2, Duration: "1h"}
	})

	if _, ok := h.h.(*mixedPath); !ok {
		t.Fatalf("handler %T, want mixedPath", h.h)
	}

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", "203.0.113.9:1"); rec.Code != want {
			t.Fatalf("request %d: %d, want %d", i, rec.Code, want)
		}
	}

	key := h.p.planIP[1].RedisKey + "{203.0.113.9}"
	if v := redisDo(t, admin, "GET", key).Str; v != "2" {
		t.Fatalf("%s in Redis: %q, want 2", key, v)
	}

	// The path's own call, not the general path after a failed one: it
	// names that key, and the node answered no call with an error.
	client := "203.0.113.9"
	rp := h.p.fast.ip
	if cmd := rp.heads[len(client)] + client + rp.tail; !strings.Contains(cmd, "$"+strconv.Itoa(len(key))+"\r\n"+key+"\r\n") {
		t.Fatalf("mixedPath's call %q does not name %s", cmd, key)
	}

	// NOSCRIPT: the script's first call, which loads it.
	for _, line := range strings.Split(redisDo(t, admin, "INFO", "errorstats").Str, "\r\n") {
		if strings.HasPrefix(line, "errorstat_") && !strings.HasPrefix(line, "errorstat_NOSCRIPT:") {
			t.Fatalf("the node answered an error: %s", line)
		}
	}

	if n := peekCount(h.p.memory, h.clock.Now().UnixNano(), "global", "global"); n != 2 {
		t.Fatalf("global in memory: %d after 2 allowed and 1 refused by ip, want 2", n)
	}
}

// TestRoutedFastPathGivesBackWhatARefusalCharged: on serveRoutedFast, a
// route that refuses a request gives the layers charged before it (ip, at
// the route's cost) their points back: the refused request changes no
// count.
func TestRoutedFastPathGivesBackWhatARefusalCharged(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 10, Duration: "1h"}
		c.Routes = []config.RouteConfig{{Name: "export", Key: "ip", Paths: []string{"/export"}, Points: 5, Duration: "1h", Cost: 3}}
	})

	if !h.p.routedFast {
		t.Fatal("the instance's route matches are not charged on serveRoutedFast")
	}

	client := "203.0.113.5:1"
	if rec := h.get("/export", client); rec.Code != http.StatusOK {
		t.Fatalf("export 1: %d, want 200", rec.Code)
	}

	// ip would reach 6, export 6 > 5: refused.
	if rec := h.get("/export", client); rec.Code != http.StatusTooManyRequests || refusedLayer(rec) != "export" {
		t.Fatalf("export 2: %d (%s), want 429 by export", rec.Code, refusedLayer(rec))
	}

	// ip holds export 1's 3 points, and now this request's 1.
	if rec := h.get("/api", client); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "6" {
		t.Fatalf("api: %d, remaining %q, want 200 and 6 (ip charged 3 by the allowed export only)", rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
}

// TestCountedFastPathLeavesACheckedRouteAlone: on serveCountedFast, a route
// that refuses after a countStatus route was checked gives back only what
// was charged: the countStatus route's count, which the check did not
// raise, stays what its listed answers made it.
func TestCountedFastPathLeavesACheckedRouteAlone(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		loginConfig(c)
		c.Routes = append(c.Routes, config.RouteConfig{Name: "login_any", Methods: []string{"POST"}, Paths: []string{"/login"}, Points: 2, Duration: "60s"})
	})
	h.p.next = loginBackend

	if !h.p.countedFast {
		t.Fatal("the instance's route matches are not charged on serveCountedFast")
	}

	for i, want := range []int{http.StatusUnauthorized, http.StatusUnauthorized, http.StatusTooManyRequests} {
		if rec := login(h, "bad"); rec.Code != want {
			t.Fatalf("bad login %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	if n := peekCount(h.p.memory, h.clock.Now().UnixNano(), "login", "203.0.113.1"); n != 2 {
		t.Fatalf("login holds %d after two 401s and a refusal by login_any, want 2", n)
	}
}

// TestRouteExactPathMatchesWithATrailingSlash: a route's exact path
// matches the request path with or without a trailing slash, so that
// "/login/" cannot walk around the limit of "/login".
func TestRouteExactPathMatchesWithATrailingSlash(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Routes = []config.RouteConfig{{Name: "login", Key: "ip", Paths: []string{"/login"}, Points: 1, Duration: "1h"}}
	})

	if rec := h.get("/login", "203.0.113.8:1"); rec.Code != http.StatusOK {
		t.Fatalf("/login: %d, want 200", rec.Code)
	}

	if rec := h.get("/login/", "203.0.113.8:1"); rec.Code != http.StatusTooManyRequests || refusedLayer(rec) != "login" {
		t.Fatalf("/login/ after /login: %d (%s), want 429 by login", rec.Code, refusedLayer(rec))
	}
}

// routePlugin is an instance with the login route, an asset prefix
// and an IP tier, on a fixed clock.
func routePlugin(t *testing.T, edit func(*Config)) *harness {
	t.Helper()

	return newHarness(t, func(cfg *Config) {
		cfg.Global.Points = 0
		cfg.IP = config.LayerConfig{Points: 1000, Duration: "60s"}
		cfg.Assets.PathPrefixes = []string{"/assets/"}
		cfg.Routes = []config.RouteConfig{{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Key: "ip", Points: 2, Duration: "60s"}}

		if edit != nil {
			edit(cfg)
		}
	})
}

// Every spelling a backend reads as the login is refused once the login's
// budget is spent; the request reaches the backend as it came.
func TestRouteMatchesCanonicalPath(t *testing.T) {
	h := routePlugin(t, nil)

	for i := 0; i < 2; i++ {
		if rec := serveOne(h, "POST", "/auth/login"); rec.Code != http.StatusOK {
			t.Fatalf("login %d: status %d, want 200", i, rec.Code)
		}
	}

	for _, p := range []string{
		"/auth/login", "/auth/login/", "/AUTH/LOGIN", "/Auth/Login", "/auth/login;jsessionid=1",
		"/assets/../auth/login", "//auth/login", "/auth/./login", "/auth//login", `/auth\login`, "/auth/%6Cogin",
	} {
		rec := serveOne(h, "POST", p)
		if rec.Code != http.StatusTooManyRequests {
			t.Errorf("POST %s: status %d, want 429", p, rec.Code)
		}
	}

	for _, p := range []string{"/auth/loginx", "/auth/log", "/auth"} {
		if rec := serveOne(h, "POST", p); rec.Code != http.StatusOK {
			t.Errorf("POST %s: status %d, want 200 (not the login)", p, rec.Code)
		}
	}
}

// With caseSensitive, only the configured case is the route; without, every
// case is, whichever case the asset prefixes (which set the form each
// request's path is canonicalised in) take.
func TestRouteCaseSensitive(t *testing.T) {
	for _, tt := range []struct {
		route, assets bool // caseSensitive
	}{{true, false}, {true, true}, {false, true}, {false, false}} {
		h := routePlugin(t, func(c *Config) {
			c.Routes[0].CaseSensitive = tt.route
			c.Assets.CaseSensitive = tt.assets
		})

		for i := 0; i < 2; i++ {
			serveOne(h, "POST", "/auth/login")
		}

		want := http.StatusTooManyRequests
		if tt.route {
			want = http.StatusOK
		}

		if rec := serveOne(h, "POST", "/AUTH/LOGIN"); rec.Code != want {
			t.Errorf("route caseSensitive %v, assets %v: POST /AUTH/LOGIN: status %d, want %d", tt.route, tt.assets, rec.Code, want)
		}

		if rec := serveOne(h, "POST", "/auth/login/"); rec.Code != http.StatusTooManyRequests {
			t.Errorf("route caseSensitive %v, assets %v: POST /auth/login/: status %d, want 429", tt.route, tt.assets, rec.Code)
		}
	}
}

// An asset prefix is matched on the canonical path: a climb out of it is not
// an asset, a spelling of it is (case-insensitively unless assets.caseSensitive).
func TestAssetsCanonicalPath(t *testing.T) {
	for _, caseSensitive := range []bool{false, true} {
		h := routePlugin(t, func(c *Config) {
			c.Routes = nil
			c.Assets.CaseSensitive = caseSensitive
		})

		tests := []struct {
			path  string
			layer string
		}{
			{"/assets/app.js", "assets"},
			{"/assets//app.js", "assets"},
			{"/assets/;x/app.js", "assets"},
			{"/assets/", "assets"},
			{"/assets", "ip"},
			{"/assets/../auth/login", "ip"},
			{"/assets/..;/auth/login", "ip"},
			{"/assets/x/../../auth/login", "ip"},
			{"/ASSETS/app.js", map[bool]string{false: "assets", true: "ip"}[caseSensitive]},
			{"/assetsx/app.js", "ip"},
		}

		for _, tt := range tests {
			rec := serveOne(h, "GET", tt.path)
			if got := layerOf(rec); got != tt.layer {
				t.Errorf("caseSensitive %v, GET %s: charged to %q, want %q", caseSensitive, tt.path, got, tt.layer)
			}
		}
	}
}

// serveOne serves a request whose decoded path is path, as Go's server
// leaves it (httptest.NewRequest would parse it as a URL).
func serveOne(h *harness, method, path string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "http://example.test/", nil)
	req.URL.Path = path
	req.RemoteAddr = "192.0.2.1:1234"
	rec := httptest.NewRecorder()
	h.h.ServeHTTP(rec, req)

	return rec
}

// layerOf is the layer the rate-limit headers show: `"name";r=...`.
func layerOf(rec *httptest.ResponseRecorder) string {
	v := rec.Header().Get("Ratelimit")
	if i := strings.Index(v, `";`); strings.HasPrefix(v, `"`) && i > 0 {
		return v[1:i]
	}

	return ""
}

// Compiled figures for the same paths as e2e/yaegibench (which measures them
// under Yaegi, as Traefik runs them): `go test -run '^$' -bench . -benchmem`.

type benchSink struct{ h http.Header }

func (s *benchSink) Header() http.Header         { return s.h }
func (s *benchSink) Write(b []byte) (int, error) { return len(b), nil }
func (s *benchSink) WriteHeader(int)             {}

func benchRequests(n int) []*http.Request {
	out := make([]*http.Request, n)

	for i := range out {
		req, _ := http.NewRequest(http.MethodGet, "http://example.com/api/items", nil)
		req.RemoteAddr = fmt.Sprintf("100.64.%d.%d:40000", i/256, i%256)
		out[i] = req
	}

	return out
}

func benchServe(b *testing.B, h http.Handler) {
	reqs := benchRequests(1000)
	w := &benchSink{h: http.Header{}}

	b.ReportAllocs()
	b.ResetTimer()

	for i := 0; i < b.N; i++ {
		for k := range w.h {
			delete(w.h, k)
		}

		h.ServeHTTP(w, reqs[i%len(reqs)])
	}
}

func benchPlugin(b *testing.B, mutate func(c *Config)) http.Handler {
	cfg := CreateConfig()
	cfg.Global = config.LayerConfig{Points: 1000000000, Duration: "1s"}

	if mutate != nil {
		mutate(cfg)
	}

	h, err := New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, b.Name()+"@bench")
	if err != nil {
		b.Fatal(err)
	}

	pluginOf(h).events = events.NewEventLog(io.Discard, "bench")

	return h
}

func BenchmarkPassthrough(b *testing.B) {
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	benchServe(b, http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.Header().Set("X-Passthrough", "1")
		next.ServeHTTP(rw, req)
	}))
}

func BenchmarkEdge(b *testing.B) {
	benchServe(b, benchPlugin(b, nil))
}

func BenchmarkEdgeRefused(b *testing.B) {
	benchServe(b, benchPlugin(b, func(c *Config) { c.IP = config.LayerConfig{Points: 1, Duration: "1h"} }))
}

func BenchmarkEdgeParallel(b *testing.B) {
	h := benchPlugin(b, nil)
	reqs := benchRequests(1000)

	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := &benchSink{h: http.Header{}}
		i := 0

		for pb.Next() {
			for k := range w.h {
				delete(w.h, k)
			}

			h.ServeHTTP(w, reqs[i%len(reqs)])
			i++
		}
	})
}
