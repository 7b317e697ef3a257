package tierlimit

import (
	"net/http"

	"github.com/tierlimit/tierlimit/config"
)

// The configuration in parts: this file is the schema and its defaults,
// configlayers.go the catalogue of built-in layers, configparse.go the
// parsing into settings, configredis.go redis.* and redis.tls, configcheck.go
// the validation helpers, configkeys.go the keys no field took.

// The schema lives in config/; these names keep the root's code as it was.
type (
	Config              = config.Config
	LayerConfig         = config.LayerConfig
	AssetsConfig        = config.AssetsConfig
	RouteConfig         = config.RouteConfig
	PlanConfig          = config.PlanConfig
	PrincipalConfig     = config.PrincipalConfig
	RedisConfig         = config.RedisConfig
	RedisSentinelConfig = config.RedisSentinelConfig
	RedisClusterConfig  = config.RedisClusterConfig
	WebsocketConfig     = config.WebsocketConfig
	StatusConfig        = config.StatusConfig
	ExemptConfig        = config.ExemptConfig
	ResponseConfig      = config.ResponseConfig
)

// defaultTrustedProxies is loopback, RFC 1918 and ULA: the addresses a reverse
// proxy in front of Traefik usually has.
var defaultTrustedProxies = []string{
	"127.0.0.1/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
}

// defaultRedisAddress is CreateConfig's redis.address: it stands for "not
// set" next to redis.sentinel or redis.cluster.
const defaultRedisAddress = "127.0.0.1:6379"

// CreateConfig returns the defaults README.md documents; Traefik decodes the
// user's settings over it. The built-in layers' defaults are their
// catalogue's (configlayers.go).
func CreateConfig() *Config {
	proxies := make([]string, len(defaultTrustedProxies))
	copy(proxies, defaultTrustedProxies)

	assets := defaultLayer(layerAssets)

	return &Config{
		Enabled:          true,
		Store:            "memory",
		KeyPrefix:        "ratelimit",
		TrustedProxies:   proxies,
		IPv6PrefixLength: 64,
		MaxTracked:       100000,
		Global:           defaultLayer(layerGlobal),
		IP:               defaultLayer(layerIP),
		Assets:           AssetsConfig{Points: assets.Points, PathPrefixes: []string{"/assets/"}},
		User:             defaultLayer(layerUser),
		Service:          defaultLayer(layerService),
		Principal: PrincipalConfig{
			ServiceAccountHeader:    "X-Auth-Service-Account",
			InvalidCredentialStatus: []int{http.StatusUnauthorized},
		},
		Redis: RedisConfig{
			Address:      defaultRedisAddress,
			DialTimeout:  "250ms",
			Timeout:      "100ms",
			PoolSize:     16,
			SyncInterval: "0",
		},
		Headers: true,
		Status:  StatusConfig{AllowedIPs: []string{"127.0.0.1/32", "::1/128"}},
		Response: ResponseConfig{
			StatusCode:  http.StatusTooManyRequests,
			ContentType: "application/json",
		},
	}
}
