package tierlimit

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
	"github.com/tierlimit/tierlimit/status"
)

// Plugin is the middleware. It is safe for concurrent use; everything but the
// counters is fixed in New (build.go builds it).
type Plugin struct {
	next   http.Handler
	name   string
	now    func() time.Time
	mode   mode
	events *events.EventLog

	ips    *request.Resolver
	stores *stores               // where each layer counts (stores.go)
	memory *memstore.WindowStore // the memory store, or the redis store's fallback (stores.memory)

	layers []*rule.Layer // every layer that is on, in evaluation order (status, metrics)
	plans
	routing
	pathForms
	// What tells who sent a request: the auth server's headers
	// (UserHeader "" when principal tiers are off) or where credentials may
	// be (request/principal.go). Embedded, so that the request path reads
	// p.UserHeader with one selector (doc.go: frames).
	request.Principal
	planHeader string // canonical; "" when there are no plans
	// invalidCode holds the statuses that mark a credential invalid; nil
	// when none is configured. A credentialed request is passed on with its ip
	// charge pending (after.go) when the ip layer is on (planInvalid).
	invalidCode map[int]bool

	dryRun  bool
	headers bool

	ws      *connCounter // nil when websocket.maxConnectionsPerIP is 0
	wsLayer *rule.Layer  // stands for the connection cap in a refusal
	exempt  *exemptions  // nil when nothing is exempt
	status  *status.Page // nil when status.path is not set (status.go)
	fast    *redisFast   // modeRedis only
	// held: some layer is a concurrency layer, whose slots a request
	// holds until its response ends (inflight.go).
	held bool
}

// routing is how an instance's routes are matched and charged (buildRoutes,
// build.go; routedPaths, general.go). Plugin embeds it, plans and pathForms
// so that the request path reads p.routes with one selector (doc.go:
// frames).
type routing struct {
	routes []*route
	// The methods some route is limited to; nil when a route takes every
	// method (or there is none), so that a request of another method skips
	// the route matchers.
	routeMethods map[string]bool
	// routedFast, countedFast: a request of the classify path that matches
	// routes is charged on serveRoutedFast, serveCountedFast, or neither:
	// serveGeneral (routedPaths).
	routedFast, countedFast bool
}

// pathForms: routes and asset prefixes match the canonical request path
// (request/path.go), in lower case when foldPaths; a route that wants the
// other form converts it (setPathForms, build.go). assetHint matches every
// path whose canonical form may start with an asset prefix, and few others:
// a request that it does not match is no asset, without canonicalising its
// path (request/assetpath.go).
type pathForms struct {
	assetPaths []string
	assetHint  *regexp.Regexp // nil when there is no asset prefix
	foldPaths  bool
}

// plans are the layers charged up front, by kind of request, in evaluation
// order, drawn up from the catalogue of built-in layers (drawPlans,
// build.go), and what a request is charged in each of their layers.
type plans struct {
	planIP, planAssets, planUser, planService, planCred, planInvalid []*rule.Layer
	planCost                                                         int64
	// planNamed holds the plan of each of plans: by name (rule.NamedPlans);
	// nil when there are none.
	planNamed map[string][]*rule.Layer
}

// mode is how an instance serves its requests, chosen once in New by
// chooseMode. Each serving function's file states what its modes guarantee.
type mode int

const (
	// modeOff passes every request on untouched: disabled, or nothing to limit.
	modeOff mode = iota
	// modeAnonymous serves every request on anonymousPath (paths.go): the
	// instance reads no principal and no credential.
	modeAnonymous
	// modePrincipal serves every request on principalPath (paths.go): the
	// instance after ForwardAuth.
	modePrincipal
	// modeClassify is the fast path for an instance with credential headers or
	// routes: classifyPath sends route matches to serveGeneral.
	modeClassify
	// modeGeneral serves every request on serveGeneral (paths.tmpl;
	// its helpers in general.go).
	modeGeneral
	// modeRedis serves every request on redisPath (paths.go): the
	// anonymous instance on the Redis store; on mixedPath when some of its
	// layers count in memory (redisFast.mixed).
	modeRedis
	// modePrincipalPlans serves every request on principalPlansPath
	// (paths.go): modePrincipal with plans.
	modePrincipalPlans
)

// New builds the middleware from a validated configuration. It does no I/O:
// counters live in the package registry, keyed by name, so routers that share
// the middleware share its budget and reloads keep the counts.
//
// A panic in parse or build is a bug, but Traefik would drop its whole
// dynamic configuration with it (every router answers 404): New turns it
// into an error, which disables only the routers that use this middleware
// (panicError). New is not on the request path: its defer costs nothing there.
func New(ctx context.Context, next http.Handler, conf *Config, name string) (handler http.Handler, err error) {
	var cfg *config.Settings

	defer func() {
		if r := recover(); r != nil {
			err = panicError(ctx, name, cfg, r)
		}
	}()

	parsed, err := parse(conf)
	if err != nil {
		return nil, fmt.Errorf("configuring %s: %w", name, err)
	}

	cfg = parsed
	if buildHook != nil {
		buildHook(cfg)
	}

	return build(ctx, cfg, next, name).handler(), nil
}

// handler is what serves the instance's requests: the handler of its fast
// mode (fastPath) or of modeGeneral (generalPath), which starts a request
// on that mode's path without ServeHTTP's frame (doc.go: frames), or, for
// modeOff, the Plugin itself. Each answers the status page first.
func (p *Plugin) handler() http.Handler {
	if p.mode == modeGeneral {
		return (*generalPath)(p)
	}

	if p.mode == modeOff {
		return p
	}

	if p.mode == modeRedis && p.fast.store.Synced != nil {
		return (*syncedPath)(p)
	}

	return p.fastPath()
}

// fastPath returns the handler of a fast mode (paths.go).
func (p *Plugin) fastPath() http.Handler {
	switch p.mode {
	case modeAnonymous:
		return (*anonymousPath)(p)
	case modePrincipal:
		return (*principalPath)(p)
	case modePrincipalPlans:
		return (*principalPlansPath)(p)
	case modeRedis:
		if p.fast.mixed {
			return (*mixedPath)(p)
		}

		if p.fast.pair {
			return (*clusterPath)(p)
		}

		return (*redisPath)(p)
	}

	return (*classifyPath)(p)
}

// ServeHTTP dispatches on the mode to the paths generated from paths.tmpl
// (paths_gen.go); New returns the fast modes' handlers themselves.
func (p *Plugin) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	switch p.mode {
	case modeGeneral, modeOff:
		if p.status != nil && serveStatus(p, rw, req) {
			return
		}

		if p.mode == modeOff {
			p.next.ServeHTTP(rw, req)
			return
		}

		serveGeneral(p, rw, req, nil)
	default:
		p.fastPath().ServeHTTP(rw, req)
	}
}

// The configuration is package config (config/): the schema and its
// defaults, their parsing and validation into config.Settings. Config is
// its schema as Traefik's plugin loader asks for it (CreateConfig and New
// name it): config.Config's fields, a type of the root's own.
type Config config.Config

// CreateConfig returns the defaults README.md documents (config.Defaults);
// Traefik decodes the user's settings over it.
func CreateConfig() *Config {
	return (*Config)(config.Defaults())
}

// parse validates cfg and returns its parsed form (config.Parse).
func parse(cfg *Config) (*config.Settings, error) {
	return config.Parse((*config.Config)(cfg))
}
