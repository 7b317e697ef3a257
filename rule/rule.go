package rule

import (
	"sync"
	"sync/atomic"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/limit"
)

// How a layer finds its key in a request.
const (
	KeyOfClient              = iota // the client IP (ip, assets, routes keyed by ip)
	KeyOfPrincipal                  // the principal id (user, service)
	KeyOfConst                      // Limits.ConstKey (global, routes keyed by global)
	KeyOfPrincipalElseClient        // routes keyed by principal
	KeyOfHeader                     // "header:<Name>": the value hashed, else the client IP
	KeyOfHost                       // "host": the request's host (request.HostKey), else the client IP
	KeyOfParts                      // a route's key of json: or several sources (Limits.KeyParts)
)

// KeyOfJSON is a KeyPart's kind for a json:<path> source: the value at
// Path in the request's JSON body.
const KeyOfJSON = -1

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
	Interval  int64 // token bucket: nanoseconds per point (../limit/bucket.go); 0 for a window
	Refill    int64 // token bucket: the points per duration configured; Capacity is then the burst
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

// MaxPrecomputed bounds the per-layer header tables.
const MaxPrecomputed = 4096

// ChargeSpan is c for its layers from to to (to excluded), sharing c's
// slices: a copy of c, which under Yaegi allocates less than a literal of
// its fields.
func ChargeSpan(c *Charge, from, to int) *Charge {
	part := *c
	part.Layers = c.Layers[from:to]
	part.Keys = c.Keys[from:to]
	part.Parent = c

	return &part
}

// ChargeAt is c for the layers at index, in that order (an empty index: no
// layer).
func ChargeAt(c *Charge, index []int) *Charge {
	part := &Charge{Client: c.Client, Principal: c.Principal, Now: c.Now, All: c.All, Lease: c.Lease, Parent: c}
	for _, i := range index {
		part.Layers = append(part.Layers, c.Layers[i])
		part.Keys = append(part.Keys, c.Keys[i])
	}

	return part
}

// ChargeWithout is c without the layers whose bit is set in skip, with c's
// lease: a give-back of the part frees the request's slots in Redis.
func ChargeWithout(c *Charge, skip uint64) *Charge {
	if skip == 0 {
		return c
	}

	part := &Charge{Client: c.Client, Principal: c.Principal, Now: c.Now, All: c.All, Lease: c.Lease, Parent: c}
	for i, l := range c.Layers {
		if skip&(uint64(1)<<uint(i)) == 0 {
			part.Layers = append(part.Layers, l)
			part.Keys = append(part.Keys, c.Keys[i])
		}
	}

	return part
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

// CountRedis records one decision of the Redis store.
func CountRedis(st *Stats, refused bool) {
	if refused {
		atomic.AddInt64(&st.RedisRefused, 1)
		return
	}

	atomic.AddInt64(&st.RedisAllowed, 1)
}

// CopyItem copies into t.Each at i the item of part.Each at j: MergeTally's,
// in a function of its own as Item is Allow's. Both tallies have items.
func CopyItem(t, part *Tally, i, j int) {
	t.Each[2*i] = part.Each[2*j]
	t.Each[2*i+1] = part.Each[2*j+1]
}

// NewItems is a Tally.Each for n layers.
func NewItems(n int) []int64 {
	return make([]int64, 2*n)
}

// Refuse records that layers[i] refused with this count and reset; first
// says it is the window's first refusal. The first refusing layer is the one
// shown.
func Refuse(t *Tally, i int, count, reset int64, resetH []string, first bool) {
	if first {
		t.Firsts |= uint64(1) << uint(i)
	}

	if !t.Refused {
		t.Refused, t.Shown, t.Count, t.Reset, t.ResetH, t.Left = true, i, count, reset, resetH, 0
	}
}

// RefuseAs records that layers[i], l, would refuse with this count and
// reset, and reports whether the request is refused: as Refuse, unless l is
// in dry run. A dry-run layer refuses nothing: its refusal is reported
// (first) and, unless it is quiet (Limits.Quiet), the headers may show it
// with nothing left, while the other layers decide the request.
func RefuseAs(t *Tally, i int, l *Layer, count, reset int64, resetH []string, first bool) bool {
	if !l.DryRun {
		Refuse(t, i, count, reset, resetH, first)
		return true
	}

	if first {
		t.Firsts |= uint64(1) << uint(i)
	}

	if l.Algorithm != algFixed {
		t.Uncharged |= uint64(1) << uint(i)
	}

	Allow(t, i, l, l.Capacity, reset, resetH)

	return false
}

// MonthPolicy is a month layer's RateLimit-Policy value for the period
// [start, end), Unix nanoseconds.
type MonthPolicy struct {
	Mu    sync.Mutex
	Start int64
	End   int64
	Hdr   []string
}

// CostOf is the points a tally's request spends in each layer: its cost,
// at least 1.
func CostOf(t *Tally) int64 {
	if t.Cost < 1 {
		return 1
	}

	return t.Cost
}
