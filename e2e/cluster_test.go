package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

const clusterLimit = 20

func clusterDynamic(seeds ...string) string {
	return `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/`" + `)
      middlewares: [clustered]
      service: backend
  middlewares:
    clustered:
      plugin:
        tierlimit:
          store: redis
          redis:
            cluster: {addresses: ["` + strings.Join(seeds, `", "`) + `"]}
            username: ` + aclUser + `
            password: ` + aclPassword + `
            timeout: 1s
            dialTimeout: 1s
          global: {points: 100000000, duration: 60s}
          ip: {points: ` + strconv.Itoa(clusterLimit) + `, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`
}

// clusterKeyOf is the ip layer's key of client in the cluster layout.
func clusterKeyOf(client string) string {
	return "ratelimit:clustered@file:ip:{" + client + "}"
}

// clusterGet reads key from whichever node holds it (asking first, for a
// slot being imported), or "" when none does.
func clusterGet(t *testing.T, nodes []*harness.Redis, key string) string {
	t.Helper()

	for _, r := range nodes {
		if !r.Running() {
			continue
		}

		p := r.Client(redisresp.Options{})
		vs, err := p.Pipeline([][]string{{"ASKING"}, {"GET", key}})
		p.Close()

		if err != nil {
			t.Fatalf("GET %s on %s: %v", key, r.Addr, err)
		}

		if v := vs[1]; !v.IsError() && !v.Null {
			return v.Str
		}
	}

	return ""
}

func nodeDo(t *testing.T, r *harness.Redis, args ...string) redisresp.Value {
	t.Helper()

	p := r.Client(redisresp.Options{})
	defer p.Close()

	return redisDo(t, p, args...)
}

// clusterLoad sends requests for many clients through both Traefiks until
// stopped, counting any answer but 200 or 429, and what each client was allowed.
type clusterLoad struct {
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	bad     atomic.Int64
	mu      sync.Mutex
	allowed map[string]int
}

func startClusterLoad(envs []*env, prefix string, workers int) *clusterLoad {
	l := &clusterLoad{stop: make(chan struct{}), allowed: map[string]int{}}

	for w := 0; w < workers; w++ {
		w := w

		l.wg.Add(1)

		go func() {
			defer l.wg.Done()

			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}

				client := prefix + strconv.Itoa((w*7+i)%100)

				code, err := getCode(envs[(w+i)%len(envs)], "/api", client)
				if err != nil || (code != http.StatusOK && code != http.StatusTooManyRequests) {
					l.bad.Add(1)
					continue
				}

				if code == http.StatusOK {
					l.mu.Lock()
					l.allowed[client]++
					l.mu.Unlock()
				}
			}
		}()
	}

	return l
}

func (l *clusterLoad) end() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// TestClusterCountsExactlyThroughMigrationAndFailover: two Traefiks share a
// three-primary Redis Cluster (one primary with a replica). 64 concurrent
// clients over many keys get exactly their limit; a slot migrated under
// load is followed through ASK (while keys are imported) and MOVED (after),
// with exact counts and no 5xx; a primary killed under load is survived as
// with Sentinel: no 5xx, no client past what memory allows each process,
// exact counts in the promoted replica within seconds, one outage and one
// recovery logged per process. The plugin connects as README's ACL user.
func TestClusterCountsExactlyThroughMigrationAndFailover(t *testing.T) {
	c, err := harness.StartCluster(t.TempDir(), 3, 1)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(c.Kill)
	grantACL(t, c.Nodes()...)

	envs := []*env{start(t, clusterDynamic(c.Primaries[0].Addr, c.Primaries[1].Addr)), start(t, clusterDynamic(c.Primaries[2].Addr))}
	for _, e := range envs {
		e.waitRouters("api")
	}

	// 1. 64 concurrent clients over 32 keys, both processes: exact.
	var wg sync.WaitGroup
	allowed := make([]atomic.Int64, 32)
	var bad atomic.Int64

	for w := 0; w < 64; w++ {
		w := w

		wg.Add(1)

		go func() {
			defer wg.Done()

			for i := 0; i < 2*clusterLimit; i++ {
				code, err := getCode(envs[(w+i)%2], "/api", "198.51.100."+strconv.Itoa(w%32))
				switch {
				case err != nil || (code != http.StatusOK && code != http.StatusTooManyRequests):
					bad.Add(1)
				case code == http.StatusOK:
					allowed[w%32].Add(1)
				}
			}
		}()
	}

	wg.Wait()

	if bad.Load() != 0 {
		t.Fatalf("%d requests failed or were not 200/429", bad.Load())
	}

	for i := range allowed {
		client := "198.51.100." + strconv.Itoa(i)
		if n := allowed[i].Load(); n != clusterLimit {
			t.Errorf("client %s: %d allowed of %d, want %d", client, n, 4*clusterLimit, clusterLimit)
		}

		// The refused requests spent nothing: the counter holds the allowed.
		if v, _ := strconv.Atoi(clusterGet(t, c.Primaries, clusterKeyOf(client))); v != clusterLimit {
			t.Errorf("client %s: counter %d in the cluster, want %d", client, v, clusterLimit)
		}
	}

	if t.Failed() {
		t.FailNow()
	}

	// 2. Migrate the slot of one client's keys under load.
	load := startClusterLoad(envs, "203.0.113.", 8)
	t.Cleanup(load.end) // on a failure too, before Traefik stops

	client := "192.0.2.77"
	slot := strconv.Itoa(redisresp.Slot(clusterKeyOf(client)))

	var src, dst *harness.Redis

	for _, r := range c.Primaries {
		for _, rng := range nodeDo(t, r, "CLUSTER", "SLOTS").Array {
			s, _ := strconv.Atoi(slot)
			if int(rng.Array[0].Int) <= s && s <= int(rng.Array[1].Int) && strconv.FormatInt(rng.Array[2].Array[1].Int, 10) == strconv.Itoa(r.Port) {
				src = r
			}
		}
	}

	if src == nil {
		t.Fatalf("no primary owns slot %s", slot)
	}

	for _, r := range c.Primaries {
		if r != src && r != c.Primaries[0] {
			dst = r
		}
	}

	sum := func(n int) int {
		got := 0
		for _, a := range burst(t, envs, "/api", client, n) {
			got += a
		}

		return got
	}

	total := sum(5)

	nodeDo(t, dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", c.IDs[src.Addr])
	nodeDo(t, src, "CLUSTER", "SETSLOT", slot, "MIGRATING", c.IDs[dst.Addr])

	keysInSlot := nodeDo(t, src, "CLUSTER", "GETKEYSINSLOT", slot, "100").Array
	migrate := []string{"MIGRATE", "127.0.0.1", strconv.Itoa(dst.Port), "", "0", "5000", "KEYS"}

	for _, k := range keysInSlot {
		migrate = append(migrate, k.Str)
	}

	if len(keysInSlot) == 0 {
		t.Fatalf("no key in slot %s on %s", slot, src.Addr)
	}

	nodeDo(t, src, migrate...)

	// The keys are on dst, the slot still src's: requests go by ASK.
	total += sum(5)

	if got := clusterGet(t, []*harness.Redis{dst}, clusterKeyOf(client)); got != "10" {
		t.Fatalf("during the migration the counter on the importing node is %q, want 10 (ASK followed)", got)
	}

	for _, r := range c.Primaries {
		nodeDo(t, r, "CLUSTER", "SETSLOT", slot, "NODE", c.IDs[dst.Addr])
	}

	// The slot is dst's: src answers MOVED and the map is refreshed.
	total += sum(3 * clusterLimit)

	if total != clusterLimit {
		t.Fatalf("through the migration %s was allowed %d, want exactly %d", client, total, clusterLimit)
	}

	// Every allowed request was counted on dst once the keys moved; the
	// refused ones spent nothing.
	if got, _ := strconv.Atoi(clusterGet(t, []*harness.Redis{dst}, clusterKeyOf(client))); got != clusterLimit {
		t.Fatalf("after the migration the counter on %s is %d, want %d", dst.Addr, got, clusterLimit)
	}

	load.end()

	if load.bad.Load() != 0 {
		t.Fatalf("%d requests under load failed during the migration", load.bad.Load())
	}

	for k, n := range load.allowed {
		if n > clusterLimit {
			t.Errorf("during the migration client %s was allowed %d, over the limit %d", k, n, clusterLimit)
		}
	}

	for i, e := range envs {
		if logs := e.traefik.Logs(); strings.Contains(logs, "REDIS_UNAVAILABLE") {
			t.Fatalf("Traefik %d fell back to memory during the migration:\n%s", i, grepLines(logs, "REDIS_"))
		}
	}

	// 3. Kill the primary that has a replica, under load.
	load = startClusterLoad(envs, "203.0.114.", 8)
	t.Cleanup(load.end)
	c.Primaries[0].Kill()

	promoted := c.Replicas[0]

	if err := waitCluster(30*time.Second, func() bool {
		p := promoted.Client(redisresp.Options{})
		defer p.Close()

		v, err := p.Do("ROLE")
		return err == nil && len(v.Array) > 0 && v.Array[0].Str == "master"
	}); err != nil {
		t.Fatal(err)
	}

	at := time.Now()

	// Clients whose keys the promoted replica now serves (the first third of the slots).
	for attempt := 0; ; attempt++ {
		ip := ipInFirstThird("100.64." + strconv.Itoa(attempt) + ".")

		burst(t, envs, "/api", ip, 2)

		if clusterGet(t, []*harness.Redis{promoted}, clusterKeyOf(ip)) == "2" {
			break
		}

		if time.Since(at) > 20*time.Second {
			t.Fatalf("20s after the promotion the processes do not both count in %s", promoted.Addr)
		}

		time.Sleep(100 * time.Millisecond) // pacing probes, not waiting for a window
	}

	t.Logf("both processes count in the promoted replica %s after its promotion", time.Since(at).Round(time.Millisecond))

	load.end()

	if load.bad.Load() != 0 {
		t.Fatalf("%d requests under load failed during the failover", load.bad.Load())
	}

	for k, n := range load.allowed {
		if n > 3*clusterLimit {
			t.Errorf("during the failover client %s was allowed %d: more than the limit in Redis and in each process's memory", k, n)
		}
	}

	after := ipInFirstThird("198.51.101.")

	if got := burst(t, envs, "/api", after, 3*clusterLimit); got[0]+got[1] != clusterLimit {
		t.Fatalf("after the failover %s was allowed %v, want %d in all", after, got, clusterLimit)
	}

	for i, e := range envs {
		logs := e.traefik.Logs()
		if down, up := strings.Count(logs, "REDIS_UNAVAILABLE"), strings.Count(logs, "REDIS_RECOVERED"); down != 1 || up != 1 {
			t.Fatalf("Traefik %d logged %d outages and %d recoveries, want one each:\n%s", i, down, up, grepLines(logs, "REDIS_"))
		}
	}
}

// ipInFirstThird returns the first prefix+N whose keys fall in the first
// third of the slots: the killed primary's, then its replica's.
func ipInFirstThird(prefix string) string {
	for i := 0; ; i++ {
		if ip := prefix + strconv.Itoa(i); redisresp.Slot(clusterKeyOf(ip)) < redisresp.Slots/3 {
			return ip
		}
	}
}

func waitCluster(limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)

	for !cond() {
		if time.Now().After(deadline) {
			return errClusterWait
		}

		time.Sleep(50 * time.Millisecond) // polling the servers' state
	}

	return nil
}

var errClusterWait = errorString("the replica was not promoted within the limit")

type errorString string

func (e errorString) Error() string { return string(e) }
