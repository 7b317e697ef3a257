package redisstore

import (
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// A concurrency layer's key in Redis is a sorted set of the requests in
// flight (TakeScript's concurrent): each request's member, unique to it
// across replicas (this process's replica id and a counter), scored by its
// lease end on Redis's clock. The release after the response removes the
// member (refundScript); a replica that dies holding slots frees them when
// their leases end, as the script drops ended members and the key expires
// with its last lease. While Redis is down the fallback holds slots in
// memory and owes Redis nothing for them: they are released anyway.

// replica names this process in the members it adds; leases counts them.
var (
	replica = strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(rand.Int63(), 36)
	leases  int64
)

// leaseOf is the member that names c's slots, made the first time one of
// its concurrency layers is encoded, and given to the charge c is a part of.
func leaseOf(c *charge) string {
	if c.Lease == "" {
		c.Lease = replica + ":" + strconv.FormatInt(atomic.AddInt64(&leases, 1), 10)
		if c.Parent != nil && c.Parent.Lease == "" {
			c.Parent.Lease = c.Lease
		}
	}

	return c.Lease
}

// variedCall adds the key and arguments of a layer whose arguments vary with
// the request (layer.RedisTail set) to a script call (EncodeCall): a
// calendar layer's, whose window is its period's rest, or a concurrency
// layer's, which ends with the request's member.
func variedCall(l *layer, keys, args string, c *charge, i int) (string, string) {
	if !l.Concurrency {
		return calendarCall(l, keys, args, c.Keys[i], c.Now)
	}

	key := l.RedisKey + c.Keys[i]

	return keys + redisresp.Bulk(key), args + l.RedisArgs + redisresp.Bulk(leaseOf(c))
}

// Release frees the slots the request of c holds in its concurrency layers,
// after its response: in memory (layers counted there, and what the fallback
// admitted while Redis was down) and in Redis, where one refundScript call
// removes its member from each key. A release that fails leaves the slots
// to their leases.
func Release(s *RedisStore, c *charge) {
	memstore.Release(s.Local, c)

	if c.Lease == "" || s.Synced != nil || s.Backend.Down.Load() {
		return
	}

	var index []int
	for i, l := range c.Layers {
		if l.Concurrency && !l.Memory {
			index = append(index, i)
		}
	}

	if len(index) == 0 {
		return
	}

	if err := refundOnRedis(s, rule.ChargeAt(c, index), 1); err != nil && !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) {
		s.Backend.Failed(s.Clock().UnixNano(), false, fmt.Errorf("releasing a request's slots: %w", err))
	}
}
