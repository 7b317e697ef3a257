package tierlimit

import (
	"context"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
)

// Construction: everything the request path reads is built here, once per
// New, so that serving computes only what depends on the request.

// exemptions are the clients and principals no tier charges (match.go).
type exemptions struct {
	ips  []netip.Prefix
	ids  map[string]bool
	plan []*rule.Layer // global, unless exempt.global
}

// chooseMode decides, from the parsed settings alone, how an instance serves
// its requests; TestChooseMode (paths_test.go) names every configuration
// shape. What each mode guarantees its path is stated beside the path
// (paths.go; config.RedisFastEligible for the Redis paths); every other
// instance takes serveGeneral, which handles everything.
func chooseMode(s *config.Settings) mode {
	// Route layers are charged on the general path only (classifyPath
	// hands route matches over), so their algorithm and key do not matter.
	routes := false
	for _, rs := range s.Routes {
		routes = routes || rs.On()
	}

	on, fixed := routes, true
	for _, l := range append(s.Builtin[:len(s.Builtin):len(s.Builtin)], s.Plans...) {
		if l.On() {
			on = true
			fixed = fixed && l.Plain()
		}
	}

	switch {
	case !s.Enabled || !on && s.WSMaxPerIP == 0:
		return modeOff
	case config.AnyConcurrency(s):
		return modeGeneral // serveGeneral releases the slots (inflight.go)
	case config.RedisFastEligible(s, fixed, routes):
		return modeRedis
	case s.Store != config.StoreMemory || !s.Headers || s.DryRun || !fixed || s.WSMaxPerIP > 0,
		len(s.CredCookies)+len(s.CredQuery) > 0,
		len(s.ExemptIPs)+len(s.ExemptIDs) > 0:
		return modeGeneral
	case s.UserHeader != "" && !routes && s.PlanHeader != "":
		return modePrincipalPlans
	case s.UserHeader != "" && !routes:
		return modePrincipal
	case s.PlanHeader != "":
		// classifyPath hands principals to principalPath, which reads no
		// plan: plans with routes are served in general.
		return modeGeneral
	case s.UserHeader == "" && config.AnonymousPlanMayBeEmpty(s):
		// anonymousPath does not handle an empty plan: rare
		// configurations, served in general.
		return modeGeneral
	case routes || len(s.CredHeaders) > 0:
		return modeClassify
	}

	return modeAnonymous
}

// build makes the Plugin of a parsed configuration.
//
// Registries hand out the middleware's shared state (counters, connection
// caps, Redis backends) held until ctx, which Traefik cancels at the next
// configuration reload, is done (lifetime/lifetime.go).
func build(ctx context.Context, cfg *config.Settings, next http.Handler, name string) *Plugin {
	memory := memstore.StoreOf(ctx, name, cfg.MaxTracked)

	p := &Plugin{
		next:    next,
		name:    name,
		now:     time.Now,
		mode:    chooseMode(cfg),
		events:  events.NewEventLog(events.EventWriter, name),
		ips:     &request.Resolver{Proxies: cfg.Proxies, Hops: cfg.Hops, IPv6Prefix: cfg.IPv6Prefix, Cache: request.NewKeyCache()},
		stores:  &stores{memory: memory, items: cfg.Headers && config.AnyConcurrency(cfg) && config.AnyCostFrom(cfg)},
		memory:  memory,
		dryRun:  cfg.DryRun,
		headers: cfg.Headers,
		held:    config.AnyConcurrency(cfg),

		pathForms: pathForms{assetPaths: cfg.AssetPaths},
		Principal: request.Principal{
			UserHeader: cfg.UserHeader, ServiceHeader: cfg.ServiceHeader, CredentialHeaders: cfg.CredHeaders,
			CredentialCookies: cfg.CredCookies, CredentialParams: cfg.CredQuery,
		},
		planHeader: cfg.PlanHeader,
	}

	if len(cfg.InvalidCode) > 0 {
		p.invalidCode = cfg.InvalidCode
	}

	built := p.buildLayers(cfg, memory)
	p.buildOperations(ctx, cfg, memory, built)

	p.buildStore(ctx, cfg, name, memory)

	all := p.layers
	if p.wsLayer != nil {
		all = append(all[:len(all):len(all)], p.wsLayer)
	}

	for _, l := range all {
		l.Refusal = rule.NewRefusal(cfg, l)
	}

	splitCountStatus(p.routes)
	loudReserves(p.routes)

	if cfg.StatusPath != "" {
		p.status = statusPageOf(p, cfg)
	}

	return p
}

// splitCountStatus gives each countStatus route its charging layer, a copy
// of the route's layer made once the layer is complete (counters, Redis
// keys, block list prefix, refusal), and then marks the route's own layer,
// the one its requests' plans hold, check-only: the script reads it with the
// check flag (redisstore.CheckArgs), and both share the block list entries.
func splitCountStatus(routes []*route) {
	for _, rt := range allRoutes(routes) {
		if rt.countStatus == nil {
			continue
		}

		charge := *rt.layer
		rt.charge = &charge
		rt.layer.CheckOnly, rt.layer.Apart = true, true
		check := *rt.layer.Encoding // the charge keeps its own
		check.RedisArgs = redisstore.CheckArgs(check.RedisArgs)
		if rt.layer.Calendar != 0 {
			check.RedisTail = redisstore.RedisTail(check.RedisArgs) // the check flag too
		}
		rt.layer.Encoding = &check
	}
}

// loudReserves gives each costFrom route (and route plan) whose layer is
// quiet its loud layer (route.loud), a copy of the complete layer that is
// not quiet.
func loudReserves(routes []*route) {
	for _, rt := range allRoutes(routes) {
		if rt.costFrom != nil && rt.layer.Quiet {
			loud := *rt.layer
			loud.Quiet = false
			rt.loud = []*rule.Layer{&loud}
		}
	}
}

// buildOperations makes the connection cap and the exemptions; built are the built-in layers (buildLayers).
func (p *Plugin) buildOperations(ctx context.Context, cfg *config.Settings, memory *memstore.WindowStore, built []*rule.Layer) {
	if cfg.WSMaxPerIP > 0 {
		p.ws = connCounters.get(ctx, p.name, cfg.WSMaxPerIP)
		p.wsLayer = newLayer(memory, config.Rule{Name: config.LayerWebsocket, Points: int64(cfg.WSMaxPerIP), Duration: time.Second}, keyOfClient)
	}

	if len(cfg.ExemptIPs)+len(cfg.ExemptIDs) > 0 {
		p.exempt = &exemptions{ips: cfg.ExemptIPs, ids: cfg.ExemptIDs}
		if !cfg.ExemptGlobal {
			p.exempt.plan = rule.ChargedTo(built, config.ExemptPlan)
		}
	}
}

// buildLayers makes the layers (built-in, of plans:, of routes) and the
// plans; it returns the built-in layers, aligned with config.Builtins (nil
// where off, or where the instance never charges the layer:
// config.NeverCharged).
// So the status page, the metrics and the reset endpoint know the layers the
// instance can charge only.
func (p *Plugin) buildLayers(cfg *config.Settings, memory *memstore.WindowStore) []*rule.Layer {
	built := make([]*rule.Layer, len(config.Builtins))
	for i, row := range config.Builtins {
		if !config.NeverCharged(cfg, row.Name) {
			built[i] = newLayer(memory, cfg.Builtin[i], rule.BuiltinKeyKind(row))
		}
	}

	p.layers = rule.On(built)

	// A plan's layer is keyed by its principal, like user's.
	named := make([]*rule.Layer, len(cfg.Plans))
	for i, spec := range cfg.Plans {
		named[i] = newLayer(memory, spec, rule.KeyOfPrincipal)
	}

	p.layers = append(p.layers, rule.On(named)...)
	p.routes, p.routeMethods = buildRoutes(memory, cfg.Routes)
	p.setPathForms(cfg)
	routedPaths(p, cfg.Routes)

	for _, rt := range allRoutes(p.routes) {
		if rt.layer != nil { // nil: a route plan with no limit on the route
			p.layers = append(p.layers, rt.layer)
		}
	}

	p.plans = drawPlans(built)
	p.planNamed = rule.NamedPlans(built, cfg.Plans, named)
	rule.QuietDryRuns(p.layers)

	return built
}

// buildRoutes makes the route layers that are on, and the methods they are
// limited to (nil when some route takes every method, or there is none).
func buildRoutes(memory *memstore.WindowStore, specs []config.Route) ([]*route, map[string]bool) {
	var routes []*route

	methods := map[string]bool{}
	anyMethod := false

	for _, rs := range specs {
		if !rs.On() {
			continue
		}

		rt := &route{
			layer: newLayer(memory, rs.Rule, rule.RouteKeyKinds[rs.Key]), exact: request.WithTrailingSlash(rs.Exact), prefixes: rs.Prefixes,
			caseSensitive: rs.CaseSensitive, cost: rs.Cost, countStatus: rs.CountStatus,
		}
		if len(rs.Methods) > 0 {
			rt.methods = map[string]bool{}
			for _, m := range rs.Methods {
				rt.methods[m] = true
			}
		}
		rt.layer.MinCost = rs.Cost
		if rs.CostFrom != nil {
			rt.costFrom, rt.reserve = rs.CostFrom, rs.Reserve
			rt.layer.MinCost = rs.Reserve
			rt.layer.Settles = true
		}
		rt.plans = routePlans(memory, rt, rs)
		routes = append(routes, rt)

		anyMethod = anyMethod || len(rs.Methods) == 0
		for _, m := range rs.Methods {
			methods[m] = true
		}
	}

	if anyMethod || len(routes) == 0 {
		return routes, nil
	}

	return routes, methods
}

// sortedPlans is the names of route rt's plans, in order.
func sortedPlans(rt *route) []string {
	names := make([]string, 0, len(rt.plans))
	for name := range rt.plans {
		names = append(names, name)
	}

	sort.Strings(names)

	return names
}

// allRoutes is routes, each followed by its plans' forms (route.plans).
func allRoutes(routes []*route) []*route {
	var all []*route
	for _, rt := range routes {
		all = append(all, rt)
		for _, name := range sortedPlans(rt) {
			all = append(all, rt.plans[name])
		}
	}

	return all
}

// routePlans makes route rt's forms for its plans (config.Route.Plans):
// each a copy of rt with the plan's layer, keyed as rt is. nil: none. A
// plan with points 0 has no limit on the route: its form has no layer, and
// charges nothing after the response either (withRoutePlan charges the
// request's cost to its other layers only).
func routePlans(memory *memstore.WindowStore, rt *route, rs config.Route) map[string]*route {
	if len(rs.Plans) == 0 {
		return nil
	}

	plans := make(map[string]*route, len(rs.Plans))

	for _, spec := range rs.Plans {
		// Keyed as the route is.
		spec.KeyHeader = rs.KeyHeader
		spec.KeyParts = rs.KeyParts
		spec.MaxBody = rs.MaxBody

		alt := *rt
		alt.layer = newLayer(memory, spec, rule.RouteKeyKinds[rs.Key])
		if alt.layer != nil {
			alt.layer.MinCost, alt.layer.Settles = rt.layer.MinCost, rt.layer.Settles
		} else {
			alt.countStatus = nil
			alt.costFrom = nil
		}

		plans[strings.TrimPrefix(spec.Name, rs.Name+".")] = &alt // config.RoutePlanName
	}

	return plans
}

// setPathForms chooses the form request paths are matched in: lower case
// when the asset prefixes (or, without them, some route) ignore case; each
// route that wants the other form converts it. It builds assetHint.
func (p *Plugin) setPathForms(cfg *config.Settings) {
	for _, rt := range p.routes {
		p.foldPaths = p.foldPaths || !rt.caseSensitive
	}

	if p.assetPaths != nil {
		p.foldPaths = !cfg.AssetsCase
		p.assetHint = request.AssetHint(p.assetPaths, p.foldPaths)
	}

	for _, rt := range p.routes {
		rt.lower = !rt.caseSensitive && !p.foldPaths
		rt.caseSensitive = rt.caseSensitive && p.foldPaths
		rt.otherForm = rt.lower || rt.caseSensitive
	}
}

// newLayer is the layer of spec in every store (rule.NewLayer, memstore's
// Attach, redisstore.Encode); nil for a layer that is off.
func newLayer(memory *memstore.WindowStore, spec config.Rule, keyKind int) *rule.Layer {
	if !spec.On() {
		return nil
	}

	l := rule.NewLayer(spec, keyKind)
	redisstore.Encode(l, spec)
	memory.Attach(l)

	return l
}

// buildStore says where the instance counts (stores): memory, or Redis
// with memory as its fallback, and what applies on top (blocks, memory
// layers of a Redis instance, month policies).
func (p *Plugin) buildStore(ctx context.Context, cfg *config.Settings, name string, memory *memstore.WindowStore) {
	st := p.stores
	st.blocks = rule.AnyBlock(p.layers)
	st.month = rule.AnyMonth(p.layers)
	st.plain = !st.blocks && !st.month

	if cfg.Store != config.StoreRedis {
		redisstore.SetCurrent(name, nil)
		return
	}

	st.plain = false

	rs := redisstore.New(ctx, cfg, name, memory, redisstore.BlockListOf(ctx, name, cfg.MaxTracked), p.layers)
	rs.Clock = func() time.Time { return p.now() }
	if rs.Exact != nil {
		rs.Exact.Clock = rs.Clock
	}
	st.redis = rs
	redisstore.SetCurrent(name, rs)
	if p.mode == modeRedis {
		p.fast = newRedisFast(rs, p.plans)
	}

	st.mixed = config.AnyMemoryLayer(cfg)
}

// requestCost is what one request is charged (config.RequestCost).
const requestCost = config.RequestCost

// drawPlans draws up the plans from the built-in layers, built aligned with
// config.Builtins (nil where off), by the plan rules (config/charges.go).
func drawPlans(built []*rule.Layer) plans {
	return plans{
		planIP:      rule.ChargedTo(built, config.AnonymousPlan),
		planAssets:  rule.ChargedTo(built, config.AssetPlan),
		planUser:    rule.ChargedTo(built, config.UserPlan),
		planService: rule.ChargedTo(built, config.ServicePlan),
		planCred:    rule.ChargedTo(built, config.CredPlan),
		planInvalid: rule.ChargedTo(built, config.InvalidPlan),
		planCost:    requestCost,
	}
}

// routedPaths sets what charges the route matches of a classify instance:
// serveRoutedFast, serveCountedFast when a route counts statuses, or
// serveGeneral when routedFastEligible says neither can. A function value
// in a field would say it once, but Yaegi cannot store one whose signature
// names the plugin's types.
func routedPaths(p *Plugin, routes []config.Route) {
	if !routedFastEligible(p, routes) {
		return
	}

	p.routedFast = true
	for _, rt := range p.routes {
		if rt.countStatus != nil {
			p.routedFast, p.countedFast = false, true
		}
	}
}

// routedFastEligible reports whether serveRoutedFast can charge the route
// matches of a classify instance: no principal and no credential (the plan
// is the client's, ip or assets), and every route a fixed window (charged
// up front, or after the response for countStatus), keyed by the client or
// a constant, enforcing.
// The plan's layers are fixed windows already (chooseMode).
func routedFastEligible(p *Plugin, routes []config.Route) bool {
	if p.mode != modeClassify || p.UserHeader != "" || len(p.CredentialHeaders) > 0 {
		return false
	}

	for _, rs := range routes {
		if rs.On() && (!rs.Plain() || rs.CostFrom != nil || rs.Key != config.KeyIP && rs.Key != config.KeyGlobal) {
			return false
		}
	}

	return true
}
