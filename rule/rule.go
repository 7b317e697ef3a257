package rule

import "sync/atomic"

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

	if l.Alg != algFixed {
		t.Uncharged |= uint64(1) << uint(i)
	}

	Allow(t, i, l, l.Capacity, reset, resetH)

	return false
}

// CostOf is the points a tally's request spends in each layer: its cost,
// at least 1.
func CostOf(t *Tally) int64 {
	if t.Cost < 1 {
		return 1
	}

	return t.Cost
}
