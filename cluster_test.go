package tierlimit

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
)

// clusterOfThree runs a Redis Cluster of three redis-server processes of the
// test's own, each the primary of a third of the slots, with README's ACL
// user on each, and returns their addresses and a client of each for
// checks.
func clusterOfThree(t *testing.T) ([]string, []*redisresp.Pool) {
	t.Helper()

	dir := t.TempDir()

	var addrs []string
	var admins []*redisresp.Pool
	var buses []string

	for i := 0; i < 3; i++ {
		_, bus, _ := net.SplitHostPort(closedPort(t))
		addr, admin := startRedisServer(t, func(port string) []string {
			return []string{"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + port + ".conf",
				"--cluster-announce-ip", "127.0.0.1", "--cluster-port", bus, "--cluster-node-timeout", "1000"}
		})
		redisDo(t, admin, readmeACL(t)...)

		from, to := i*redisresp.Slots/3, (i+1)*redisresp.Slots/3-1
		redisDo(t, admin, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(from), strconv.Itoa(to))

		addrs = append(addrs, addr)
		admins = append(admins, admin)
		buses = append(buses, bus)
	}

	for i := 1; i < 3; i++ {
		_, port, _ := net.SplitHostPort(addrs[i])
		redisDo(t, admins[0], "CLUSTER", "MEET", "127.0.0.1", port, buses[i])
	}

	waitUntil(t, "cluster_state:ok on the three nodes", func() bool {
		for _, admin := range admins {
			info := redisDo(t, admin, "CLUSTER", "INFO").Str
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3\r\n") {
				return false
			}
		}

		return true
	})

	return addrs, admins
}

// onCluster is a mutate of newHarness: the Redis store on the Cluster of
// addrs, as README's ACL user.
func onCluster(addrs []string) func(c *Config) {
	return func(c *Config) {
		c.Store = "redis"
		c.Redis.Cluster = &config.RedisClusterConfig{Addresses: addrs}
		c.Redis.Timeout = "2s"
		asACLUser(c)
	}
}

// scriptCallsOn is scriptCalls summed over a Cluster's nodes.
func scriptCallsOn(t *testing.T, admins []*redisresp.Pool) int64 {
	t.Helper()

	var n int64
	for _, admin := range admins {
		n += scriptCalls(t, admin)
	}

	return n
}

// TestSyncedCountingOnAClusterTakesTheSyncedPath: with global and ip in
// Redis on a Cluster, their keys in two slots, redis.syncInterval serves
// requests on syncedPath, as on one server: a request makes no Redis call
// once its counters hold leases, and the leases' calls go to each key's
// node.
func TestSyncedCountingOnAClusterTakesTheSyncedPath(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	h := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Redis.SyncInterval = "1h"
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 100, Duration: "1h"}
	})

	if fmt.Sprintf("%T", h.h) != "*tierlimit.syncedPath" {
		t.Fatalf("handler %T, want syncedPath", h.h)
	}

	clients := []string{"203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4"}
	for _, client := range clients {
		if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s's first request: %d, want 200", client, rec.Code)
		}
	}

	before := scriptCallsOn(t, admins)

	for i := 0; i < 10; i++ {
		for _, client := range clients {
			if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
				t.Fatalf("%s's request %d: %d, want 200", client, i, rec.Code)
			}
		}
	}

	if n := scriptCallsOn(t, admins) - before; n != 0 {
		t.Fatalf("40 requests on leases made %d script calls, want 0", n)
	}
}

// nodeOf is the index, in clusterOfThree's nodes, of the node that serves
// key's slot.
func nodeOf(key string) int {
	slot := redisresp.Slot(key)
	for i := 2; i > 0; i-- {
		if slot >= i*redisresp.Slots/3 {
			return i
		}
	}

	return 0
}

// clusterKeys are the Redis keys of global and of client's ip layer on a
// Cluster (redisstore.ClusterKey).
func clusterKeys(h *harness, client string) (string, string) {
	return h.p.planIP[0].RedisKey + "{global}", h.p.planIP[1].RedisKey + "{" + client + "}"
}

// clientsOnOtherNodes returns n client addresses whose ip key is on
// another node than global's key.
func clientsOnOtherNodes(h *harness, n int) []string {
	var out []string

	for i := 1; len(out) < n; i++ {
		client := "198.51.100." + strconv.Itoa(i)
		global, ip := clusterKeys(h, client)
		if nodeOf(ip) != nodeOf(global) {
			out = append(out, client)
		}
	}

	return out
}

// TestExactCountingOnAClusterSendsEachSlotItsCallTogether: with global and
// ip in Redis on a Cluster, an allowed request is charged on clusterPath,
// one call on global's node and one on the client's, sent together, and no
// other call: global's count is every request's, each client's its own.
func TestExactCountingOnAClusterSendsEachSlotItsCallTogether(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	h := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 100, Duration: "1h"}
	})

	if fmt.Sprintf("%T", h.h) != "*tierlimit.clusterPath" {
		t.Fatalf("handler %T, want clusterPath", h.h)
	}

	clients := clientsOnOtherNodes(h, 4)
	// The first calls read the map, make the pools and load the script.
	for _, client := range clients {
		if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s's first request: %d, want 200", client, rec.Code)
		}
	}

	before := scriptCallsOn(t, admins)

	for i := 0; i < 5; i++ {
		for _, client := range clients {
			rec := h.get("/api", client+":1")
			if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != strconv.Itoa(100-2-i) {
				t.Fatalf("%s's request %d: %d, X-RateLimit-Remaining %q, want 200, %d", client, i, rec.Code, rec.Header().Get("X-RateLimit-Remaining"), 100-2-i)
			}
		}
	}

	if n := scriptCallsOn(t, admins) - before; n != 2*20 {
		t.Fatalf("20 requests made %d script calls, want 40 (one per slot each)", n)
	}

	global, _ := clusterKeys(h, "")
	if v := redisDo(t, admins[nodeOf(global)], "GET", global).Str; v != "24" {
		t.Fatalf("global in Redis %q, want 24", v)
	}

	for _, client := range clients {
		_, ip := clusterKeys(h, client)
		if v := redisDo(t, admins[nodeOf(ip)], "GET", ip).Str; v != "6" {
			t.Fatalf("%s in Redis %q, want 6", ip, v)
		}
	}

	// The calls are clusterPath's, not the general path's: global's asks
	// for the one-integer reply (ARGV[1] "2", the general path's "0").
	if line := monitored(t, addrs[nodeOf(global)], func() { h.get("/api", clients[0]+":1") }); !strings.Contains(line, `{global}" "2" "1"`) {
		t.Fatalf("global's call %s, want its one-integer form", line)
	}

	// An asset: global and assets, the assets plan's pair of calls.
	if rec := h.get("/assets/app.js", clients[0]+":1"); rec.Code != http.StatusOK {
		t.Fatalf("an asset: %d, want 200", rec.Code)
	}

	assets := h.p.planAssets[1].RedisKey + "{" + clients[0] + "}"
	if v := redisDo(t, admins[nodeOf(assets)], "GET", assets).Str; v != "1" {
		t.Fatalf("%s in Redis %q, want 1", assets, v)
	}

	if n := scriptCallsOn(t, admins) - before; n != 2*22 {
		t.Fatalf("22 requests made %d script calls, want 44 (one per slot each)", n)
	}
}

// TestAClusterNeverAdmitsOverThePointsAcrossSlots: requests of many
// clients at once, their keys in other slots than global's: global admits no more than its points, no client more than
// ip's, and what Redis holds at the end is what was admitted, every
// refused request's charge in the other slot given back.
func TestAClusterNeverAdmitsOverThePointsAcrossSlots(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	a := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Global = config.LayerConfig{Points: 60, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 5, Duration: "1h"}
	})

	clients := clientsOnOtherNodes(a, 16)
	allowed := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup

	for w := 0; w < 8; w++ {
		w := w
		wg.Add(1)

		go func() {
			defer wg.Done()

			for i := 0; i < 20; i++ {
				client := clients[(w*5+i)%len(clients)]

				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, "/api", nil)
				req.RemoteAddr = client + ":1"
				a.h.ServeHTTP(rec, req)

				if rec.Code == http.StatusOK {
					mu.Lock()
					allowed[client]++
					mu.Unlock()
				}
			}
		}()
	}

	wg.Wait()

	total := 0
	for _, client := range clients {
		total += allowed[client]
		if allowed[client] > 5 {
			t.Errorf("%s admitted %d times, over ip's 5", client, allowed[client])
		}

		_, ip := clusterKeys(a, client)
		if v := redisDo(t, admins[nodeOf(ip)], "GET", ip).Str; v != strconv.Itoa(allowed[client]) && !(v == "" && allowed[client] == 0) {
			t.Errorf("%s in Redis %q, want %d (its admitted requests)", ip, v, allowed[client])
		}
	}

	if total > 60 {
		t.Errorf("%d admitted, over global's 60", total)
	}

	global, _ := clusterKeys(a, "")
	if v := redisDo(t, admins[nodeOf(global)], "GET", global).Str; v != strconv.Itoa(total) {
		t.Errorf("global in Redis %q, want %d (the admitted requests)", v, total)
	}
}

// TestARefusalInOneSlotLeavesTheOtherSlotUnchanged: on a Cluster, a request
// that ip refuses leaves global's count (another slot, another node) as it
// was, and one that global refuses leaves the client's ip count as it was.
func TestARefusalInOneSlotLeavesTheOtherSlotUnchanged(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	h := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Global = config.LayerConfig{Points: 4, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 2, Duration: "1h"}
	})

	clients := clientsOnOtherNodes(h, 3)
	global, _ := clusterKeys(h, "")
	get := func(key string) string { return redisDo(t, admins[nodeOf(key)], "GET", key).Str }

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", clients[0]+":1"); rec.Code != want {
			t.Fatalf("%s's request %d: %d, want %d", clients[0], i, rec.Code, want)
		}
	}

	if v := get(global); v != "2" {
		t.Fatalf("global in Redis %q after 2 requests allowed and 1 that ip refused, want 2", v)
	}

	for _, client := range clients[1:] {
		if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s's request: %d, want 200", client, rec.Code)
		}
	}

	// global is full (4): the next client's request is refused by global.
	_, ip := clusterKeys(h, clients[2])
	if rec := h.get("/api", clients[2]+":1"); rec.Code != http.StatusTooManyRequests || refusedLayer(rec) != "global" {
		t.Fatalf("%s's second request: %d refused by %q, want 429 by global", clients[2], rec.Code, refusedLayer(rec))
	}

	if v := get(ip); v != "1" {
		t.Fatalf("%s in Redis %q after 1 request allowed and 1 that global refused, want 1", ip, v)
	}

	if v := get(global); v != "4" {
		t.Fatalf("global in Redis %q, want 4", v)
	}
}

// TestAClusterNodeDownMidRequestIsDecidedInMemory: the node of a client's
// slot shuts down between two of its requests, its pooled connections
// with it: the next request's call fails in the middle, and that request
// and the next are decided in memory with the same limits (never a 5xx,
// never over ip's points), one REDIS_UNAVAILABLE reported.
func TestAClusterNodeDownMidRequestIsDecidedInMemory(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	var logs bytes.Buffer
	h := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Global = config.LayerConfig{Points: 100, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 3, Duration: "1h"}
	})
	h.p.stores.redis.Backend.Log = &logs

	client := clientsOnOtherNodes(h, 1)[0]
	_, ip := clusterKeys(h, client)

	if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
		t.Fatalf("first request: %d, want 200", rec.Code)
	}

	_, _ = admins[nodeOf(ip)].Do("SHUTDOWN", "NOSAVE")

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", client+":1"); rec.Code != want {
			t.Fatalf("request %d after the node went down: %d, want %d\n%s", i, rec.Code, want, logs.String())
		}
	}

	if n := strings.Count(logs.String(), `"REDIS_UNAVAILABLE"`); n != 1 {
		t.Fatalf("%d REDIS_UNAVAILABLE, want 1:\n%s", n, logs.String())
	}
}

// monitored runs do while MONITOR watches the node at addr, and returns the
// first script call the node ran.
func monitored(t *testing.T, addr string, do func()) string {
	t.Helper()

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}

	if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", line, err)
	}

	do()

	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))

	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("no script call seen: %v", err)
		}

		if strings.Contains(line, `"EVALSHA"`) || strings.Contains(line, `"evalsha"`) {
			return line
		}
	}
}
