package e2e

import (
	"fmt"
	"io"
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

// sentinelGroup is one primary, one replica and three sentinels.
type sentinelGroup struct {
	t         *testing.T
	servers   map[string]*harness.Redis // by address
	sentinels []*harness.Redis
}

func startSentinelGroup(t *testing.T, extra ...string) *sentinelGroup {
	t.Helper()

	// The default user stays unrestricted: the sentinels and the replica use
	// it. The plugin connects as README's ACL user (grantACL below).
	primary := startOpenRedis(t, extra...)
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica := startOpenRedis(t, append([]string{"--replicaof", host, port}, extra...)...)

	g := &sentinelGroup{t: t, servers: map[string]*harness.Redis{primary.Addr: primary, replica.Addr: replica}}
	grantACL(t, primary, replica)

	for i := 0; i < 3; i++ {
		s, err := harness.StartSentinel(t.TempDir(), "mymaster", primary.Addr)
		if err != nil {
			t.Fatal(err)
		}

		t.Cleanup(s.Kill)
		g.sentinels = append(g.sentinels, s)
	}

	grantSentinelACL(t, g.sentinels...)

	return g
}

func (g *sentinelGroup) addresses() string {
	var out []string
	for _, s := range g.sentinels {
		out = append(out, `"`+s.Addr+`"`)
	}

	return strings.Join(out, ", ")
}

// ask runs a command on every sentinel and returns the replies.
func (g *sentinelGroup) ask(args ...string) []redisresp.Value {
	var out []redisresp.Value

	for _, s := range g.sentinels {
		p := s.Client(redisresp.Options{Timeout: 2 * time.Second})
		v, err := p.Do(args...)
		p.Close()

		if err != nil {
			v = redisresp.Value{Kind: redisresp.KindError, Str: err.Error()}
		}

		out = append(out, v)
	}

	return out
}

// primary returns the address every sentinel names, or "" while they differ.
func (g *sentinelGroup) primary() string {
	named := ""

	for i, v := range g.ask("SENTINEL", "get-master-addr-by-name", "mymaster") {
		if len(v.Array) != 2 {
			return ""
		}

		addr := v.Array[0].Str + ":" + v.Array[1].Str
		if i > 0 && addr != named {
			return ""
		}

		named = addr
	}

	return named
}

// field reads a field of a SENTINEL replicas/sentinels entry (a flat list).
func field(entry redisresp.Value, name string) string {
	for i := 0; i+1 < len(entry.Array); i += 2 {
		if entry.Array[i].Str == name {
			return entry.Array[i+1].Str
		}
	}

	return ""
}

// waitReady waits until every sentinel knows the other two and sees the
// replica in sync, so that a failover can be agreed and has a replica to promote.
func (g *sentinelGroup) waitReady() {
	g.t.Helper()

	deadline := time.Now().Add(40 * time.Second)

	for {
		ready := true

		for _, v := range g.ask("SENTINEL", "sentinels", "mymaster") {
			if len(v.Array) != 2 {
				ready = false
			}
		}

		for _, v := range g.ask("SENTINEL", "replicas", "mymaster") {
			good := 0

			for _, r := range v.Array {
				if field(r, "flags") == "slave" && field(r, "master-link-status") == "ok" {
					good++
				}
			}

			if good != 1 {
				ready = false
			}
		}

		if ready {
			return
		}

		if time.Now().After(deadline) {
			g.t.Fatalf("the sentinels did not agree on the group within 40s: %v %v",
				g.ask("SENTINEL", "sentinels", "mymaster"), g.ask("SENTINEL", "replicas", "mymaster"))
		}

		time.Sleep(100 * time.Millisecond) // polling the sentinels' view, not waiting for a window
	}
}

// waitNewPrimary waits until every sentinel names a primary other than old.
func (g *sentinelGroup) waitNewPrimary(old string) string {
	g.t.Helper()

	deadline := time.Now().Add(40 * time.Second)

	for {
		if p := g.primary(); p != "" && p != old {
			return p
		}

		if time.Now().After(deadline) {
			g.t.Fatalf("no new primary named within 40s (old %s): %v", old, g.ask("SENTINEL", "get-master-addr-by-name", "mymaster"))
		}

		time.Sleep(50 * time.Millisecond) // polling the sentinels' view
	}
}

func sentinelDynamic(addresses string) string {
	return `
http:
  routers:
    api:
      entryPoints: [web]
      rule: PathPrefix(` + "`/api`" + `)
      middlewares: [limited]
      service: backend
    load:
      entryPoints: [web]
      rule: PathPrefix(` + "`/load`" + `)
      middlewares: [load]
      service: backend
  middlewares:
    limited:
      plugin:
        tierlimit:
          store: redis
          redis:
            sentinel: {masterName: mymaster, addresses: [` + addresses + `], username: ` + aclSentinelUser + `, password: ` + aclSentinelPassword + `}
            username: ` + aclUser + `
            password: ` + aclPassword + `
            timeout: 1s
            dialTimeout: 1s
          global: {points: 0}
          ip: {points: 20, duration: 60s}
    load:
      plugin:
        tierlimit:
          store: redis
          redis:
            sentinel: {masterName: mymaster, addresses: [` + addresses + `], username: ` + aclSentinelUser + `, password: ` + aclSentinelPassword + `}
            username: ` + aclUser + `
            password: ` + aclPassword + `
            timeout: 1s
            dialTimeout: 1s
          global: {points: 0}
          ip: {points: 1000000, duration: 60s}
  services:
    backend:
      loadBalancer:
        servers:
          - url: "{{backend}}"
`
}

// burst sends n requests for client alternately to each Traefik and returns
// how many each allowed; any answer but 200 or 429 fails the test.
func burst(t *testing.T, envs []*env, path, client string, n int) []int {
	t.Helper()

	allowed, err := tryBurst(envs, path, client, n)
	if err != nil {
		t.Fatal(err)
	}

	return allowed
}

// tryBurst is burst for goroutines other than the test's.
func tryBurst(envs []*env, path, client string, n int) ([]int, error) {
	allowed := make([]int, len(envs))

	for i := 0; i < n; i++ {
		e := envs[i%len(envs)]

		code, err := getCode(e, path, client)
		if err != nil {
			return nil, err
		}

		switch code {
		case http.StatusOK:
			allowed[i%len(envs)]++
		case http.StatusTooManyRequests:
		default:
			return nil, fmt.Errorf("%s for %s: %d", path, client, code)
		}
	}

	return allowed, nil
}

func getCode(e *env, path, client string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, e.traefik.Web+path, nil)
	if err != nil {
		return 0, err
	}

	req.Header.Set("X-Forwarded-For", client)

	resp, err := e.client.Do(req)
	if err != nil {
		return 0, err
	}

	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	return resp.StatusCode, nil
}

func sum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}

	return n
}

// counter reads a counter of the limited middleware on a server.
func counter(t *testing.T, r *harness.Redis, client string) string {
	t.Helper()

	p := r.Client(redisresp.Options{})
	defer p.Close()

	v, err := p.Do("GET", "ratelimit:limited@file:ip:"+client)
	if err != nil {
		t.Fatalf("reading the counter on %s: %v", r.Addr, err)
	}

	return v.String()
}

// TestSentinelFailover: two Traefiks count exactly in the primary that three
// sentinels name. The primary is switched under load twice, by SENTINEL
// FAILOVER and by killing it: no 5xx, no client past the limit that memory
// allows each process during the switch, and within a few seconds of the
// promotion both processes count exactly in the new primary. Each outage and
// each recovery is logged once per process. The plugin connects to the data
// nodes and the sentinels as README's ACL users.
func TestSentinelFailover(t *testing.T) {
	const limit = 20

	g := startSentinelGroup(t)
	envs := []*env{start(t, sentinelDynamic(g.addresses())), start(t, sentinelDynamic(g.addresses()))}

	for _, e := range envs {
		e.waitRouters("api", "load")
	}

	g.waitReady()

	primary := g.primary()
	if primary == "" {
		t.Fatal("the sentinels name no primary")
	}

	if got := burst(t, envs, "/api", "198.51.100.1", 3*limit); sum(got) != limit || counter(t, g.servers[primary], "198.51.100.1") != "20" {
		t.Fatalf("before any failover: allowed %v, counter %s; want %d in all, counted in the primary", got,
			counter(t, g.servers[primary], "198.51.100.1"), limit)
	}

	outages := make([]int, len(envs))

	for phase, how := range []string{"SENTINEL FAILOVER", "kill"} {
		old := primary

		// Load that reaches Redis on every request, from both processes.
		stop := make(chan struct{})
		var stopOnce sync.Once
		halt := func() { stopOnce.Do(func() { close(stop) }) }
		var failed atomic.Int64
		var wg sync.WaitGroup

		for w := 0; w < 4; w++ {
			e := envs[w%2]
			base := "10." + strconv.Itoa(phase) + "." + strconv.Itoa(w) + "."

			wg.Add(1)

			go func() {
				defer wg.Done()

				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}

					if code, err := getCode(e, "/load", base+strconv.Itoa(i%200)); err != nil || code != http.StatusOK {
						failed.Add(1)
					}
				}
			}()
		}

		// Clients of the limited middleware through the switch: each sends
		// five times its limit over both processes. Redis allows the limit
		// in all; during the switch each process's memory may allow it once
		// more, never more than that.
		var slots atomic.Int64
		checkerDone := make(chan struct{})

		// On a failure the load stops before the test ends, not after.
		t.Cleanup(func() {
			halt()
			wg.Wait()
			<-checkerDone
		})

		go func() {
			defer close(checkerDone)

			for s := 0; ; s++ {
				select {
				case <-stop:
					return
				default:
				}

				client := "203.0." + strconv.Itoa(phase) + "." + strconv.Itoa(s)
				got, err := tryBurst(envs, "/api", client, 5*limit)
				if err != nil {
					t.Errorf("%s: %v", how, err)
					return
				}

				if sum(got) > 3*limit || got[0] > 2*limit || got[1] > 2*limit {
					t.Errorf("%s: client %s allowed %v of %d per process during the switch; memory allows %d per process",
						how, client, got, 5*limit, limit)
				}

				slots.Add(1)
			}
		}()

		if how == "kill" {
			g.servers[old].Kill()
		} else {
			for _, v := range g.ask("SENTINEL", "FAILOVER", "mymaster")[:1] {
				if v.IsError() {
					t.Fatalf("SENTINEL FAILOVER: %s", v.Str)
				}
			}
		}

		primary = g.waitNewPrimary(old)
		promoted := time.Now()

		// Both processes count in the new primary within a few seconds.
		for attempt := 0; ; attempt++ {
			client := "192.0." + strconv.Itoa(phase) + "." + strconv.Itoa(attempt%250)
			burst(t, envs, "/api", client, 2)

			if counter(t, g.servers[primary], client) == "2" {
				break
			}

			if time.Since(promoted) > 5*time.Second {
				t.Fatalf("%s: 5s after the sentinels named %s the processes do not both count there", how, primary)
			}

			time.Sleep(100 * time.Millisecond) // pacing probes, not waiting for a window
		}

		t.Logf("%s: both processes count in %s %s after the sentinels named it", how, primary, time.Since(promoted).Round(time.Millisecond))

		halt()
		wg.Wait()
		<-checkerDone

		if failed.Load() != 0 {
			t.Fatalf("%s: %d requests under load failed or were not 200", how, failed.Load())
		}

		if slots.Load() == 0 {
			t.Fatalf("%s: no limited client ran through the switch", how)
		}

		client := "198.51.100." + strconv.Itoa(10+phase)
		if got := burst(t, envs, "/api", client, 3*limit); sum(got) != limit || counter(t, g.servers[primary], client) != "20" {
			t.Fatalf("%s: after the switch allowed %v, counter %s in %s; want %d, counted there", how, got,
				counter(t, g.servers[primary], client), primary, limit)
		}

		// Each switch is logged once per process. SENTINEL FAILOVER leaves
		// the old primary up, so calls may move without failing; a kill is
		// an outage: logged once, and its recovery once.
		for i, e := range envs {
			logs := e.traefik.Logs()
			down, up := strings.Count(logs, "REDIS_UNAVAILABLE"), strings.Count(logs, "REDIS_RECOVERED")
			switched := strings.Count(logs, "REDIS_PRIMARY_CHANGED")

			if switched != phase+1 || down != up || down > phase+1 || (how == "kill" && down != outages[i]+1) {
				t.Fatalf("%s: Traefik %d logged %d switches, %d outages, %d recoveries (%d outages before):\n%s", how, i, switched,
					down, up, outages[i], tail(logs, 20))
			}

			outages[i] = down
		}

		if how == "SENTINEL FAILOVER" {
			g.waitReady() // the old primary, now a replica, is in sync before the next switch
		}
	}
}
