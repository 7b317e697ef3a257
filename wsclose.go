package tierlimit

import (
	"context"
	"sync"

	"github.com/tierlimit/tierlimit/lifetime"
)

// connCounter counts the open upgraded connections per client IP in this
// process and caps them. An upgrade holds its slot while the rest of the chain
// serves it, which for a WebSocket is the connection's whole life: Traefik's
// proxy returns when either side closes or the network drops.
type connCounter struct {
	mu     sync.Mutex
	max    int
	byIP   map[string]int
	logged map[string]bool // a refusal was reported since the IP last had a free slot
}

// acquire takes a slot for ip. It reports whether it did, and whether this is
// the first refusal to report.
func (c *connCounter) acquire(ip string) (ok, first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.byIP[ip] >= c.max {
		first = !c.logged[ip]
		c.logged[ip] = true

		return false, first
	}

	c.byIP[ip]++

	return true, false
}

func (c *connCounter) release(ip string) {
	c.mu.Lock()
	defer c.mu.Unlock()

	c.byIP[ip]--
	if c.byIP[ip] <= 0 {
		delete(c.byIP, ip)
	}

	delete(c.logged, ip)
}

// connCounters holds one connCounter per middleware name while some instance
// of the middleware uses it or it counts open connections (lifetime/lifetime.go,
// connLive in stores.go), like the memory store (memstore.Stores).
var connCounters = &counterRegistry{byName: lifetime.NewKeepingRegistry(connLive)}

type counterRegistry struct {
	byName *lifetime.HeldRegistry // *connCounter by middleware name
}

// get returns the counter of the middleware called name, held until ctx is
// cancelled, with the cap capacity.
func (r *counterRegistry) get(ctx context.Context, name string, capacity int) *connCounter {
	v := r.byName.Take(ctx, name, func() interface{} {
		return &connCounter{byIP: map[string]int{}, logged: map[string]bool{}}
	})

	c, _ := v.(*connCounter)

	c.mu.Lock()
	c.max = capacity
	c.mu.Unlock()

	return c
}
