// Package counter holds the memory store's counters (package memstore): an
// Entry per layer and key (a window's count, a token bucket's TAT, a
// concurrency layer's slots), the Lists that order them by start, and a
// layer's Table of them, which the memory store makes for each layer of an
// instance (memstore's Attach) and the layer (rule.Layer) points to, so that
// the request path reaches its counters without a lookup (../doc.go:
// frames). It is data and the lists' operations; memstore decides, and no
// other store reads it but through memstore (the Redis store's fallback).
package counter

// Entry is one layer's counter of one key: a fixed or sliding window's
// count, a token bucket's TAT (Reset), a concurrency layer's slots. Times
// are Unix nanoseconds.
type Entry struct {
	Layer  string
	Key    string
	Count  int64 // points spent in the window: never above the layer's points but in dry run
	Start  int64
	Reset  int64
	Expire int64 // when the counter may be dropped: reset, or reset + duration for a sliding window
	// PrevCount is a sliding window's count of the window before; ResetSec
	// is the second ResetH shows.
	PrevCount int64
	ResetSec  int64
	Refused   int64    // requests this window refused (status page)
	Logged    bool     // a refusal of this window was reported (rule.Tally.Firsts)
	Taken     int64    // memstore.WindowStore.Takes of the last request that charged it: never evicted by that request
	Slots     []int64  // a concurrency layer's slots held: each one's lease end (../memstore/concurrency.go)
	ResetH    []string // X-RateLimit-Reset value, formatted once per window
	List      *List
	prev      *Entry
	Next      *Entry
}

// Entry's type is made here, after its declaration and before List's:
// Yaegi 0.16 resolves a pair of types that point to each other (Entry.List,
// List.Head) right only from the first one it meets, Entry (a List met
// first leaves Entry.List typed as an *Entry). Made before its declaration,
// it would cost every function of another package that names counter.Entry
// an allocation per call (../doc.go: qualified names).
var _ = &Entry{}

// List links the counters of one duration and algorithm, oldest start
// first. A sliding window's counter outlives its window by one duration (its
// count weighs on the next window), so it keeps a list of its own.
type List struct {
	Duration int64
	Span     int64 // how long a counter lives from its start: duration, or 2x when sliding; 0 for token buckets
	// Calendar and UtcOffset are those of the list's layers: a calendar
	// window lives to its period's end (memstore.alignCalendar).
	Calendar  int
	UtcOffset int64
	Head      *Entry
	tail      *Entry
}

// Push appends w at the list's tail.
func (l *List) Push(w *Entry) {
	w.List = l
	w.prev = l.tail
	w.Next = nil

	if l.tail != nil {
		l.tail.Next = w
	} else {
		l.Head = w
	}

	l.tail = w
}

// Unlink removes w from l, its list.
func (l *List) Unlink(w *Entry) {
	if w.prev != nil {
		w.prev.Next = w.Next
	} else {
		l.Head = w.Next
	}

	if w.Next != nil {
		w.Next.prev = w.prev
	} else {
		l.tail = w.prev
	}

	w.prev = nil
	w.Next = nil
	w.List = nil
}

// Requeue moves w, in list l, to l's tail: a function rather than Unlink
// and Push, two method calls on the request path (../doc.go: functions,
// not methods).
func Requeue(l *List, w *Entry) {
	if l.tail == w {
		return
	}

	if w.prev != nil {
		w.prev.Next = w.Next
	} else {
		l.Head = w.Next
	}

	w.Next.prev = w.prev
	w.prev = l.tail
	w.Next = nil
	l.tail.Next = w
	l.tail = w
}

// Table is a layer's counters in the memory store: the store's map of the
// layer's name (shared by every instance of that name and its reloads, as
// its blocks are) and the list of its duration, resolved once by memstore's
// Attach so that the request path does no lookup.
type Table struct {
	Entries map[string]*Entry
	List    *List            // the memory store's list for this duration
	Blocks  map[string]int64 // blocked keys' block ends (../memstore/block.go)
}
