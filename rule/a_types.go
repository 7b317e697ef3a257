package rule

import (
	"sync"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rediscall"
)

// The package's types (a layer and its parts, a charge, a tally), which
// other packages' request paths name in their functions' bodies, are
// declared in this file, which Yaegi reads first: a type it meets named (in
// a signature, a field) before its declaration costs each such function an
// allocation per call (../doc.go: qualified names). Their functions are in
// the package's other files.

// Layer is a layer as the request path uses it, in parts by concern. The
// parts are embedded so that the request path reads l.Capacity, l.Entries,
// l.LimitHdr alike. NewLayer (build.go) builds Limits and HeaderTable,
// NewRefusal Refusal: the layer's rule and its answer. What a store
// keeps of the layer is the store's, in its package's type: its counters in
// the memory store (counter.Table, made by memstore's Attach) and its part
// of the Redis script call (rediscall.Encoding, made by redisstore's
// Encode). The layer points to them, embedded, because under Yaegi that is
// the only way to reach them from the one list of layers every store takes
// (Charge) at no cost: a lookup by the layer's position, a list beside the
// layers, a map or an untyped field each cost allocations per request, and
// a store's own list of its layers would need a list per store wherever a
// request's layers are listed, per request on the routed paths
// (e2e/yaegibench's TestALayerReachesItsStoresPartsOnlyThroughItselfForFreeUnderYaegi,
// ../BENCHMARKS.md). A promoted field passed straight to a call costs a few
// allocations: pass what equals it (w.List, not l.List).
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
	// Ahead are the calendar layers whose place a maxDelay reserved in
	// their next period, in Redis another key (set on the first charge,
	// whose parts find it through Parent: ../redisstore/calendar.go), where
	// a give-back of the charge goes.
	Ahead []*Layer
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
	// Wait is how long the request must wait for the place its layers
	// reserved (nanoseconds, the longest of their waits; 0: none): a layer
	// with a MaxDelay would have refused it now. Firsts has WaitBit set
	// then, so that the request path tests nothing more for it.
	Wait int64
}

// WaitBit marks, in Tally.Firsts, a tally with a Wait (the bits below are
// the layers' first refusals; MonthPolicyBit and the root's itemsBit take
// bits 63 and 62).
const WaitBit = uint64(1) << 61

// KeyPart is one source of a KeyOfParts key.
type KeyPart struct {
	Kind   int    // KeyOfClient, KeyOfPrincipalElseClient, KeyOfHost, KeyOfHeader or KeyOfJSON
	Header string // canonical, for KeyOfHeader
	Path   []string
}

// Limits is what the configuration says of a layer.
type Limits struct {
	Name string
	// Capacity is what the layer holds at once: a window's points, a token
	// bucket's burst, a concurrency layer's slots (limit.Capacity); what
	// X-RateLimit-Limit shows and every check compares with.
	Capacity  int64
	Duration  int64 // nanoseconds
	KeyKind   int
	ConstKey  string
	KeyHeader string // canonical, for keyOfHeader
	// KeyParts are the sources of a KeyOfParts key, in order, each a
	// KeyOf* but KeyOfConst (or KeyOfJSON), whose values the key joins;
	// MaxBody bounds the body bytes its json: sources read.
	KeyParts []KeyPart
	MaxBody  int64
	// Algorithm is how the layer counts, and so what Capacity is
	// (limit.Algorithm): a window's points, a token bucket's burst, a
	// concurrency layer's slots (requests in flight per key, each slot held
	// until its request ends or for Duration at most, its lease:
	// ../memstore/concurrency.go; a request holds one slot whatever its
	// cost).
	Algorithm limit.Algorithm
	// Alg is Algorithm as an int, set with it by NewLayer: the request path
	// compares Alg (with each package's int constants algSliding...,
	// aliases.go), code off it Algorithm (../doc.go: frames).
	Alg      int
	Interval int64 // token bucket: nanoseconds per point (../limit/bucket.go); 0 for a window
	Refill   int64 // token bucket: the points per duration configured; Capacity is then the burst
	// MinCost is the smallest cost a request charged to the layer can have:
	// a route's cost (a request is charged the largest cost of its routes),
	// 1 elsewhere (0 reads as 1). The Redis block list blocks only what
	// even that cost would not fit (RedisStore.refused, ../redisstore).
	MinCost int64
	// CheckOnly marks a countStatus route's layer as a request's plan holds
	// it: evaluated, never charged (../after.go). Its charge, once the
	// response's status is known, goes to route.charge.
	CheckOnly bool
	// BlockDuration is how long a key this layer refused stays refused,
	// in nanoseconds (0: only while over its limit; ../memstore/block.go).
	BlockDuration int64
	// DryRun marks a layer that counts and reports what it would refuse, but
	// refuses nothing (Tally.RefuseAs); a fixed window is charged even
	// then, a sliding window or a token bucket takes only what it holds.
	DryRun bool
	// Quiet marks a dry-run layer of an instance where some rule enforces. The
	// client's headers never show it (Tally.Allow): they show the most
	// restrictive rule that enforces. When every rule is in dry run (the
	// top-level dryRun), the most restrictive dry-run rule shows.
	Quiet bool
	// Calendar aligns the layer's fixed windows to days, weeks or months
	// at UtcOffset, nanoseconds east of UTC (limit.Period; 0: none).
	Calendar  int
	UtcOffset int64
	Month     *MonthPolicy // a month layer's RateLimit-Policy (month.go)
	// Memory marks the layer of a Redis instance that is counted in memory
	// (../redisstore/mixed.go).
	Memory bool
	// Apart marks a layer that the memory store's Take charges apart from
	// its algorithm's usual take (memstore's apart): a check-only layer, a
	// layer with a MaxDelay.
	Apart bool
	// MaxDelay is how long a request the layer would refuse may wait for
	// its place, in nanoseconds (0: none; a dry-run layer refuses nothing,
	// so it waits for nothing): the stores reserve the place at once and
	// report the wait (Tally.Wait).
	MaxDelay int64
	// Unleased marks a layer that a synced store counts with the script at
	// each request rather than from leases (../redisstore/slots.go).
	Unleased bool
	// Settles marks a costFrom route's layer, whose counts fall when a
	// response reports less than its reservation (../meter.go): the Redis
	// block list, which holds a key until its reset, never holds its keys.
	Settles bool
}

// HeaderTable holds the rate-limit header values that depend only on the
// layer and the requests left. The slices are shared by every response:
// http.Header's Add and Set replace a value rather than write into it.
type HeaderTable struct {
	Limit        string   // points, formatted
	LimitHdr     []string // X-RateLimit-Limit
	PolicyHdr    []string // RateLimit-Policy
	RemainingHdr [][]string
	RatePrefix   []string // RateLimit values up to the seconds: `"name";r=12;t=`
	TableLen     int64    // len(remainingHdr)
	// RemainingHdr and RatePrefix are indexed by requests left, for the
	// first MaxPrecomputed values; larger ones are formatted per request.

	// PolicyItem and RateItem are the layer's item after another's in
	// RateLimit-Policy and RateLimit (up to its requests left): `, ` and
	// its policy, `, "name";r=` (../items.go).
	PolicyItem string
	RateItem   string
}

// Refusal is how the layer answers a request it refuses: the answer's
// Policy (status, content type, and either a template (response.body) or the
// default JSON body around its reset time; layer names need no JSON
// escaping: validName), embedded so that the request path reads l.Status,
// l.Body alike, and the fast paths' cache of a default refusal.
type Refusal struct {
	answer.Policy
	Cache refusalCache // the fast paths', under the memory store's lock (in modeRedis, the block list's)
}

// refusalCache holds a default refusal of the layer, for the reset second
// ResetH and Secs seconds to the reset: the body and the header values, in
// the order of RefusalHeaders (refusal.go). Many refusals share them: every
// refusal of a flood within one second, of windows that reset in one second.
type refusalCache struct {
	ResetH   string
	ResetSec int64 // ResetH, parsed
	Secs     int64
	Body     []byte
	Values   [][]string
}

// Stats counts a layer's decisions since the process started: requests
// it let through and requests it refused. The memory store counts under its
// lock, with plain increments (../doc.go: a sync/atomic call costs
// allocations);
// the Redis store, which takes no lock, counts in the atomic fields.
type Stats struct {
	Allowed, Refused           int64 // under WindowStore.Mu
	RedisAllowed, RedisRefused int64 // atomic
	// A costFrom route's layer (../meter.go), atomic: the requests holding
	// a reservation now, the points their responses reported, the responses
	// that reported none, and the window (time / duration) of the last
	// event about one.
	Reserved, Settled, Unreported, UnreportedWindow int64
}

// MonthPolicy is a month layer's RateLimit-Policy value for the period
// [start, end), Unix nanoseconds.
type MonthPolicy struct {
	Mu    sync.Mutex
	Start int64
	End   int64
	Hdr   []string
}
