package tierlimit

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
)

func TestDefaultsMatchDesign(t *testing.T) {
	s, err := parse(CreateConfig())
	if err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}

	layers := []struct {
		got    config.Rule
		points int64
		d      time.Duration
	}{
		{s.Spec(layerGlobal), 1000, time.Second},
		{s.Spec(layerIP), 50, time.Second},
		{s.Spec(layerAssets), 300, time.Second},
		{s.Spec(layerUser), 300, time.Minute},
		{s.Spec(layerService), 10000, time.Minute},
	}
	for _, l := range layers {
		if l.got.Points != l.points || l.got.Duration != l.d {
			t.Errorf("%s: %d/%s, want %d/%s", l.got.Name, l.got.Points, l.got.Duration, l.points, l.d)
		}
	}

	if !s.Enabled || s.DryRun || !s.Headers || s.Store != "memory" || s.KeyPrefix != "ratelimit" ||
		s.MaxTracked != 100000 || s.IPv6Prefix != 64 || s.Hops != 0 || len(s.Proxies) != 6 ||
		len(s.AssetPaths) != 1 || s.AssetPaths[0] != "/assets/" || len(s.Routes) != 0 ||
		s.UserHeader != "" || s.ServiceHeader != "X-Auth-Service-Account" ||
		!s.InvalidCode[401] || len(s.InvalidCode) != 1 ||
		s.Redis.DialTimeout != 250*time.Millisecond || s.Redis.Timeout != 100*time.Millisecond || s.Redis.PoolSize != 16 || s.Redis.Address != "127.0.0.1:6379" || s.WSMaxPerIP != 0 {
		t.Fatalf("defaults differ from README.md: %+v", s)
	}
}

func TestInvalidConfigurationNamesFieldAndValue(t *testing.T) {
	cases := []struct {
		field, value string
		mutate       func(c *Config)
	}{
		{"store", "etcd", func(c *Config) { c.Store = "etcd" }},
		{"global.store", "disk", func(c *Config) { c.Store = "redis"; c.Global.Store = "disk" }},
		{"ip.store", "redis", func(c *Config) { c.IP.Store = "redis" }},
		{"assets.store", "Memory", func(c *Config) { c.Assets.Store = "Memory" }},
		{"routes[0].store", "redis", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "login", Paths: []string{"/x"}, Points: 1, Duration: "1s", Store: "redis"}}
		}},
		{"plans.gold.store", "redis", func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-User", "X-Plan"
			c.Plans = map[string]PlanConfig{"gold": {Points: 1, Duration: "1s", Store: "redis"}}
		}},
		{"keyPrefix", "rate limit", func(c *Config) { c.KeyPrefix = "rate limit" }},
		{"trustedProxies[1]", "10.0.0.0/33", func(c *Config) { c.TrustedProxies = []string{"10.0.0.0/8", "10.0.0.0/33"} }},
		{"trustedProxies[0]", "proxy.local", func(c *Config) { c.TrustedProxies = []string{"proxy.local"} }},
		{"trustedHops", "-1", func(c *Config) { c.TrustedHops = -1 }},
		{"trustedProxies", "10.1.0.0/16", func(c *Config) { c.TrustedHops = 2; c.TrustedProxies = []string{"10.1.0.0/16"} }},
		{"ipv6PrefixLength", "0", func(c *Config) { c.IPv6PrefixLength = 0 }},
		{"ipv6PrefixLength", "129", func(c *Config) { c.IPv6PrefixLength = 129 }},
		{"maxTracked", "0", func(c *Config) { c.MaxTracked = 0 }},
		{"maxTracked", "-5", func(c *Config) { c.MaxTracked = -5 }},
		{"global.points", "-1", func(c *Config) { c.Global.Points = -1 }},
		{"global.duration", "soon", func(c *Config) { c.Global.Duration = "soon" }},
		{"ip.points", "-50", func(c *Config) { c.IP.Points = -50 }},
		{"ip.duration", "1s", func(c *Config) { c.IP.Calendar, c.IP.Duration = "day", "1s" }},
		{"ip.duration", "0s", func(c *Config) { c.IP.Duration = "0s" }},
		{"ip.duration", "-1s", func(c *Config) { c.IP.Duration = "-1s" }},
		{"ip.duration", "-3", func(c *Config) { c.IP.Duration = "-3" }},
		{"ip.duration", "1us", func(c *Config) { c.IP.Duration = "1us" }},
		{"assets.points", "-1", func(c *Config) { c.Assets.Points = -1 }},
		{"assets.duration", "1x", func(c *Config) { c.Assets.Duration = "1x" }},
		{"assets.pathPrefixes[1]", "static/", func(c *Config) { c.Assets.PathPrefixes = []string{"/assets/", "static/"} }},
		{"user.points", "-1", func(c *Config) { c.User.Points = -1 }},
		{"user.duration", "forever", func(c *Config) { c.User.Duration = "forever" }},
		{"service.points", "-1", func(c *Config) { c.Service.Points = -1 }},
		{"service.duration", "100000000", func(c *Config) { c.Service.Duration = "100000000" }},
		{"routes[0].name", "", func(c *Config) { c.Routes = []RouteConfig{{Paths: []string{"/x"}, Points: 1, Duration: "1s"}} }},
		{"routes[0].name", "websocket", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "websocket", Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[0].name", "ip", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "ip", Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[0].name", "log in", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "log in", Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[1].name", "login", func(c *Config) {
			c.Routes = []RouteConfig{
				{Name: "login", Paths: []string{"/x"}, Points: 1, Duration: "1s"},
				{Name: "login", Paths: []string{"/y"}, Points: 1, Duration: "1s"},
			}
		}},
		{"routes[0].key", "session", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/x"}, Key: "session", Points: 1, Duration: "1s"}}
		}},
		{"routes[0].points", "-2", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: -2, Duration: "1s"}}
		}},
		{"routes[0].duration", "1 minute", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: 1, Duration: "1 minute"}}
		}},
		{"routes[0].methods[1]", "PO ST", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Methods: []string{"GET", "PO ST"}, Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[0].paths", "", func(c *Config) { c.Routes = []RouteConfig{{Name: "r", Points: 1, Duration: "1s"}} }},
		{"routes[0].paths[0]", "auth/login", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"auth/login"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[0].paths[1]", "/auth/login?next=/", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/x", "/auth/login?next=/"}, Points: 1, Duration: "1s"}}
		}},
		{"assets.pathPrefixes[0]", "/static files/", func(c *Config) { c.Assets.PathPrefixes = []string{"/static files/"} }},
		{"principal.userHeader", "X Auth User", func(c *Config) { c.Principal.UserHeader = "X Auth User" }},
		{"principal.serviceAccountHeader", "X:SA", func(c *Config) { c.Principal.ServiceAccountHeader = "X:SA" }},
		{"principal.credentialHeaders[0]", "", func(c *Config) { c.Principal.CredentialHeaders = []string{""} }},
		{"principal.credentialCookies[0]", "a=b", func(c *Config) { c.Principal.CredentialCookies = []string{"a=b"} }},
		{"principal.credentialQueryParams[0]", "", func(c *Config) { c.Principal.CredentialQueryParams = []string{""} }},
		{"principal.invalidCredentialStatus[1]", "4010", func(c *Config) { c.Principal.InvalidCredentialStatus = []int{401, 4010} }},
		{"redis.dialTimeout", "fast", func(c *Config) { c.Redis.DialTimeout = "fast" }},
		{"redis.timeout", "0", func(c *Config) { c.Redis.Timeout = "0" }},
		{"redis.db", "-1", func(c *Config) { c.Redis.DB = -1 }},
		{"redis.poolSize", "0", func(c *Config) { c.Redis.PoolSize = 0 }},
		{"redis.address", "localhost", func(c *Config) { c.Store = "redis"; c.Redis.Address = "localhost" }},
		{"websocket.maxConnectionsPerIP", "-1", func(c *Config) { c.Websocket.MaxConnectionsPerIP = -1 }},
		{"ip.algorithm", "leaky", func(c *Config) { c.IP.Algorithm = "leaky" }},
		{"routes[0].algorithm", "Sliding!", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: 1, Duration: "1s", Algorithm: "Sliding!"}}
		}},
		{"ip.key", "X-Api-Key", func(c *Config) { c.IP.Key = "X-Api-Key" }},
		{"user.key", "header:X Api", func(c *Config) { c.User.Key = "header:X Api" }},
		{"global.key", "header:X-Api-Key", func(c *Config) { c.Global.Key = "header:X-Api-Key" }},
		{"routes[0].key", "header:", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: 1, Duration: "1s", Key: "header:"}}
		}},
		{"routes[0].key", "cookie:sid", func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: 1, Duration: "1s", Key: "cookie:sid"}}
		}},
		{"status.path", "status", func(c *Config) { c.Status.Path = "status" }},
		{"status.path", "/status/", func(c *Config) { c.Status.Path = "/status/" }},
		{"status.allowedIPs[1]", "10.0.0.300", func(c *Config) { c.Status.AllowedIPs = []string{"10.0.0.1", "10.0.0.300"} }},
		{"exempt.ips[0]", "monitor", func(c *Config) { c.Exempt.IPs = []string{"monitor"} }},
		{"exempt.principals[0]", " ", func(c *Config) { c.Exempt.Principals = []string{" "} }},
		{"response.statusCode", "500", func(c *Config) { c.Response.StatusCode = 500 }},
		{"response.contentType", "", func(c *Config) { c.Response.ContentType = "" }},
		{"response.body", `retry in {retry}s`, func(c *Config) { c.Response.Body = `retry in {retry}s` }},
	}

	for _, tc := range cases {
		cfg := CreateConfig()
		tc.mutate(cfg)

		_, err := New(context.Background(), http.NotFoundHandler(), cfg, "invalid@test")
		if err == nil {
			t.Errorf("%s = %q accepted", tc.field, tc.value)
			continue
		}

		if !errors.Is(err, config.ErrConfig) {
			t.Errorf("%s: error does not wrap config.ErrConfig: %v", tc.field, err)
		}

		if want := tc.field + ` = "` + tc.value + `"`; !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestValidConfigurationsAccepted(t *testing.T) {
	cases := map[string]func(c *Config){
		"hops with default proxies": func(c *Config) { c.TrustedHops = 2 },
		"hops with no proxies":      func(c *Config) { c.TrustedHops = 1; c.TrustedProxies = nil },
		"bare address as proxy":     func(c *Config) { c.TrustedProxies = []string{"203.0.113.7", "2001:db8::1"} },
		"all layers off":            func(c *Config) { c.Global.Points = 0; c.IP.Points = 0; c.Assets.Points = 0 },
		"bare integer duration":     func(c *Config) { c.IP.Duration = "60" },
		"route without methods": func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/a/"}, Points: 1, Duration: "1s"}}
		},
		"route off": func(c *Config) { c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/a"}, Duration: "1s"}} },
		"route default key is ip": func(c *Config) {
			c.Routes = []RouteConfig{{Name: "r", Paths: []string{"/a"}, Points: 1, Duration: "1s"}}
		},
		"ipv6 /128": func(c *Config) { c.IPv6PrefixLength = 128 },
		"principal headers": func(c *Config) {
			c.Principal.UserHeader = "X-Auth-User"
			c.Principal.CredentialHeaders = []string{"Authorization"}
		},
		"redis settings not used yet": func(c *Config) { c.Redis.Address = "" },
	}

	for name, mutate := range cases {
		cfg := CreateConfig()
		mutate(cfg)

		if _, err := New(context.Background(), http.NotFoundHandler(), cfg, "valid@test"); err != nil {
			t.Errorf("%s: rejected: %v", name, err)
		}
	}
}

func TestMaxTrackedHoldsOneCounterPerLayer(t *testing.T) {
	cfg := CreateConfig()
	cfg.MaxTracked = 1
	cfg.Assets.Points, cfg.User.Points, cfg.Service.Points = 0, 0, 0
	cfg.IP = LayerConfig{Points: 5, Duration: "1s"}

	_, err := parse(cfg)
	if err == nil || !errors.Is(err, config.ErrConfig) ||
		!strings.Contains(err.Error(), `maxTracked = "1": must be at least 2, one counter for each layer that is on (global, ip)`) {
		t.Fatalf("maxTracked 1 with global and ip: %v", err)
	}

	cfg.MaxTracked = 2
	if _, err := parse(cfg); err != nil {
		t.Fatalf("maxTracked 2 with global and ip: %v", err)
	}

	// Routes count; layers that are off do not.
	cfg.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 3, Duration: "1m"}}
	if _, err := parse(cfg); err == nil || !strings.Contains(err.Error(), "at least 3") || !strings.Contains(err.Error(), "(global, ip, login)") {
		t.Fatalf("maxTracked 2 with global, ip and a route: %v", err)
	}

	// The defaults: five layers on.
	cfg = CreateConfig()
	cfg.MaxTracked = 4
	if _, err := parse(cfg); err == nil || !strings.Contains(err.Error(), "at least 5") {
		t.Fatalf("maxTracked 4 with the default layers: %v", err)
	}

	cfg.Enabled = false
	if _, err := parse(cfg); err != nil {
		t.Fatalf("disabled: %v", err)
	}
}
