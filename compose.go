package tierlimit

import (
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rule"
)

// blockingStore is the memory store of an instance with a blockDuration
// layer: it checks the blocks before windowStore.take and starts one after a
// refusal, so that take, shared by every instance, costs layers without a
// block nothing more (doc.go: frames). It is the Redis store's memory
// fallback too (redisStore.takeLocal): during an outage the block list
// refuses the keys Redis blocked, and a refusal in memory starts a block.
type blockingStore struct {
	*windowStore
}

// anyBlock reports whether one of the layers has a blockDuration.
func anyBlock(layers []*layer) bool {
	for _, l := range layers {
		if l.BlockDuration != 0 {
			return true
		}
	}

	return false
}

// take is windowStore.take with the layers' blocks: a request of a blocked
// key is refused, charged nowhere; a refusal of a layer with a
// blockDuration blocks its key. A dry run, which refuses nothing, neither
// honours nor starts blocks.
func (b *blockingStore) Take(t *tally, c *charge) {
	s := b.windowStore

	if !c.All && refuseAny(b, t, c) {
		return
	}

	s.Take(t, c)

	if !t.Refused || c.All || t.Shown < 0 || c.Layers[t.Shown].BlockDuration == 0 {
		return
	}

	s.Mu.Lock()
	s.StartBlock(t, t.Shown, c.Now, c.Layers[t.Shown], c.Keys[t.Shown])
	s.Mu.Unlock()
}

// refuseAny refuses the request when one of its keys is blocked, and
// reports whether it did. The blocked layer refuses in its turn, as in
// Redis: a layer before it that refuses is the one shown, and the layers
// before it that allow are charged and given back (between the two holds of
// the lock another request may see that charge; the counts end exact).
func refuseAny(b *blockingStore, t *tally, c *charge) bool {
	s := b.windowStore
	i := firstBlocked(b, c)

	if i < 0 {
		return false
	}

	cost := rule.CostOf(t)

	if i > 0 {
		s.Take(t, rule.ChargePrefix(c, i))
		if t.Refused {
			return true
		}
	}

	s.Mu.Lock()
	memstore.GiveBack(c, i, cost, t.Uncharged)
	*t = tally{Cost: t.Cost}

	if !memstore.RefuseBlockedAt(s, t, c, i) {
		t.Shown = -1 // the block ended meanwhile: decided afresh
		s.Mu.Unlock()

		return false
	}

	s.Mu.Unlock()

	return true
}

// firstBlocked returns the index of the first of c's layers whose key is
// blocked at c.now, or -1. A dry-run layer refuses nothing: a block it
// started before a reload to dry run is not honoured.
func firstBlocked(b *blockingStore, c *charge) int {
	s := b.windowStore

	s.Mu.Lock()
	defer s.Mu.Unlock()

	for i, l := range c.Layers {
		if l.BlockDuration == 0 || l.DryRun {
			continue
		}

		if until := l.Blocks[c.Keys[i]]; until > c.Now {
			return i
		}
	}

	return -1
}
