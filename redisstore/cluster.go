package redisstore

import (
	"fmt"
	"strings"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// ClusterKey is a layer's key in a Redis Cluster: the bucket key in a hash
// tag, <keyPrefix>:<middleware>:<layer>:{<key>}, so that the layers of one
// client (ip, assets, routes keyed by ip) share a slot, as do those of one
// principal, and one script call charges them. A principal-keyed route's
// fallback to the client IP (ip:<addr>) is tagged by the address, with the
// client's other layers. bucket is the key as rule.KeyFor made it.
func ClusterKey(l *rule.Layer, bucket string) string {
	if l.KeyKind == keyOfPrincipalElseClient && strings.HasPrefix(bucket, "ip:") {
		return l.RedisKey + "ip:{" + bucket[len("ip:"):] + "}"
	}

	return l.RedisKey + "{" + bucket + "}"
}

// slotGroup is the layers of one request whose keys share a slot.
type slotGroup struct {
	slot   int
	Layers []int // indexes in the request's layers, in order
	Keys   string
	Args   string
}

// runCluster charges layers on a Redis Cluster: one script call per slot
// involved, all sent before any reply is read (one round trip per node), and
// a refund of the other slots' layers when one refused (refundOtherSlots).
// The reply is returned as the single-server script would give it: count and
// milliseconds to reset per layer in order, up to the first refusal.
func (s *RedisStore) runCluster(cl *redisresp.Cluster, c *rule.Charge, cost int64) ([]int64, string, error) {
	layers, all := c.Layers, c.All
	mode := ArgStopAtRefusal
	if all {
		mode = argChargeAll
	}

	groups := slotGroups(c, mode+CostArg(cost))

	calls := make([]redisresp.ClusterCall, len(groups))
	for i, g := range groups {
		calls[i] = redisresp.ClusterCall{Slot: g.slot, Call: CallFor(s, len(g.Layers)), Encoded: g.Keys + g.Args}
	}

	replies, err := cl.RunInts(calls)
	if err != nil {
		return nil, "", err
	}

	// Merged before the refund's own call, which may reuse the connection
	// buffers the replies' integers are read into.
	ints, serverErr, err := mergeSlotReplies(layers, groups, replies, all)
	if !all && err == nil && serverErr == "" {
		s.refundOtherSlots(cl, c, groups, replies, cost)
	}

	return ints, serverErr, err
}

// refundOtherSlots keeps a refused request from spending anything across
// slots: each slot's call decides its own layers all or nothing, so when one
// refused the request, the calls of the other slots, which could not see it,
// charged theirs, and get them back here (one more call per such slot, on
// refusals only), cost each; check-only layers were charged nothing. A
// refund that fails leaves those layers over-charged for this request; the
// refusal stands either way.
func (s *RedisStore) refundOtherSlots(cl *redisresp.Cluster, c *rule.Charge, groups []*slotGroup, replies []redisresp.Reply, cost int64) {
	var charged []int

	layers := c.Layers

	refused := false

	for i, g := range groups {
		if slotRefused(layers, g, replies[i]) {
			refused = true
			continue
		}

		for _, li := range g.Layers {
			if !layers[li].CheckOnly {
				charged = append(charged, li)
			}
		}
	}

	if refused && len(charged) > 0 {
		noteSlotsAhead(c, groups, replies)
		_ = s.refundCluster(cl, rule.ChargeAt(c, charged), cost)
	}
}

// noteSlotsAhead is noteAhead (calendar.go) for each slot's reply that
// ends with a wait: a calendar layer's place there may be in its next
// period, where refundOtherSlots gives it back.
func noteSlotsAhead(c *rule.Charge, groups []*slotGroup, replies []redisresp.Reply) {
	for i, g := range groups {
		if n := len(replies[i].Ints); n%2 != 0 {
			noteAhead(rule.ChargeAt(c, g.Layers), replies[i].Ints[:n-1])
		}
	}
}

// SettlePair reads the replies of the two calls of the root's clusterPath
// (../paths.go) when they did not both allow the request: c's layer 0
// (global) and layer 1 (the client's) each had a call of its own on its
// slot's node, sent together (redisresp.PairInts), with the one-integer
// reply of ArgOneInteger and a cost of one: an integer (va, vb: allowed),
// an array (ia, ib: count and milliseconds to reset), or neither (the call
// did not run, or was not sent). As runCluster does, it keeps the rule that
// a refused request changes no count: a call that charged its layer while
// the other refused, or did not run, is given its point back
// (refundCluster, whose failure leaves that point charged, as there). It
// returns what one call on one server would have answered (count and
// milliseconds to reset per layer, up to the refusal), or again when a call
// did not run: the request is then to be decided anew by the store's Take,
// which follows redirections and loads scripts.
func SettlePair(s *RedisStore, c *rule.Charge, va int64, ia []int64, vb int64, ib []int64) ([]int64, bool) {
	var replies [2][]int64

	var charged [2]bool

	again := false
	arrays := [2][]int64{ia, ib}

	for i, v := range [2]int64{va, vb} {
		l, ints := c.Layers[i], arrays[i]

		switch {
		case v >= 0:
			// (left x (window + 1) + reset) x 16 + 0 (TakeScript).
			replies[i] = []int64{limit.Held(v/16/(l.MaxTTL+1), l.Capacity), v / 16 % (l.MaxTTL + 1)}
			charged[i] = true
		case ints == nil:
			again = true
		default:
			replies[i] = ints
			charged[i] = len(ints) == 2 && !limit.Over(ints[0], l.Capacity)
		}
	}

	for i := range charged {
		if charged[i] && (!charged[0] || !charged[1]) {
			_ = s.refundCluster(s.Backend.cluster, rule.ChargeAt(c, []int{i}), 1)
		}
	}

	if again {
		return nil, true
	}

	ints := append([]int64(nil), replies[0]...)
	if charged[0] {
		ints = append(ints, replies[1]...)
	}

	return ints, false
}

// refundCluster is refund's call on a Redis Cluster: one refundScript call
// per slot.
func (s *RedisStore) refundCluster(cl *redisresp.Cluster, c *rule.Charge, cost int64) error {
	groups := slotGroups(c, CostArg(cost))

	calls := make([]redisresp.ClusterCall, len(groups))
	for i, g := range groups {
		n := len(g.Layers)
		calls[i] = redisresp.ClusterCall{Slot: g.slot, Call: refundRedis.Call(n, 5*n+1), Encoded: g.Keys + g.Args}
	}

	replies, err := cl.RunInts(calls)
	if err != nil {
		return err
	}

	for _, r := range replies {
		if r.ServerErr != "" {
			return fmt.Errorf("running the refund script: %s", r.ServerErr)
		}
	}

	return nil
}

// slotGroups groups c's layers by the slot of their keys, each group's
// arguments starting with head (the request's arguments); a calendar layer's
// key and window are those of the period it counts in (calendarAt).
func slotGroups(c *rule.Charge, head string) []*slotGroup {
	var groups []*slotGroup

	for i, l := range c.Layers {
		key := ClusterKey(l, c.Keys[i])
		args := l.RedisArgs
		if l.Calendar != 0 {
			// The period from the hash tag on: the slot stays the client's.
			// One value per statement: doc.go, constructs Yaegi cannot run.
			key += calendarSuffix(l, calendarAt(c, l))
			args = calendarArgs(l, calendarAt(c, l))
		}

		if l.Alg == algConcurrency {
			args += redisresp.Bulk(leaseOf(c)) // concurrency.go
		}

		slot := redisresp.Slot(key)

		var g *slotGroup
		for _, x := range groups {
			if x.slot == slot {
				g = x
			}
		}

		if g == nil {
			g = &slotGroup{slot: slot, Args: head}
			groups = append(groups, g)
		}

		g.Layers = append(g.Layers, i)
		g.Keys += redisresp.Bulk(key)
		g.Args += args
	}

	return groups
}
