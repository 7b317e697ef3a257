package tierlimit

import "github.com/tierlimit/tierlimit/config"

// The configuration is package config (config/): the schema and its
// defaults, their parsing and validation into config.Settings. This file
// gives Traefik the root's Config and CreateConfig; configlayers.go adds to
// config's catalogue of built-in layers what each charges.

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

// CreateConfig returns the defaults README.md documents (config.Defaults);
// Traefik decodes the user's settings over it.
func CreateConfig() *Config {
	return config.Defaults()
}

// parse validates cfg and returns its parsed form (config.Parse).
func parse(cfg *Config) (*config.Settings, error) {
	return config.Parse(cfg)
}
