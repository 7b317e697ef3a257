package tierlimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// Config is the plugin's dynamic configuration. Traefik decodes it with
// mapstructure: keys match field names case-insensitively and every scalar may
// arrive as a string, so durations are strings parsed in New (see parseDuration).
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

	Principal PrincipalConfig
	Redis     RedisConfig
	Headers   bool
	Websocket WebsocketConfig

	Status   StatusConfig
	Exempt   ExemptConfig
	Response ResponseConfig

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// LayerConfig is one window: Points requests per Duration. Points 0 turns
// the layer off. Duration is a time.ParseDuration string; a bare integer means
// seconds. Algorithm is "fixed" (the default), "sliding" or "tokenbucket"
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

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// AssetsConfig is the per-IP budget for anonymous requests under PathPrefixes,
// which match the canonical request path (path.go), ignoring case unless
// CaseSensitive.
type AssetsConfig struct {
	Points        int
	Duration      string
	Algorithm     string
	Burst         int
	Key           string
	PathPrefixes  []string
	CaseSensitive bool

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// RouteConfig is a limit on requests matching Methods (all when empty) and
// Paths (exact, or by prefix when the path ends with "/"), counted per Key:
// "ip", "principal", "global", "host" or "header:<Name>". Name is the layer name in
// keys and headers. Paths match the canonical request path (path.go),
// ignoring case unless CaseSensitive.
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

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// PrincipalConfig says where the principal and credentials are read from.
type PrincipalConfig struct {
	UserHeader              string
	ServiceAccountHeader    string
	CredentialHeaders       []string
	CredentialCookies       []string
	CredentialQueryParams   []string
	InvalidCredentialStatus []int

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
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

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// RedisSentinelConfig finds the primary of MasterName through the sentinels
// at Addresses. Username and Password are the sentinels' own credentials;
// redis.username and redis.password are the primary's.
type RedisSentinelConfig struct {
	MasterName string
	Addresses  []string
	Username   string
	Password   string

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// RedisClusterConfig lists seed nodes of a Redis Cluster.
type RedisClusterConfig struct {
	Addresses []string

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// WebsocketConfig caps upgraded connections; 0 means no cap.
type WebsocketConfig struct {
	MaxConnectionsPerIP int

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// StatusConfig turns on the status endpoint at Path (and Prometheus metrics at
// Path + "/metrics") for clients whose IP is in AllowedIPs. Empty Path: off.
type StatusConfig struct {
	Path       string
	AllowedIPs []string

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// ExemptConfig lists client IPs (CIDRs) and principal ids that no layer
// charges; the global layer still does unless Global is set.
type ExemptConfig struct {
	IPs        []string
	Principals []string
	Global     bool

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// ResponseConfig is the refusal: its status (429 or 503), content type and
// body template. An empty Body is the default JSON body (README.md). Placeholders:
// {limit}, {remaining}, {reset} (RFC 3339), {resetUnix}, {retryAfter}, {layer}.
type ResponseConfig struct {
	StatusCode  int
	ContentType string
	Body        string

	Unknown map[string]interface{} `mapstructure:",remain"` // keys no field took: configkeys.go
}

// defaultTrustedProxies is loopback, RFC 1918 and ULA: the addresses a reverse
// proxy in front of Traefik usually has.
var defaultTrustedProxies = []string{
	"127.0.0.1/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
}

// CreateConfig returns the defaults README.md documents; Traefik decodes the
// user's settings over it.
func CreateConfig() *Config {
	proxies := make([]string, len(defaultTrustedProxies))
	copy(proxies, defaultTrustedProxies)

	return &Config{
		Enabled:          true,
		Store:            "memory",
		KeyPrefix:        "ratelimit",
		TrustedProxies:   proxies,
		IPv6PrefixLength: 64,
		MaxTracked:       100000,
		Global:           LayerConfig{Points: 1000, Duration: "1s"},
		IP:               LayerConfig{Points: 50, Duration: "1s"},
		Assets:           AssetsConfig{Points: 300, Duration: "1s", PathPrefixes: []string{"/assets/"}},
		User:             LayerConfig{Points: 300, Duration: "60s"},
		Service:          LayerConfig{Points: 10000, Duration: "60s"},
		Principal: PrincipalConfig{
			ServiceAccountHeader:    "X-Auth-Service-Account",
			InvalidCredentialStatus: []int{http.StatusUnauthorized},
		},
		Redis: RedisConfig{
			Address:     "127.0.0.1:6379",
			DialTimeout: "250ms",
			Timeout:     "100ms",
			PoolSize:    16,
		},
		Headers: true,
		Status:  StatusConfig{AllowedIPs: []string{"127.0.0.1/32", "::1/128"}},
		Response: ResponseConfig{
			StatusCode:  http.StatusTooManyRequests,
			ContentType: "application/json",
		},
	}
}

// Layer names that routes may not take, since they name the built-in layers.
const (
	layerGlobal  = "global"
	layerIP      = "ip"
	layerAssets  = "assets"
	layerUser    = "user"
	layerService = "service"
	// layerWebsocket names the connection cap in refusals and events; no
	// route may take the name.
	layerWebsocket = "websocket"
)

// Route keys.
const (
	keyIP        = "ip"
	keyPrincipal = "principal"
	keyGlobal    = "global"
	keyHeader    = "header:"
	keyHost      = "host"
)

// settings is the validated, parsed form of Config that New builds once, so
// that nothing on the request path parses configuration.
type settings struct {
	enabled   bool
	dryRun    bool
	store     string
	keyPrefix string
	headers   bool

	proxies     []netip.Prefix
	hops        int
	ipv6Prefix  int
	maxTracked  int
	global      layerSpec
	ip          layerSpec
	assets      layerSpec
	assetPaths  []string // canonical (canonicalPattern); nil when none
	assetsCase  bool     // assets.caseSensitive
	user        layerSpec
	service     layerSpec
	routes      []routeSpec
	principal   PrincipalConfig
	invalidCode map[int]bool

	redis      redisresp.Options
	wsMaxPerIP int

	statusPath    string // "" when the status endpoint is off
	statusAllowed []netip.Prefix
	exemptIPs     []netip.Prefix
	exemptIDs     map[string]bool
	exemptGlobal  bool
	response      ResponseConfig
	responseBody  []bodyPart // response.body parsed; nil for the default JSON body
}

// layerSpec is a parsed layer. points == 0 means off.
type layerSpec struct {
	name      string
	points    int64
	duration  time.Duration
	sliding   bool
	bucket    bool   // tokenbucket: points per duration into a bucket of burst
	burst     int64  // tokenbucket only
	keyHeader string // canonical header name when keyed by "header:<Name>"
	keyHost   bool   // keyed by the request's host
}

func (l layerSpec) on() bool { return l.points > 0 }

// routeSpec is a parsed route limit.
type routeSpec struct {
	layerSpec
	methods       []string
	exact         map[string]bool // canonical paths (canonicalPattern)
	prefixes      []string        // canonical, ending in "/"
	caseSensitive bool
	key           string // keyIP, keyPrincipal, keyGlobal, keyHost or keyHeader
}

// errConfig is the sentinel every validation error wraps, so callers can tell
// a configuration error from anything else with errors.Is.
var errConfig = errors.New("invalid configuration")

func invalid(field string, value interface{}, why string) error {
	return fmt.Errorf("%w: %s = %q: %s", errConfig, field, fmt.Sprint(value), why)
}

// parse validates cfg and returns its parsed form. Every error names the field
// and the bad value.
func parse(cfg *Config) (*settings, error) {
	if cfg == nil {
		cfg = CreateConfig()
	}

	if err := checkUnknown(cfg); err != nil {
		return nil, err
	}

	s := &settings{
		enabled:   cfg.Enabled,
		dryRun:    cfg.DryRun,
		headers:   cfg.Headers,
		keyPrefix: cfg.KeyPrefix,
		principal: cfg.Principal,
	}

	var err error

	switch cfg.Store {
	case "memory", "redis":
		s.store = cfg.Store
	default:
		return nil, invalid("store", cfg.Store, `must be "memory" or "redis"`)
	}

	if strings.ContainsAny(cfg.KeyPrefix, " \t\r\n") {
		return nil, invalid("keyPrefix", cfg.KeyPrefix, "must not contain whitespace")
	}

	if cfg.TrustedHops < 0 {
		return nil, invalid("trustedHops", cfg.TrustedHops, "must be >= 0")
	}

	s.hops = cfg.TrustedHops

	if s.hops > 0 {
		// The defaults stand for "not set": only a list the user wrote conflicts.
		if len(cfg.TrustedProxies) > 0 && !sameStrings(cfg.TrustedProxies, defaultTrustedProxies) {
			return nil, invalid("trustedProxies", strings.Join(cfg.TrustedProxies, ","),
				"cannot be set together with trustedHops ("+strconv.Itoa(cfg.TrustedHops)+"); use one of them")
		}
	} else {
		for i, raw := range cfg.TrustedProxies {
			p, perr := parsePrefix(raw)
			if perr != nil {
				return nil, invalid("trustedProxies["+strconv.Itoa(i)+"]", raw, "not a CIDR or IP address")
			}

			s.proxies = append(s.proxies, p)
		}
	}

	if cfg.IPv6PrefixLength < 1 || cfg.IPv6PrefixLength > 128 {
		return nil, invalid("ipv6PrefixLength", cfg.IPv6PrefixLength, "must be between 1 and 128")
	}

	s.ipv6Prefix = cfg.IPv6PrefixLength

	if cfg.MaxTracked < 1 {
		return nil, invalid("maxTracked", cfg.MaxTracked, "must be >= 1")
	}

	s.maxTracked = cfg.MaxTracked

	if cfg.Global.Key != "" {
		return nil, invalid("global.key", cfg.Global.Key, "the global layer has one bucket; only other layers take a key")
	}

	if s.global, err = parseLayer("global", layerGlobal, cfg.Global); err != nil {
		return nil, err
	}

	if s.ip, err = parseLayer("ip", layerIP, cfg.IP); err != nil {
		return nil, err
	}

	assets := LayerConfig{Points: cfg.Assets.Points, Duration: cfg.Assets.Duration, Algorithm: cfg.Assets.Algorithm, Burst: cfg.Assets.Burst, Key: cfg.Assets.Key}
	if s.assets, err = parseLayer("assets", layerAssets, assets); err != nil {
		return nil, err
	}

	s.assetsCase = cfg.Assets.CaseSensitive

	for i, p := range cfg.Assets.PathPrefixes {
		if err := checkPath(p); err != "" {
			return nil, invalid("assets.pathPrefixes["+strconv.Itoa(i)+"]", p, err)
		}

		s.assetPaths = append(s.assetPaths, canonicalPattern(p, s.assetsCase))
	}

	if s.user, err = parseLayer("user", layerUser, cfg.User); err != nil {
		return nil, err
	}

	if s.service, err = parseLayer("service", layerService, cfg.Service); err != nil {
		return nil, err
	}

	if s.routes, err = parseRoutes(cfg.Routes); err != nil {
		return nil, err
	}

	if err = checkMaxTracked(s); err != nil {
		return nil, err
	}

	if err = checkPrincipal(cfg.Principal); err != nil {
		return nil, err
	}

	s.invalidCode = make(map[int]bool, len(cfg.Principal.InvalidCredentialStatus))
	for _, code := range cfg.Principal.InvalidCredentialStatus {
		s.invalidCode[code] = true
	}

	if err = checkRedis(cfg.Redis, s); err != nil {
		return nil, err
	}

	if cfg.Websocket.MaxConnectionsPerIP < 0 {
		return nil, invalid("websocket.maxConnectionsPerIP", cfg.Websocket.MaxConnectionsPerIP, "must be >= 0")
	}

	s.wsMaxPerIP = cfg.Websocket.MaxConnectionsPerIP

	if err = parseOperations(cfg, s); err != nil {
		return nil, err
	}

	return s, nil
}

func parseLayer(field, name string, lc LayerConfig) (layerSpec, error) {
	if lc.Points < 0 {
		return layerSpec{}, invalid(field+".points", lc.Points, "must be >= 0 (0 turns the layer off)")
	}

	d, err := parseDuration(lc.Duration)
	if err != nil {
		return layerSpec{}, invalid(field+".duration", lc.Duration, err.Error())
	}

	spec := layerSpec{name: name, points: int64(lc.Points), duration: d}

	switch strings.TrimSpace(lc.Algorithm) {
	case "", "fixed":
	case "sliding":
		spec.sliding = true
	case "tokenbucket":
		spec.bucket = true
	default:
		return layerSpec{}, invalid(field+".algorithm", lc.Algorithm, `must be "fixed", "sliding" or "tokenbucket"`)
	}

	if err := parseBurst(field, lc, &spec); err != nil {
		return layerSpec{}, err
	}

	if lc.Key == keyHost {
		spec.keyHost = true
	} else if lc.Key != "" {
		if spec.keyHeader, err = parseKeyHeader(lc.Key); err != nil {
			return layerSpec{}, invalid(field+".key", lc.Key, err.Error())
		}
	}

	return spec, nil
}

// maxBucketProduct bounds a token bucket's duration in microseconds times its
// points and its burst: the Redis script computes with them in Lua numbers,
// which are exact integers up to 2^53.
const maxBucketProduct = int64(1) << 53

// parseBurst checks a layer's burst and gives a token bucket its default
// burst, the points. A burst on another algorithm is an error rather than
// ignored: it would say the layer allows bursts that it does not.
func parseBurst(field string, lc LayerConfig, spec *layerSpec) error {
	if lc.Burst < 0 {
		return invalid(field+".burst", lc.Burst, "must be >= 0 (0: the points)")
	}

	if !spec.bucket {
		if lc.Burst != 0 {
			return invalid(field+".burst", lc.Burst, `only algorithm "tokenbucket" takes a burst`)
		}

		return nil
	}

	spec.burst = int64(lc.Burst)
	if spec.burst == 0 {
		spec.burst = spec.points
	}

	micros := int64(spec.duration / time.Microsecond)
	if spec.points > micros {
		return invalid(field+".points", lc.Points, "a token bucket refills at most one point per microsecond")
	}

	if spec.points > 0 && (spec.points > maxBucketProduct/micros || spec.burst > maxBucketProduct/micros) {
		return invalid(field+".burst", spec.burst, "too large for a token bucket of this duration (duration in microseconds x points or burst must stay below 2^53)")
	}

	return nil
}

// parseKeyHeader reads a "header:<Name>" key and returns the canonical name.
func parseKeyHeader(key string) (string, error) {
	name := strings.TrimPrefix(key, keyHeader)
	if name == key {
		return "", errors.New(`must be empty, "host" or "header:<Name>"`)
	}

	if !validToken(name) {
		return "", errors.New(`"` + name + `" is not a header name`)
	}

	return http.CanonicalHeaderKey(name), nil
}

// parseDuration reads a time.ParseDuration string or a bare integer of seconds.
// Windows are kept in whole milliseconds because Redis expiries are.
func parseDuration(raw string) (time.Duration, error) {
	raw = strings.TrimSpace(raw)

	var d time.Duration

	if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
		if n > int64(365*24*time.Hour/time.Second) {
			return 0, errors.New("longer than a year")
		}

		d = time.Duration(n) * time.Second
	} else {
		d, err = time.ParseDuration(raw)
		if err != nil {
			return 0, errors.New(`not a duration (examples: "1s", "60s", "500ms", 60)`)
		}
	}

	if d < time.Millisecond {
		return 0, errors.New("must be at least 1ms")
	}

	if d > 365*24*time.Hour {
		return 0, errors.New("longer than a year")
	}

	return d.Truncate(time.Millisecond), nil
}

func parseRoutes(routes []RouteConfig) ([]routeSpec, error) {
	seen := map[string]bool{}
	specs := make([]routeSpec, 0, len(routes))

	for i, rc := range routes {
		field := "routes[" + strconv.Itoa(i) + "]"

		if !validName(rc.Name) {
			return nil, invalid(field+".name", rc.Name, "must be 1-64 characters of A-Z a-z 0-9 _ - .")
		}

		switch rc.Name {
		case layerGlobal, layerIP, layerAssets, layerUser, layerService, layerWebsocket:
			return nil, invalid(field+".name", rc.Name, "is the name of a built-in layer")
		}

		if seen[rc.Name] {
			return nil, invalid(field+".name", rc.Name, "is used by another route")
		}

		seen[rc.Name] = true

		layer, err := parseLayer(field, rc.Name, LayerConfig{Points: rc.Points, Duration: rc.Duration, Algorithm: rc.Algorithm, Burst: rc.Burst})
		if err != nil {
			return nil, err
		}

		spec := routeSpec{layerSpec: layer, exact: map[string]bool{}, caseSensitive: rc.CaseSensitive}

		switch {
		case rc.Key == keyIP || rc.Key == keyPrincipal || rc.Key == keyGlobal || rc.Key == keyHost:
			spec.key = rc.Key
		case rc.Key == "":
			spec.key = keyIP
		case strings.HasPrefix(rc.Key, keyHeader):
			if spec.keyHeader, err = parseKeyHeader(rc.Key); err != nil {
				return nil, invalid(field+".key", rc.Key, err.Error())
			}

			spec.key = keyHeader
		default:
			return nil, invalid(field+".key", rc.Key, `must be "ip", "principal", "global", "host" or "header:<Name>"`)
		}

		for j, m := range rc.Methods {
			if !validToken(m) {
				return nil, invalid(field+".methods["+strconv.Itoa(j)+"]", m, "not an HTTP method")
			}

			spec.methods = append(spec.methods, strings.ToUpper(m))
		}

		if len(rc.Paths) == 0 {
			return nil, invalid(field+".paths", "", "at least one path is required")
		}

		for j, p := range rc.Paths {
			if err := checkPath(p); err != "" {
				return nil, invalid(field+".paths["+strconv.Itoa(j)+"]", p, err)
			}

			c := canonicalPattern(p, rc.CaseSensitive)
			if strings.HasSuffix(c, "/") {
				spec.prefixes = append(spec.prefixes, c)
			} else {
				spec.exact[c] = true
			}
		}

		specs = append(specs, spec)
	}

	return specs, nil
}

// checkPath tells why a configured route path or asset prefix is not one:
// "" when it is.
func checkPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?# \t\r\n") {
		return `must start with "/" and hold no query, fragment or whitespace`
	}

	return ""
}

func checkPrincipal(pc PrincipalConfig) error {
	if pc.UserHeader != "" && !validToken(pc.UserHeader) {
		return invalid("principal.userHeader", pc.UserHeader, "not a header name")
	}

	if pc.ServiceAccountHeader != "" && !validToken(pc.ServiceAccountHeader) {
		return invalid("principal.serviceAccountHeader", pc.ServiceAccountHeader, "not a header name")
	}

	for i, h := range pc.CredentialHeaders {
		if !validToken(h) {
			return invalid("principal.credentialHeaders["+strconv.Itoa(i)+"]", h, "not a header name")
		}
	}

	for i, c := range pc.CredentialCookies {
		if !validToken(c) {
			return invalid("principal.credentialCookies["+strconv.Itoa(i)+"]", c, "not a cookie name")
		}
	}

	for i, q := range pc.CredentialQueryParams {
		if q == "" {
			return invalid("principal.credentialQueryParams["+strconv.Itoa(i)+"]", q, "must not be empty")
		}
	}

	for i, code := range pc.InvalidCredentialStatus {
		if code < 100 || code > 599 {
			return invalid("principal.invalidCredentialStatus["+strconv.Itoa(i)+"]", code, "not an HTTP status")
		}
	}

	return nil
}

func checkRedis(rc RedisConfig, s *settings) error {
	var err error

	s.redis = redisresp.Options{
		Address: rc.Address, Username: rc.Username, Password: rc.Password,
		DB: rc.DB, PoolSize: rc.PoolSize,
	}

	if err = parseTLS(rc.TLS, &s.redis); err != nil {
		return err
	}

	if s.redis.DialTimeout, err = parseDuration(rc.DialTimeout); err != nil {
		return invalid("redis.dialTimeout", rc.DialTimeout, err.Error())
	}

	if s.redis.Timeout, err = parseDuration(rc.Timeout); err != nil {
		return invalid("redis.timeout", rc.Timeout, err.Error())
	}

	if rc.DB < 0 {
		return invalid("redis.db", rc.DB, "must be >= 0")
	}

	if rc.PoolSize < 1 {
		return invalid("redis.poolSize", rc.PoolSize, "must be >= 1")
	}

	return checkDeployment(rc, s)
}

// defaultRedisAddress is CreateConfig's redis.address: it stands for "not
// set" next to redis.sentinel or redis.cluster.
const defaultRedisAddress = "127.0.0.1:6379"

// checkDeployment reads which of redis.address, redis.sentinel and
// redis.cluster is used: exactly one.
func checkDeployment(rc RedisConfig, s *settings) error {
	address := rc.Address
	if address == defaultRedisAddress && (rc.Sentinel != nil || rc.Cluster != nil) {
		address = ""
	}

	switch {
	case rc.Sentinel != nil && rc.Cluster != nil:
		return invalid("redis.cluster", strings.Join(rc.Cluster.Addresses, ","), "cannot be set together with redis.sentinel; use one of them")
	case address != "" && rc.Sentinel != nil:
		return invalid("redis.address", address, "cannot be set together with redis.sentinel; the sentinels name the primary")
	case address != "" && rc.Cluster != nil:
		return invalid("redis.address", address, "cannot be set together with redis.cluster; list the nodes in redis.cluster.addresses")
	case rc.Cluster != nil:
		return checkCluster(rc, s)
	case rc.Sentinel != nil:
		return checkSentinel(rc, s)
	}

	if s.store == "redis" {
		if !validHostPort(rc.Address) {
			return invalid("redis.address", rc.Address, "must be host:port")
		}
	}

	return nil
}

func checkCluster(rc RedisConfig, s *settings) error {
	if len(rc.Cluster.Addresses) == 0 {
		return invalid("redis.cluster.addresses", "", "must list at least one node (host:port)")
	}

	for i, a := range rc.Cluster.Addresses {
		if !validHostPort(a) {
			return invalid("redis.cluster.addresses["+strconv.Itoa(i)+"]", a, "must be host:port")
		}
	}

	if rc.DB != 0 {
		return invalid("redis.db", rc.DB, "must be 0 with redis.cluster: a cluster has database 0 only")
	}

	s.redis.Address = ""
	s.redis.Cluster = &redisresp.ClusterOptions{Addresses: rc.Cluster.Addresses}

	return nil
}

func checkSentinel(rc RedisConfig, s *settings) error {
	sc := rc.Sentinel

	if strings.TrimSpace(sc.MasterName) == "" || strings.ContainsAny(sc.MasterName, " \t\r\n") {
		return invalid("redis.sentinel.masterName", sc.MasterName, "must be the monitored group's name (no whitespace)")
	}

	if len(sc.Addresses) == 0 {
		return invalid("redis.sentinel.addresses", "", "must list at least one sentinel (host:port)")
	}

	for i, a := range sc.Addresses {
		if !validHostPort(a) {
			return invalid("redis.sentinel.addresses["+strconv.Itoa(i)+"]", a, "must be host:port")
		}
	}

	if sc.Username != "" && sc.Password == "" {
		return invalid("redis.sentinel.username", sc.Username, "needs redis.sentinel.password")
	}

	s.redis.Address = ""
	s.redis.Sentinel = &redisresp.SentinelOptions{
		MasterName: sc.MasterName, Addresses: sc.Addresses, Username: sc.Username, Password: sc.Password,
	}

	return nil
}

func validHostPort(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || port == "" {
		return false
	}

	n, err := strconv.Atoi(port)

	return err == nil && n > 0 && n < 65536
}

// parseTLS reads redis.tls: a boolean, or a map of RedisTLS keys (matched
// case-insensitively, as Traefik matches field names) that turns TLS on.
// Values may be strings, as the file provider sends every scalar.
func parseTLS(v interface{}, o *redisresp.Options) error {
	switch t := v.(type) {
	case nil:
		return nil
	case bool:
		o.TLS = t
		return nil
	case string:
		on, err := strconv.ParseBool(strings.TrimSpace(t))
		if err != nil && strings.TrimSpace(t) != "" {
			return invalid("redis.tls", t, "must be true, false or a map with ca, cert, key, serverName, insecureSkipVerify")
		}

		o.TLS = on

		return nil
	case map[string]interface{}:
		return parseTLSMap(t, o)
	case map[interface{}]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, val := range t {
			m[fmt.Sprint(k)] = val
		}

		return parseTLSMap(m, o)
	}

	return invalid("redis.tls", v, "must be true, false or a map with ca, cert, key, serverName, insecureSkipVerify")
}

func parseTLSMap(m map[string]interface{}, o *redisresp.Options) error {
	o.TLS = true
	tc := &o.TLSConfig

	for k, val := range m {
		field := "redis.tls." + k

		if strings.EqualFold(k, "insecureSkipVerify") {
			on, ok := val.(bool)
			if s, isString := val.(string); isString {
				var err error
				on, err = strconv.ParseBool(strings.TrimSpace(s))
				ok = err == nil
			}

			if !ok {
				return invalid(field, val, "must be true or false")
			}

			tc.InsecureSkipVerify = on

			continue
		}

		s, ok := val.(string)
		if !ok && val != nil {
			return invalid(field, val, "must be a string")
		}

		switch strings.ToLower(k) {
		case "ca":
			tc.CA = s
		case "cert":
			tc.Cert = s
		case "key":
			tc.Key = s
		case "servername":
			tc.ServerName = strings.TrimSpace(s)
		default:
			return invalid(field, "", "unknown key; redis.tls takes ca, cert, key, serverName, insecureSkipVerify")
		}
	}

	if field, err := tc.Check(); err != nil {
		value := tc.CA
		switch field {
		case "cert":
			value = tc.Cert
		case "key":
			value = tc.Key
		}

		if redisresp.IsPEM(value) {
			value = "(inline PEM)" // never echo key material
		}

		return invalid("redis.tls."+field, value, err.Error())
	}

	return nil
}

// parsePrefix accepts a CIDR or a bare address (a one-address prefix). IPv4-mapped
// IPv6 prefixes are stored as IPv4 so that they match unmapped client addresses.
func parsePrefix(raw string) (netip.Prefix, error) {
	raw = strings.TrimSpace(raw)

	if !strings.Contains(raw, "/") {
		a, err := netip.ParseAddr(raw)
		if err != nil {
			return netip.Prefix{}, err
		}

		a = a.Unmap().WithZone("")

		return netip.PrefixFrom(a, a.BitLen()), nil
	}

	p, err := netip.ParsePrefix(raw)
	if err != nil {
		return netip.Prefix{}, err
	}

	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}

	return p.Masked(), nil
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}

	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}

	return true
}

// validName limits layer names to characters that are safe unquoted in Redis
// keys, log lines and structured header fields.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}

	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}

	return true
}

// validToken reports whether s is an RFC 9110 token (header names, methods, cookie names).
func validToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}

	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}

	return true
}

// maxBodyTemplate bounds the configured refusal body.
const maxBodyTemplate = 64 << 10

// parseOperations reads the status endpoint, the exemptions and the refusal.
func parseOperations(cfg *Config, s *settings) error {
	if p := cfg.Status.Path; p != "" {
		if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") || strings.ContainsAny(p, "?# \t\r\n") {
			return invalid("status.path", p, `must start with "/", not end with "/", and hold no query`)
		}

		s.statusPath = p
	}

	for i, raw := range cfg.Status.AllowedIPs {
		prefix, err := parsePrefix(raw)
		if err != nil {
			return invalid("status.allowedIPs["+strconv.Itoa(i)+"]", raw, "not a CIDR or IP address")
		}

		s.statusAllowed = append(s.statusAllowed, prefix)
	}

	for i, raw := range cfg.Exempt.IPs {
		prefix, err := parsePrefix(raw)
		if err != nil {
			return invalid("exempt.ips["+strconv.Itoa(i)+"]", raw, "not a CIDR or IP address")
		}

		s.exemptIPs = append(s.exemptIPs, prefix)
	}

	for i, id := range cfg.Exempt.Principals {
		if strings.TrimSpace(id) == "" || len(id) > maxPrincipalLen {
			return invalid("exempt.principals["+strconv.Itoa(i)+"]", id, "must be 1-128 characters")
		}

		if s.exemptIDs == nil {
			s.exemptIDs = map[string]bool{}
		}

		s.exemptIDs[strings.TrimSpace(id)] = true
	}

	s.exemptGlobal = cfg.Exempt.Global
	s.response = cfg.Response

	switch cfg.Response.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		return invalid("response.statusCode", cfg.Response.StatusCode, "must be 429 or 503")
	}

	if ct := cfg.Response.ContentType; ct == "" || len(ct) > 256 || strings.ContainsAny(ct, "\r\n\x00") {
		return invalid("response.contentType", ct, "must be a media type of 1-256 characters on one line")
	}

	if len(cfg.Response.Body) > maxBodyTemplate {
		return invalid("response.body", cfg.Response.Body[:32]+"...", "longer than 64 KiB")
	}

	var err error
	if s.responseBody, err = parseBodyTemplate(cfg.Response.Body); err != nil {
		return invalid("response.body", cfg.Response.Body, err.Error())
	}

	return nil
}

// checkMaxTracked rejects a cap below the number of layers that are on: one
// request charges a counter in each of its layers (global, its tier, the
// routes it matches), and a store that cannot hold one counter per layer for
// one key would evict the counters of a request's own layers, letting every
// request through.
func checkMaxTracked(s *settings) error {
	if !s.enabled {
		return nil
	}

	var on []string

	for _, l := range []layerSpec{s.global, s.ip, s.assets, s.user, s.service} {
		if l.on() {
			on = append(on, l.name)
		}
	}

	for _, rs := range s.routes {
		if rs.on() {
			on = append(on, rs.name)
		}
	}

	if s.maxTracked >= len(on) {
		return nil
	}

	return invalid("maxTracked", s.maxTracked, "must be at least "+strconv.Itoa(len(on))+
		", one counter for each layer that is on ("+strings.Join(on, ", ")+")")
}
