package tierlimit

import (
	"context"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/answer"
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
	plan []*layer // global, unless exempt.global
}

// chooseMode decides, from the parsed settings alone, how an instance serves
// its requests; TestChooseMode (paths_test.go) names every configuration
// shape.
//
// The fast paths (paths.go) handle the common instances: the memory store,
// headers on, no dry run, fixed windows keyed by client, principal or a
// constant, credentials in headers only, no connection cap, no exemptions.
// redisPath handles the anonymous instance on one Redis server, and
// mixedPath the same with layers counted in memory (redisFastEligible,
// paths.go).
// Every other instance takes serveGeneral, which handles everything.
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
			// A dry-run layer, or one that blocks, is charged on the general path only.
			fixed = fixed && l.Algorithm != algSliding && l.Algorithm != algTokenBucket && l.KeyHeader == "" && !l.KeyHost && l.Block == 0 && !l.DryRun && l.Calendar == 0
		}
	}

	switch {
	case !s.Enabled || !on && s.WSMaxPerIP == 0:
		return modeOff
	case anyConcurrency(s):
		return modeGeneral // serveGeneral releases the slots (inflight.go)
	case redisFastEligible(s, fixed, routes):
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
	case s.UserHeader == "" && anonymousPlanMayBeEmpty(s):
		// anonymousPath does not handle an empty plan: rare
		// configurations, served in general.
		return modeGeneral
	case routes || len(s.CredHeaders) > 0:
		return modeClassify
	}

	return modeAnonymous
}

// anonymousPlanMayBeEmpty reports whether an anonymous request may meet a
// plan with no layer: the anonymous one, or, when there are asset paths,
// the assets one.
func anonymousPlanMayBeEmpty(s *config.Settings) bool {
	return !planOn(s, anonymousPlan) || len(s.AssetPaths) > 0 && !planOn(s, assetPlan)
}

// build makes the Plugin of a parsed configuration.
//
// Registries hand out the middleware's shared state (counters, connection
// caps, Redis backends) held until ctx, which Traefik cancels at the next
// configuration reload, is done (lifetime/lifetime.go).
func build(ctx context.Context, cfg *config.Settings, next http.Handler, name string) *Plugin {
	memory := registry.get(ctx, name, cfg.MaxTracked)

	p := &Plugin{
		next:    next,
		name:    name,
		now:     time.Now,
		mode:    chooseMode(cfg),
		events:  events.NewEventLog(events.EventWriter, name),
		ips:     &request.Resolver{Proxies: cfg.Proxies, Hops: cfg.Hops, IPv6Prefix: cfg.IPv6Prefix, Cache: request.NewKeyCache()},
		stores:  &stores{memory: memory},
		memory:  memory,
		dryRun:  cfg.DryRun,
		headers: cfg.Headers,
		held:    anyConcurrency(cfg),

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
		l.Refusal = newRefusal(cfg, l)
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
	var all []*route
	for _, rt := range routes {
		all = append(all, rt)
		for _, name := range sortedPlans(rt) {
			all = append(all, rt.plans[name])
		}
	}

	for _, rt := range all {
		if rt.countStatus == nil {
			continue
		}

		charge := *rt.layer
		rt.charge = &charge
		rt.layer.CheckOnly = true
		rt.layer.RedisArgs = redisstore.CheckArgs(rt.layer.RedisArgs)
		if rt.layer.Calendar != 0 {
			rt.layer.RedisTail = redisstore.RedisTail(rt.layer.RedisArgs) // the check flag too
		}
	}
}

// loudReserves gives each costFrom route (and route plan) whose layer is
// quiet its loud layer (route.loud), a copy of the complete layer that is
// not quiet.
func loudReserves(routes []*route) {
	var all []*route
	for _, rt := range routes {
		all = append(all, rt)
		for _, name := range sortedPlans(rt) {
			all = append(all, rt.plans[name])
		}
	}

	for _, rt := range all {
		if rt.costFrom != nil && rt.layer.Quiet {
			loud := *rt.layer
			loud.Quiet = false
			rt.loud = []*layer{&loud}
		}
	}
}

// buildOperations makes the connection cap and the exemptions; built are the built-in layers (buildLayers).
func (p *Plugin) buildOperations(ctx context.Context, cfg *config.Settings, memory *memstore.WindowStore, built []*layer) {
	if cfg.WSMaxPerIP > 0 {
		p.ws = connCounters.get(ctx, p.name, cfg.WSMaxPerIP)
		p.wsLayer = newLayer(memory, config.Rule{Name: layerWebsocket, Points: int64(cfg.WSMaxPerIP), Duration: time.Second}, keyOfClient)
	}

	if len(cfg.ExemptIPs)+len(cfg.ExemptIDs) > 0 {
		p.exempt = &exemptions{ips: cfg.ExemptIPs, ids: cfg.ExemptIDs}
		if !cfg.ExemptGlobal {
			p.exempt.plan = chargedTo(built, exemptPlan)
		}
	}
}

// buildLayers makes the layers (built-in, of plans:, of routes) and the
// plans; it returns the built-in layers, aligned with builtinLayers (nil
// where off, or where the instance never charges the layer: neverCharged).
// So the status page, the metrics and the reset endpoint know the layers the
// instance can charge only.
func (p *Plugin) buildLayers(cfg *config.Settings, memory *memstore.WindowStore) []*layer {
	built := make([]*layer, len(builtinLayers))
	for i, row := range builtinLayers {
		if !neverCharged(cfg, row.Name) {
			built[i] = newLayer(memory, cfg.Builtin[i], row.keyKind)
		}
	}

	p.layers = plan(built...)

	// A plan's layer is keyed by its principal, like user's.
	named := make([]*layer, len(cfg.Plans))
	for i, spec := range cfg.Plans {
		named[i] = newLayer(memory, spec, keyOfPrincipal)
	}

	p.layers = append(p.layers, plan(named...)...)
	p.routes, p.routeMethods = buildRoutes(memory, cfg.Routes)
	p.setPathForms(cfg)
	routedPaths(p)

	for _, rt := range p.routes {
		p.layers = append(p.layers, rt.layer)
		for _, name := range sortedPlans(rt) {
			if alt := rt.plans[name]; alt.layer != nil {
				p.layers = append(p.layers, alt.layer)
			}
		}
	}

	p.plans = drawPlans(built)
	p.planNamed = drawNamedPlans(built, cfg.Plans, named)
	quietDryRuns(p.layers)

	return built
}

// neverCharged reports whether an instance never charges the built-in layer
// called name, whatever its points: user and service without a principal
// (principal.userHeader empty, the edge), service without its flag's header,
// assets without asset paths.
func neverCharged(cfg *config.Settings, name string) bool {
	switch name {
	case layerUser:
		return cfg.UserHeader == ""
	case layerService:
		return cfg.UserHeader == "" || cfg.ServiceHeader == ""
	case layerAssets:
		return len(cfg.AssetPaths) == 0
	}

	return false
}

// quietDryRuns marks the dry-run layers quiet unless every layer is in dry
// run (layer.quiet).
func quietDryRuns(layers []*layer) {
	enforced := false
	for _, l := range layers {
		enforced = enforced || !l.DryRun
	}

	for _, l := range layers {
		l.Quiet = l.DryRun && enforced
	}
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
			layer: newLayer(memory, rs.Rule, routeKeyKinds[rs.Key]), exact: withTrailingSlash(rs.Exact), prefixes: rs.Prefixes,
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
		alt.layer = newLayer(memory, spec, routeKeyKinds[rs.Key])
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

// withTrailingSlash is the set of paths, each with and without a trailing
// slash (route.exact); nil for none.
func withTrailingSlash(paths map[string]bool) map[string]bool {
	if len(paths) == 0 {
		return nil
	}

	out := make(map[string]bool, 2*len(paths))
	for path := range paths {
		out[path] = true
		out[path+"/"] = true
	}

	return out
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

// newLayer is the layer of spec in every store (rule.NewLayer, memstore's
// Attach, redisstore.Encode); nil for a layer that is off.
func newLayer(memory *memstore.WindowStore, spec config.Rule, keyKind int) *layer {
	if !spec.On() {
		return nil
	}

	l := rule.NewLayer(spec, keyKind)
	redisstore.Encode(l, spec)
	memory.Attach(l)

	return l
}

// newRefusal is the configured refusal of layer l.
func newRefusal(cfg *config.Settings, l *layer) rule.Refusal {
	r := rule.Refusal{Policy: answer.Policy{
		Status:      cfg.RefusalStatus,
		ContentType: answer.JSONContentType,
		BodyPrefix:  `{"errors":[{"message":"Hit rate limit","extensions":{"code":"REQUESTS_EXCEEDED","limit":` + l.Limit + `,"reset":"`,
		BodySuffix:  `","layer":"` + l.Name + `"}}]}`,
	}}

	if cfg.RefusalType != answer.JSONContentType[0] {
		r.ContentType = []string{cfg.RefusalType}
	}

	if cfg.ResponseBody != "" {
		body, _ := answer.ParseBodyTemplate(cfg.ResponseBody) // checked by config.Parse
		r.Body = answer.BindLayer(body, l.Name, l.Limit)
	}

	return r
}

// buildStore says where the instance counts (stores): memory, or Redis
// with memory as its fallback, and what applies on top (blocks, memory
// layers of a Redis instance, month policies).
func (p *Plugin) buildStore(ctx context.Context, cfg *config.Settings, name string, memory *memstore.WindowStore) {
	st := p.stores
	st.blocks = anyBlock(p.layers)
	st.month = anyMonth(p.layers)
	st.plain = !st.blocks && !st.month

	if cfg.Store != config.StoreRedis {
		redisstore.SetCurrent(name, nil)
		return
	}

	st.plain = false

	rs := redisstore.New(ctx, cfg, name, memory, registry.blockListFor(ctx, name, cfg.MaxTracked), p.layers)
	rs.Clock = func() time.Time { return p.now() }
	st.redis = rs
	redisstore.SetCurrent(name, rs)
	if p.mode == modeRedis {
		p.fast = newRedisFast(rs, p.plans)
	}

	if anyMemoryLayer(cfg) {
		st.mixed = true
		st.blocks = false
		for _, l := range p.layers {
			if l.Memory && l.BlockDuration != 0 {
				st.blocks = true
			}
		}
	}
}

// The built-in layers as data. builtinLayers is config.Builtins (the
// defaults, parsing and validation: config/layers.go) with what each layer
// charges: the mode choice (chooseMode) and the plans (drawPlans) read it, so
// that a layer is one row. A plan is drawn up from the classes of requests its
// layers charge (the plan rules below), not from layer names. The plans of
// plans: (config/plans.go), charged instead of user, are one more rule
// (namedPlan) with a layer of their own each.

// Layer names and key values: configuration's (config/layers.go).
const (
	layerGlobal    = config.LayerGlobal
	layerIP        = config.LayerIP
	layerAssets    = config.LayerAssets
	layerUser      = config.LayerUser
	layerService   = config.LayerService
	layerWebsocket = config.LayerWebsocket

	keyIP        = config.KeyIP
	keyPrincipal = config.KeyPrincipal
	keyGlobal    = config.KeyGlobal
	keyHeader    = config.KeyHeader
	keyHost      = config.KeyHost
	keyParts     = config.KeyParts
)

// The classes of requests a built-in layer charges.
const (
	chargesAll       = iota // every request
	chargesAnonymous        // a request without a principal, not for an asset
	chargesAsset            // a request without a principal, for an asset (assets.pathPrefixes)
	chargesUser             // a principal that is not a service account
	chargesService          // a service account
)

// builtinLayer is one built-in layer: configuration's row (its name,
// defaults and keys), the class of requests it charges and how it finds its
// key.
type builtinLayer struct {
	config.Builtin
	charges int
	keyKind int // rule/rule.go's keyOf*, unless key: says otherwise
}

// builtinLayers in evaluation order, row for row config.Builtins: a plan
// charges its layers in this order.
var builtinLayers = []builtinLayer{
	{Builtin: config.Builtins[0], charges: chargesAll, keyKind: keyOfConst},
	{Builtin: config.Builtins[1], charges: chargesAnonymous, keyKind: keyOfClient},
	{Builtin: config.Builtins[2], charges: chargesAsset, keyKind: keyOfClient},
	{Builtin: config.Builtins[3], charges: chargesUser, keyKind: keyOfPrincipal},
	{Builtin: config.Builtins[4], charges: chargesService, keyKind: keyOfPrincipal},
}

// routeKeyKinds are the key: values a route takes and how each finds its key.
var routeKeyKinds = map[string]int{
	keyIP: keyOfClient, keyPrincipal: keyOfPrincipalElseClient, keyGlobal: keyOfConst, keyHost: keyOfHost, keyHeader: keyOfHeader,
	keyParts: keyOfParts,
}

// The plan rules: the classes of built-in layers each plan of plugin.go
// charges, in catalogue order. A credentialed request is charged the
// layers every request pays (planCred), and, once its credential is known
// invalid, the anonymous ones (planInvalid).
var (
	anonymousPlan = []int{chargesAll, chargesAnonymous}
	assetPlan     = []int{chargesAll, chargesAsset}
	userPlan      = []int{chargesAll, chargesUser}
	servicePlan   = []int{chargesAll, chargesService}
	credPlan      = []int{chargesAll}
	invalidPlan   = []int{chargesAnonymous}
	// exemptPlan: an exempt request still pays what every request does,
	// unless exempt.global.
	exemptPlan = []int{chargesAll}
	// namedPlan: a principal whose plan header names one of plans: pays
	// what every request does, then its plan's own layer (drawNamedPlans),
	// in place of userPlan. Service accounts keep servicePlan.
	namedPlan = []int{chargesAll}
)

// requestCost is what one request is charged (config.RequestCost).
const requestCost = config.RequestCost

// drawPlans draws up the plans from the built-in layers, built aligned with
// builtinLayers (nil where off).
func drawPlans(built []*layer) plans {
	return plans{
		planIP:      chargedTo(built, anonymousPlan),
		planAssets:  chargedTo(built, assetPlan),
		planUser:    chargedTo(built, userPlan),
		planService: chargedTo(built, servicePlan),
		planCred:    chargedTo(built, credPlan),
		planInvalid: chargedTo(built, invalidPlan),
		planCost:    requestCost,
	}
}

// drawNamedPlans draws up the plan of each of plans: (specs, by name), whose
// layers are named (aligned with specs, nil where off: that plan charges
// namedPlan's layers only). nil when there are no plans.
func drawNamedPlans(built []*layer, specs []config.Rule, named []*layer) map[string][]*layer {
	if len(specs) == 0 {
		return nil
	}

	out := make(map[string][]*layer, len(specs))

	for i, spec := range specs {
		layers := chargedTo(built, namedPlan)
		if named[i] != nil {
			layers = append(layers, named[i])
		}

		out[spec.Name] = layers
	}

	return out
}

// chargedTo lists, in catalogue order, the layers that are on among those of
// the classes; nil when none is.
func chargedTo(built []*layer, classes []int) []*layer {
	var out []*layer

	for i, row := range builtinLayers {
		if built[i] != nil && hasClass(classes, row.charges) {
			out = append(out, built[i])
		}
	}

	return out
}

// planOn reports whether some built-in layer of the classes is on: whether
// the plan of those classes charges anything but routes.
func planOn(s *config.Settings, classes []int) bool {
	for i, row := range builtinLayers {
		if s.Builtin[i].On() && hasClass(classes, row.charges) {
			return true
		}
	}

	return false
}

func hasClass(classes []int, c int) bool {
	for _, k := range classes {
		if k == c {
			return true
		}
	}

	return false
}
