package memstore

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// WindowStore holds fixed-window counters in memory: one counter per layer and
// key, starting at the key's first hit and reset duration later. It is safe for
// concurrent use; every method takes the time from its caller, so tests move a
// clock instead of sleeping.
//
// Memory is bounded by max counters. Counters of the same duration expire in the
// order they started, so each duration keeps its counters in a list ordered by
// start: expired counters are found at the list heads in O(1), without a
// goroutine or a scan. Each new key purges a few expired counters; at the cap
// all expired counters go, then the oldest live one that is not over its
// limit (a key over its limit goes last, so that other clients filling the
// table do not let it back in).
//
// Each layer has its own map keyed by the bucket key: under Yaegi a map with a
// string key is one compiled operation, a struct key is not.
type WindowStore struct {
	Mu        sync.Mutex
	Max       int
	size      int
	Takes     int64                                // requests charged so far: window.taken of the current one
	evictions int64                                // live counters dropped at the cap (status page, metrics)
	Maps      map[string]map[string]*counter.Entry // by layer name
	Blocks    map[string]map[string]int64          // by layer name: the end of each blocked key's block (block.go)
	blockHits map[string]map[string]int64          // by layer name: the requests each running block refused (block.go)
	lists     []*counter.List
	stats     map[string]*rule.Stats // by layer name
}

// Totals returns a layer's allowed and refused counts, both stores together.
func (s *WindowStore) Totals(st *rule.Stats) (allowed, refused int64) {
	s.Mu.Lock()
	allowed, refused = st.Allowed, st.Refused
	s.Mu.Unlock()

	return allowed + atomic.LoadInt64(&st.RedisAllowed), refused + atomic.LoadInt64(&st.RedisRefused)
}

// purgePerInsert is how many expired counters each new key removes, so memory
// follows the number of live keys even below the cap.
const purgePerInsert = 2

func NewWindowStore(capacity int) *WindowStore {
	return &WindowStore{Max: capacity, Maps: map[string]map[string]*counter.Entry{}, Blocks: map[string]map[string]int64{}, stats: map[string]*rule.Stats{}}
}

// Evicted returns the live counters dropped at the cap so far.
func (s *WindowStore) Evicted() int64 {
	s.Mu.Lock()
	n := s.evictions
	s.Mu.Unlock()

	return n
}

// SetMax changes the cap; a lower cap takes effect as keys are added.
func (s *WindowStore) SetMax(capacity int) {
	s.Mu.Lock()
	s.Max = capacity
	s.Mu.Unlock()
}

// Attach makes a layer's table of counters in this store (counter.Table):
// the map of its name and its duration's list, which the layer points to
// so that the request path does no lookup, and its stats.
func (s *WindowStore) Attach(l *rule.Layer) {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	if s.Maps[l.Name] == nil {
		s.Maps[l.Name] = map[string]*counter.Entry{}
	}

	if s.Blocks[l.Name] == nil {
		s.Blocks[l.Name] = map[string]int64{}
	}

	if s.stats[l.Name] == nil {
		s.stats[l.Name] = &rule.Stats{}
	}

	l.Stats = s.stats[l.Name]
	l.Table = &counter.Table{Entries: s.Maps[l.Name], Blocks: s.Blocks[l.Name], List: s.list(l)}
}

// list is the list of l's duration, algorithm and calendar, made on first
// use; under s.Mu.
func (s *WindowStore) list(l *rule.Layer) *counter.List {
	span := l.Duration
	if l.Alg == algSliding {
		span = 2 * l.Duration
	}

	if l.Alg == algTokenBucket {
		span = 0 // token buckets: ordered by last request (bucket.go)
	}

	for _, wl := range s.lists {
		if wl.Duration == l.Duration && wl.Span == span && wl.Calendar == l.Calendar && wl.UtcOffset == l.UtcOffset {
			return wl
		}
	}

	wl := &counter.List{Duration: l.Duration, Span: span, Calendar: l.Calendar, UtcOffset: l.UtcOffset}
	s.lists = append(s.lists, wl)

	return wl
}

// refuseFixed records that the fixed window w of layers[i] cannot take cost
// points; the window is charged only in dry run (all, or the layer's own).
// Kept out of Take, whose frame every charge allocates (doc.go:
// frames). It reports whether the request is refused.
func refuseFixed(t *rule.Tally, i int, l *rule.Layer, w *counter.Entry, cost int64, all bool) bool {
	l.Stats.Refused++
	w.Refused++
	first := !w.Logged
	w.Logged = true
	refused := rule.RefuseAs(t, i, l, w.Count+cost, w.Reset, w.ResetH, first)

	if all || l.DryRun {
		w.Count += cost
	}

	return refused
}

// Restart starts a new, empty window for key in l: the expired w (or one
// whose layer changed duration at a reload), or a new counter, held by the
// current request (WindowStore.Takes) so that its own later layers cannot
// evict it. Kept out of the paths that charge so that their common case
// stays small (../doc.go: frames).
func (s *WindowStore) Restart(now int64, l *rule.Layer, w *counter.Entry, key string) *counter.Entry {
	if w != nil {
		w.List.Unlink(w)
	} else {
		s.makeRoom(now, l.List)

		w = &counter.Entry{Layer: l.Name, Key: key}
		l.Entries[key] = w
		s.size++
	}

	w.Count = 0
	w.PrevCount = 0
	w.Refused = 0
	w.Start = now
	w.Reset = now + l.List.Duration
	w.Expire = now + l.List.Span
	if l.Calendar != 0 {
		alignCalendar(now, l, w)
	}
	w.ResetSec = limit.CeilSeconds(w.Reset)
	w.ResetH = []string{strconv.FormatInt(w.ResetSec, 10)}
	w.Logged = false
	w.Taken = s.Takes
	l.List.Push(w)

	return w
}

// makeRoom purges a few expired counters and, at the cap, all expired ones and
// then the oldest live ones that are not over their limit (oldestEvictable),
// until one more fits. It never evicts a counter
// the current request charged: with the cap at least the number of layers
// (config/check.go), another one is always there to evict, so the layers of one
// request cannot evict each other's counters.
func (s *WindowStore) makeRoom(now int64, l *counter.List) {
	for n := 0; n < purgePerInsert && l.Head != nil && l.Head.Expire <= now; n++ {
		s.remove(l.Head)
	}

	if s.size < s.Max {
		return
	}

	for _, other := range s.lists {
		for other.Head != nil && other.Head.Expire <= now {
			s.remove(other.Head)
		}
	}

	for s.size >= s.Max {
		oldest := s.oldestEvictable(false)
		if oldest == nil {
			oldest = s.oldestEvictable(true)
		}

		if oldest == nil {
			return
		}

		s.remove(oldest)
		s.evictions++
	}
}

// maxEvictionScan bounds how many counters of each list an eviction looks
// at for one that is not over its limit, so that a table full of limited
// keys costs each new key a bounded walk.
const maxEvictionScan = 256

// oldestEvictable returns the counter to evict at the cap: the oldest one,
// of any list, that the current request did not charge and, unless limited
// is set, that is not over its limit (refused in its window, w.logged): a
// limited client must not get back in because other clients filled the
// table. nil when there is none.
func (s *WindowStore) oldestEvictable(limited bool) *counter.Entry {
	var oldest *counter.Entry

	for _, other := range s.lists {
		w := other.Head
		for n := 0; w != nil && n < maxEvictionScan && (w.Taken == s.Takes || w.Logged && !limited); n++ {
			w = w.Next
		}

		if w != nil && w.Taken != s.Takes && (limited || !w.Logged) && (oldest == nil || w.Start < oldest.Start) {
			oldest = w
		}
	}

	return oldest
}

func (s *WindowStore) remove(w *counter.Entry) {
	w.List.Unlink(w)
	delete(s.Maps[w.Layer], w.Key)
	s.size--
}

// alignCalendar gives the memory window w, restarted at now, its period.
func alignCalendar(now int64, l *rule.Layer, w *counter.Entry) {
	w.Start, w.Reset = limit.Period(now, l.Calendar, l.UtcOffset)
	w.Expire = w.Reset
}

// Forget drops key's counter in l, of any algorithm, and reports whether it
// still counted something: a window not yet over (for a sliding window, one
// whose count still weighs on the next), a token bucket not yet full.
func (s *WindowStore) Forget(l *rule.Layer, key string, now int64) bool {
	return s.ForgetKey(l.Name, key, now)
}

// ForgetKey is forget by the layer's name, for a reset another replica sent.
func (s *WindowStore) ForgetKey(layer, key string, now int64) bool {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	w := s.Maps[layer][key]
	if w == nil {
		return false
	}

	if w.List != nil {
		w.List.Unlink(w)
	}

	delete(s.Maps[layer], key)
	s.size--

	return w.Expire > now
}

// Count returns the number of counters held, expired or not.
func (s *WindowStore) Count() int {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	return s.size
}

// Peek returns the count and reset of a live window without charging it;
// count is 0 when the key has no live window.
func (s *WindowStore) Peek(now int64, layer, key string) (count, reset int64) {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	w := s.Maps[layer][key]
	if w == nil || w.Reset <= now {
		return 0, 0
	}

	return w.Count, w.Reset
}
