// Package tierlimit is a Traefik middleware plugin that limits requests with
// several layers (fixed or sliding windows, token buckets): global, per
// client IP, per IP for public assets, per principal, per plan and per
// route. README.md documents its configuration and docs/ the rules behind
// it; CONTRIBUTING.md lists its packages and what each owns.
//
// This package is New (with recover.go, its last line of defence against a
// panic) and what no sub-package owns: the mode an instance
// serves in and the layers, plans, routes and stores it is built from
// (plugin.go, build.go), the request paths (paths.tmpl, generated into
// paths_gen.go; paths.go, general.go), routes, assets and exemptions
// (match.go), the charges after authentication and after the response
// (after.go), the stores as an instance puts them together (stores.go), the
// WebSocket connection cap (wsclose.go), the release of concurrency layers'
// slots after the response (inflight.go), and what the status endpoint (the
// status page, its metrics and resets: package status) is asked and handed
// (status.go). It imports its sub-packages; none of them imports it.
//
// # Writing this package for Yaegi
//
// Traefik runs the plugin's non-test files in the Yaegi interpreter. These
// rules explain the shape of the request path; comments elsewhere, in this
// package and in its sub-packages, point here by name ("doc.go: frames")
// instead of repeating them.
//
// Frames. Each call allocates the callee's whole frame: one allocation per
// local and per temporary of every branch, taken or not (Yaegi's newFrame
// and the reflect.New of each slot); every field selector, operator, index
// and call result is a temporary. So the request path keeps the common
// case in few small functions and moves rare work (new windows, refusals,
// large header values, route matches) into functions of its own that only
// those requests call. A tuple assignment (a, b = x, y) costs a slot per
// value and per target: the request path assigns one value at a time.
// Typed constant expressions such as int64(time.Second) are evaluated per
// request. An == or != of a value of a defined type (limit.Algorithm)
// allocates once per evaluation (Yaegi boxes it) where an int's costs
// nothing, and a switch on it costs what one on an int does: the request
// path compares a layer's algorithm as an int (rule.Limits.Alg).
// Allocations per request are deterministic under Yaegi where timings are
// not; e2e/yaegibench's budget test counts them.
//
// Functions, not methods. Yaegi calls a method of our own types through a
// reflect.MakeFunc wrapper, as if it were compiled code, where it calls a
// function directly: a method call costs about 18 allocations more. So the
// request path is written as functions that take the Plugin (or the
// resolver) as their first argument; methods remain where an interface
// needs them (ServeHTTP, the ResponseWriter of after.go) and off the
// request path. New returns the handler of the instance's mode (plugin.go),
// whose ServeHTTP is that mode's path: the one method call a request makes
// is Traefik's.
//
// Qualified names. In a function on the request path, each constant of
// another package named as pkg.Name (rule.KeyOfClient) costs one allocation
// per call of that function, for each such name. So each package names the
// constants its request path uses through constants declared once
// (aliases.go here, memstore/aliases.go, redisstore/aliases.go), and its
// request path names those (keyOfClient, not rule.KeyOfClient); code off the
// request path names them qualified. A type of another package named in a
// function's body (var shown *rule.Layer, rule.Tally{...}) costs that
// allocation too when Yaegi met the type named (in a signature, a field)
// before its declaration, reading its package's files by name and each
// file's declarations in order, and nothing when it met the declaration
// first; named in a signature it costs nothing either way. So the request
// path names types qualified, and each type it names is declared before
// anything of its package names it: rule's Layer, Charge and Tally in
// rule/a_types.go, the file Yaegi reads first, redisstore.SyncCounter in
// redisstore/lease.go, counter.Entry, memstore.BlockedKey and
// events.RedisEvent first in their files. e2e/yaegibench's
// TestTypesTheRequestPathNamesCostNothingUnderYaegi measures each of them. A
// call of another package's function costs what a call of a local one does,
// and reading a field of its struct costs nothing more: a sub-package is
// free on the request path as long as it exposes functions.
//
// Generated paths. Where a shared helper would put a frame on the fast
// path, the fast path writes the few lines out. Those lines are written once,
// as snippets of paths.tmpl (the client-IP fast case, the fixed-window
// charge and its all-or-nothing decision, the rate-limit headers, the
// credential-header check, the pending charge of a credentialed request,
// the answer of a cached refusal, the keys of a charge), and every path that
// needs them is generated from it by e2e/cmd/genpaths (make generate, or go
// generate in the root): the root's paths into paths_gen.go, the memory
// store's Take (and TakeEach, which records RateLimit items) into
// memstore/take_gen.go, the allow snippet as rule.Allow
// into rule/allow_gen.go, the Redis store's Record into
// redisstore/reply_gen.go. The comparisons of limit/ in them are copied
// from limit's source (the template's inline). Edit paths.tmpl, never a _gen.go
// file: the generator's test fails when they disagree.
//
// Modes. New chooses the mode once (chooseMode, build.go); paths.go (the
// fast paths and the Redis paths) and general.go (the general path) state
// what their mode guarantees them, so that the request path tests no
// configuration it does not need. Within a mode, the shapes New can tell
// apart take paths of their own too: a Redis instance with layers in
// memory takes mixedPath (redisFast.mixed), one on a Cluster with global
// in Redis clusterPath (redisFast.pair), a route match of a classify
// instance whose routes are fixed windows takes serveRoutedFast, or
// serveCountedFast when some route counts statuses (routedPaths);
// everything else, serveGeneral.
//
// Wrappers. A ResponseWriter of our own type handed to compiled code must be
// converted to http.ResponseWriter first (an interface variable); passed
// directly, Yaegi panics in reflect. The wrapper then loses Flush, so it
// flushes the original writer itself (watchWriter, after.go).
//
// Constructs Yaegi cannot run: generics with inferred type arguments,
// atomic.Pointer, method expressions, min/max/clear, range over an integer,
// errors.As or a type switch on our own error types, custom JSON methods, a
// multiple assignment with "=" whose values include a call or a conversion
// (only the call's value is stored) or untyped nils (it panics; the e2e test
// TestRuntimeCodeAvoidsYaegiMultiAssignBug guards both). A closure must copy
// a loop variable it captures; write uint64(1) << n next to a uint64.
// sync/atomic calls cost several allocations each; a plain increment under a
// held lock costs none; select and defer cost more than a map lookup.
package tierlimit

// paths_gen.go, memstore/take_gen.go, rule/allow_gen.go and redisstore/reply_gen.go are made from paths.tmpl (see
// "Generated paths" above).
//go:generate sh -c "cd e2e && go run ./cmd/genpaths -root .."
