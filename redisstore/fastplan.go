package redisstore

import (
	"strconv"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// FastCall is the script call of a plan of the root's Redis fast path (a
// plan with one layer keyed by the client, paths.go's redisPlan), encoded
// once but for the client's key: the command is Heads[len(client)] +
// client + Tail.
type FastCall struct {
	Call  redisresp.Call
	Heads []string // the call's head, the keys before the client's, and its length and prefix
	Tail  string   // the end of the client's key, the keys after it, the arguments
	// Cluster is the Redis Cluster the call goes to (nil: one server or a
	// Sentinel's primary), on the node of the client's slot: the plan's
	// layers in Redis are then those keyed by the client alone.
	Cluster *redisresp.Cluster
}

// EncodeFast encodes the call that charges shared, the layers in Redis of
// such a plan, as EncodeCall encodes it but for ARGV[1]: "2", the
// one-integer reply; each request costs cost. Client keys up to maxClient
// bytes have their head.
func EncodeFast(s *RedisStore, shared []*rule.Layer, cost int64, maxClient int) FastCall {
	f := FastCall{Call: CallFor(s, len(shared)), Cluster: ClusterOf(s.Backend)}
	front, key, tail, args := f.Call.Head(), "", "", ArgOneInteger+CostArg(cost)
	seen := false

	for _, l := range shared {
		args += l.RedisArgs

		switch {
		case l.KeyKind != keyOfConst && f.Cluster != nil:
			// The client is the key's hash tag, as ClusterKey writes it:
			// the key's slot is the client's.
			key = l.RedisKey + "{"
			tail = "}\r\n"
			seen = true
		case l.KeyKind != keyOfConst:
			key = l.RedisKey
			tail = "\r\n"
			seen = true
		case seen:
			tail += l.RedisConstKey
		default:
			front += l.RedisConstKey
		}
	}

	f.Tail = tail + args

	extra := 0
	if f.Cluster != nil {
		extra = 1 // the "}" after the client
	}

	for n := 0; n < maxClient; n++ {
		f.Heads = append(f.Heads, front+"$"+strconv.Itoa(len(key)+n+extra)+"\r\n"+key)
	}

	return f
}

// EncodeConst encodes the root's clusterPath call of g, a plan's global
// layer, whole, after call's head, and the slot of its key, whose node it
// goes to.
func EncodeConst(call redisresp.Call, g *rule.Layer) (string, int) {
	key := ClusterKey(g, g.ConstKey)
	slot := redisresp.Slot(key)

	return call.Head() + redisresp.Bulk(key) + ArgOneInteger + CostArg(1) + g.RedisArgs, slot
}

// PairAllowed is global's reply on the root's clusterPath when it is an
// array, count and milliseconds to reset (TakeScript sends one integer only
// while it fits a Lua number: not for a global of a billion points an
// hour): the integer it stands for, or -1 when it does not allow the
// request or the integer would not fit.
func PairAllowed(ints []int64, l *rule.Layer) int64 {
	if len(ints) != 2 || ints[0] < 1 || limit.Over(ints[0], l.Capacity) || ints[1] < 0 || ints[1] > l.MaxTTL {
		return -1
	}

	left := l.Capacity - ints[0]
	if left > (1<<58)/(l.MaxTTL+1) {
		return -1
	}

	return (left*(l.MaxTTL+1) + ints[1]) * 16
}
