package config

import (
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/usage"
)

// Settings is the validated, parsed form of Config that New builds once, so
// that nothing on the request path parses configuration. Its fields are
// typed: the root's build and chooseMode read nothing of Config.
type Settings struct {
	Enabled   bool
	DryRun    bool
	Store     string
	KeyPrefix string
	Headers   bool

	Proxies    []netip.Prefix
	Hops       int
	IPv6Prefix int
	MaxTracked int
	Builtin    []Rule   // aligned with Builtins
	AssetPaths []string // canonical (canonicalPattern); nil when none
	AssetsCase bool     // assets.caseSensitive
	Routes     []Route
	Plans      []Rule // plans:, by name (plans.go)

	// The principal's headers, canonical ("" when not read), and the
	// credentials the instance reads: none after ForwardAuth (userHeader
	// set), where a credential tells it nothing more (the root's after.go).
	UserHeader    string
	ServiceHeader string
	PlanHeader    string   // "" unless there are plans
	CredHeaders   []string // canonical
	CredCookies   []string
	CredQuery     []string
	InvalidCode   map[int]bool

	Redis        redisresp.Options
	SyncInterval time.Duration // redis.syncInterval; 0: exact mode (redisstore/syncstore.go)
	WSMaxPerIP   int

	StatusPath    string // "" when the status endpoint is off
	StatusAllowed []netip.Prefix
	ExemptIPs     []netip.Prefix
	ExemptIDs     map[string]bool
	ExemptGlobal  bool

	RefusalStatus int    // response.statusCode
	RefusalType   string // response.contentType
	ResponseBody  string // response.body, checked by answer.ParseBodyTemplate; "" for the default JSON body
}

// Rule is a parsed layer. points == 0 means off.
type Rule struct {
	Name     string
	Points   int64
	Duration time.Duration
	// Algorithm is how the rule counts (limit.Algorithm): a token bucket
	// takes points per duration into a bucket of Burst; a concurrency rule
	// holds points requests in flight at once, each slot held at most
	// duration, its lease.
	Algorithm limit.Algorithm
	Burst     int64  // tokenbucket only
	KeyHeader string // canonical header name when keyed by "header:<Name>"
	KeyHost   bool   // keyed by the request's host
	// KeyParts are the sources of a route key that reads the request's
	// body (json:<path>) or combines several sources; nil otherwise.
	// MaxBody bounds the body bytes read for it (maxRequestBody).
	KeyParts []KeyPart
	MaxBody  int64
	// BlockDuration is how long a key the layer refused stays refused (0: none).
	BlockDuration time.Duration
	// MaxDelay is how long a request the rule would refuse may wait for its
	// place (0: none, it is refused; always 0 in dry run, which refuses
	// nothing).
	MaxDelay time.Duration
	// calendar (calDay, calWeek, calMonth; 0: none) aligns the windows to
	// the calendar at utcOffset (nanoseconds east of UTC); duration is then
	// the period's longest (calendarMax).
	Calendar  int
	UtcOffset int64
	DryRun    bool // counts, logs, sends headers, never refuses (its own or the top-level dryRun)
	// memory (store: memory) counts the layer in memory on a Redis instance;
	// redisField names a store: redis, which only a Redis instance takes.
	Memory     bool
	RedisField string
	// Unleased marks a rule that synced counting (redis.syncInterval) does
	// not lease: the script counts it at each request, as exact counting
	// does, since every replica must see what it holds at once (a
	// concurrency layer's slots, held from a request's admission to its end).
	Unleased bool
	// Apart marks a rule that the memory store charges apart from its
	// algorithm's usual take (rule.Limits.Apart): a maxDelay's.
	Apart bool
}

func (l Rule) On() bool { return l.Points > 0 }

// Plain reports whether the fast paths can charge the rule: a fixed window,
// off the calendar, that blocks no key, enforces, and is keyed as its
// section says (not by a header, the host or the body). Any other rule is
// charged on the general path only (the root's chooseMode and
// routedPaths): an option the fast paths do not implement joins here.
func (l Rule) Plain() bool {
	return l.Algorithm == limit.Fixed && l.KeyHeader == "" && !l.KeyHost && l.KeyParts == nil && l.BlockDuration == 0 && l.MaxDelay == 0 && !l.DryRun && l.Calendar == 0
}

// Route is a parsed route limit.
type Route struct {
	Rule
	Methods       []string
	Exact         map[string]bool // canonical paths (canonicalPattern)
	Prefixes      []string        // canonical, ending in "/"
	CaseSensitive bool
	Key           string       // KeyIP, keyPrincipal, keyGlobal, KeyHost, KeyHeader or KeyParts
	Cost          int64        // what a matching request is charged in each of its layers (>= 1)
	CountStatus   map[int]bool // the statuses charged to the route; nil: every request, up front
	// CostFrom is where the response states what a request cost the
	// route's own layer (costFrom; nil: the route charges Cost up front),
	// which holds Reserve points for it until then.
	CostFrom *usage.Expr
	Reserve  int64
	// Plans are the route's windows for principals on a plan, in plan
	// order: each rule named <route>.<plan> (RoutePlanName).
	Plans []Rule
}

// Spec is the parsed built-in layer of that name.
func (s *Settings) Spec(name string) Rule {
	for _, l := range s.Builtin {
		if l.Name == name {
			return l
		}
	}

	return Rule{}
}

// Parse validates cfg (nil: the defaults) and returns its parsed form. Every
// error names the field and the bad value; a configuration with several
// errors reports the first in the order of these steps.
func Parse(cfg *Config) (*Settings, error) {
	if cfg == nil {
		cfg = Defaults()
	}

	if err := checkUnknown(cfg); err != nil {
		return nil, err
	}

	s := &Settings{Enabled: cfg.Enabled, DryRun: cfg.DryRun, Headers: cfg.Headers, KeyPrefix: cfg.KeyPrefix}

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

	if err := checkStores(cfg, s); err != nil {
		return nil, err
	}

	if cfg.Websocket.MaxConnectionsPerIP < 0 {
		return nil, invalid("websocket.maxConnectionsPerIP", cfg.Websocket.MaxConnectionsPerIP, "must be >= 0")
	}

	s.WSMaxPerIP = cfg.Websocket.MaxConnectionsPerIP

	if err := parseOperations(cfg, s); err != nil {
		return nil, err
	}

	if s.DryRun {
		allDryRun(s)
	}

	return s, nil
}

// checkStores checks what the layers ask of their stores: the Redis
// deployment, synced counting, concurrency and maxDelay, in that order.
func checkStores(cfg *Config, s *Settings) error {
	if err := checkRedis(cfg.Redis, s); err != nil {
		return err
	}

	if err := checkSync(cfg.Redis.SyncInterval, s); err != nil {
		return err
	}

	if err := checkConcurrency(s); err != nil {
		return err
	}

	return checkMaxDelays(cfg, s)
}

// checkMaxDelays refuses a maxDelay where its place cannot be reserved:
// a countStatus route charges after the response, too late to wait; a
// costFrom route's reservation is the response's. The error names the
// route's maxDelay, or its plan's (delayingField). On synced counting a
// layer with a maxDelay is unleased (parseLayer): the script reserves its
// place at each request.
func checkMaxDelays(cfg *Config, s *Settings) error {
	for i, rs := range s.Routes {
		field, value := delayingField(cfg, i, rs)

		switch {
		case field == "":
		case rs.CountStatus != nil:
			return invalid(field, value, "a countStatus route charges after the response, too late to wait")
		case rs.CostFrom != nil:
			return invalid(field, value, "a costFrom route's reservation does not wait (the request's other layers may)")
		}
	}

	return nil
}

// delayingField is the field and value of the maxDelay of route i (rs),
// else of the first of its plans (in plan order) that has one; "" when
// none has.
func delayingField(cfg *Config, i int, rs Route) (string, string) {
	prefix := "routes[" + strconv.Itoa(i) + "]"
	if rs.MaxDelay != 0 {
		return prefix + ".maxDelay", cfg.Routes[i].MaxDelay
	}

	for _, pl := range rs.Plans {
		if pl.MaxDelay != 0 {
			name := strings.TrimPrefix(pl.Name, rs.Name+".")
			return prefix + ".plans." + name + ".maxDelay", cfg.Routes[i].Plans[name].MaxDelay
		}
	}

	return "", ""
}

// allDryRun puts every layer in dry run: the top-level dryRun is each rule's
// dryRun at once, so the request path knows one flag.
func allDryRun(s *Settings) {
	for i := range s.Builtin {
		dryRun(&s.Builtin[i])
	}

	for i := range s.Routes {
		dryRun(&s.Routes[i].Rule)
		for j := range s.Routes[i].Plans {
			dryRun(&s.Routes[i].Plans[j])
		}
	}

	for i := range s.Plans {
		dryRun(&s.Plans[i])
	}
}

// dryRun puts r in dry run: it refuses nothing, so it waits for nothing.
func dryRun(r *Rule) {
	r.DryRun = true
	r.MaxDelay = 0
	placesAhead(r)
}

// placesAhead marks what a rule's MaxDelay asks of the stores. A place
// reserved ahead is Redis's to keep at once, as a slot is: no lease holds
// it (Unleased). Memory's Take charges it apart from its algorithm (Apart).
func placesAhead(r *Rule) {
	r.Unleased = r.Algorithm == limit.Concurrency || r.MaxDelay != 0
	r.Apart = r.MaxDelay != 0
}

// parseStore reads store and keyPrefix.
func parseStore(cfg *Config, s *Settings) error {
	switch cfg.Store {
	case StoreMemory, StoreRedis:
		s.Store = cfg.Store
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
func parseClients(cfg *Config, s *Settings) error {
	if cfg.TrustedHops < 0 {
		return invalid("trustedHops", cfg.TrustedHops, "must be >= 0")
	}

	s.Hops = cfg.TrustedHops

	if s.Hops > 0 {
		// The defaults stand for "not set": only a list the user wrote conflicts.
		if len(cfg.TrustedProxies) > 0 && !sameStrings(cfg.TrustedProxies, defaultTrustedProxies) {
			return invalid("trustedProxies", strings.Join(cfg.TrustedProxies, ","),
				"cannot be set together with trustedHops ("+strconv.Itoa(cfg.TrustedHops)+"); use one of them")
		}
	} else {
		for i, raw := range cfg.TrustedProxies {
			p, err := ParsePrefix(raw)
			if err != nil {
				return invalid("trustedProxies["+strconv.Itoa(i)+"]", raw, "not a CIDR or IP address")
			}

			s.Proxies = append(s.Proxies, p)
		}
	}

	if cfg.IPv6PrefixLength < 1 || cfg.IPv6PrefixLength > 128 {
		return invalid("ipv6PrefixLength", cfg.IPv6PrefixLength, "must be between 1 and 128")
	}

	s.IPv6Prefix = cfg.IPv6PrefixLength

	if cfg.MaxTracked < 1 {
		return invalid("maxTracked", cfg.MaxTracked, "must be >= 1")
	}

	s.MaxTracked = cfg.MaxTracked

	return nil
}

// parseLayers reads the built-in layers, the routes, and checks that
// maxTracked holds a counter of each.
func parseLayers(cfg *Config, s *Settings) error {
	for _, row := range Builtins {
		spec, err := parseBuiltin(cfg, row)
		if err != nil {
			return err
		}

		s.Builtin = append(s.Builtin, spec)

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

	s.Routes = routes

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
func checkLayerStores(s *Settings) error {
	if s.Store == "redis" {
		return nil
	}

	for _, l := range Rules(s) {
		if l.RedisField != "" {
			return invalid(l.RedisField, "redis", `takes an instance with store: redis (this one counts in memory)`)
		}
	}

	return nil
}

// Rules is every rule's window: the built-in layers, the routes and the
// plans.
func Rules(s *Settings) []Rule {
	specs := append([]Rule(nil), s.Builtin...)
	for _, rs := range s.Routes {
		specs = append(specs, rs.Rule)
		specs = append(specs, rs.Plans...)
	}

	return append(specs, s.Plans...)
}

// Alone is s without its routes and plans, and with its built-in layers
// off: what the root's panicField adds one part of s to at a time.
func Alone(s *Settings) *Settings {
	t := *s
	t.Routes = nil
	t.Plans = nil
	t.Builtin = make([]Rule, len(s.Builtin))

	for i, rule := range s.Builtin {
		t.Builtin[i] = Rule{Name: rule.Name}
	}

	return &t
}

// parseBuiltin reads the section of a built-in layer.
func parseBuiltin(cfg *Config, row Builtin) (Rule, error) {
	lc := row.config(cfg)

	if lc.Key != "" && len(row.Keys) == 0 {
		return Rule{}, invalid(row.Name+".key", lc.Key, "the "+row.Name+" layer has one bucket; only other layers take a key")
	}

	// A section without a duration has the built-in default, unless a
	// calendar replaces it (CreateConfig writes none: defaultLayer).
	if strings.TrimSpace(lc.Calendar) == "" && strings.TrimSpace(lc.Duration) == "" {
		lc.Duration = row.Duration
	}

	spec, err := parseLayer(row.Name, row.Name, lc)
	if err != nil {
		return Rule{}, err
	}

	if err := parseTierKey(row, lc.Key, &spec); err != nil {
		return Rule{}, invalid(row.Name+".key", lc.Key, err.Error())
	}

	return spec, nil
}

// parseTierKey reads the key of a built-in layer: none, or a form its row
// takes.
func parseTierKey(row Builtin, key string, spec *Rule) error {
	switch {
	case key == "":
		return nil
	case key == KeyHost && TakesKey(row, KeyHost):
		spec.KeyHost = true
		return nil
	case !TakesKey(row, KeyHeader):
		return errors.New("must be empty or one of " + strings.Join(row.Keys, ", "))
	}

	name, err := parseKeyHeader(key)
	spec.KeyHeader = name

	return err
}

// parseAssetPaths reads assets.pathPrefixes and assets.caseSensitive.
func parseAssetPaths(cfg *Config, s *Settings) error {
	s.AssetsCase = cfg.Assets.CaseSensitive

	for i, p := range cfg.Assets.PathPrefixes {
		if why := checkPath(p); why != "" {
			return invalid("assets.pathPrefixes["+strconv.Itoa(i)+"]", p, why)
		}

		s.AssetPaths = append(s.AssetPaths, request.CanonicalPattern(p, s.AssetsCase))
	}

	return nil
}

// parseLayer reads a window: points, duration, algorithm and burst (a
// layer's key is its caller's).
func parseLayer(field, name string, lc LayerConfig) (Rule, error) {
	if lc.Points < 0 {
		return Rule{}, invalid(field+".points", lc.Points, "must be >= 0 (0 turns the layer off)")
	}

	spec := Rule{Name: name, Points: int64(lc.Points), DryRun: lc.DryRun}

	switch lc.Store {
	case "":
	case "memory":
		spec.Memory = true
	case "redis":
		spec.RedisField = field + ".store"
	default:
		return Rule{}, invalid(field+".store", lc.Store, `must be "memory" or "redis" (empty: the instance's store)`)
	}

	if err := parseWindow(field, lc, &spec); err != nil {
		return Rule{}, err
	}

	alg, ok := algorithmNamed(strings.TrimSpace(lc.Algorithm))
	if !ok {
		return Rule{}, invalid(field+".algorithm", lc.Algorithm, `must be "fixed", "sliding", "tokenbucket" or "concurrency"`)
	}

	spec.Algorithm = alg

	if err := parseBurst(field, lc, &spec); err != nil {
		return Rule{}, err
	}

	if spec.Calendar != 0 && (spec.Algorithm == limit.Sliding || spec.Algorithm == limit.TokenBucket) {
		return Rule{}, invalid(field+".calendar", lc.Calendar, `takes algorithm "fixed" only, not `+strconv.Quote(lc.Algorithm))
	}

	block, err := parseBlock(field, lc.BlockDuration)
	if err != nil {
		return Rule{}, err
	}

	spec.BlockDuration = block

	if spec.MaxDelay, err = parseMaxDelay(field, lc, spec); err != nil {
		return Rule{}, err
	}

	// A dry-run layer refuses nothing, so it waits for nothing.
	if spec.DryRun {
		spec.MaxDelay = 0
	}

	placesAhead(&spec)

	return spec, checkConcurrencyLayer(field, lc, spec)
}

// parseMaxDelay reads a maxDelay: empty or 0 waits for nothing. Any
// duration is a horizon (a fixed or calendar window's place is at most its
// next window, however long maxDelay is); a concurrency slot has no moment
// to wait for.
func parseMaxDelay(field string, lc LayerConfig, spec Rule) (time.Duration, error) {
	v := lc.MaxDelay
	if t := strings.TrimSpace(v); t == "" || t == "0" {
		return 0, nil
	}

	d, err := ParseDuration(v)
	switch {
	case err != nil:
		return 0, invalid(field+".maxDelay", durationText(v), err.Error())
	case spec.Algorithm == limit.Concurrency:
		return 0, invalid(field+".maxDelay", v, "a concurrency layer does not queue: a slot frees when a request ends, not at a moment to wait for")
	}

	return d, nil
}

// parseBlock reads a blockDuration: empty or 0 blocks nothing.
func parseBlock(field, v string) (time.Duration, error) {
	if t := strings.TrimSpace(v); t == "" || t == "0" {
		return 0, nil
	}

	d, err := ParseDuration(v)
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
func parseBurst(field string, lc LayerConfig, spec *Rule) error {
	if lc.Burst < 0 {
		return invalid(field+".burst", lc.Burst, "must be >= 0 (0: the points)")
	}

	if spec.Algorithm != limit.TokenBucket {
		if lc.Burst != 0 {
			return invalid(field+".burst", lc.Burst, `only algorithm "tokenbucket" takes a burst`)
		}

		return nil
	}

	spec.Burst = int64(lc.Burst)
	if spec.Burst == 0 {
		spec.Burst = spec.Points
	}

	micros := int64(spec.Duration / time.Microsecond)
	if spec.Points > micros {
		return invalid(field+".points", lc.Points, "a token bucket refills at most one point per microsecond")
	}

	if spec.Points > 0 && (spec.Points > maxBucketProduct/micros || spec.Burst > maxBucketProduct/micros) {
		return invalid(field+".burst", spec.Burst, "too large for a token bucket of this duration (duration in microseconds x points or burst must stay below 2^53)")
	}

	return nil
}

// parseKeyHeader reads a "header:<Name>" key and returns the canonical name.
func parseKeyHeader(key string) (string, error) {
	name := strings.TrimPrefix(key, KeyHeader)
	if name == key {
		return "", errors.New(`must be empty, "host" or "header:<Name>"`)
	}

	if !request.ValidToken(name) {
		return "", errors.New(`"` + name + `" is not a header name`)
	}

	return http.CanonicalHeaderKey(name), nil
}

// ParseDuration reads a time.ParseDuration string or a bare number of
// seconds: an integer, or a decimal such as 1.5 (which Traefik's file
// provider hands over as "1.500000"). Windows are kept in whole milliseconds
// because Redis expiries are.
func ParseDuration(raw string) (time.Duration, error) {
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

func parseRoutes(routes []RouteConfig) ([]Route, error) {
	seen := map[string]bool{}
	specs := make([]Route, 0, len(routes))

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

	if IsBuiltinName(name) {
		return invalid(field+".name", name, "is the name of a built-in layer")
	}

	if seen[name] {
		return invalid(field+".name", name, "is used by another route")
	}

	seen[name] = true

	return nil
}

// parseRoute reads one route; field is its place in routes.
func parseRoute(field string, rc RouteConfig) (Route, error) {
	layer, err := parseLayer(field, rc.Name, layerOf(rc))
	if err != nil {
		return Route{}, err
	}

	spec := Route{Rule: layer, Exact: map[string]bool{}, CaseSensitive: rc.CaseSensitive}

	if err := parseRouteCost(field, rc, &spec); err != nil {
		return Route{}, err
	}

	if err := parseRouteKey(field, rc.Key, &spec); err != nil {
		return Route{}, err
	}

	if err := parseMaxRequestBody(field, rc, &spec.Rule); err != nil {
		return Route{}, err
	}

	if err := parseRouteMatch(field, rc, &spec); err != nil {
		return Route{}, err
	}

	if err := parseRoutePlans(field, rc, &spec); err != nil {
		return Route{}, err
	}

	if err := parseRouteMeter(field, rc, &spec); err != nil {
		return Route{}, err
	}

	return spec, nil
}

// parseRouteCost reads a route's cost (default RequestCost) and the
// statuses it counts. A cost above what the route's layer holds (its points,
// a token bucket's burst) could never be served, so it is an error. So is a
// cost on a route that is off (points 0): such a route matches nothing, so
// its cost would be silently ignored, where a user may expect it to charge
// the other layers.
func parseRouteCost(field string, rc RouteConfig, spec *Route) error {
	spec.Cost = RequestCost
	if rc.Cost < 0 {
		return invalid(field+".cost", rc.Cost, "must be >= 1 (0: 1)")
	}

	if !spec.On() && rc.Cost > 1 {
		return invalid(field+".cost", rc.Cost, "is ignored on a route with points 0 (off), which charges nothing: give the route points, or remove its cost")
	}

	if rc.Cost > 0 {
		spec.Cost = int64(rc.Cost)
	}

	capacity := limit.Capacity(spec.Algorithm, spec.Points, spec.Burst)

	if spec.On() && spec.Cost > capacity && rc.CostFrom == "" {
		return invalid(field+".cost", rc.Cost, "must be at most what the route holds (its points, a token bucket's burst): "+strconv.FormatInt(capacity, 10))
	}

	for j, code := range rc.CountStatus {
		if code < 100 || code > 599 {
			return invalid(field+".countStatus["+strconv.Itoa(j)+"]", code, "must be an HTTP status, 100-599")
		}

		if spec.CountStatus == nil {
			spec.CountStatus = map[int]bool{}
		}

		spec.CountStatus[code] = true
	}

	return nil
}

// parseRouteKey reads a route's key: ip by default.
func parseRouteKey(field, key string, spec *Route) error {
	known := false
	for _, k := range routeKeys {
		known = known || k == key
	}

	switch {
	case key == "":
		spec.Key = KeyIP
	case known && key != KeyHeader:
		spec.Key = key
	case strings.HasPrefix(key, KeyJSON) || strings.Contains(key, ","):
		spec.Key = KeyParts
		return parseKeyParts(field+".key", key, &spec.Rule)
	case strings.HasPrefix(key, KeyHeader):
		name, err := parseKeyHeader(key)
		if err != nil {
			return invalid(field+".key", key, err.Error())
		}

		spec.KeyHeader = name
		spec.Key = KeyHeader
	default:
		return invalid(field+".key", key, `must be "ip", "principal", "global", "host", "header:<Name>", "json:<path>", or sources joined by commas ("header:X-Api-Key,json:model")`)
	}

	return nil
}

// parseRouteMatch reads the methods and paths a route matches.
func parseRouteMatch(field string, rc RouteConfig, spec *Route) error {
	for j, m := range rc.Methods {
		if !request.ValidToken(m) {
			return invalid(field+".methods["+strconv.Itoa(j)+"]", m, "not an HTTP method")
		}

		spec.Methods = append(spec.Methods, strings.ToUpper(m))
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
			spec.Prefixes = append(spec.Prefixes, c)
		} else {
			spec.Exact[c] = true
		}
	}

	return nil
}

// parsePrincipal reads where the principal and credentials come from.
func parsePrincipal(pc PrincipalConfig, s *Settings) error {
	if err := checkPrincipal(pc); err != nil {
		return err
	}

	s.UserHeader = http.CanonicalHeaderKey(pc.UserHeader)
	s.ServiceHeader = http.CanonicalHeaderKey(pc.ServiceAccountHeader)

	// After ForwardAuth the principal is known; credentials are not read.
	if s.UserHeader == "" {
		for _, h := range pc.CredentialHeaders {
			s.CredHeaders = append(s.CredHeaders, http.CanonicalHeaderKey(h))
		}

		s.CredCookies = pc.CredentialCookies
		s.CredQuery = pc.CredentialQueryParams
	}

	s.InvalidCode = make(map[int]bool, len(pc.InvalidCredentialStatus))
	for _, code := range pc.InvalidCredentialStatus {
		s.InvalidCode[code] = true
	}

	return nil
}

// parseOperations reads the status endpoint, the exemptions and the refusal.
func parseOperations(cfg *Config, s *Settings) error {
	if err := parseStatus(cfg.Status, s); err != nil {
		return err
	}

	if err := parseExempt(cfg.Exempt, s); err != nil {
		return err
	}

	return parseResponse(cfg.Response, s)
}

func parseStatus(sc StatusConfig, s *Settings) error {
	if p := sc.Path; p != "" {
		if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") || strings.ContainsAny(p, "?# \t\r\n") {
			return invalid("status.path", p, `must start with "/", not end with "/", and hold no query`)
		}

		s.StatusPath = p
	}

	allowed, err := parsePrefixes("status.allowedIPs", sc.AllowedIPs)
	if err != nil {
		return err
	}

	s.StatusAllowed = allowed

	return nil
}

func parseExempt(ec ExemptConfig, s *Settings) error {
	ips, err := parsePrefixes("exempt.ips", ec.IPs)
	if err != nil {
		return err
	}

	s.ExemptIPs = ips

	for i, id := range ec.Principals {
		if strings.TrimSpace(id) == "" || len(id) > request.MaxPrincipalLen {
			return invalid("exempt.principals["+strconv.Itoa(i)+"]", id, "must be 1-128 characters")
		}

		if s.ExemptIDs == nil {
			s.ExemptIDs = map[string]bool{}
		}

		s.ExemptIDs[strings.TrimSpace(id)] = true
	}

	s.ExemptGlobal = ec.Global

	return nil
}

// maxBodyTemplate bounds the configured refusal body.
const maxBodyTemplate = 64 << 10

func parseResponse(rc ResponseConfig, s *Settings) error {
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

	if _, err := answer.ParseBodyTemplate(rc.Body); err != nil {
		return invalid("response.body", rc.Body, err.Error())
	}

	s.RefusalStatus = rc.StatusCode
	s.RefusalType = rc.ContentType
	s.ResponseBody = rc.Body

	return nil
}

// parsePrefixes reads a list of CIDRs or addresses; field names the list.
// It returns nil for an empty list.
func parsePrefixes(field string, raws []string) ([]netip.Prefix, error) {
	var out []netip.Prefix

	for i, raw := range raws {
		p, err := ParsePrefix(raw)
		if err != nil {
			return nil, invalid(field+"["+strconv.Itoa(i)+"]", raw, "not a CIDR or IP address")
		}

		out = append(out, p)
	}

	return out, nil
}

// ParsePrefix accepts a CIDR or a bare address (a one-address prefix). IPv4-mapped
// IPv6 prefixes are stored as IPv4 so that they match unmapped client addresses.
func ParsePrefix(raw string) (netip.Prefix, error) {
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
