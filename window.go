package tierlimit

import (
	"sync"
	"time"
)

// windowStore holds fixed-window counters in memory: one counter per (layer, key),
// starting at the key's first hit and reset duration later. It is safe for
// concurrent use; every method takes the time from its caller, so tests move a
// clock instead of sleeping.
//
// Memory is bounded by max counters. Counters of the same duration expire in the
// order they started, so each duration keeps its counters in a list ordered by
// start: expired counters are found at the list heads in O(1), without a
// goroutine or a scan. Each new key purges a few expired counters; at the cap
// all expired counters go, then the oldest live one.
type windowStore struct {
	mu      sync.Mutex
	max     int
	entries map[slotKey]*window
	lists   []*windowList
}

// slotKey names one counter.
type slotKey struct {
	layer string
	key   string
}

// window is one counter. Times are Unix nanoseconds.
type window struct {
	id     slotKey
	count  int64
	start  int64
	reset  int64
	logged bool // a refusal of this window was reported (see take)
	list   *windowList
	prev   *window
	next   *window
}

// windowList links the counters of one duration, oldest start first.
type windowList struct {
	duration int64
	head     *window
	tail     *window
}

// purgePerInsert is how many expired counters each new key removes, so memory
// follows the number of live keys even below the cap.
const purgePerInsert = 2

func newWindowStore(capacity int) *windowStore {
	return &windowStore{max: capacity, entries: make(map[slotKey]*window)}
}

// setMax changes the cap; a lower cap takes effect as keys are added.
func (s *windowStore) setMax(capacity int) {
	s.mu.Lock()
	s.max = capacity
	s.mu.Unlock()
}

// listFor returns the list that keeps counters of duration d. Layers resolve
// their list once, in New, so the request path does no lookup.
func (s *windowStore) listFor(d time.Duration) *windowList {
	s.mu.Lock()
	defer s.mu.Unlock()

	for _, l := range s.lists {
		if l.duration == int64(d) {
			return l
		}
	}

	l := &windowList{duration: int64(d)}
	s.lists = append(s.lists, l)

	return l
}

// size returns the number of counters held, expired or not.
func (s *windowStore) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()

	return len(s.entries)
}

// charge is one hit to take: the layer (with its list in this store) and the key.
type charge struct {
	layer *layer
	key   string
}

// result is a counter after a hit. firstRefusal is true for the first hit of
// the window that went over the layer's points, so a refusal is reported once
// per layer, key and window.
type result struct {
	count        int64
	reset        int64
	firstRefusal bool
}

// take charges one hit to each charge in order, under one lock so that the
// counts are exact under concurrency. Unless all is set it stops after the
// first charge whose count exceeds its layer's points: a refused request is not
// charged to the layers after the one that refused it. It writes out[i] for
// each charge taken and returns how many were taken.
func (s *windowStore) take(now int64, charges []charge, out []result, all bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()

	for i := range charges {
		c := charges[i]
		w := s.hitLocked(now, c.layer.list, c.layer.name, c.key)

		res := result{count: w.count, reset: w.reset}
		if w.count > c.layer.points && !w.logged {
			w.logged = true
			res.firstRefusal = true
		}

		out[i] = res

		if !all && w.count > c.layer.points {
			return i + 1
		}
	}

	return len(charges)
}

// peek returns the counter of (layer, key) without charging it; count is 0 when
// the key has no live window.
func (s *windowStore) peek(now int64, layer, key string) result {
	s.mu.Lock()
	defer s.mu.Unlock()

	w := s.entries[slotKey{layer: layer, key: key}]
	if w == nil || w.reset <= now {
		return result{}
	}

	return result{count: w.count, reset: w.reset}
}

func (s *windowStore) hitLocked(now int64, l *windowList, layer, key string) *window {
	id := slotKey{layer: layer, key: key}

	w := s.entries[id]
	if w != nil && w.reset > now && w.list == l {
		w.count++
		return w
	}

	if w != nil {
		// Expired (or its layer changed duration at a reload): start a new
		// window at the tail of its list.
		w.list.unlink(w)
	} else {
		s.makeRoom(now, l)

		w = &window{id: id}
		s.entries[id] = w
	}

	w.count = 1
	w.start = now
	w.reset = now + l.duration
	w.logged = false
	l.push(w)

	return w
}

// makeRoom purges a few expired counters and, at the cap, all expired ones and
// then the oldest live ones, until one more fits.
func (s *windowStore) makeRoom(now int64, l *windowList) {
	for n := 0; n < purgePerInsert && l.head != nil && l.head.reset <= now; n++ {
		s.remove(l.head)
	}

	if len(s.entries) < s.max {
		return
	}

	for _, other := range s.lists {
		for other.head != nil && other.head.reset <= now {
			s.remove(other.head)
		}
	}

	for len(s.entries) >= s.max {
		var oldest *window

		for _, other := range s.lists {
			if other.head != nil && (oldest == nil || other.head.start < oldest.start) {
				oldest = other.head
			}
		}

		if oldest == nil {
			return
		}

		s.remove(oldest)
	}
}

func (s *windowStore) remove(w *window) {
	w.list.unlink(w)
	delete(s.entries, w.id)
}

func (l *windowList) push(w *window) {
	w.list = l
	w.prev = l.tail
	w.next = nil

	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}

	l.tail = w
}

func (l *windowList) unlink(w *window) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}

	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}

	w.prev = nil
	w.next = nil
	w.list = nil
}

// registry holds one windowStore per middleware name for the life of the
// process. Traefik keeps one interpreter per plugin, so this survives
// configuration reloads and is shared by every router that uses the middleware.
var registry = &storeRegistry{stores: map[string]*windowStore{}, blocked: map[string]*blockList{}}

type storeRegistry struct {
	mu      sync.Mutex
	stores  map[string]*windowStore
	blocked map[string]*blockList // redis store: keys known over their limit
}

// get returns the store of the middleware called name, creating it with the
// cap capacity, or applying capacity to the existing one.
func (r *storeRegistry) get(name string, capacity int) *windowStore {
	r.mu.Lock()
	defer r.mu.Unlock()

	s := r.stores[name]
	if s == nil {
		s = newWindowStore(capacity)
		r.stores[name] = s

		return s
	}

	s.setMax(capacity)

	return s
}

// blockListFor returns the list of keys known over their limit for the
// middleware called name (redis store).
func (r *storeRegistry) blockListFor(name string, capacity int) *blockList {
	r.mu.Lock()
	defer r.mu.Unlock()

	b := r.blocked[name]
	if b == nil {
		b = newBlockList(capacity)
		r.blocked[name] = b
	}

	return b
}
