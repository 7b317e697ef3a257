package tierlimit

import (
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/request"
)

// settings is the validated, parsed form of Config that New builds once, so
// that nothing on the request path parses configuration. Its fields are
// typed: build and chooseMode read nothing of Config.
type settings struct {
	enabled   bool
	dryRun    bool
	store     string
	keyPrefix string
	headers   bool

	proxies    []netip.Prefix
	hops       int
	ipv6Prefix int
	maxTracked int
	builtin    []layerSpec // aligned with builtinLayers
	assetPaths []string    // canonical (canonicalPattern); nil when none
	assetsCase bool        // assets.caseSensitive
	routes     []routeSpec
	plans      []layerSpec // plans:, by name (configplans.go)

	// The principal's headers, canonical ("" when not read), and the
	// credentials the instance reads: none after ForwardAuth (userHeader
	// set), where a credential tells it nothing more (chain.go).
	userHeader    string
	serviceHeader string
	planHeader    string   // "" unless there are plans
	credHeaders   []string // canonical
	credCookies   []string
	credQuery     []string
	invalidCode   map[int]bool

	redis        redisresp.Options
	syncInterval time.Duration // redis.syncInterval; 0: exact mode (syncstore.go)
	wsMaxPerIP   int

	statusPath    string // "" when the status endpoint is off
	statusAllowed []netip.Prefix
	exemptIPs     []netip.Prefix
	exemptIDs     map[string]bool
	exemptGlobal  bool

	refusalStatus int               // response.statusCode
	refusalType   string            // response.contentType
	responseBody  []answer.BodyPart // response.body parsed; nil for the default JSON body
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
	// block is how long a key the layer refused stays refused (0: none).
	block time.Duration
	// calendar (calDay, calWeek, calMonth; 0: none) aligns the windows to
	// the calendar at utcOffset (nanoseconds east of UTC); duration is then
	// the period's longest (calendar.go).
	calendar  int
	utcOffset int64
	dryRun    bool // counts, logs, sends headers, never refuses (its own or the top-level dryRun)
	// memory (store: memory) counts the layer in memory on a Redis instance;
	// redisField names a store: redis, which only a Redis instance takes.
	memory     bool
	redisField string
}

func (l layerSpec) on() bool { return l.points > 0 }

// routeSpec is a parsed route limit.
type routeSpec struct {
	layerSpec
	methods       []string
	exact         map[string]bool // canonical paths (canonicalPattern)
	prefixes      []string        // canonical, ending in "/"
	caseSensitive bool
	key           string       // keyIP, keyPrincipal, keyGlobal, keyHost or keyHeader
	cost          int64        // what a matching request is charged in each of its layers (>= 1)
	countStatus   map[int]bool // the statuses charged to the route; nil: every request, up front
}

// spec is the parsed built-in layer of that name.
func (s *settings) spec(name string) layerSpec {
	for _, l := range s.builtin {
		if l.name == name {
			return l
		}
	}

	return layerSpec{}
}

// planOn reports whether some built-in layer of the classes is on: whether
// the plan of those classes charges anything but routes.
func (s *settings) planOn(classes []int) bool {
	for i, row := range builtinLayers {
		if s.builtin[i].on() && hasClass(classes, row.charges) {
			return true
		}
	}

	return false
}

// parse validates cfg and returns its parsed form. Every error names the field
// and the bad value; a configuration with several errors reports the first
// in the order of these steps.
func parse(cfg *Config) (*settings, error) {
	if cfg == nil {
		cfg = CreateConfig()
	}

	if err := checkUnknown(cfg); err != nil {
		return nil, err
	}

	s := &settings{enabled: cfg.Enabled, dryRun: cfg.DryRun, headers: cfg.Headers, keyPrefix: cfg.KeyPrefix}

	if err := parseStore(cfg, s); err != nil {
		return nil, err
	}

	if err := parseClients(cfg, s); err != nil {
		return nil, err
	}

	if err := parseLayers(cfg, s); err != nil {
		return nil, err
	}

	if err := parsePrincipal(cfg.Principal, s); err != nil {
		return nil, err
	}

	if err := parsePlanHeader(cfg, s); err != nil {
		return nil, err
	}

	if err := checkRedis(cfg.Redis, s); err != nil {
		return nil, err
	}

	if err := checkSync(cfg.Redis.SyncInterval, s); err != nil {
		return nil, err
	}

	if cfg.Websocket.MaxConnectionsPerIP < 0 {
		return nil, invalid("websocket.maxConnectionsPerIP", cfg.Websocket.MaxConnectionsPerIP, "must be >= 0")
	}

	s.wsMaxPerIP = cfg.Websocket.MaxConnectionsPerIP

	if err := parseOperations(cfg, s); err != nil {
		return nil, err
	}

	if s.dryRun {
		allDryRun(s)
	}

	return s, nil
}

// allDryRun puts every layer in dry run: the top-level dryRun is each rule's
// dryRun at once, so the request path knows one flag.
func allDryRun(s *settings) {
	for i := range s.builtin {
		s.builtin[i].dryRun = true
	}

	for i := range s.routes {
		s.routes[i].dryRun = true
	}

	for i := range s.plans {
		s.plans[i].dryRun = true
	}
}

// parseStore reads store and keyPrefix.
func parseStore(cfg *Config, s *settings) error {
	switch cfg.Store {
	case "memory", "redis":
		s.store = cfg.Store
	default:
		return invalid("store", cfg.Store, `must be "memory" or "redis"`)
	}

	if strings.ContainsAny(cfg.KeyPrefix, " \t\r\n") {
		return invalid("keyPrefix", cfg.KeyPrefix, "must not contain whitespace")
	}

	return nil
}

// parseClients reads how client addresses are found and keyed, and how many
// keys are tracked.
func parseClients(cfg *Config, s *settings) error {
	if cfg.TrustedHops < 0 {
		return invalid("trustedHops", cfg.TrustedHops, "must be >= 0")
	}

	s.hops = cfg.TrustedHops

	if s.hops > 0 {
		// The defaults stand for "not set": only a list the user wrote conflicts.
		if len(cfg.TrustedProxies) > 0 && !sameStrings(cfg.TrustedProxies, defaultTrustedProxies) {
			return invalid("trustedProxies", strings.Join(cfg.TrustedProxies, ","),
				"cannot be set together with trustedHops ("+strconv.Itoa(cfg.TrustedHops)+"); use one of them")
		}
	} else {
		for i, raw := range cfg.TrustedProxies {
			p, err := parsePrefix(raw)
			if err != nil {
				return invalid("trustedProxies["+strconv.Itoa(i)+"]", raw, "not a CIDR or IP address")
			}

			s.proxies = append(s.proxies, p)
		}
	}

	if cfg.IPv6PrefixLength < 1 || cfg.IPv6PrefixLength > 128 {
		return invalid("ipv6PrefixLength", cfg.IPv6PrefixLength, "must be between 1 and 128")
	}

	s.ipv6Prefix = cfg.IPv6PrefixLength

	if cfg.MaxTracked < 1 {
		return invalid("maxTracked", cfg.MaxTracked, "must be >= 1")
	}

	s.maxTracked = cfg.MaxTracked

	return nil
}

// parseLayers reads the built-in layers, the routes, and checks that
// maxTracked holds a counter of each.
func parseLayers(cfg *Config, s *settings) error {
	for _, row := range builtinLayers {
		spec, err := parseBuiltin(cfg, row)
		if err != nil {
			return err
		}

		s.builtin = append(s.builtin, spec)

		if row.more != nil {
			if err := row.more(cfg, s); err != nil {
				return err
			}
		}
	}

	routes, err := parseRoutes(cfg.Routes)
	if err != nil {
		return err
	}

	s.routes = routes

	if err := parsePlans(cfg, s); err != nil {
		return err
	}

	if err := checkLayerStores(s); err != nil {
		return err
	}

	return checkMaxTracked(s)
}

// checkLayerStores refuses a layer's store: redis on a memory instance,
// which has no Redis to count it in.
func checkLayerStores(s *settings) error {
	if s.store == "redis" {
		return nil
	}

	for _, l := range ruleSpecs(s) {
		if l.redisField != "" {
			return invalid(l.redisField, "redis", `takes an instance with store: redis (this one counts in memory)`)
		}
	}

	return nil
}

// ruleSpecs is every rule's window: the built-in layers, the routes and the
// plans.
func ruleSpecs(s *settings) []layerSpec {
	specs := append([]layerSpec(nil), s.builtin...)
	for _, rs := range s.routes {
		specs = append(specs, rs.layerSpec)
	}

	return append(specs, s.plans...)
}

// parseBuiltin reads the section of a built-in layer.
func parseBuiltin(cfg *Config, row builtinLayer) (layerSpec, error) {
	lc := row.config(cfg)

	if lc.Key != "" && len(row.keys) == 0 {
		return layerSpec{}, invalid(row.name+".key", lc.Key, "the "+row.name+" layer has one bucket; only other layers take a key")
	}

	// A section without a duration has the built-in default, unless a
	// calendar replaces it (CreateConfig writes none: defaultLayer).
	if strings.TrimSpace(lc.Calendar) == "" && strings.TrimSpace(lc.Duration) == "" {
		lc.Duration = row.duration
	}

	spec, err := parseLayer(row.name, row.name, lc)
	if err != nil {
		return layerSpec{}, err
	}

	if err := parseTierKey(row, lc.Key, &spec); err != nil {
		return layerSpec{}, invalid(row.name+".key", lc.Key, err.Error())
	}

	return spec, nil
}

// parseTierKey reads the key of a built-in layer: none, or a form its row
// takes.
func parseTierKey(row builtinLayer, key string, spec *layerSpec) error {
	switch {
	case key == "":
		return nil
	case key == keyHost && takesKey(row, keyHost):
		spec.keyHost = true
		return nil
	case !takesKey(row, keyHeader):
		return errors.New("must be empty or one of " + strings.Join(row.keys, ", "))
	}

	name, err := parseKeyHeader(key)
	spec.keyHeader = name

	return err
}

// parseAssetPaths reads assets.pathPrefixes and assets.caseSensitive.
func parseAssetPaths(cfg *Config, s *settings) error {
	s.assetsCase = cfg.Assets.CaseSensitive

	for i, p := range cfg.Assets.PathPrefixes {
		if why := checkPath(p); why != "" {
			return invalid("assets.pathPrefixes["+strconv.Itoa(i)+"]", p, why)
		}

		s.assetPaths = append(s.assetPaths, request.CanonicalPattern(p, s.assetsCase))
	}

	return nil
}

// parseLayer reads a window: points, duration, algorithm and burst (a
// layer's key is its caller's).
func parseLayer(field, name string, lc LayerConfig) (layerSpec, error) {
	if lc.Points < 0 {
		return layerSpec{}, invalid(field+".points", lc.Points, "must be >= 0 (0 turns the layer off)")
	}

	spec := layerSpec{name: name, points: int64(lc.Points), dryRun: lc.DryRun}

	switch lc.Store {
	case "":
	case "memory":
		spec.memory = true
	case "redis":
		spec.redisField = field + ".store"
	default:
		return layerSpec{}, invalid(field+".store", lc.Store, `must be "memory" or "redis" (empty: the instance's store)`)
	}

	if err := parseWindow(field, lc, &spec); err != nil {
		return layerSpec{}, err
	}

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

	if spec.calendar != 0 && (spec.sliding || spec.bucket) {
		return layerSpec{}, invalid(field+".calendar", lc.Calendar, `takes algorithm "fixed" only, not `+strconv.Quote(lc.Algorithm))
	}

	block, err := parseBlock(field, lc.BlockDuration)
	if err != nil {
		return layerSpec{}, err
	}

	spec.block = block

	return spec, nil
}

// parseBlock reads a blockDuration: empty or 0 blocks nothing.
func parseBlock(field, v string) (time.Duration, error) {
	if t := strings.TrimSpace(v); t == "" || t == "0" {
		return 0, nil
	}

	d, err := parseDuration(v)
	if err != nil {
		return 0, invalid(field+".blockDuration", durationText(v), err.Error())
	}

	return d, nil
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

// parseDuration reads a time.ParseDuration string or a bare number of
// seconds: an integer, or a decimal such as 1.5 (which Traefik's file
// provider hands over as "1.500000"). Windows are kept in whole milliseconds
// because Redis expiries are.
func parseDuration(raw string) (time.Duration, error) {
	raw = strings.TrimSpace(raw)

	var d time.Duration

	if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
		if n > int64(365*24*time.Hour/time.Second) {
			return 0, errors.New("longer than a year")
		}

		d = time.Duration(n) * time.Second
	} else {
		if bareSeconds(raw) {
			raw += "s"
		}

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

// bareSeconds reports whether raw is a bare decimal number (digits and at
// most one dot), which a duration reads as seconds.
func bareSeconds(raw string) bool {
	digits := false
	for i, r := range raw {
		switch {
		case r >= '0' && r <= '9':
			digits = true
		case r != '.' || strings.IndexByte(raw[i+1:], '.') >= 0:
			return false
		}
	}

	return digits
}

// durationText is a configured duration as errors show it: a bare decimal
// number of seconds with its unit and without the zeros Traefik's file
// provider adds (1.5 arrives as "1.500000" and reads "1.5s"), anything else
// (a bare integer included) as written.
func durationText(raw string) string {
	t := strings.TrimSpace(raw)
	if !bareSeconds(t) || strings.IndexByte(t, '.') < 0 {
		return raw
	}

	t = strings.TrimRight(strings.TrimRight(t, "0"), ".")
	if t == "" || t[0] == '.' {
		t = "0" + t
	}

	return t + "s"
}

func parseRoutes(routes []RouteConfig) ([]routeSpec, error) {
	seen := map[string]bool{}
	specs := make([]routeSpec, 0, len(routes))

	for i, rc := range routes {
		field := "routes[" + strconv.Itoa(i) + "]"

		if err := checkRouteName(field, rc.Name, seen); err != nil {
			return nil, err
		}

		spec, err := parseRoute(field, rc)
		if err != nil {
			return nil, err
		}

		specs = append(specs, spec)
	}

	return specs, nil
}

// checkRouteName checks a route's name, which names its layer, and adds it
// to those seen.
func checkRouteName(field, name string, seen map[string]bool) error {
	if !validName(name) {
		return invalid(field+".name", name, "must be 1-64 characters of A-Z a-z 0-9 _ - .")
	}

	if isBuiltinName(name) {
		return invalid(field+".name", name, "is the name of a built-in layer")
	}

	if seen[name] {
		return invalid(field+".name", name, "is used by another route")
	}

	seen[name] = true

	return nil
}

// parseRoute reads one route; field is its place in routes.
func parseRoute(field string, rc RouteConfig) (routeSpec, error) {
	layer, err := parseLayer(field, rc.Name, LayerConfig{Points: rc.Points, Duration: rc.Duration, Algorithm: rc.Algorithm, Burst: rc.Burst, BlockDuration: rc.BlockDuration, Calendar: rc.Calendar, UtcOffset: rc.UtcOffset, DryRun: rc.DryRun, Store: rc.Store})
	if err != nil {
		return routeSpec{}, err
	}

	spec := routeSpec{layerSpec: layer, exact: map[string]bool{}, caseSensitive: rc.CaseSensitive}

	if err := parseRouteCost(field, rc, &spec); err != nil {
		return routeSpec{}, err
	}

	if err := parseRouteKey(field, rc.Key, &spec); err != nil {
		return routeSpec{}, err
	}

	if err := parseRouteMatch(field, rc, &spec); err != nil {
		return routeSpec{}, err
	}

	return spec, nil
}

// parseRouteCost reads a route's cost (default requestCost) and the
// statuses it counts. A cost above what the route's layer holds (its points,
// a token bucket's burst) could never be served, so it is an error. So is a
// cost on a route that is off (points 0): such a route matches nothing, so
// its cost would be silently ignored, where a user may expect it to charge
// the other layers.
func parseRouteCost(field string, rc RouteConfig, spec *routeSpec) error {
	spec.cost = requestCost
	if rc.Cost < 0 {
		return invalid(field+".cost", rc.Cost, "must be >= 1 (0: 1)")
	}

	if !spec.on() && rc.Cost > 1 {
		return invalid(field+".cost", rc.Cost, "is ignored on a route with points 0 (off), which charges nothing: give the route points, or remove its cost")
	}

	if rc.Cost > 0 {
		spec.cost = int64(rc.Cost)
	}

	capacity := spec.points
	if spec.bucket {
		capacity = spec.burst
	}

	if spec.on() && spec.cost > capacity {
		return invalid(field+".cost", rc.Cost, "must be at most what the route holds (its points, a token bucket's burst): "+formatInt(capacity))
	}

	for j, code := range rc.CountStatus {
		if code < 100 || code > 599 {
			return invalid(field+".countStatus["+strconv.Itoa(j)+"]", code, "must be an HTTP status, 100-599")
		}

		if spec.countStatus == nil {
			spec.countStatus = map[int]bool{}
		}

		spec.countStatus[code] = true
	}

	return nil
}

// parseRouteKey reads a route's key: ip by default.
func parseRouteKey(field, key string, spec *routeSpec) error {
	_, known := routeKeyKinds[key]

	switch {
	case key == "":
		spec.key = keyIP
	case known && key != keyHeader:
		spec.key = key
	case strings.HasPrefix(key, keyHeader):
		name, err := parseKeyHeader(key)
		if err != nil {
			return invalid(field+".key", key, err.Error())
		}

		spec.keyHeader = name
		spec.key = keyHeader
	default:
		return invalid(field+".key", key, `must be "ip", "principal", "global", "host" or "header:<Name>"`)
	}

	return nil
}

// parseRouteMatch reads the methods and paths a route matches.
func parseRouteMatch(field string, rc RouteConfig, spec *routeSpec) error {
	for j, m := range rc.Methods {
		if !validToken(m) {
			return invalid(field+".methods["+strconv.Itoa(j)+"]", m, "not an HTTP method")
		}

		spec.methods = append(spec.methods, strings.ToUpper(m))
	}

	if len(rc.Paths) == 0 {
		return invalid(field+".paths", "", "at least one path is required")
	}

	for j, p := range rc.Paths {
		if why := checkPath(p); why != "" {
			return invalid(field+".paths["+strconv.Itoa(j)+"]", p, why)
		}

		c := request.CanonicalPattern(p, rc.CaseSensitive)
		if strings.HasSuffix(c, "/") {
			spec.prefixes = append(spec.prefixes, c)
		} else {
			spec.exact[c] = true
		}
	}

	return nil
}

// parsePrincipal reads where the principal and credentials come from.
func parsePrincipal(pc PrincipalConfig, s *settings) error {
	if err := checkPrincipal(pc); err != nil {
		return err
	}

	s.userHeader = http.CanonicalHeaderKey(pc.UserHeader)
	s.serviceHeader = http.CanonicalHeaderKey(pc.ServiceAccountHeader)

	// After ForwardAuth the principal is known; credentials are not read.
	if s.userHeader == "" {
		for _, h := range pc.CredentialHeaders {
			s.credHeaders = append(s.credHeaders, http.CanonicalHeaderKey(h))
		}

		s.credCookies = pc.CredentialCookies
		s.credQuery = pc.CredentialQueryParams
	}

	s.invalidCode = make(map[int]bool, len(pc.InvalidCredentialStatus))
	for _, code := range pc.InvalidCredentialStatus {
		s.invalidCode[code] = true
	}

	return nil
}

// parseOperations reads the status endpoint, the exemptions and the refusal.
func parseOperations(cfg *Config, s *settings) error {
	if err := parseStatus(cfg.Status, s); err != nil {
		return err
	}

	if err := parseExempt(cfg.Exempt, s); err != nil {
		return err
	}

	return parseResponse(cfg.Response, s)
}

func parseStatus(sc StatusConfig, s *settings) error {
	if p := sc.Path; p != "" {
		if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") || strings.ContainsAny(p, "?# \t\r\n") {
			return invalid("status.path", p, `must start with "/", not end with "/", and hold no query`)
		}

		s.statusPath = p
	}

	allowed, err := parsePrefixes("status.allowedIPs", sc.AllowedIPs)
	if err != nil {
		return err
	}

	s.statusAllowed = allowed

	return nil
}

func parseExempt(ec ExemptConfig, s *settings) error {
	ips, err := parsePrefixes("exempt.ips", ec.IPs)
	if err != nil {
		return err
	}

	s.exemptIPs = ips

	for i, id := range ec.Principals {
		if strings.TrimSpace(id) == "" || len(id) > request.MaxPrincipalLen {
			return invalid("exempt.principals["+strconv.Itoa(i)+"]", id, "must be 1-128 characters")
		}

		if s.exemptIDs == nil {
			s.exemptIDs = map[string]bool{}
		}

		s.exemptIDs[strings.TrimSpace(id)] = true
	}

	s.exemptGlobal = ec.Global

	return nil
}

// maxBodyTemplate bounds the configured refusal body.
const maxBodyTemplate = 64 << 10

func parseResponse(rc ResponseConfig, s *settings) error {
	switch rc.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		return invalid("response.statusCode", rc.StatusCode, "must be 429 or 503")
	}

	if ct := rc.ContentType; ct == "" || len(ct) > 256 || strings.ContainsAny(ct, "\r\n\x00") {
		return invalid("response.contentType", ct, "must be a media type of 1-256 characters on one line")
	}

	if len(rc.Body) > maxBodyTemplate {
		return invalid("response.body", rc.Body[:32]+"...", "longer than 64 KiB")
	}

	body, err := answer.ParseBodyTemplate(rc.Body)
	if err != nil {
		return invalid("response.body", rc.Body, err.Error())
	}

	s.refusalStatus = rc.StatusCode
	s.refusalType = rc.ContentType
	s.responseBody = body

	return nil
}

// parsePrefixes reads a list of CIDRs or addresses; field names the list.
// It returns nil for an empty list.
func parsePrefixes(field string, raws []string) ([]netip.Prefix, error) {
	var out []netip.Prefix

	for i, raw := range raws {
		p, err := parsePrefix(raw)
		if err != nil {
			return nil, invalid(field+"["+strconv.Itoa(i)+"]", raw, "not a CIDR or IP address")
		}

		out = append(out, p)
	}

	return out, nil
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
