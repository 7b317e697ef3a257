package tierlimit

import (
	"context"
	"net/http"
	"testing"
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
	c.Global = LayerConfig{Points: 60, Duration: "2s"}
	c.IP = LayerConfig{Points: 6, Duration: "1s"}
	c.Assets = AssetsConfig{Points: 8, Duration: "3s", PathPrefixes: []string{"/assets/"}}
	c.User = LayerConfig{Points: 4, Duration: "2s"}
	c.Service = LayerConfig{Points: 7, Duration: "3s"}
	c.Principal.InvalidCredentialStatus = []int{401, 404}
}

func chainEdge(c *Config) {
	smallLayers(c)
	c.Principal.CredentialHeaders = []string{"Authorization"}
	c.Routes = []RouteConfig{
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
	c.Plans = map[string]PlanConfig{
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
		c.Routes = append(c.Routes, RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 4, Duration: "2s"})
	}), modeClassify},
	{"routes only", with(smallLayers, func(c *Config) {
		c.Routes = []RouteConfig{{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Points: 2, Duration: "3s"}}
	}), modeClassify},
	{"status", with(smallLayers, func(c *Config) { c.Status.Path = "/_tierlimit" }), modeAnonymous},
	{"principal with routes", with(principalInstance, func(c *Config) {
		c.Routes = []RouteConfig{{Name: "export", Key: "principal", Paths: []string{"/export"}, Points: 3, Duration: "2s"}}
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
		c.Assets = AssetsConfig{Points: 1, Duration: "10s", PathPrefixes: []string{"/assets/"}}
	}, modeGeneral},
	{"ip only, no asset paths", func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 3, Duration: "1s"}
		c.Assets.PathPrefixes = nil
	}, modeAnonymous},
	{"principal with routes, tiers only", with(principalInstance, func(c *Config) {
		c.Global.Points, c.IP.Points, c.Assets.Points = 0, 0, 0
		c.Routes = []RouteConfig{{Name: "export", Key: "principal", Paths: []string{"/export"}, Points: 3, Duration: "2s"}}
	}), modeClassify},
	{"principal with plans", withPlans, modePrincipalPlans},
	{"principal with plans, global off", with(withPlans, func(c *Config) { c.Global.Points = 0 }), modePrincipalPlans},
	{"principal with plans and routes", with(withPlans, func(c *Config) {
		c.Routes = []RouteConfig{{Name: "export", Key: "principal", Paths: []string{"/export"}, Points: 3, Duration: "2s"}}
	}), modeGeneral},
	{"principal with a sliding plan", with(withPlans, func(c *Config) { c.Plans["pro"] = PlanConfig{Points: 5, Duration: "2s", Algorithm: "sliding"} }), modeGeneral},
	{"principal with a token-bucket plan", with(withPlans, func(c *Config) {
		c.Plans["pro"] = PlanConfig{Points: 5, Duration: "2s", Algorithm: "tokenbucket", Burst: 3}
	}), modeGeneral},
	{"principal, plan header without plans", with(principalInstance, func(c *Config) { c.Principal.PlanHeader = "X-Auth-Plan" }), modePrincipal},
	{"costed route", with(chainEdge, func(c *Config) {
		c.Routes = append(c.Routes, RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 9, Duration: "2s", Cost: 3})
	}), modeClassify},
	{"costed sliding and token-bucket routes", with(chainEdge, func(c *Config) {
		c.IP.Algorithm = "sliding"
		c.Routes = append(c.Routes,
			RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 9, Duration: "2s", Cost: 2, Algorithm: "sliding"},
			RouteConfig{Name: "search", Paths: []string{"/export", "/api"}, Points: 1, Duration: "2s", Burst: 6, Cost: 3, Algorithm: "tokenbucket"})
	}), modeGeneral},
	{"countStatus route", with(chainEdge, func(c *Config) {
		c.Routes = append(c.Routes, RouteConfig{Name: "missing", Paths: []string{"/missing/"}, Points: 2, Duration: "2s", CountStatus: []int{404}})
	}), modeClassify},
	{"countStatus routes, every algorithm, costed", with(chainEdge, func(c *Config) {
		c.Routes[0].CountStatus = []int{200}
		c.Routes = append(c.Routes,
			RouteConfig{Name: "missing", Paths: []string{"/missing/"}, Points: 4, Duration: "2s", CountStatus: []int{404}, Cost: 2, Algorithm: "sliding"},
			RouteConfig{Name: "missing_bucket", Paths: []string{"/missing/"}, Points: 1, Duration: "2s", Burst: 3, CountStatus: []int{404, 200}, Algorithm: "tokenbucket"})
	}), modeClassify},
	{"blockDuration on a layer and a costed sliding route", with(chainEdge, func(c *Config) {
		c.IP.BlockDuration = "2h"
		c.Routes = append(c.Routes, RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 6, Duration: "2s", Cost: 2, Algorithm: "sliding", BlockDuration: "3h"})
	}), modeGeneral},
	{"dry-run routes, every algorithm", with(chainEdge, func(c *Config) {
		c.Routes[0].DryRun = true
		c.Routes = append(c.Routes,
			RouteConfig{Name: "export", Paths: []string{"/export", "/api"}, Points: 3, Duration: "2s", Algorithm: "sliding", DryRun: true},
			RouteConfig{Name: "search", Paths: []string{"/export", "/users/"}, Points: 1, Duration: "2s", Burst: 2, Cost: 2, Algorithm: "tokenbucket", DryRun: true},
			RouteConfig{Name: "missing", Paths: []string{"/missing/"}, Points: 1, Duration: "2s", CountStatus: []int{404}, DryRun: true},
			RouteConfig{Name: "export_cap", Paths: []string{"/export"}, Points: 4, Duration: "2s"})
	}), modeClassify},
	{"dry-run ip layer and plan", with(withPlans, func(c *Config) {
		c.IP.DryRun = true
		c.Plans["free"] = PlanConfig{Points: 2, Duration: "3s", DryRun: true}
	}), modeGeneral},
	// Calendar windows, with a block, a dry run and a cost on them.
	{"calendar: a day ip layer that blocks, month and day routes", with(chainEdge, func(c *Config) {
		c.IP = LayerConfig{Points: 6, Calendar: "day", BlockDuration: "2h"}
		c.Routes[0] = RouteConfig{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Points: 2, Calendar: "day", UtcOffset: "+07:00", DryRun: true}
		c.Routes = append(c.Routes, RouteConfig{Name: "export", Paths: []string{"/export"}, Points: 9, Calendar: "month", Cost: 3, BlockDuration: "3h"})
	}), modeGeneral},
	{"calendar plans and routes", with(withPlans, func(c *Config) {
		c.User = LayerConfig{Points: 4, Calendar: "month"}
		c.Plans["pro"] = PlanConfig{Points: 9, Calendar: "week", UtcOffset: "-03:30"}
		c.Plans["free"] = PlanConfig{Points: 2, Calendar: "day", DryRun: true}
		c.Routes = []RouteConfig{{Name: "export", Key: "principal", Paths: []string{"/export"}, Points: 3, Calendar: "month", Cost: 2}}
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
			c.Redis.Sentinel = &RedisSentinelConfig{MasterName: "m", Addresses: []string{"127.0.0.1:26379"}}
		}), modeRedis},
		{"redis cluster", with(redis, func(c *Config) { c.Redis.Cluster = &RedisClusterConfig{Addresses: []string{"127.0.0.1:7000"}} }), modeGeneral},
		{"redis, dry run", with(redis, func(c *Config) { c.DryRun = true }), modeGeneral},
		{"redis, headers off", with(redis, func(c *Config) { c.Headers = false }), modeGeneral},
		{"redis, sliding ip", with(redis, func(c *Config) { c.IP.Algorithm = "sliding" }), modeGeneral},
		{"redis, token bucket global", with(redis, func(c *Config) { c.Global.Algorithm = "tokenbucket"; c.Global.Burst = 3 }), modeGeneral},
		{"redis, header-keyed ip", with(redis, func(c *Config) { c.IP.Key = "header:X-Api-Key" }), modeGeneral},
		{"redis, routes", with(redis, func(c *Config) {
			c.Routes = []RouteConfig{{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Points: 2, Duration: "3s"}}
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
		}

		if p.mode != modeAnonymous && p.mode != modePrincipal && p.mode != modeClassify && p.mode != modePrincipalPlans {
			continue
		}

		held := map[string][]*layer{"ip": p.planIP, "assets": p.planAssets, "user": p.planUser, "service": p.planService, "cred": p.planCred}
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
