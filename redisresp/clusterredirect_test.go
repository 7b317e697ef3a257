package redisresp

import (
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeCluster is two fake nodes, a and b, whose CLUSTER SLOTS give every slot
// to a, or, once moved is set, the test's slot to b and the rest to a.
type fakeCluster struct {
	a, b *fakeServer

	mu    sync.Mutex
	moved bool
}

const redirectSlot = 100

// slotsReply is CLUSTER SLOTS as the nodes answer it now.
func (fc *fakeCluster) slotsReply() string {
	fc.mu.Lock()
	moved := fc.moved
	fc.mu.Unlock()

	entry := func(start, end int, addr string) string {
		host, port, _ := net.SplitHostPort(addr)
		return "*3\r\n:" + strconv.Itoa(start) + "\r\n:" + strconv.Itoa(end) + "\r\n*3\r\n" + bulk(host) + ":" + port + "\r\n" + bulk("id-"+port)
	}

	if !moved {
		return "*1\r\n" + entry(0, Slots-1, fc.a.addr())
	}

	return "*3\r\n" + entry(0, redirectSlot-1, fc.a.addr()) + entry(redirectSlot, redirectSlot, fc.b.addr()) +
		entry(redirectSlot+1, Slots-1, fc.a.addr())
}

// startCluster starts the nodes: CLUSTER SLOTS is answered by slotsReply,
// EVALSHA by onA and onB (given how many EVALSHA the node has had, 1 first),
// ASKING with +OK.
func startCluster(t *testing.T, onA, onB func(n int) string) *fakeCluster {
	t.Helper()

	fc := &fakeCluster{}
	fc.a, fc.b = newServer(t), newServer(t)

	for _, node := range []struct {
		s  *fakeServer
		on func(n int) string
	}{{fc.a, onA}, {fc.b, onB}} {
		on := node.on
		var mu sync.Mutex
		calls := 0

		node.s.start(func(_ int, args []string) string {
			switch strings.ToUpper(args[0]) {
			case "CLUSTER":
				return fc.slotsReply()
			case "ASKING":
				return "+OK\r\n"
			case "EVALSHA":
				mu.Lock()
				calls++
				n := calls
				mu.Unlock()

				return on(n)
			}

			return "-ERR unexpected " + args[0] + "\r\n"
		})
	}

	return fc
}

func runOnSlot(t *testing.T, c *Cluster) Reply {
	t.Helper()

	call := NewScript("return {1}").Call(1, 1)

	replies, err := c.RunInts([]ClusterCall{{Slot: redirectSlot, Call: call, Encoded: Bulk("k")}})
	if err != nil {
		t.Fatalf("RunInts: %v", err)
	}

	return replies[0]
}

// commandsOf lists the names of the commands s received, in order.
func commandsOf(s *fakeServer) []string {
	var names []string
	for _, c := range s.log() {
		names = append(names, c.args[0])
	}

	return names
}

func newTestCluster(fc *fakeCluster) *Cluster {
	return NewCluster(Options{DialTimeout: failAfter, Timeout: failAfter, WaitTimeout: failAfter,
		Cluster: &ClusterOptions{Addresses: []string{fc.a.addr()}}})
}

// TestClusterMovedMarksTheMapStale: MOVED sends the call to the node named,
// and the next call on that slot goes straight there, after one refresh of
// the map; without the refresh every later call would cost a redirection.
func TestClusterMovedMarksTheMapStale(t *testing.T) {
	var fc *fakeCluster
	fc = startCluster(t, func(int) string {
		fc.mu.Lock()
		fc.moved = true
		fc.mu.Unlock()

		return "-MOVED " + strconv.Itoa(redirectSlot) + " " + fc.b.addr() + "\r\n"
	}, func(n int) string {
		return "*1\r\n:" + strconv.Itoa(n) + "\r\n"
	})

	c := newTestCluster(fc)
	defer c.Close()

	if r := runOnSlot(t, c); r.ServerErr != "" || len(r.Ints) != 1 || r.Ints[0] != 1 {
		t.Fatalf("first call: %+v, want b's reply [1]", r)
	}

	if r := runOnSlot(t, c); r.ServerErr != "" || len(r.Ints) != 1 || r.Ints[0] != 2 {
		t.Fatalf("second call: %+v, want b's reply [2]", r)
	}

	if got := commandsOf(fc.a); !sameArgs(got, []string{"CLUSTER", "EVALSHA", "CLUSTER"}) {
		t.Fatalf("node a received %v: want the map, the call answered MOVED, the map again, and no second call", got)
	}

	if got := commandsOf(fc.b); !sameArgs(got, []string{"EVALSHA", "EVALSHA"}) {
		t.Fatalf("node b received %v, want both calls", got)
	}
}

// TestClusterAskSendsAskingAndKeepsTheMap: ASK sends ASKING then the call to
// the node named, and changes nothing in the map: the next call goes to the
// slot's owner again.
func TestClusterAskSendsAskingAndKeepsTheMap(t *testing.T) {
	var fc *fakeCluster
	fc = startCluster(t, func(n int) string {
		if n == 1 {
			return "-ASK " + strconv.Itoa(redirectSlot) + " " + fc.b.addr() + "\r\n"
		}

		return "*1\r\n:10\r\n"
	}, func(int) string {
		return "*1\r\n:20\r\n"
	})

	c := newTestCluster(fc)
	defer c.Close()

	if r := runOnSlot(t, c); r.ServerErr != "" || len(r.Ints) != 1 || r.Ints[0] != 20 {
		t.Fatalf("first call: %+v, want b's reply [20]", r)
	}

	if r := runOnSlot(t, c); r.ServerErr != "" || len(r.Ints) != 1 || r.Ints[0] != 10 {
		t.Fatalf("second call: %+v, want a's reply [10]", r)
	}

	if got := commandsOf(fc.b); !sameArgs(got, []string{"ASKING", "EVALSHA"}) {
		t.Fatalf("node b received %v, want ASKING then the call", got)
	}

	if got := commandsOf(fc.a); !sameArgs(got, []string{"CLUSTER", "EVALSHA", "EVALSHA"}) {
		t.Fatalf("node a received %v: want one map, and both calls", got)
	}
}

// TestClusterRetriesTryAgain: TRYAGAIN (a slot in migration) is retried on
// the slot's owner, and its reply is the call's.
func TestClusterRetriesTryAgain(t *testing.T) {
	fc := startCluster(t, func(n int) string {
		if n < 3 {
			return "-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
		}

		return "*1\r\n:30\r\n"
	}, func(int) string {
		return "-ERR b is not asked\r\n"
	})

	c := newTestCluster(fc)
	defer c.Close()

	if r := runOnSlot(t, c); r.ServerErr != "" || len(r.Ints) != 1 || r.Ints[0] != 30 {
		t.Fatalf("call: %+v, want a's reply [30] after two TRYAGAIN", r)
	}

	if got := commandsOf(fc.a); !sameArgs(got, []string{"CLUSTER", "EVALSHA", "EVALSHA", "EVALSHA"}) {
		t.Fatalf("node a received %v, want the map and three tries", got)
	}

	if len(fc.b.log()) != 0 {
		t.Fatalf("node b received %v", commandsOf(fc.b))
	}
}

// TestClusterReadOnlyReadsTheMapAtOnce: a primary demoted by a failover that
// the map has not seen answers READONLY; the map is read at once and the
// call runs on the slot's new owner, within the call (the rate limiter does
// not fall back to memory for a back-off). A READONLY from the node the
// fresh map still names is the call's reply.
func TestClusterReadOnlyReadsTheMapAtOnce(t *testing.T) {
	var fc *fakeCluster
	fc = startCluster(t, func(n int) string {
		if n == 2 {
			fc.mu.Lock()
			fc.moved = true
			fc.mu.Unlock()
		}

		return "-READONLY You can't write against a read only replica.\r\n"
	}, func(n int) string {
		return "*1\r\n:" + strconv.Itoa(n) + "\r\n"
	})

	c := newTestCluster(fc)
	defer c.Close()

	// The map still gives the slot to a: READONLY is the reply.
	if r := runOnSlot(t, c); !strings.HasPrefix(r.ServerErr, "READONLY") {
		t.Fatalf("first call: %+v, want a's READONLY (the map names no other owner)", r)
	}

	// The failover is in the map: the call moves to b.
	if r := runOnSlot(t, c); r.ServerErr != "" || len(r.Ints) != 1 || r.Ints[0] != 1 {
		t.Fatalf("second call: %+v, want b's reply [1], the map read again at the READONLY", r)
	}

	if got := commandsOf(fc.a); !sameArgs(got, []string{"CLUSTER", "EVALSHA", "CLUSTER", "EVALSHA", "CLUSTER"}) {
		t.Fatalf("node a received %v: want the map, each call answered READONLY followed by the map", got)
	}
}
