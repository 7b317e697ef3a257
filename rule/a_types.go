package rule

import (
	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/rediscall"
)

// The types that other packages' request paths name in their functions'
// bodies are declared in this file, which Yaegi reads first: a type it
// meets named (in a signature, a field) before its declaration costs each
// such function an allocation per call (../doc.go: qualified names).

// Layer is a layer as the request path uses it, in parts by concern. The
// parts are embedded so that the request path reads l.Capacity, l.Entries,
// l.LimitHdr alike. NewLayer (build.go) builds Limits and HeaderTable,
// NewRefusal Refusal: the layer's rule and its answer. What a store
// keeps of the layer is the store's: its counters in the memory store
// (counter.Table, made by memstore's Attach) and its part of the Redis
// script call (rediscall.Encoding, made by redisstore's Encode). The layer
// points to them, embedded, so that the request path reaches them without
// a lookup, at no cost under Yaegi (a table indexed by the layer's position
// cost 6 allocations per request). A promoted field passed straight to a
// call costs a few allocations: pass what equals it (w.List, not l.List).
type Layer struct {
	Limits
	Stats *Stats // decisions since the process started, shared across reloads
	*counter.Table
	*rediscall.Encoding
	HeaderTable
	Refusal
}

// Charge is a request's charge as the stores take it: the layers and each
// layer's key, computed from the request's facts once (the keys snippet of
// paths.tmpl: chargeOf, serveGeneral, decide), never the request itself.
// The stores, the fallback, synced counters, the block list and an outage's
// debts count by these keys.
type Charge struct {
	Layers    []*Layer
	Keys      []string // Keys[i] is Layers[i]'s key (KeyFor)
	Client    string   // the client's key, which events name
	Principal string   // the request's principal ("": none), for the charges after the response (../after.go)
	Now       int64
	All       bool // the top-level dry run: every layer charged and evaluated
	// Lease names the request's slots in Redis's concurrency layers, made by
	// the Redis store when it first encodes one ("": none), which the
	// release after the response removes (../redisstore/concurrency.go).
	Lease string
	// Parent is the charge this one is a part of (ChargeAt), which a lease
	// made for the part is given too, so that the release finds it.
	Parent *Charge
}

// Tally is what a store reports of one request's layers. Cost is the
// caller's: the points the request spends in every layer (0 counts as 1).
type Tally struct {
	Cost    int64
	Shown   int   // the layer for the headers: the refusing one, else the one with the fewest left; -1 if none
	Count   int64 // its count after this request (a refusing layer: the count it would have reached)
	Reset   int64 // its reset, Unix nanoseconds
	ResetH  []string
	Left    int64 // its requests left
	Refused bool  // a layer's count would exceed its points
	// Firsts has bit i set when layers[i] refused for the first time in its
	// window, so a refusal is reported once per layer, key and window.
	Firsts uint64
	// Uncharged has bit i set when layers[i], in dry run, would have
	// refused and took nothing (a sliding window, a token bucket): a later
	// refusal has nothing to give back to it (memstore.GiveBack).
	Uncharged uint64
	// Each, when the caller sets it (NewItems: the general path of an
	// instance with headers, for a request of several layers), receives
	// every layer that allows the request and may show (not quiet): at 2i
	// layers[i]'s requests (points) left plus one, 0 for a layer that
	// reported none, at 2i+1 its reset (Unix nanoseconds). They are the
	// items of the RateLimit and RateLimit-Policy fields (../items.go).
	Each []int64
}
