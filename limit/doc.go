// Package limit is the arithmetic of a rate limit, as pure functions over
// numbers: no I/O, no locks, no net/http. Times are Unix nanoseconds, passed
// in by the caller, so every function is as easy to test as to call. The
// stores (memstore, redisstore), the answer and the root's status page use
// it; the Lua scripts of redisstore are its only other form, held equal by
// the root's equivalence tests (equivalence_test.go). The
// generated fast paths (../paths.tmpl) write the fixed window's check out,
// where a call would cost every request its frame (../doc.go: frames): the
// generator copies the returned expression of Fits, Full and Left from
// here (its inline function), so a function of one return is this
// package's form of a check the request path needs written out.
package limit
