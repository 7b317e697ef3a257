package tierlimit

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/rule"
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
		{s.Spec(config.LayerGlobal), 1000, time.Second},
		{s.Spec(config.LayerIP), 50, time.Second},
		{s.Spec(config.LayerAssets), 300, time.Second},
		{s.Spec(config.LayerUser), 300, time.Minute},
		{s.Spec(config.LayerService), 10000, time.Minute},
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
			c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/x"}, Points: 1, Duration: "1s", Store: "redis"}}
		}},
		{"plans.gold.store", "redis", func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-User", "X-Plan"
			c.Plans = map[string]config.PlanConfig{"gold": {Points: 1, Duration: "1s", Store: "redis"}}
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
		{"routes[0].name", "", func(c *Config) { c.Routes = []config.RouteConfig{{Paths: []string{"/x"}, Points: 1, Duration: "1s"}} }},
		{"routes[0].name", "websocket", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "websocket", Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[0].name", "ip", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "ip", Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[0].name", "log in", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "log in", Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[1].name", "login", func(c *Config) {
			c.Routes = []config.RouteConfig{
				{Name: "login", Paths: []string{"/x"}, Points: 1, Duration: "1s"},
				{Name: "login", Paths: []string{"/y"}, Points: 1, Duration: "1s"},
			}
		}},
		{"routes[0].key", "session", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/x"}, Key: "session", Points: 1, Duration: "1s"}}
		}},
		{"routes[0].points", "-2", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: -2, Duration: "1s"}}
		}},
		{"routes[0].duration", "1 minute", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: 1, Duration: "1 minute"}}
		}},
		{"routes[0].methods[1]", "PO ST", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Methods: []string{"GET", "PO ST"}, Paths: []string{"/x"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[0].paths", "", func(c *Config) { c.Routes = []config.RouteConfig{{Name: "r", Points: 1, Duration: "1s"}} }},
		{"routes[0].paths[0]", "auth/login", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"auth/login"}, Points: 1, Duration: "1s"}}
		}},
		{"routes[0].paths[1]", "/auth/login?next=/", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/x", "/auth/login?next=/"}, Points: 1, Duration: "1s"}}
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
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: 1, Duration: "1s", Algorithm: "Sliding!"}}
		}},
		{"ip.key", "X-Api-Key", func(c *Config) { c.IP.Key = "X-Api-Key" }},
		{"user.key", "header:X Api", func(c *Config) { c.User.Key = "header:X Api" }},
		{"global.key", "header:X-Api-Key", func(c *Config) { c.Global.Key = "header:X-Api-Key" }},
		{"routes[0].key", "header:", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: 1, Duration: "1s", Key: "header:"}}
		}},
		{"routes[0].key", "cookie:sid", func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/x"}, Points: 1, Duration: "1s", Key: "cookie:sid"}}
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
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/a/"}, Points: 1, Duration: "1s"}}
		},
		"route off": func(c *Config) { c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/a"}, Duration: "1s"}} },
		"route default key is ip": func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "r", Paths: []string{"/a"}, Points: 1, Duration: "1s"}}
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
	cfg.IP = config.LayerConfig{Points: 5, Duration: "1s"}

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
	cfg.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 3, Duration: "1m"}}
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

func layerNames(layers []*rule.Layer) string {
	names := make([]string, 0, len(layers))
	for _, l := range layers {
		names = append(names, l.Name)
	}

	return strings.Join(names, ",")
}

// TestPlansFollowTheCatalogue: the plans drawn up from the catalogue's
// classes are the layers each kind of request is charged, in evaluation
// order, with the layers that are off left out; every plan and route
// charges requestCost.
func TestPlansFollowTheCatalogue(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   map[string]string
	}{
		{"defaults", func(c *Config) {}, map[string]string{
			"ip": "global,ip", "assets": "global,assets", "user": "global,user", "service": "global,service",
			"cred": "global", "invalid": "ip", "exempt": "global", "layers": "global,ip,assets,user,service,login",
		}},
		{"global and assets off", func(c *Config) { c.Global.Points = 0; c.Assets.Points = 0 }, map[string]string{
			"ip": "ip", "assets": "", "user": "user", "service": "service",
			"cred": "", "invalid": "ip", "exempt": "", "layers": "ip,user,service,login",
		}},
		{"ip off", func(c *Config) { c.IP.Points = 0 }, map[string]string{
			"ip": "global", "assets": "global,assets", "user": "global,user", "service": "global,service",
			"cred": "global", "invalid": "", "exempt": "global", "layers": "global,assets,user,service,login",
		}},
	}

	for _, tc := range cases {
		cfg := CreateConfig()
		cfg.Exempt.IPs = []string{"203.0.113.7"}
		cfg.Principal.UserHeader = "X-Auth-User" // else user and service are never charged (config.NeverCharged)
		cfg.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Points: 3, Duration: "1m"}}
		tc.mutate(cfg)

		s, err := parse(cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}

		p := build(context.Background(), s, http.NotFoundHandler(), "plans-"+strings.ReplaceAll(tc.name, " ", "-")+"@test")

		got := map[string]string{
			"ip": layerNames(p.planIP), "assets": layerNames(p.planAssets), "user": layerNames(p.planUser),
			"service": layerNames(p.planService), "cred": layerNames(p.planCred), "invalid": layerNames(p.planInvalid),
			"exempt": layerNames(p.exempt.plan), "layers": layerNames(p.layers),
		}

		for plan, want := range tc.want {
			if got[plan] != want {
				t.Errorf("%s: plan %s charges %q, want %q", tc.name, plan, got[plan], want)
			}
		}

		if len(p.routes) != 1 {
			t.Fatalf("%s: %d routes, want 1", tc.name, len(p.routes))
		}

		if p.planCost != requestCost || p.routes[0].cost != requestCost || requestCost != 1 {
			t.Errorf("%s: plans cost %d, route cost %d, want 1 each", tc.name, p.planCost, p.routes[0].cost)
		}
	}
}

// testPEM returns a self-signed certificate and its key as PEM.
func testPEM(t *testing.T) (string, string) {
	t.Helper()

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}

	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "t"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(4e9, 0), IsCA: true, BasicConstraintsValid: true}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}

	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}

	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
}

func redisConfig(mutate func(r *config.RedisConfig)) *Config {
	cfg := CreateConfig()
	cfg.Store = "redis"
	mutate(&cfg.Redis)

	return cfg
}

func sentinelConfig() *config.RedisSentinelConfig {
	return &config.RedisSentinelConfig{MasterName: "mymaster", Addresses: []string{"10.0.0.1:26379", "10.0.0.2:26379"}}
}

func TestInvalidRedisDeploymentsNameTheField(t *testing.T) {
	_, keyPEM := testPEM(t)
	badPEM := "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"

	cases := []struct {
		field, value string
		mutate       func(r *config.RedisConfig)
	}{
		{"redis.tls", "maybe", func(r *config.RedisConfig) { r.TLS = "maybe" }},
		{"redis.tls", "1.5", func(r *config.RedisConfig) { r.TLS = 1.5 }},
		{"redis.tls.cafile", "", func(r *config.RedisConfig) { r.TLS = map[string]interface{}{"cafile": "/etc/ca.pem"} }},
		{"redis.tls.insecureSkipVerify", "perhaps", func(r *config.RedisConfig) {
			r.TLS = map[string]interface{}{"insecureSkipVerify": "perhaps"}
		}},
		{"redis.tls.serverName", "[1 2]", func(r *config.RedisConfig) { r.TLS = map[string]interface{}{"serverName": []int{1, 2}} }},
		{"redis.tls.ca", "(inline PEM)", func(r *config.RedisConfig) { r.TLS = map[string]interface{}{"ca": badPEM} }},
		{"redis.tls.key", "", func(r *config.RedisConfig) { r.TLS = map[string]interface{}{"cert": "/etc/client.crt"} }},
		{"redis.tls.cert", "", func(r *config.RedisConfig) { r.TLS = map[string]interface{}{"key": keyPEM} }},
		{"redis.tls.cert", "(inline PEM)", func(r *config.RedisConfig) {
			r.TLS = map[string]interface{}{"cert": badPEM, "key": keyPEM}
		}},
		{"redis.sentinel.masterName", "", func(r *config.RedisConfig) { r.Sentinel = &config.RedisSentinelConfig{Addresses: []string{"a:1"}} }},
		{"redis.sentinel.masterName", "my master", func(r *config.RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.MasterName = "my master"
		}},
		{"redis.sentinel.addresses", "", func(r *config.RedisConfig) { r.Sentinel = &config.RedisSentinelConfig{MasterName: "m"} }},
		{"redis.sentinel.addresses[1]", "sentinel-2", func(r *config.RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.Addresses[1] = "sentinel-2"
		}},
		{"redis.sentinel.username", "watcher", func(r *config.RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.Username = "watcher"
		}},
		{"redis.address", "10.0.0.9:6379", func(r *config.RedisConfig) { r.Address = "10.0.0.9:6379"; r.Sentinel = sentinelConfig() }},
		{"redis.address", "10.0.0.9:6379", func(r *config.RedisConfig) {
			r.Address = "10.0.0.9:6379"
			r.Cluster = &config.RedisClusterConfig{Addresses: []string{"10.0.0.1:7000"}}
		}},
		{"redis.cluster", "10.0.0.1:7000", func(r *config.RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Cluster = &config.RedisClusterConfig{Addresses: []string{"10.0.0.1:7000"}}
		}},
		{"redis.cluster.addresses", "", func(r *config.RedisConfig) { r.Cluster = &config.RedisClusterConfig{} }},
		{"redis.cluster.addresses[0]", "node-1", func(r *config.RedisConfig) { r.Cluster = &config.RedisClusterConfig{Addresses: []string{"node-1"}} }},
		{"redis.db", "2", func(r *config.RedisConfig) {
			r.DB = 2
			r.Cluster = &config.RedisClusterConfig{Addresses: []string{"10.0.0.1:7000"}}
		}},
		{"redis.address", "127.0.0.1:99999", func(r *config.RedisConfig) { r.Address = "127.0.0.1:99999" }},
	}

	for _, tc := range cases {
		_, err := New(context.Background(), http.NotFoundHandler(), redisConfig(tc.mutate), "invalid@test")
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

		if strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Errorf("error %q shows key material", err)
		}
	}
}

func TestUnknownKeysUnderSentinelAndCluster(t *testing.T) {
	cases := map[string]func(r *config.RedisConfig){
		`unknown field "redis.sentinel.master" (did you mean "redis.sentinel.masterName"?)`: func(r *config.RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.Unknown = map[string]interface{}{"master": "mymaster"}
		},
		`unknown field "redis.cluster.adresses" (did you mean "redis.cluster.addresses"?)`: func(r *config.RedisConfig) {
			r.Cluster = &config.RedisClusterConfig{Addresses: []string{"10.0.0.1:7000"}, Unknown: map[string]interface{}{"adresses": "x"}}
		},
	}

	for want, mutate := range cases {
		_, err := New(context.Background(), http.NotFoundHandler(), redisConfig(mutate), "unknown@test")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %s", err, want)
		}
	}
}

func TestRedisDeploymentsAccepted(t *testing.T) {
	certPEM, keyPEM := testPEM(t)

	cases := []struct {
		name   string
		mutate func(r *config.RedisConfig)
		check  func(s *config.Settings) bool
	}{
		{"tls true from the file provider", func(r *config.RedisConfig) { r.TLS = "true" }, func(s *config.Settings) bool {
			return s.Redis.TLS && s.Redis.TLSConfig.CA == ""
		}},
		{"tls false", func(r *config.RedisConfig) { r.TLS = false }, func(s *config.Settings) bool { return !s.Redis.TLS }},
		{"tls unset", func(r *config.RedisConfig) {}, func(s *config.Settings) bool { return !s.Redis.TLS }},
		{"inline CA and client pair, insecureSkipVerify as string", func(r *config.RedisConfig) {
			r.TLS = map[string]interface{}{"CA": certPEM, "cert": certPEM, "key": keyPEM, "serverName": "redis.internal", "insecureSkipVerify": "false"}
		}, func(s *config.Settings) bool {
			o := s.Redis.TLSConfig
			return s.Redis.TLS && o.CA == certPEM && o.Key == keyPEM && o.ServerName == "redis.internal" && !o.InsecureSkipVerify
		}},
		{"files are not read by New", func(r *config.RedisConfig) {
			r.TLS = map[interface{}]interface{}{"ca": "/nonexistent/ca.pem", "insecureSkipVerify": true}
		}, func(s *config.Settings) bool {
			return s.Redis.TLSConfig.CA == "/nonexistent/ca.pem" && s.Redis.TLSConfig.InsecureSkipVerify
		}},
		{"cluster", func(r *config.RedisConfig) {
			r.Cluster = &config.RedisClusterConfig{Addresses: []string{"10.0.0.1:7000", "[::1]:7001"}}
		},
			func(s *config.Settings) bool {
				return s.Redis.Cluster != nil && len(s.Redis.Cluster.Addresses) == 2 && s.Redis.Address == "" && s.Redis.Sentinel == nil
			}},
		{"sentinel next to the default address", func(r *config.RedisConfig) {
			r.Sentinel = sentinelConfig()
			r.Sentinel.Username, r.Sentinel.Password = "watcher", "pw"
		}, func(s *config.Settings) bool {
			so := s.Redis.Sentinel
			return so != nil && so.MasterName == "mymaster" && len(so.Addresses) == 2 && so.Password == "pw" && s.Redis.Address == ""
		}},
	}

	for _, tc := range cases {
		s, err := parse(redisConfig(tc.mutate))
		if err != nil {
			t.Errorf("%s: rejected: %v", tc.name, err)
			continue
		}

		if !tc.check(s) {
			t.Errorf("%s: parsed as %+v", tc.name, s.Redis)
		}
	}
}

// The status page and the policy header report such a window as a
// duration: "1.5s", and w=2 (whole seconds, rounded up).
func TestDecimalDurationIsReportedAsADuration(t *testing.T) {
	h := statusHarness(t, func(c *Config) { c.IP.Duration = "1.500000" })

	rec := h.get("/api", "203.0.113.1:1")
	if got := rec.Header().Get("Ratelimit-Policy"); got != `"ip";q=5;w=2` {
		t.Errorf("RateLimit-Policy %q, want %q", got, `"ip";q=5;w=2`)
	}

	doc := h.status("/_rl")
	if len(doc.Layers) != 1 || doc.Layers[0].Duration != "1.5s" {
		t.Fatalf("status layers %+v, want ip with duration 1.5s", doc.Layers)
	}

	h.clock.now = h.clock.now.Add(1500 * time.Millisecond)
	if rec := h.get("/api", "203.0.113.1:1"); rec.Header().Get("X-Ratelimit-Remaining") != "4" {
		t.Errorf("after 1.5s: X-RateLimit-Remaining %q, want a new window's 4", rec.Header().Get("X-Ratelimit-Remaining"))
	}
}

// Errors name a bare decimal number of seconds as a duration too, never as
// the file provider's "1.500000"; a bare integer as written.
func TestDurationErrorsShowBareSecondsAsDurations(t *testing.T) {
	for want, mutate := range map[string]func(c *Config){
		`ip.duration = "0.0001s": must be at least 1ms`:                        func(c *Config) { c.IP.Duration = "0.000100" },
		`ip.duration = "90.5s": cannot be set together with ip.calendar (day)`: func(c *Config) { c.IP.Duration = "90.500000"; c.IP.Calendar = "day" },
		`ip.blockDuration = "40000000.5s": longer than a year`:                 func(c *Config) { c.IP.BlockDuration = "40000000.500000" },
		`ip.blockDuration = "40000000": longer than a year`:                    func(c *Config) { c.IP.BlockDuration = "40000000" },
		`redis.timeout = "0.0005s": must be at least 1ms`:                      func(c *Config) { c.Redis.Timeout = "0.000500" },
		`routes[0].duration = "1.5.0": not a duration`: func(c *Config) {
			c.Routes = []config.RouteConfig{{Name: "a", Paths: []string{"/a"}, Points: 1, Duration: "1.5.0"}}
		},
	} {
		cfg := CreateConfig()
		mutate(cfg)

		_, err := New(context.Background(), http.NotFoundHandler(), cfg, "durations@test")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %s", err, want)
		}
	}
}

// A route with points 0 is off: it matches nothing, so a cost on it would
// charge nothing, not even the other layers. Rather than ignore it silently,
// New refuses it, naming the field and the value; cost 1 (or unset) on such
// a route is accepted.
func TestCostOnARouteThatIsOffIsAnError(t *testing.T) {
	routes := func(cost int) []config.RouteConfig {
		return []config.RouteConfig{
			{Name: "login", Paths: []string{"/login"}, Points: 5, Duration: "60s"},
			{Name: "search", Paths: []string{"/search"}, Points: 10, Duration: "60s"},
			{Name: "export", Paths: []string{"/export"}, Points: 0, Duration: "60s", Cost: cost},
		}
	}

	cfg := CreateConfig()
	cfg.Routes = routes(5)

	_, err := New(context.Background(), http.NotFoundHandler(), cfg, "costoff@test")
	if err == nil || !strings.Contains(err.Error(), `routes[2].cost = "5": is ignored on a route with points 0 (off)`) {
		t.Fatalf("cost 5 on a route with points 0: error %v", err)
	}

	for _, cost := range []int{0, 1} {
		cfg := CreateConfig()
		cfg.Routes = routes(cost)

		if _, err := New(context.Background(), http.NotFoundHandler(), cfg, "costoff@test"); err != nil {
			t.Errorf("cost %d on a route with points 0: %v", cost, err)
		}
	}
}

// TestNewTurnsAPanicIntoAnErrorNamingTheField: a panic while building the
// middleware (here made by buildHook, for a route, a route's plan or a plan
// called boom) is New's error, naming the middleware and the part of the
// configuration that building alone panics on, never a panic that would
// make Traefik drop every router. A panic that needs several parts names
// none of them; a configuration without the culprit builds.
func TestNewTurnsAPanicIntoAnErrorNamingTheField(t *testing.T) {
	buildHook = func(s *config.Settings) {
		var names []string
		for _, rs := range s.Routes {
			names = append(names, rs.Name)
			for _, p := range rs.Plans {
				names = append(names, p.Name)
			}
		}

		for _, p := range s.Plans {
			names = append(names, p.Name)
		}

		for _, n := range names {
			if n == "boom" || n == "chat.boom" || n == "both" && len(names) > 1 {
				panic("boom in " + n)
			}
		}
	}
	t.Cleanup(func() { buildHook = nil })

	route := func(name string) config.RouteConfig {
		return config.RouteConfig{Name: name, Paths: []string{"/" + name}, Points: 5, Duration: "1s"}
	}

	for _, tc := range []struct {
		name string
		set  func(c *Config)
		want string // "" when it builds
	}{
		{"a route", func(c *Config) { c.Routes = []config.RouteConfig{route("fine"), route("boom")} },
			`configuring mw@test: building routes[1] failed (a bug of the plugin, please report it with this configuration): panic: boom in boom`},
		{"a route's plan", func(c *Config) {
			routePlanConfig(c)
			c.Routes[0].Plans["boom"] = config.PlanConfig{Points: 5, Duration: "1s"}
		}, `configuring mw@test: building routes[0].plans.boom failed`},
		{"a plan", func(c *Config) {
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-Auth-User", "X-Auth-Plan"
			c.Plans = map[string]config.PlanConfig{"boom": {Points: 5, Duration: "1s"}, "pro": {Points: 5, Duration: "1s"}}
		}, `configuring mw@test: building plans.boom failed`},
		{"several parts", func(c *Config) { c.Routes = []config.RouteConfig{route("both"), route("fine")} },
			`configuring mw@test: building the middleware failed (a bug of the plugin, please report it with this configuration): panic: boom in both`},
		{"no culprit", func(c *Config) { c.Routes = []config.RouteConfig{route("fine")} }, ""},
	} {
		cfg := CreateConfig()
		tc.set(cfg)

		h, err := New(context.Background(), http.NotFoundHandler(), cfg, "mw@test")
		switch {
		case tc.want == "" && (err != nil || h == nil):
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want) || h != nil):
			t.Errorf("%s: handler %v, error %v; want none and an error starting %s", tc.name, h, err, tc.want)
		case err != nil && errors.Is(err, config.ErrConfig):
			t.Errorf("%s: a panic reads as an invalid configuration: %v", tc.name, err)
		}
	}
}
