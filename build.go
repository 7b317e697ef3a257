package tierlimit

import (
	"context"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/request"
)

// Construction: everything the request path reads is built here, once per
// New, so that serving computes only what depends on the request.

// exemptions are the clients and principals no tier charges (exempt.go).
type exemptions struct {
	ips  []netip.Prefix
	ids  map[string]bool
	plan []*layer // global, unless exempt.global
}

// statusPage is the status endpoint (status.go).
type statusPage struct {
	path    string
	allowed []netip.Prefix
	store   string // "memory" or "redis", as configured
}

// chooseMode decides, from the parsed settings alone, how an instance serves
// its requests; the table test in mode_test.go names every configuration shape.
//
// The fast paths (fast.go) handle the common instances: the memory store,
// headers on, no dry run, fixed windows keyed by client, principal or a
// constant, credentials in headers only, no connection cap, no exemptions.
// redisPath handles the anonymous instance on one Redis server
// (redisFastEligible, redisfast.go).
// Every other instance takes serveGeneral, which handles everything.
func chooseMode(s *settings) mode {
	// Route layers are charged on the general path only (classifyPath
	// hands route matches over), so their algorithm and key do not matter.
	routes := false
	for _, rs := range s.routes {
		routes = routes || rs.on()
	}

	on, fixed := routes, true
	for _, l := range append(s.builtin[:len(s.builtin):len(s.builtin)], s.plans...) {
		if l.on() {
			on = true
			// A dry-run layer, or one that blocks, is charged on the general path only.
			fixed = fixed && !l.sliding && !l.bucket && l.keyHeader == "" && !l.keyHost && l.block == 0 && !l.dryRun && l.calendar == 0
		}
	}

	switch {
	case !s.enabled || !on && s.wsMaxPerIP == 0:
		return modeOff
	case redisFastEligible(s, fixed, routes):
		return modeRedis
	case s.store != "memory" || !s.headers || s.dryRun || !fixed || s.wsMaxPerIP > 0,
		len(s.credCookies)+len(s.credQuery) > 0,
		len(s.exemptIPs)+len(s.exemptIDs) > 0:
		return modeGeneral
	case s.userHeader != "" && !routes && s.planHeader != "":
		return modePrincipalPlans
	case s.userHeader != "" && !routes:
		return modePrincipal
	case s.planHeader != "":
		// classifyPath hands principals to principalPath, which reads no
		// plan: plans with routes are served in general.
		return modeGeneral
	case s.userHeader == "" && anonymousPlanMayBeEmpty(s):
		// anonymousPath does not handle an empty plan: rare
		// configurations, served in general.
		return modeGeneral
	case routes || len(s.credHeaders) > 0:
		return modeClassify
	}

	return modeAnonymous
}

// anonymousPlanMayBeEmpty reports whether an anonymous request may meet a
// plan with no layer: the anonymous one, or, when there are asset paths,
// the assets one.
func anonymousPlanMayBeEmpty(s *settings) bool {
	return !s.planOn(anonymousPlan) || len(s.assetPaths) > 0 && !s.planOn(assetPlan)
}

// build makes the Plugin of a parsed configuration.
//
// Registries hand out the middleware's shared state (counters, connection
// caps, Redis backends) held until ctx, which Traefik cancels at the next
// configuration reload, is done (lifetime.go).
func build(ctx context.Context, cfg *settings, next http.Handler, name string) *Plugin {
	memory := registry.get(ctx, name, cfg.maxTracked)

	p := &Plugin{
		next:    next,
		name:    name,
		now:     time.Now,
		mode:    chooseMode(cfg),
		events:  newEventLog(eventWriter, name),
		ips:     &request.Resolver{Proxies: cfg.proxies, Hops: cfg.hops, IPv6Prefix: cfg.ipv6Prefix, Cache: request.NewKeyCache()},
		store:   memory,
		memory:  memory,
		dryRun:  cfg.dryRun,
		headers: cfg.headers,

		assetPaths: cfg.assetPaths,
		Principal: request.Principal{
			UserHeader: cfg.userHeader, ServiceHeader: cfg.serviceHeader, CredentialHeaders: cfg.credHeaders,
			CredentialCookies: cfg.credCookies, CredentialParams: cfg.credQuery,
		},
		planHeader: cfg.planHeader,
	}

	if len(cfg.invalidCode) > 0 {
		p.invalidCode = cfg.invalidCode
	}

	built := p.buildLayers(cfg, memory)
	p.buildOperations(ctx, cfg, memory, built)

	p.buildStore(ctx, cfg, name, memory)

	all := p.layers
	if p.wsLayer != nil {
		all = append(all[:len(all):len(all)], p.wsLayer)
	}

	for _, l := range all {
		l.refusal = newRefusal(cfg, l)
	}

	splitCountStatus(p.routes)

	return p
}

// splitCountStatus gives each countStatus route its charging layer, a copy
// of the route's layer made once the layer is complete (counters, Redis
// keys, block list prefix, refusal), and then marks the route's own layer,
// the one its requests' plans hold, check-only: the script reads it with the
// check flag (checkArgs), and both share the block list entries.
func splitCountStatus(routes []*route) {
	for _, rt := range routes {
		if rt.countStatus == nil {
			continue
		}

		charge := *rt.layer
		rt.charge = &charge
		rt.layer.checkOnly = true
		rt.layer.redisArgs = checkArgs(rt.layer.redisArgs)
	}
}

// buildOperations makes the connection cap, the exemptions and the status
// page; built are the built-in layers (buildLayers).
func (p *Plugin) buildOperations(ctx context.Context, cfg *settings, memory *windowStore, built []*layer) {
	if cfg.wsMaxPerIP > 0 {
		p.ws = connCounters.get(ctx, p.name, cfg.wsMaxPerIP)
		p.wsLayer = newLayer(memory, layerSpec{name: layerWebsocket, points: int64(cfg.wsMaxPerIP), duration: time.Second}, keyOfClient)
	}

	if len(cfg.exemptIPs)+len(cfg.exemptIDs) > 0 {
		p.exempt = &exemptions{ips: cfg.exemptIPs, ids: cfg.exemptIDs}
		if !cfg.exemptGlobal {
			p.exempt.plan = chargedTo(built, exemptPlan)
		}
	}

	if cfg.statusPath != "" {
		p.status = &statusPage{path: cfg.statusPath, allowed: cfg.statusAllowed, store: cfg.store}
	}
}

// buildLayers makes the layers (built-in, of plans:, of routes) and the
// plans; it returns the built-in layers, aligned with builtinLayers (nil
// where off, or where the instance never charges the layer: neverCharged).
// So the status page, the metrics and the reset endpoint know the layers the
// instance can charge only.
func (p *Plugin) buildLayers(cfg *settings, memory *windowStore) []*layer {
	built := make([]*layer, len(builtinLayers))
	for i, row := range builtinLayers {
		if !neverCharged(cfg, row.name) {
			built[i] = newLayer(memory, cfg.builtin[i], row.keyKind)
		}
	}

	p.layers = plan(built...)

	// A plan's layer is keyed by its principal, like user's.
	named := make([]*layer, len(cfg.plans))
	for i, spec := range cfg.plans {
		named[i] = newLayer(memory, spec, keyOfPrincipal)
	}

	p.layers = append(p.layers, plan(named...)...)
	p.routes, p.routeMethods = buildRoutes(memory, cfg.routes)
	p.setPathForms(cfg)

	for _, rt := range p.routes {
		p.layers = append(p.layers, rt.layer)
	}

	p.plans = drawPlans(built)
	p.planNamed = drawNamedPlans(built, cfg.plans, named)
	quietDryRuns(p.layers)

	return built
}

// neverCharged reports whether an instance never charges the built-in layer
// called name, whatever its points: user and service without a principal
// (principal.userHeader empty, the edge), service without its flag's header,
// assets without asset paths.
func neverCharged(cfg *settings, name string) bool {
	switch name {
	case layerUser:
		return cfg.userHeader == ""
	case layerService:
		return cfg.userHeader == "" || cfg.serviceHeader == ""
	case layerAssets:
		return len(cfg.assetPaths) == 0
	}

	return false
}

// quietDryRuns marks the dry-run layers quiet unless every layer is in dry
// run (layer.quiet).
func quietDryRuns(layers []*layer) {
	enforced := false
	for _, l := range layers {
		enforced = enforced || !l.dryRun
	}

	for _, l := range layers {
		l.quiet = l.dryRun && enforced
	}
}

// buildRoutes makes the route layers that are on, and the methods they are
// limited to (nil when some route takes every method, or there is none).
func buildRoutes(memory *windowStore, specs []routeSpec) ([]*route, map[string]bool) {
	var routes []*route

	methods := map[string]bool{}
	anyMethod := false

	for _, rs := range specs {
		if !rs.on() {
			continue
		}

		rt := &route{
			layer: newLayer(memory, rs.layerSpec, routeKeyKinds[rs.key]), methods: rs.methods, exact: rs.exact, prefixes: rs.prefixes,
			caseSensitive: rs.caseSensitive, cost: rs.cost, countStatus: rs.countStatus,
		}
		rt.layer.minCost = rs.cost
		routes = append(routes, rt)

		anyMethod = anyMethod || len(rs.methods) == 0
		for _, m := range rs.methods {
			methods[m] = true
		}
	}

	if anyMethod || len(routes) == 0 {
		return routes, nil
	}

	return routes, methods
}

// setPathForms chooses the form request paths are matched in: lower case
// when the asset prefixes (or, without them, some route) ignore case; each
// route that wants the other form converts it. It builds assetHint.
func (p *Plugin) setPathForms(cfg *settings) {
	for _, rt := range p.routes {
		p.foldPaths = p.foldPaths || !rt.caseSensitive
	}

	if p.assetPaths != nil {
		p.foldPaths = !cfg.assetsCase
		p.assetHint = request.AssetHint(p.assetPaths, p.foldPaths)
	}

	for _, rt := range p.routes {
		rt.lower = !rt.caseSensitive && !p.foldPaths
		rt.caseSensitive = rt.caseSensitive && p.foldPaths
	}
}

// newRedisStore makes the Redis store of an instance and encodes each
// layer's keys.
func newRedisStore(ctx context.Context, cfg *settings, name string, memory *windowStore, layers []*layer) *redisStore {
	rs := &redisStore{
		prefix:  cfg.keyPrefix + ":" + name + ":",
		name:    name,
		channel: resetChannel(cfg.keyPrefix),
		backend: backends.get(ctx, cfg.redis),
		local:   memory,
		blocked: registry.blockListFor(ctx, name, cfg.maxTracked),
		owed:    newOwedCounts(cfg.maxTracked),
		clock:   time.Now, // buildStore sets the instance's
	}

	rs.fallback = memory
	if anyBlock(layers) {
		rs.fallback = &blockingStore{memory}
	}

	for _, l := range layers {
		l.redisKey = rs.prefix + l.name + ":"
		l.redisConstKey = redisresp.Bulk(l.redisKey + l.constKey)
		l.blockPrefix = blockPrefix(l)
	}

	if cfg.syncInterval > 0 {
		rs.synced = syncStateFor(ctx, name, rs.backend, cfg.syncInterval, cfg.maxTracked, func() { listenResets(rs) })
	}

	// A plan has at most every layer: global, one tier or plan and the routes.
	for n := 0; n <= len(layers); n++ {
		rs.calls = append(rs.calls, takeCall(n))
	}

	return rs
}

// plan lists the layers that are on, in order.
func plan(layers ...*layer) []*layer {
	var out []*layer

	for _, l := range layers {
		if l != nil {
			out = append(out, l)
		}
	}

	return out
}

// newLayer returns nil for a layer that is off.
func newLayer(memory *windowStore, spec layerSpec, keyKind int) *layer {
	if !spec.on() {
		return nil
	}

	if spec.keyHeader != "" {
		keyKind = keyOfHeader
	}

	if spec.keyHost {
		keyKind = keyOfHost
	}

	l := &layer{
		limits: limits{
			name:          spec.name,
			points:        spec.points,
			duration:      int64(spec.duration),
			keyKind:       keyKind,
			constKey:      layerGlobal,
			keyHeader:     spec.keyHeader,
			sliding:       spec.sliding,
			blockDuration: int64(spec.block),
			calendar:      spec.calendar,
			utcOffset:     spec.utcOffset,
			dryRun:        spec.dryRun,
			memory:        spec.memory,
		},
	}

	// A token bucket's points become its burst (tokenbucket.go).
	if spec.bucket {
		spec = l.makeBucket(spec)
	}

	l.redisEncoding = newRedisEncoding(spec, l.refill)
	l.headerTable = newHeaderTable(spec, l.interval)

	if spec.calendar == calMonth {
		l.month = &monthPolicy{}
	}

	memory.attach(l)

	return l
}

// newRedisEncoding encodes the script's arguments of a layer (redisstore.go):
// points, window, algorithm and a token bucket's rate.
func newRedisEncoding(spec layerSpec, rate int64) redisEncoding {
	ms := int64(spec.duration / time.Millisecond)
	head := redisresp.Bulk(formatInt(spec.points)) + redisresp.Bulk(formatInt(ms))
	e := redisEncoding{redisArgs: head + algoFixed + argNoRate, maxTTL: ms}

	switch {
	case spec.sliding:
		e.redisArgs = head + algoSliding + argNoRate
		e.maxTTL = 2 * ms
	case spec.bucket:
		e.redisArgs = head + algoBucket + redisresp.Bulk(formatInt(rate))
		e.maxTTL = (spec.points*ms+rate-1)/rate + 1
	}

	if spec.block > 0 {
		e.redisArgs, e.maxTTL = withBlock(e.redisArgs, e.maxTTL, int64(spec.block/time.Millisecond))
	}

	if spec.dryRun {
		e.redisArgs = flagArgs(e.redisArgs, "d")
	}

	if spec.calendar != 0 {
		e.redisTail = redisTail(e.redisArgs)
	}

	return e
}

// withBlock adds a block of blockMs to a layer's script arguments: its
// algorithm, the third argument, gets the suffix "b<blockMs>" (takeScript),
// and a refusal may report the block's end.
func withBlock(args string, maxTTL, blockMs int64) (string, int64) {
	start, value, size := algorithmArg(args)

	if blockMs > maxTTL {
		maxTTL = blockMs
	}

	return args[:start] + redisresp.Bulk(args[value:value+size]+"b"+formatInt(blockMs)) + args[value+size+2:], maxTTL
}

// algorithmArg finds a layer's algorithm in its script arguments, the third
// one: it returns start, value and size, where args[start:] is
// "$<size>\r\n<algorithm>\r\n..." and the algorithm is args[value:value+size].
func algorithmArg(args string) (int, int, int) {
	start := 0
	for n := 0; n < 2; n++ {
		j := strings.Index(args[start:], "\r\n")
		skip, _ := strconv.Atoi(args[start+1 : start+j])
		start += j + 2 + skip + 2
	}

	j := strings.Index(args[start:], "\r\n")
	size, _ := strconv.Atoi(args[start+1 : start+j])

	return start, start + j + 2, size
}

// newHeaderTable makes a layer's header values; a token bucket's policy
// window is the time its burst takes to refill (interval per point).
func newHeaderTable(spec layerSpec, interval int64) headerTable {
	limit := formatInt(spec.points)
	window := int64(spec.duration)
	if spec.bucket {
		window = spec.points * interval
	}

	t := headerTable{
		limit:     limit,
		limitHdr:  []string{limit},
		policyHdr: []string{`"` + spec.name + `";q=` + limit + ";w=" + formatInt(ceilSeconds(window))},
	}

	for left := int64(0); left <= spec.points && left < maxPrecomputed; left++ {
		t.remainingHdr = append(t.remainingHdr, []string{formatInt(left)})
		t.ratePrefix = append(t.ratePrefix, `"`+spec.name+`";r=`+formatInt(left)+";t=")
	}

	t.tableLen = int64(len(t.remainingHdr))

	return t
}

// newRefusal is the configured refusal of layer l.
func newRefusal(cfg *settings, l *layer) refusal {
	r := refusal{Policy: answer.Policy{
		Status:      cfg.refusalStatus,
		ContentType: answer.JSONContentType,
		BodyPrefix:  `{"errors":[{"message":"Hit rate limit","extensions":{"code":"REQUESTS_EXCEEDED","limit":` + l.limit + `,"reset":"`,
		BodySuffix:  `","layer":"` + l.name + `"}}]}`,
	}}

	if cfg.refusalType != answer.JSONContentType[0] {
		r.ContentType = []string{cfg.refusalType}
	}

	if cfg.responseBody != nil {
		r.Body = answer.BindLayer(cfg.responseBody, l.name, l.limit)
	}

	return r
}

// checkArgs is a layer's script arguments (newRedisEncoding) with the check
// flag (takeScript).
func checkArgs(args string) string {
	return flagArgs(args, "c")
}

// flagArgs is a layer's script arguments with flag prefixed to its
// algorithm, the third argument (takeScript: "c" check-only, "d" dry run).
func flagArgs(args, flag string) string {
	start, value, size := algorithmArg(args)

	return args[:start] + "$" + strconv.Itoa(size+len(flag)) + "\r\n" + flag + args[value:]
}

// buildStore gives the instance its store: memory, or Redis with memory as
// its fallback, wrapped for what its layers need (blocks, memory layers of
// a Redis instance, month policies).
func (p *Plugin) buildStore(ctx context.Context, cfg *settings, name string, memory *windowStore) {
	if anyBlock(p.layers) {
		p.store = &blockingStore{memory}
	}

	if cfg.store == "redis" {
		rs := newRedisStore(ctx, cfg, name, memory, p.layers)
		rs.clock = func() time.Time { return p.now() }
		p.store = rs
		if p.mode == modeRedis {
			p.fast = newRedisFast(rs, p.plans)
		}

		if anyMemoryLayer(cfg) {
			p.store = newMixedStore(memory, rs, p.layers)
		}
	}

	if anyMonth(p.layers) {
		p.store = &monthStore{inner: p.store}
	}
}
