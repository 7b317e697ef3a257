package tierlimit

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
)

// Resets and Clusters at their edges: a reset that finds no
// Redis key, a synced batch on a Cluster.

// TestResetIsPublishedWhenRedisHasNoKey: a reset reaches the other
// replicas even when Redis holds no key for it (its window ended there, or
// the counts were the memory fallback's): replica B, which counted and
// blocked the client in its memory fallback, forgets it.
func TestResetIsPublishedWhenRedisHasNoKey(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Status.Path = "/_rl"
		c.IP = LayerConfig{Points: 2, Duration: "1h"}
	})
	a := h.p.stores.redis

	// Replica B: the same middleware with a backend, a block list and a
	// memory fallback of its own (as in
	// TestResetReachesAnotherReplicasBlockListOnRedisServer).
	bb := redisstore.NewBackend(redisresp.Options{Address: addr, Username: "tierlimit", Password: aclPassword, Timeout: time.Second})
	bb.Log = &bytes.Buffer{}
	b := &redisStore{Prefix: a.Prefix, Name: a.Name, Channel: a.Channel, Backend: bb, Local: memstore.NewWindowStore(100), Blocked: redisstore.NewBlockList(100), Calls: a.Calls}
	b.Blocks = false
	b.Clock = time.Now
	t.Cleanup(func() { redisstore.CloseBackend(bb) })

	l := h.p.layers[0]
	client := "203.0.113.40"
	now := time.Now().UnixNano()
	req := httptest.NewRequest(http.MethodGet, "/api", nil)

	// B decided the client in memory during an outage: 2 counted, then
	// refused and blocked; Redis never saw the client.
	for i := 0; i < 2; i++ {
		var tl tally
		take(storeOf(b.Local), &tl, chargeOf([]*layer{l}, client, "", req, now, false))
	}

	b.Blocked.Add(l.BlockPrefix, client, now+int64(time.Hour), now)
	redisstore.ListenResets(b)

	waitUntil(t, "B subscribes", func() bool {
		return redisDo(t, admin, "PUBSUB", "NUMSUB", a.Channel).Array[1].Int == 1
	})

	if n := redisDo(t, admin, "EXISTS", l.RedisKey+client).Int; n != 0 {
		t.Fatal("Redis holds the client's key")
	}

	if code, doc := h.reset("?layer=ip&key="+client, ""); doc.Redis == nil || *doc.Redis != redisAbsent {
		t.Fatalf("reset: %d %+v, want Redis absent", code, doc)
	}

	waitUntil(t, "B forgets the key it blocked", func() bool { return b.Blocked.ResetOf(l.BlockPrefix, client, now) == 0 })

	if got := peekCount(b.Local, now, "ip", client); got != 0 {
		t.Fatalf("B's memory fallback still counts %d for the client", got)
	}
}

// TestResetIsPublishedToASyncedReplicaWhenRedisHasNoKey: a synced
// replica B refused a client on charges it has not synced yet, so Redis
// holds no key of the client's window; a reset through A reaches B all the
// same, and B lets the client in again.
func TestResetIsPublishedToASyncedReplicaWhenRedisHasNoKey(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Status.Path = "/_rl"
	})
	a := h.p.stores.redis

	bb := redisstore.NewBackend(redisresp.Options{Address: addr, Username: "tierlimit", Password: aclPassword, Timeout: time.Second})
	bb.Log = &bytes.Buffer{}
	bst := replica(st)
	// B decides without Redis (its charges pending), so that Redis holds
	// no key of the client.
	bst.Backend = nil
	b := &redisStore{Prefix: a.Prefix, Name: a.Name, Channel: a.Channel, Backend: bb, Local: memstore.NewWindowStore(100), Blocked: redisstore.NewBlockList(100), Calls: a.Calls, Synced: bst}
	b.Blocks = false
	b.Clock = h.clock.Now
	t.Cleanup(func() { redisstore.CloseBackend(bb) })

	client := "203.0.113.47"
	for i := 0; i < 10; i++ {
		takeOn(bst, h, client)
	}

	if takeOn(bst, h, client) {
		t.Fatal("B allowed an 11th request")
	}

	redisstore.ListenResets(b)
	waitUntil(t, "B subscribes", func() bool {
		return redisDo(t, admin, "PUBSUB", "NUMSUB", a.Channel).Array[1].Int == 1
	})

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())
	if n := redisDo(t, admin, "EXISTS", redisstore.SyncKey(ip, client, false, start)).Int; n != 0 {
		t.Fatal("Redis holds the client's key")
	}

	if code, doc := h.reset("?layer=ip&key="+client, ""); doc.Redis == nil || *doc.Redis != redisAbsent {
		t.Fatalf("reset: %d %+v, want Redis absent", code, doc)
	}

	waitUntil(t, "B forgets the key", func() bool { return counterOf(bst, "ip", client) == nil })

	if !takeOn(bst, h, client) {
		t.Fatal("B still refuses the client after the reset")
	}
}

// TestSyncedBatchIsGroupedPerSlotOnACluster: on a Cluster, a sync sends one
// script call per slot: a real Cluster node (owning every slot) refuses a
// call whose keys are in several slots with CROSSSLOT.
func TestSyncedBatchIsGroupedPerSlotOnACluster(t *testing.T) {
	addr, admin := clusterNode(t)
	h, st, _ := syncHarness(t, addr, nil)

	bk := redisstore.NewBackend(redisresp.Options{Cluster: &redisresp.ClusterOptions{Addresses: []string{addr}}, Timeout: 2 * time.Second})
	bk.Log = &bytes.Buffer{}
	t.Cleanup(func() { redisstore.CloseBackend(bk) })

	st.Mu.Lock()
	st.Backend = bk
	st.Mu.Unlock()

	clients := []string{"203.0.113.41", "203.0.113.42", "203.0.113.43", "203.0.113.44", "203.0.113.45", "203.0.113.46"}
	slots := map[int]bool{}

	for i, client := range clients {
		for n := 0; n <= i; n++ {
			takeOn(st, h, client)
		}

		slots[redisresp.Slot(counterOf(st, "ip", client).Key)] = true
	}

	if len(slots) < 2 {
		t.Fatalf("the clients' keys share %d slot: the test needs several", len(slots))
	}

	// The last sync: every lease back, one call per slot.
	if err := redisstore.SyncNow(st, h.clock.Now().UnixNano(), true); err != nil {
		t.Fatal(err)
	}

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())

	for i, client := range clients {
		want := formatInt(int64(i + 1))
		if got := redisDo(t, admin, "GET", redisstore.SyncKey(ip, client, true, start)).Str; got != want {
			t.Fatalf("%s: Redis total %q, want %s", client, got, want)
		}

		if c := counterOf(st, "ip", client); c.Remote != int64(i+1) || c.Pending != 0 || c.Lease != 0 {
			t.Fatalf("%s after the sync: %+v", client, c)
		}
	}
}

// clusterNode runs a redis-server of the test's own as a one-node Redis
// Cluster that owns every slot, and returns its address and a client for
// checks. Like any Cluster node it refuses a command whose keys are in
// several slots.
func clusterNode(t *testing.T) (string, *redisresp.Pool) {
	t.Helper()

	dir := t.TempDir()
	addr, admin := startRedisServer(t, func(port string) []string {
		return []string{"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + port + ".conf",
			"--cluster-announce-ip", "127.0.0.1"}
	})

	redisDo(t, admin, "CLUSTER", "ADDSLOTSRANGE", "0", "16383")
	waitUntil(t, "the cluster's state ok", func() bool {
		return strings.Contains(redisDo(t, admin, "CLUSTER", "INFO").Str, "cluster_state:ok")
	})

	return addr, admin
}
