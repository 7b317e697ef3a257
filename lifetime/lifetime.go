// Package lifetime owns how long process-wide state lives. That state
// (counters, block lists, connection counters, Redis pools) lives in
// registries (HeldRegistry) keyed by middleware name or Redis configuration,
// so that routers share it and reloads keep it; the root and redisstore
// create them, this package decides when an entry is released. Traefik's only teardown signal
// is the ctx passed to New, and it cancels the previous configuration's ctx
// before it calls New for the next one (pkg/server/routerfactory.go,
// CreateRouters). So an entry counts the instances that hold it: each New
// adds one, its ctx's cancellation removes it, and an entry nobody holds is
// released only after ReleaseGrace, by which time the next configuration's
// New calls have taken it again if it is still configured. No goroutine
// waits on a ctx: context.AfterFunc registers a callback, and time.AfterFunc
// runs the grace timer.
//
// An entry whose value holds counts that still matter (a window, a block or
// a calendar period not yet ended, an open connection) outlives the grace:
// a registry with a live function keeps it, unheld, until the latest end
// that function reports, checks again then, and releases it once it holds
// nothing that matters. So a reload that disables the middleware (a typo in
// its configuration) or removes it does not wipe its counts: the same name
// configured again within their windows takes them back. One timer per
// entry, not per key; each store is bounded by maxTracked.
package lifetime

import (
	"context"
	"sync"
	"time"
)

// ReleaseGrace is how long an entry that no instance holds is kept. It covers
// building the next configuration and the requests still in flight on the
// previous one's handlers.
const ReleaseGrace = 10 * time.Second

// HeldRegistry is a registry whose entries are kept while some instance
// holds them: its entries by id, each with the instances holding it.
type HeldRegistry struct {
	Mu      sync.Mutex
	Entries map[string]*heldEntry

	// After schedules f after d (time.AfterFunc); tests replace it.
	After func(d time.Duration, f func())
	// closed runs, outside the lock, for each released entry's value.
	closed func(v interface{})
	// live, when set, returns until when (Unix nanoseconds) an unheld
	// entry's value still holds counts that matter at now: 0, or a time
	// not after now, when it holds none. Without it, an unheld entry is
	// released at the grace.
	live func(v interface{}, now int64) int64
	// Now is the clock live is asked with; tests replace it.
	Now func() time.Time
}

// heldEntry is one entry: its value, the number of instances holding it,
// and the number of times it became unheld, so that a grace timer started
// before the entry was taken again does not release it.
type heldEntry struct {
	Value   interface{}
	holders int
	idle    int
}

// NewHeldRegistry returns an empty registry that releases an unheld entry at
// the grace and then runs closed (when not nil) on its value.
func NewHeldRegistry(closed func(v interface{})) *HeldRegistry {
	return &HeldRegistry{Entries: map[string]*heldEntry{}, After: afterFunc, closed: closed, Now: time.Now}
}

// NewKeepingRegistry returns a HeldRegistry whose unheld entries are kept while
// live reports counts that matter (see above).
func NewKeepingRegistry(live func(v interface{}, now int64) int64) *HeldRegistry {
	r := NewHeldRegistry(nil)
	r.live = live

	return r
}

func afterFunc(d time.Duration, f func()) {
	time.AfterFunc(d, f)
}

// Take returns the entry of id, creating it with create, held by one more
// instance until ctx is cancelled. A ctx that is never cancelled
// (context.Background) holds it for the life of the process.
func (r *HeldRegistry) Take(ctx context.Context, id string, create func() interface{}) interface{} {
	r.Mu.Lock()

	e := r.Entries[id]
	if e == nil {
		e = &heldEntry{Value: create()}
		r.Entries[id] = e
	}

	e.holders++
	v := e.Value
	r.Mu.Unlock()

	if ctx != nil && ctx.Done() != nil {
		context.AfterFunc(ctx, func() { r.drop(id, e) })
	}

	return v
}

// drop runs when an instance's ctx is cancelled (on a goroutine of its own,
// which must not panic).
func (r *HeldRegistry) drop(id string, e *heldEntry) {
	defer func() { _ = recover() }()

	r.Mu.Lock()

	e.holders--
	if e.holders > 0 {
		r.Mu.Unlock()
		return
	}

	e.idle++
	idle := e.idle
	r.Mu.Unlock()

	r.After(ReleaseGrace, func() { r.expire(id, e, idle) })
}

// expire releases the entry if no instance took it since it became unheld
// and it holds no counts that still matter; while it does, it checks again
// at the latest end live reports.
func (r *HeldRegistry) expire(id string, e *heldEntry, idle int) {
	defer func() { _ = recover() }()

	if !r.unheld(id, e, idle) {
		return
	}

	if r.live != nil {
		// Outside r.Mu: live takes the value's own lock and may scan it.
		now := r.Now().UnixNano()
		if until := r.live(e.Value, now); until > now {
			r.After(time.Duration(until-now), func() { r.expire(id, e, idle) })
			return
		}
	}

	r.Mu.Lock()

	if r.Entries[id] != e || e.holders > 0 || e.idle != idle {
		r.Mu.Unlock()
		return
	}

	delete(r.Entries, id)
	r.Mu.Unlock()

	if r.closed != nil {
		r.closed(e.Value)
	}
}

// unheld reports whether id's entry is still e, and unheld since the grace
// timer of idle started.
func (r *HeldRegistry) unheld(id string, e *heldEntry, idle int) bool {
	r.Mu.Lock()
	defer r.Mu.Unlock()

	return r.Entries[id] == e && e.holders == 0 && e.idle == idle
}

// Size returns the number of entries held.
func (r *HeldRegistry) Size() int {
	r.Mu.Lock()
	defer r.Mu.Unlock()

	return len(r.Entries)
}
