// Package limit is the arithmetic of a rate limit, as pure functions over
// numbers: no I/O, no locks, no net/http. Times are Unix nanoseconds, passed
// in by the caller, so every function is as easy to test as to call. The
// stores (memstore, redisstore), the answer and the root's status page use
// it; the Lua scripts of redisstore are its only other form, held equal by
// the root's equivalence tests (equivalence_test.go). The
// generated request path (../paths.tmpl: the root's paths, memstore's
// takes, rule's tallies, redisstore's reading of a reply) writes its checks
// out, where a call would cost every request its frame (../doc.go: frames):
// the generator copies the returned expression of a function of one return
// from here (Fits, Full, Over, Left, FewerLeft; its inline function), so
// that form is this package's for a check the request path writes out.
package limit
