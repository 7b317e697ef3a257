package tierlimit

import (
	"context"

	"github.com/tierlimit/tierlimit/redisstore"

	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/memstore"
)

// What an unheld registry entry still holds that matters (lifetime.go): the
// live functions of the registries that hold counts. Each returns until when
// (Unix nanoseconds) its value holds something that can still change a
// decision at now, or 0. They run when an entry nobody holds reaches its
// grace or the end they last reported, never on the request path.

// connLive is the WebSocket connection counter's: while connections it
// counted are open, they end when their clients go, at no known time, so it
// is checked again a grace later.
func connLive(v interface{}, now int64) int64 {
	c, ok := v.(*connCounter)
	if !ok {
		return 0
	}

	c.mu.Lock()
	open := len(c.byIP)
	c.mu.Unlock()

	if open == 0 {
		return 0
	}

	return now + int64(releaseGrace)
}

// registry holds one windowStore per middleware name, and for the redis
// store one blockList, while some instance of the middleware uses them or
// they hold counts that still matter (lifetime.go, keep.go). Traefik keeps
// one interpreter per plugin, so this survives configuration reloads and is
// shared by every router that uses the middleware.
var registry = &storeRegistry{stores: lifetime.NewKeepingRegistry(memstore.Live), blocked: lifetime.NewKeepingRegistry(redisstore.BlockListLive)}

type storeRegistry struct {
	stores  *heldRegistry // *windowStore by middleware name
	blocked *heldRegistry // *blockList by middleware name: keys known over their limit
}

// get returns the store of the middleware called name, held until ctx is
// cancelled, creating it with the cap capacity or applying capacity to the
// existing one.
func (r *storeRegistry) get(ctx context.Context, name string, capacity int) *windowStore {
	v := r.stores.Take(ctx, name, func() interface{} { return memstore.NewWindowStore(capacity) })

	s, _ := v.(*windowStore)
	s.SetMax(capacity)

	return s
}

// blockListFor returns the list of keys known over their limit for the
// middleware called name (redis store), held until ctx is cancelled.
func (r *storeRegistry) blockListFor(ctx context.Context, name string, capacity int) *blockList {
	v := r.blocked.Take(ctx, name, func() interface{} { return redisstore.NewBlockList(capacity) })

	b, _ := v.(*blockList)

	return b
}
