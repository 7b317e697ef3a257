package tierlimit

// Writing this package for Yaegi
//
// Traefik runs the plugin's non-test files in the Yaegi interpreter. These
// rules explain the shape of the request path; comments elsewhere point here
// by name ("doc.go: frames") instead of repeating them.
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
// request. Allocations per request are deterministic under
// Yaegi where timings are not; e2e/yaegibench's budget test counts them.
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
// Generated paths. Where a shared helper would put a frame on the fast
// path, the fast path writes the few lines out. Those lines are written once,
// as snippets of paths.tmpl (the client-IP fast case, the fixed-window
// charge and its all-or-nothing decision, the rate-limit headers, the
// credential-header check, the pending charge of a credentialed request,
// the answer of a cached refusal), and every path that needs them is
// generated from it into paths_gen.go by e2e/cmd/genpaths (make generate,
// or go generate in the root). Edit paths.tmpl, never paths_gen.go: the
// generator's test fails when the two disagree.
//
// Modes. New chooses the mode once (chooseMode, build.go); paths.go,
// paths.go and general.go state what their mode guarantees them, so that
// the request path tests no configuration it does not need.
//
// Wrappers. A ResponseWriter of our own type handed to compiled code must be
// converted to http.ResponseWriter first (an interface variable); passed
// directly, Yaegi panics in reflect. The wrapper then loses Flush, so it
// flushes the original writer itself (after.go, after.go).
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

// paths_gen.go is made from paths.tmpl (see "Generated paths" above).
//go:generate sh -c "cd e2e && go run ./cmd/genpaths -root .."
