// Package config is the plugin's configuration, and the only package that
// knows its names: the schema Traefik decodes into (this file), its defaults
// (Defaults), and their parsing and validation (Parse, parse.go) into
// Settings, a Rule for each layer and plan and a Route for each route, which
// the root builds its layers and stores from. layers.go is the catalogue of
// built-in layers, charges.go what each charges and the plan rules,
// plans.go plans:, redis.go redis.* and redis.tls,
// calendar.go calendar and utcOffset, sync.go redis.syncInterval, check.go
// the validation helpers, keys.go the keys no field took. It imports the
// plugin's request/ (canonical path patterns), answer/ (the refusal body
// template), limit/ (the calendar units) and redisresp/ (Redis options),
// never the root.
package config

import "net/http"

// Config is the plugin's dynamic configuration. Traefik decodes it with
// mapstructure: keys match field names case-insensitively and every scalar may
// arrive as a string, so durations are strings parsed in New (see ParseDuration).
type Config struct {
	Enabled          bool
	DryRun           bool
	Store            string
	KeyPrefix        string
	TrustedProxies   []string
	TrustedHops      int
	IPv6PrefixLength int
	MaxTracked       int

	Global  LayerConfig
	IP      LayerConfig
	Assets  AssetsConfig
	User    LayerConfig
	Service LayerConfig
	Routes  []RouteConfig
	// Plans replace user for a principal whose principal.planHeader names
	// one (plans.go).
	Plans map[string]PlanConfig

	Principal PrincipalConfig
	Redis     RedisConfig
	Headers   bool
	Websocket WebsocketConfig

	Status   StatusConfig
	Exempt   ExemptConfig
	Response ResponseConfig

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// LayerConfig is one window: Points requests per Duration. Points 0 turns
// the layer off. Duration is a time.ParseDuration string; a bare number means
// seconds (1.5: 1.5s). Algorithm is "fixed" (the default), "sliding", "concurrency" (Points requests in flight, Duration the lease) or "tokenbucket"
// (Points per Duration refilled into a bucket of Burst, default Points). Key,
// empty by default, may be "header:<Name>" on every layer but global (the
// header's value, hashed, is the bucket key, and a request without it is keyed
// by its client IP) or "host" (the request's host, port stripped).
type LayerConfig struct {
	Points    int
	Duration  string
	Algorithm string
	Burst     int
	Key       string
	// BlockDuration, when set, refuses every request of a key that the
	// layer refused, for that long from the refusal (0: only while over).
	BlockDuration string
	// Calendar, "day", "week" or "month", replaces Duration with windows
	// aligned to the calendar at UtcOffset ("+07:00"; empty: UTC).
	Calendar  string
	UtcOffset string
	// MaxDelay, a duration (empty or 0: none), lets a request that the rule
	// would refuse wait for its place when that comes within it.
	MaxDelay string

	// Store, "memory" or "redis" (empty: the instance's store), counts this
	// rule in the Traefik process even when the others are in Redis.
	Store string

	DryRun  bool                   // this rule counts, logs and sends its headers, but never refuses
	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// AssetsConfig is the per-IP budget for anonymous requests under PathPrefixes,
// which match the canonical request path (request/path.go), ignoring case unless
// CaseSensitive.
type AssetsConfig struct {
	Points        int
	Duration      string
	Algorithm     string
	Burst         int
	Key           string
	PathPrefixes  []string
	CaseSensitive bool
	BlockDuration string
	// Calendar, "day", "week" or "month", replaces Duration with windows
	// aligned to the calendar at UtcOffset ("+07:00"; empty: UTC).
	Calendar  string
	UtcOffset string
	MaxDelay  string // as LayerConfig's

	// Store, "memory" or "redis" (empty: the instance's store), counts this
	// rule in the Traefik process even when the others are in Redis.
	Store string

	DryRun  bool                   // this rule counts, logs and sends its headers, but never refuses
	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// RouteConfig is a limit on requests matching Methods (all when empty) and
// Paths (exact, or by prefix when the path ends with "/"), counted per Key:
// "ip", "principal", "global", "host" or "header:<Name>". Name is the layer name in
// keys and headers. Paths match the canonical request path (request/path.go),
// ignoring case unless CaseSensitive. Cost is what a matching request
// spends in every layer it is charged to (0: 1). With CountStatus set, the
// route checks its budget up front and charges a request only when the
// response's status is listed (the root's after.go).
type RouteConfig struct {
	Name          string
	Methods       []string
	Paths         []string
	Key           string
	Points        int
	Duration      string
	Algorithm     string
	Burst         int
	CaseSensitive bool
	Cost          int
	CountStatus   []int
	BlockDuration string
	// CostFrom, "header:<Name>" or "json:<dotted.path>", is where the
	// response states what the request cost the route's own layer, which
	// holds Reserve points (0: 1) for the request until the response ends
	// (the root's meter.go).
	CostFrom string
	Reserve  int
	// MaxRequestBody ("8MiB", bytes) bounds what a route whose key reads the
	// request's body reads of it (bodykeys.go).
	MaxRequestBody string
	// Calendar, "day", "week" or "month", replaces Duration with windows
	// aligned to the calendar at UtcOffset ("+07:00"; empty: UTC).
	Calendar  string
	UtcOffset string
	MaxDelay  string // as LayerConfig's

	// Store, "memory" or "redis" (empty: the instance's store), counts this
	// rule in the Traefik process even when the others are in Redis.
	Store string

	DryRun bool // this rule counts, logs and sends its headers, but never refuses

	// Plans give the route another window for principals whose
	// principal.planHeader names the plan (parseRoutes, parse.go).
	Plans map[string]PlanConfig

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// PlanConfig is the window of a plan: as LayerConfig, without a key (a
// plan's bucket is its principal's).
type PlanConfig struct {
	Points    int
	Duration  string
	Algorithm string
	Burst     int
	Calendar  string
	UtcOffset string
	MaxDelay  string // as LayerConfig's

	// Store, "memory" or "redis" (empty: the instance's store), counts this
	// rule in the Traefik process even when the others are in Redis.
	Store string

	DryRun  bool                   // this rule counts, logs and sends its headers, but never refuses
	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// PrincipalConfig says where the principal, its plan and credentials are
// read from.
type PrincipalConfig struct {
	UserHeader              string
	PlanHeader              string
	ServiceAccountHeader    string
	CredentialHeaders       []string
	CredentialCookies       []string
	CredentialQueryParams   []string
	InvalidCredentialStatus []int

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// RedisConfig configures the shared store (store: redis): one server at
// Address, or the primary that Sentinel names, or a Redis Cluster. TLS is
// false, true (system roots) or a map with the RedisTLSConfig keys; it is an
// interface{} because mapstructure has no other way to take both forms
// (parseTLS reads it, from strings as the file provider sends them too).
type RedisConfig struct {
	Address     string
	Username    string
	Password    string
	DB          int
	TLS         interface{}
	Sentinel    *RedisSentinelConfig
	Cluster     *RedisClusterConfig
	DialTimeout string
	Timeout     string
	PoolSize    int
	// SyncInterval, when set, counts fixed windows in each Traefik process and
	// syncs them with Redis every interval (redisstore/syncstore.go); "" or 0: one
	// script call per request.
	SyncInterval string

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// RedisSentinelConfig finds the primary of MasterName through the sentinels
// at Addresses. Username and Password are the sentinels' own credentials;
// redis.username and redis.password are the primary's.
type RedisSentinelConfig struct {
	MasterName string
	Addresses  []string
	Username   string
	Password   string

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// RedisClusterConfig lists seed nodes of a Redis Cluster.
type RedisClusterConfig struct {
	Addresses []string

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// WebsocketConfig caps upgraded connections; 0 means no cap.
type WebsocketConfig struct {
	MaxConnectionsPerIP int

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// StatusConfig turns on the status endpoint at Path (and Prometheus metrics at
// Path + "/metrics") for clients whose IP is in AllowedIPs. Empty Path: off.
type StatusConfig struct {
	Path       string
	AllowedIPs []string

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// ExemptConfig lists client IPs (CIDRs) and principal ids that no layer
// charges; the global layer still does unless Global is set.
type ExemptConfig struct {
	IPs        []string
	Principals []string
	Global     bool

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// ResponseConfig is the refusal: its status (429 or 503), content type and
// body template. An empty Body is the default JSON body (README.md). Placeholders:
// {limit}, {remaining}, {reset} (RFC 3339), {resetUnix}, {retryAfter}, {layer}.
type ResponseConfig struct {
	StatusCode  int
	ContentType string
	Body        string

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: keys.go
}

// defaultTrustedProxies is loopback, RFC 1918 and ULA: the addresses a reverse
// proxy in front of Traefik usually has.
var defaultTrustedProxies = []string{
	"127.0.0.1/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
}

// defaultRedisAddress is CreateConfig's redis.address: it stands for "not
// set" next to redis.sentinel or redis.cluster.
const defaultRedisAddress = "127.0.0.1:6379"

// Defaults is the configuration README.md documents, which the root's
// CreateConfig hands Traefik to decode the user's settings over. The
// built-in layers' defaults are their catalogue's (layers.go).
func Defaults() *Config {
	proxies := make([]string, len(defaultTrustedProxies))
	copy(proxies, defaultTrustedProxies)

	assets := defaultLayer(LayerAssets)

	return &Config{
		Enabled:          true,
		Store:            "memory",
		KeyPrefix:        "ratelimit",
		TrustedProxies:   proxies,
		IPv6PrefixLength: 64,
		MaxTracked:       100000,
		Global:           defaultLayer(LayerGlobal),
		IP:               defaultLayer(LayerIP),
		Assets:           AssetsConfig{Points: assets.Points, PathPrefixes: []string{"/assets/"}},
		User:             defaultLayer(LayerUser),
		Service:          defaultLayer(LayerService),
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
