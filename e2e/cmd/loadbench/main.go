// Command loadbench measures Traefik v3.6.12 (the real binary, started by the
// e2e harness) under a closed-loop Go load generator on loopback, in these
// configurations behind one router to the same backend:
//
//	none                no middleware
//	passthrough-plugin  a Yaegi plugin that sets one header and calls next: the floor of any plugin
//	minimal-limiter-plugin  a Yaegi plugin doing the least a rate limiter with headers must (harness.MinimalLimiter)
//	minimal-edge-plugin     the same with tierlimit-memory's two layers, global and ip (harness.MinimalEdge)
//	builtin-memory    Traefik's RateLimit, in-memory buckets, keyed by X-Forwarded-For (depth 1)
//	tierlimit-memory  this plugin, store: memory, global + ip layers, headers on
//	builtin-redis     Traefik's RateLimit with redis.endpoints
//	minimal-redis     a Yaegi plugin doing the least tierlimit-redis's global + ip must, in one script call (harness.MinimalRedis)
//	tierlimit-redis   this plugin, store: redis
//	tierlimit-redis-sync  the same with redis.syncInterval: 100ms (counted locally, synced in batches)
//	tierlimit-sentinel  this plugin, store: redis, the same server found through a sentinel
//	builtin-cluster   Traefik's RateLimit with three endpoints: a Redis Cluster of three primaries
//	tierlimit-cluster this plugin, redis.cluster, the same cluster
//	tierlimit-cluster-memglobal  the same with global: {store: memory}, one script call per request
//	tierlimit-cluster-sync  tierlimit-cluster with redis.syncInterval: 100ms
//
// (the sentinel's own PING and PUBLISH to the server, about one a second, are
// in its Redis command counts) and two scenarios: (a) limits high enough that nothing is refused, (b) a
// small per-IP limit with a long period, so that almost every request is
// refused. Each (configuration, scenario, repetition) gets a fresh Traefik;
// one redis-server is shared (flushed before each run). Repetitions alternate
// the configurations to spread machine noise; the tables report medians.
//
// Run it from e2e/: go run ./cmd/loadbench [-duration 5s] [-warmup 1s]
// [-concurrency 32] [-clients 16] [-runs 3] [-only none,tierlimit-memory].
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// Limits of the two scenarios, shared by the built-in RateLimit and the plugin.
const (
	highPoints = 100000000 // scenario a: per second, far above anything one machine serves
	lowPoints  = 10        // scenario b: per client IP ...

	typicalIPPoints = 4000 // scenario a, tierlimit's ip layer: see plugin()
	lowPeriod       = "1h" // ... per hour
)

type scenario struct {
	id    string
	title string
}

var scenarios = []scenario{
	{"a", fmt.Sprintf("(a) nothing refused: limits of %d/s", highPoints)},
	{"b", fmt.Sprintf("(b) mostly refused: %d per client IP per %s, all load from the -clients IPs", lowPoints, lowPeriod)},
}

// configuration is one way of putting (or not) a rate limiter in front of the backend.
type configuration struct {
	name       string
	redis      bool
	sentinel   bool                                      // needs a sentinel watching the redis-server
	cluster    bool                                      // runs on the Redis Cluster instead
	middleware func(s scenario, redisAddr string) string // YAML under middlewares.limit; "" for none
	source     string                                    // the plugin source to load (-baseline); "" for the working tree
}

var configurations = []configuration{
	{name: "none"},
	{name: "passthrough-plugin", middleware: func(scenario, string) string { return "plugin:\n  passthrough: {}\n" }},
	{name: "minimal-limiter-plugin", middleware: func(s scenario, _ string) string {
		if s.id == "b" {
			return fmt.Sprintf("plugin:\n  minimal: {points: %d, seconds: 3600}\n", lowPoints)
		}

		return "plugin:\n  minimal: {}\n"
	}},
	{name: "minimal-edge-plugin", middleware: func(s scenario, _ string) string {
		if s.id == "b" {
			return fmt.Sprintf("plugin:\n  minimaledge: {points: %d, seconds: 3600}\n", lowPoints)
		}

		return "plugin:\n  minimaledge: {}\n"
	}},
	{name: "builtin-memory", middleware: builtin(false)},
	{name: "tierlimit-memory", middleware: plugin(false)},
	{name: "builtin-redis", redis: true, middleware: builtin(true)},
	{name: "minimal-redis", redis: true, middleware: func(s scenario, addr string) string {
		if s.id == "b" {
			return fmt.Sprintf("plugin:\n  minimalredis: {address: %q, points: %d, seconds: 3600}\n", addr, lowPoints)
		}

		return fmt.Sprintf("plugin:\n  minimalredis: {address: %q}\n", addr)
	}},
	{name: "tierlimit-redis", redis: true, middleware: plugin(true)},
	{name: "tierlimit-redis-sync", redis: true, middleware: pluginSync},
	{name: "tierlimit-sentinel", redis: true, sentinel: true, middleware: pluginSentinel},
	{name: "builtin-cluster", redis: true, cluster: true, middleware: builtinCluster},
	{name: "tierlimit-cluster", redis: true, cluster: true, middleware: pluginCluster},
	{name: "tierlimit-cluster-memglobal", redis: true, cluster: true, middleware: pluginClusterMemGlobal},
	{name: "tierlimit-cluster-sync", redis: true, cluster: true, middleware: pluginClusterSync},
}

// clusterAddrs are the cluster's primaries, when a configuration needs them.
var clusterAddrs []string

// builtinCluster is builtin(true) with every primary as an endpoint, which
// makes Traefik's go-redis client a cluster client.
func builtinCluster(s scenario, addr string) string {
	y := builtin(true)(s, addr)

	return strings.Replace(y, fmt.Sprintf("endpoints: [%q]", addr), "endpoints: [\""+strings.Join(clusterAddrs, "\", \"")+"\"]", 1)
}

// pluginCluster is plugin(true) on the cluster.
func pluginCluster(s scenario, addr string) string {
	y := plugin(true)(s, addr)

	return strings.Replace(y, fmt.Sprintf("redis: {address: %q}", addr),
		"redis: {cluster: {addresses: [\""+strings.Join(clusterAddrs, "\", \"")+"\"]}}", 1)
}

// pluginClusterMemGlobal is pluginCluster with global counted in memory
// (store: memory on the layer): the client's slot alone is in the cluster.
func pluginClusterMemGlobal(s scenario, addr string) string {
	y := pluginCluster(s, addr)

	return strings.Replace(y, fmt.Sprintf("global: {points: %d, duration: 1s}", highPoints),
		fmt.Sprintf("global: {points: %d, duration: 1s, store: memory}", highPoints), 1)
}

// pluginClusterSync is pluginCluster with redis.syncInterval: 100ms.
func pluginClusterSync(s scenario, addr string) string {
	y := pluginCluster(s, addr)

	return strings.Replace(y, "redis: {cluster: {", "redis: {syncInterval: 100ms, cluster: {", 1)
}

// pluginSync is plugin(true) with redis.syncInterval: 100ms.
func pluginSync(s scenario, addr string) string {
	y := plugin(true)(s, addr)

	return strings.Replace(y, fmt.Sprintf("redis: {address: %q}", addr), fmt.Sprintf("redis: {address: %q, syncInterval: 100ms}", addr), 1)
}

// sentinelAddr is the sentinel that run starts when a configuration needs one.
var sentinelAddr string

// pluginSentinel is plugin(true) with the server found through the sentinel.
func pluginSentinel(s scenario, addr string) string {
	y := plugin(true)(s, addr)

	return strings.Replace(y, fmt.Sprintf("redis: {address: %q}", addr),
		fmt.Sprintf("redis: {sentinel: {masterName: mymaster, addresses: [%q]}}", sentinelAddr), 1)
}

// builtin is Traefik's RateLimit keyed by the rightmost X-Forwarded-For entry,
// which is the address the plugin keys by (the entrypoint trusts 127.0.0.1).
func builtin(redis bool) func(scenario, string) string {
	return func(s scenario, addr string) string {
		avg, period, burst := highPoints, "1s", highPoints
		if s.id == "b" {
			avg, period, burst = lowPoints, lowPeriod, lowPoints
		}

		y := fmt.Sprintf(`rateLimit:
  average: %d
  period: %s
  burst: %d
  sourceCriterion:
    ipStrategy:
      depth: 1
`, avg, period, burst)
		if redis {
			y += fmt.Sprintf("  redis:\n    endpoints: [%q]\n", addr)
		}

		return y
	}
}

// plugin is a typical edge instance of tierlimit: global + ip layers, headers on.
func plugin(redis bool) func(scenario, string) string {
	return func(s scenario, addr string) string {
		// A per-IP limit far above what -clients IPs reach here, but in the
		// range real configurations use (the design's default is 50), where
		// the plugin's header values come from its precomputed tables.
		ip := fmt.Sprintf("{points: %d, duration: 1s}", typicalIPPoints)
		if s.id == "b" {
			ip = fmt.Sprintf("{points: %d, duration: %s}", lowPoints, lowPeriod)
		}

		store := "store: memory\n"
		if redis {
			store = fmt.Sprintf("store: redis\n    redis: {address: %q}\n", addr)
		}

		return fmt.Sprintf(`plugin:
  tierlimit:
    %s    headers: true
    global: {points: %d, duration: 1s}
    ip: %s
`, store, highPoints, ip)
	}
}

func dynamic(c configuration, s scenario, backend, redisAddr string) string {
	var b strings.Builder

	b.WriteString("http:\n  routers:\n    bench:\n      entryPoints: [web]\n      rule: PathPrefix(`/`)\n      service: backend\n")

	if c.middleware != nil {
		b.WriteString("      middlewares: [limit]\n  middlewares:\n    limit:\n")
		b.WriteString(indent(c.middleware(s, redisAddr), "      "))
	}

	fmt.Fprintf(&b, "  services:\n    backend:\n      loadBalancer:\n        servers:\n          - url: %q\n", backend)

	return b.String()
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}

	return strings.Join(lines, "\n") + "\n"
}

type options struct {
	duration, warmup time.Duration
	concurrency      int
	clients          int
	runs             int
	only             []configuration
	cpuProfiles      string // directory for Traefik's CPU profile of each measured phase; "" for none
	baseline         string // a git revision whose plugin each tierlimit-* configuration also runs; "" for none
}

func main() {
	var (
		o    options
		only string
	)

	flag.DurationVar(&o.duration, "duration", 5*time.Second, "measured duration of each run")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "warm-up before each measured run (not counted)")
	flag.IntVar(&o.concurrency, "concurrency", 32, "concurrent workers (closed loop, keep-alive HTTP/1.1)")
	flag.IntVar(&o.clients, "clients", 16, "client IPs the requests are spread over (X-Forwarded-For)")
	flag.IntVar(&o.runs, "runs", 3, "repetitions of each configuration and scenario (medians are reported)")
	flag.StringVar(&o.cpuProfiles, "cpuprofile", "", "directory to write Traefik's CPU profile of each measured phase to (go tool pprof); turns on api.debug")
	flag.StringVar(&only, "only", "", "comma-separated configurations to run (default all): "+names(configurations))
	flag.StringVar(&o.baseline, "baseline", "", "a git revision: every tierlimit-* configuration also runs with the plugin at that revision, as <name>@<revision>, interleaved in the same run")
	flag.Parse()

	if flag.NArg() > 0 || o.duration <= 0 || o.warmup < 0 || o.concurrency < 1 || o.clients < 1 || o.clients > 65536 || o.runs < 1 {
		fmt.Fprintln(os.Stderr, "loadbench: bad arguments (need -duration > 0, -warmup >= 0, -concurrency >= 1, 1 <= -clients <= 65536, -runs >= 1, no positional arguments)")
		flag.Usage()
		os.Exit(2)
	}

	o.only = configurations
	if only != "" {
		o.only = nil

		for _, n := range strings.Split(only, ",") {
			n = strings.TrimSpace(n)
			c, ok := find(n)
			if !ok {
				fmt.Fprintf(os.Stderr, "loadbench: unknown configuration %q (known: %s)\n", n, names(configurations))
				os.Exit(2)
			}

			o.only = append(o.only, c)
		}
	}

	if o.baseline != "" {
		src, cleanup, err := exportRevision(o.baseline)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadbench:", err)
			os.Exit(1)
		}
		defer cleanup()

		o.only = withBaseline(o.only, o.baseline, src)
	}

	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "loadbench:", err)
		os.Exit(1)
	}
}

// builtinPeer is the built-in configuration a configuration's "vs built-in"
// column compares with: tierlimit-X with builtin-X, minimal-redis with
// builtin-redis; "" for none.
func builtinPeer(name string) string {
	name, _, _ = strings.Cut(name, "@")

	if name == "minimal-redis" {
		return "builtin-redis"
	}

	if peer, ok := strings.CutPrefix(name, "tierlimit-"); ok {
		return "builtin-" + strings.TrimSuffix(peer, "-memglobal")
	}

	return ""
}

// exportRevision writes the plugin's source at rev into a temporary
// directory (git archive), for harness.Options.PluginSource.
func exportRevision(rev string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "loadbench-baseline-")
	if err != nil {
		return "", nil, err
	}

	cleanup := func() { os.RemoveAll(dir) }

	cmd := exec.Command("sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", harness.RepoRoot(), rev, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("exporting revision %s: %v: %s", rev, err, out)
	}

	return dir, cleanup, nil
}

// withBaseline adds, after each tierlimit-* configuration, the same one on
// the plugin at rev (exported to src).
func withBaseline(cs []configuration, rev, src string) []configuration {
	var out []configuration

	for _, c := range cs {
		out = append(out, c)

		if strings.HasPrefix(c.name, "tierlimit-") {
			b := c
			b.name = c.name + "@" + rev
			b.source = src
			out = append(out, b)
		}
	}

	return out
}

func names(cs []configuration) string {
	var n []string
	for _, c := range cs {
		n = append(n, c.name)
	}

	return strings.Join(n, ",")
}

func find(name string) (configuration, bool) {
	for _, c := range configurations {
		if c.name == name {
			return c, true
		}
	}

	return configuration{}, false
}

// bench holds what every run shares.
type bench struct {
	o        options
	backend  string
	redis    *harness.Redis
	redisErr error
	admin    *redisresp.Pool
	ips      []string

	clusterAdmins []*redisresp.Pool // one per primary
	current       []*redisresp.Pool // the servers the running configuration uses
}

func run(o options) error {
	started := time.Now()

	if _, err := harness.TraefikBinary(os.Stderr); err != nil {
		return err
	}

	backend, stopBackend, err := harness.ServeBackend("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer stopBackend()

	b := &bench{o: o, backend: backend, ips: clientIPs(o.clients)}

	needRedis, needSentinel, needCluster := false, false, false
	for _, c := range o.only {
		needRedis = needRedis || c.redis
		needSentinel = needSentinel || c.sentinel
		needCluster = needCluster || c.cluster
	}

	if needCluster {
		dir, err := os.MkdirTemp("", "loadbench-cluster-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)

		cl, err := harness.StartCluster(dir, 3, 0)
		if err != nil {
			return fmt.Errorf("starting a Redis Cluster: %w", err)
		}
		defer cl.Kill()

		for _, r := range cl.Primaries {
			clusterAddrs = append(clusterAddrs, r.Addr)

			p := r.Client(redisresp.Options{})
			defer p.Close()

			b.clusterAdmins = append(b.clusterAdmins, p)
		}
	}

	if needRedis {
		dir, err := os.MkdirTemp("", "loadbench-redis-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)

		b.redis, b.redisErr = harness.StartRedis(dir)
		if b.redisErr == nil {
			defer b.redis.Kill()

			b.admin = b.redis.Client(redisresp.Options{})
			defer b.admin.Close()

			if needSentinel {
				sdir := filepath.Join(dir, "sentinel")
				if err := os.MkdirAll(sdir, 0o755); err != nil {
					return err
				}

				sentinel, err := harness.StartSentinel(sdir, "mymaster", b.redis.Addr)
				if err != nil {
					return fmt.Errorf("starting a sentinel: %w", err)
				}
				defer sentinel.Kill()

				sentinelAddr = sentinel.Addr
			}
		} else {
			fmt.Fprintln(os.Stderr, "loadbench: redis-server:", b.redisErr)
		}
	}

	// results[scenario][configuration] holds one result per repetition.
	results := map[string]map[string][]result{}
	for _, s := range scenarios {
		results[s.id] = map[string][]result{}
	}

	total := o.runs * len(scenarios) * len(o.only)
	done := 0

	for rep := 0; rep < o.runs; rep++ {
		for _, s := range scenarios {
			// Rotate the order each repetition so no configuration always runs first.
			for i := range o.only {
				c := o.only[(i+rep)%len(o.only)]
				done++
				fmt.Fprintf(os.Stderr, "[%d/%d] run %d, scenario %s, %-16s ", done, total, rep+1, s.id, c.name)

				r := b.runOne(c, s, rep)
				results[s.id][c.name] = append(results[s.id][c.name], r)

				if r.err != nil {
					fmt.Fprintf(os.Stderr, "error: %s\n", oneLine(r.err.Error(), 200))
				} else {
					fmt.Fprintf(os.Stderr, "%8.0f req/s  p50 %s  p99 %s  %s\n", r.rps, fmtDur(r.p50), fmtDur(r.p99), fmtCodes(r.codes, r.transportErrs))
				}
			}
		}
	}

	report(os.Stdout, b, results, time.Since(started))

	return nil
}

// clientIPs returns n addresses from 198.18.0.0/15 (RFC 2544, benchmarking),
// outside the plugin's default trustedProxies.
func clientIPs(n int) []string {
	ips := make([]string, n)
	for i := range ips {
		v := i + 1
		ips[i] = fmt.Sprintf("198.%d.%d.%d", 18+v>>16, (v>>8)&0xff, v&0xff)
	}

	return ips
}

// result is one measured run.
type result struct {
	err           error
	requests      int64 // sent in the measured phase (each completed or failed)
	elapsed       time.Duration
	rps           float64
	p50, p99      time.Duration
	codes         map[int]int64
	transportErrs int64
	lastErr       string
	dials         int64 // TCP connections opened over warm-up + measurement

	redisMeasured bool
	redisPerReq   float64 // all commands in INFO commandstats (incl. those run inside scripts), minus INFO/CONFIG
	tripsPerReq   float64 // the same without the commands the two scripts run inside Redis
	scriptsPerReq float64 // EVALSHA + EVAL
	redisCmds     string  // the commandstats breakdown, for the notes

	pluginHash string // of the plugin source copied into this run's Traefik

	notes []string
}

func (b *bench) runOne(c configuration, s scenario, rep int) (res result) {
	redisAddr := ""

	if c.redis {
		if b.redisErr != nil {
			return result{err: fmt.Errorf("redis-server: %w", b.redisErr)}
		}

		redisAddr = b.redis.Addr

		b.current = []*redisresp.Pool{b.admin}
		if c.cluster {
			b.current = b.clusterAdmins
		}

		if err := b.redisOK("FLUSHALL"); err != nil {
			return result{err: err}
		}
	}

	dir, err := os.MkdirTemp("", "loadbench-traefik-")
	if err != nil {
		return result{err: err}
	}
	defer os.RemoveAll(dir)

	tr, err := harness.Start(harness.Options{Dir: dir, Dynamic: dynamic(c, s, b.backend, redisAddr),
		Plugins: []harness.LocalPlugin{harness.Passthrough, harness.MinimalLimiter, harness.MinimalEdge, harness.MinimalRedis},
		Debug:   b.o.cpuProfiles != "", PluginSource: c.source})
	if err != nil {
		return result{err: err}
	}

	// harness.Start copies the working tree's plugin for each run: record
	// which source this Traefik loaded, in case it changes during the benchmark.
	hash, hashErr := treeHash(filepath.Join(dir, "plugins-local"))
	if hashErr != nil {
		hash = "unknown (" + hashErr.Error() + ")"
	}

	defer func() { res.pluginHash = hash }()

	defer func() {
		tr.Stop()

		logs := tr.Logs()
		if n := strings.Count(logs, "REDIS_UNAVAILABLE"); n > 0 {
			res.notes = append(res.notes, fmt.Sprintf("plugin logged REDIS_UNAVAILABLE %d times (memory decided during back-off)", n))
		}

		if n := countErrorLines(logs); n > 0 {
			res.notes = append(res.notes, fmt.Sprintf("Traefik logged %d error lines", n))
		}

		if res.err != nil || len(res.notes) > 0 {
			path := filepath.Join(os.TempDir(), fmt.Sprintf("loadbench-%s-%s-run%d.log", c.name, s.id, rep+1))
			if os.WriteFile(path, []byte(logs), 0o644) == nil {
				res.notes = append(res.notes, "Traefik log: "+path)
			}
		}
	}()

	states, err := tr.WaitRouters(30*time.Second, "bench")
	if err != nil {
		return result{err: err}
	}

	if st := states["bench"]; st.Status != "enabled" {
		return result{err: fmt.Errorf("router bench is %q: %s", st.Status, strings.Join(st.Error, "; "))}
	}

	var dials atomic.Int64

	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dialer.DialContext(ctx, network, addr)
		},
		MaxIdleConns:        2 * b.o.concurrency,
		MaxIdleConnsPerHost: 2 * b.o.concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	defer transport.CloseIdleConnections()

	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	url := tr.Web + "/bench"

	if b.o.warmup > 0 {
		w := load(client, url, b.ips, b.o.concurrency, b.o.warmup)
		if w.requests == 0 {
			return result{err: errors.New("no request completed during warm-up")}
		}
	}

	if c.redis {
		if err := b.redisOK("CONFIG", "RESETSTAT"); err != nil {
			return result{err: err}
		}
	}

	profiled := make(chan error, 1)
	if b.o.cpuProfiles != "" {
		path := filepath.Join(b.o.cpuProfiles, fmt.Sprintf("%s-%s-run%d.pprof", c.name, s.id, rep+1))
		go func() { profiled <- cpuProfile(tr.API, path, b.o.duration) }()
	} else {
		profiled <- nil
	}

	res = load(client, url, b.ips, b.o.concurrency, b.o.duration)
	res.dials = dials.Load()

	if err := <-profiled; err != nil {
		res.notes = append(res.notes, "CPU profile: "+err.Error())
	}

	if res.dials > int64(2*b.o.concurrency) {
		res.notes = append(res.notes, fmt.Sprintf("%d TCP connections opened for %d workers (keep-alive not holding)", res.dials, b.o.concurrency))
	}

	if res.requests == 0 {
		res.err = fmt.Errorf("no request completed (last error: %s)", res.lastErr)
		return res
	}

	if c.redis {
		if err := b.commandStats(&res); err != nil {
			res.notes = append(res.notes, "INFO commandstats: "+err.Error())
		}
	}

	return res
}

// redisOK runs a command on every server of the running configuration.
func (b *bench) redisOK(args ...string) error {
	for _, p := range b.current {
		v, err := p.Do(args...)
		if err == nil && v.IsError() {
			err = errors.New(v.Str)
		}

		if err != nil {
			return fmt.Errorf("redis %s: %w", strings.Join(args, " "), err)
		}
	}

	return nil
}

// scriptInner are the commands the rate-limit scripts run inside Redis
// (tierlimit's and the minimal plugin's: PTTL, INCRBY, SET, INCR, GET,
// DECRBY, PEXPIRE, HMGET, HSET, HINCRBY, DEL, TIME; Traefik's: HGETALL,
// HSET, EXPIRE).
// Redis counts them in commandstats like client commands.
var scriptInner = map[string]bool{"set": true, "incr": true, "pttl": true, "pexpire": true, "hgetall": true, "hset": true, "expire": true,
	"get": true, "incrby": true, "decrby": true, "hmget": true, "hincrby": true, "del": true, "time": true}

// commandStats reads INFO commandstats (reset before the measured phase).
func (b *bench) commandStats(res *result) error {
	counts := map[string]int64{}

	// Summed over the configuration's servers (every primary of a cluster).
	for _, p := range b.current {
		v, err := p.Do("INFO", "commandstats")
		if err == nil && v.IsError() {
			err = errors.New(v.Str)
		}

		if err != nil {
			return err
		}

		for _, line := range strings.Split(v.Str, "\r\n") {
			rest, ok := strings.CutPrefix(line, "cmdstat_")
			if !ok {
				continue
			}

			name, fields, ok := strings.Cut(rest, ":")
			if !ok || name == "info" || name == "config" || strings.HasPrefix(name, "config|") {
				continue
			}

			for _, f := range strings.Split(fields, ",") {
				if n, ok := strings.CutPrefix(f, "calls="); ok {
					calls, _ := strconv.ParseInt(n, 10, 64)
					counts[name] += calls
				}
			}
		}
	}

	var all, trips, scripts int64

	var parts []string

	for name, calls := range counts {
		all += calls
		if !scriptInner[name] {
			trips += calls
		}

		if name == "evalsha" || name == "eval" {
			scripts += calls
		}

		parts = append(parts, fmt.Sprintf("%s %.2f", name, float64(calls)/float64(res.requests)))
	}

	sort.Strings(parts)

	n := float64(res.requests)
	res.redisMeasured = true
	res.redisPerReq = float64(all) / n
	res.tripsPerReq = float64(trips) / n
	res.scriptsPerReq = float64(scripts) / n
	res.redisCmds = strings.Join(parts, ", ")
	if res.redisCmds == "" {
		res.redisCmds = "no commands"
	}

	return nil
}

// worker is what one load worker saw.
type worker struct {
	requests int64
	codes    map[int]int64
	errs     int64
	lastErr  string
	lat      []int64 // nanoseconds, successful exchanges only
}

// load runs c closed-loop workers against url for d: each sends a request,
// reads the whole response and sends the next, over keep-alive connections,
// spreading the requests over ips via X-Forwarded-For. A request started
// before the deadline is waited for, and rps divides by the time until the
// last one ended.
func load(client *http.Client, url string, ips []string, c int, d time.Duration) result {
	var (
		wg  sync.WaitGroup
		seq atomic.Uint64
	)

	workers := make([]worker, c)
	start := time.Now()
	deadline := start.Add(d)

	for w := range workers {
		wg.Add(1)

		go func(st *worker) {
			defer wg.Done()

			st.codes = map[int]int64{}
			st.lat = make([]int64, 0, 1<<14)

			for time.Now().Before(deadline) {
				ip := ips[seq.Add(1)%uint64(len(ips))]

				req, err := http.NewRequest(http.MethodGet, url, nil)
				if err != nil {
					st.errs++
					st.lastErr = err.Error()

					continue
				}

				req.Header.Set("X-Forwarded-For", ip)

				t0 := time.Now()
				resp, err := client.Do(req)
				st.requests++

				if err != nil {
					st.errs++
					st.lastErr = err.Error()

					continue
				}

				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()

				if err != nil {
					st.errs++
					st.lastErr = err.Error()

					continue
				}

				st.lat = append(st.lat, int64(time.Since(t0)))
				st.codes[resp.StatusCode]++
			}
		}(&workers[w])
	}

	wg.Wait()

	res := result{elapsed: time.Since(start), codes: map[int]int64{}}

	var lat []int64

	for _, st := range workers {
		res.requests += st.requests
		res.transportErrs += st.errs

		if st.lastErr != "" {
			res.lastErr = st.lastErr
		}

		for code, n := range st.codes {
			res.codes[code] += n
		}

		lat = append(lat, st.lat...)
	}

	res.rps = float64(res.requests) / res.elapsed.Seconds()

	if len(lat) > 0 {
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		res.p50 = time.Duration(lat[percentileIndex(len(lat), 0.50)])
		res.p99 = time.Duration(lat[percentileIndex(len(lat), 0.99)])
	}

	return res
}

// percentileIndex is the nearest-rank index of quantile q in n sorted values.
func percentileIndex(n int, q float64) int {
	i := int(float64(n)*q+0.999999999) - 1
	if i < 0 {
		i = 0
	}

	if i >= n {
		i = n - 1
	}

	return i
}

// countErrorLines counts Traefik's error-level log lines (common format: " ERR ").
func countErrorLines(logs string) int {
	n := 0

	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 64*1024), 1<<20)

	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, " ERR ") || strings.Contains(line, `"level":"error"`) {
			n++
		}
	}

	return n
}

// summary is the medians of one configuration in one scenario.
type summary struct {
	ok       int // successful runs
	errs     []string
	rps      float64
	rpsRuns  []float64
	p50, p99 time.Duration
	codes    map[int]int64 // summed over runs
	transErr int64
	redis    bool
	redisReq float64
	trips    float64
	scripts  float64
	cmds     string // breakdown of the median-throughput run
	notes    []string
}

func summarize(rs []result) summary {
	s := summary{codes: map[int]int64{}}

	var rps, p50, p99, redisReq, trips, scripts []float64

	type ranked struct {
		rps  float64
		cmds string
	}

	var byRPS []ranked

	for _, r := range rs {
		s.notes = append(s.notes, r.notes...)

		if r.err != nil {
			s.errs = append(s.errs, r.err.Error())
			continue
		}

		s.ok++
		rps = append(rps, r.rps)
		s.rpsRuns = append(s.rpsRuns, r.rps)
		p50 = append(p50, float64(r.p50))
		p99 = append(p99, float64(r.p99))
		s.transErr += r.transportErrs

		for code, n := range r.codes {
			s.codes[code] += n
		}

		if r.transportErrs > 0 {
			s.notes = append(s.notes, "transport error: "+r.lastErr)
		}

		if r.redisMeasured {
			s.redis = true
			redisReq = append(redisReq, r.redisPerReq)
			trips = append(trips, r.tripsPerReq)
			scripts = append(scripts, r.scriptsPerReq)
			byRPS = append(byRPS, ranked{r.rps, r.redisCmds})
		}
	}

	if s.ok == 0 {
		return s
	}

	s.rps = median(rps)
	s.p50 = time.Duration(median(p50))
	s.p99 = time.Duration(median(p99))

	if s.redis {
		s.redisReq = median(redisReq)
		s.trips = median(trips)
		s.scripts = median(scripts)

		sort.Slice(byRPS, func(i, j int) bool { return byRPS[i].rps < byRPS[j].rps })
		s.cmds = byRPS[len(byRPS)/2].cmds
	}

	return s
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}

	s := append([]float64(nil), v...)
	sort.Float64s(s)

	if len(s)%2 == 1 {
		return s[len(s)/2]
	}

	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// check says whether the run behaved as its scenario should.
// Without a rate limiter (none) every request must pass in both scenarios.
func check(s summary, scen string, limited bool) string {
	var bad []string

	var total, ok2xx, refused, server int64

	for code, n := range s.codes {
		total += n

		switch {
		case code >= 200 && code < 300:
			ok2xx += n
		case code == http.StatusTooManyRequests:
			refused += n
		case code >= 500:
			server += n
		}
	}

	if server > 0 {
		bad = append(bad, fmt.Sprintf("%d 5xx", server))
	}

	if s.transErr > 0 {
		bad = append(bad, fmt.Sprintf("%d transport errors", s.transErr))
	}

	if !limited {
		scen = "a"
	}

	if scen == "a" && refused > 0 {
		bad = append(bad, fmt.Sprintf("%d 429", refused))
	}

	if scen == "a" && ok2xx != total {
		bad = append(bad, fmt.Sprintf("%d non-2xx", total-ok2xx))
	}

	if scen == "b" && total > 0 && float64(refused) < 0.5*float64(total) {
		bad = append(bad, fmt.Sprintf("only %.1f%% 429", 100*float64(refused)/float64(total)))
	}

	if len(bad) == 0 {
		if scen == "b" && total > 0 {
			return fmt.Sprintf("ok (%.2f%% 429)", 100*float64(refused)/float64(total))
		}

		return "ok"
	}

	return "**" + strings.Join(bad, ", ") + "**"
}

func report(w io.Writer, b *bench, results map[string]map[string][]result, took time.Duration) {
	o := b.o

	fmt.Fprintf(w, "# loadbench: Traefik %s, closed-loop load on loopback\n\n", harness.TraefikVersion)
	fmt.Fprintf(w, "- Command: `%s`\n", commandLine())
	fmt.Fprintf(w, "- Machine: %s\n", machine())
	fmt.Fprintf(w, "- Go %s (load generator and backend in this process, GOMAXPROCS %d); Traefik, redis-server and this process share the machine\n",
		runtime.Version(), runtime.GOMAXPROCS(0))

	if b.redis != nil {
		fmt.Fprintf(w, "- %s, on %s (flushed before each run; CONFIG RESETSTAT after warm-up)\n", redisVersion(), b.redis.Addr)
	}

	fmt.Fprintf(w, "- Load: %d workers, keep-alive HTTP/1.1 (one http.Transport, MaxIdleConnsPerHost %d), GET /bench, X-Forwarded-For spread round-robin over %d client IPs from 198.18.0.0/15\n",
		o.concurrency, 2*o.concurrency, o.clients)
	fmt.Fprintf(w, "- Each run: fresh Traefik, %s warm-up (not counted), then %s measured; %d run(s) per configuration and scenario, configurations alternated; figures are medians over runs\n",
		o.warmup, o.duration, o.runs)
	fmt.Fprintf(w, "- Plugin source: %s at the end; %s\n", gitState(), pluginVersions(results))
	if b.o.baseline != "" {
		fmt.Fprintf(w, "- Baseline: every tierlimit-* configuration also ran as <name>@%s, on the plugin at that revision (`git archive`), alternated with the working tree's\n", b.o.baseline)
	}
	fmt.Fprintf(w, "- Total time: %s\n\n", took.Round(time.Second))

	for _, s := range scenarios {
		fmt.Fprintf(w, "## Scenario %s\n\n", s.title)
		fmt.Fprintln(w, "| configuration | req/s | req/s per run | p50 | p99 | % of none | vs built-in | statuses (all runs) | Redis cmds/req | round trips/req | scripts/req | check |")
		fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---|")

		sums := map[string]summary{}
		for _, c := range b.o.only {
			sums[c.name] = summarize(results[s.id][c.name])
		}

		var notes []string

		for _, c := range b.o.only {
			sm := sums[c.name]

			for _, n := range sm.notes {
				notes = append(notes, c.name+": "+n)
			}

			if sm.ok == 0 {
				msg := "no runs"
				if len(sm.errs) > 0 {
					msg = sm.errs[0]
				}

				fmt.Fprintf(w, "| %s | – | – | – | – | – | – | – | – | – | – | **error: %s** |\n", c.name, cell(msg, 400))

				continue
			}

			var runs []string
			for _, r := range sm.rpsRuns {
				runs = append(runs, fmt.Sprintf("%.0f", r))
			}

			ofNone := "–"
			if n, ok := sums["none"]; ok && n.ok > 0 && c.name != "none" {
				ofNone = fmt.Sprintf("%.1f%%", 100*sm.rps/n.rps)
			}

			vsBuiltin := "–"
			if peer := builtinPeer(c.name); peer != "" {
				if bi, ok := sums[peer]; ok && bi.ok > 0 {
					vsBuiltin = fmt.Sprintf("%.1f%%", 100*sm.rps/bi.rps)
				}
			}

			redisReq, trips, scripts := "–", "–", "–"
			if sm.redis {
				redisReq = fmt.Sprintf("%.2f", sm.redisReq)
				trips = fmt.Sprintf("%.3f", sm.trips)
				scripts = fmt.Sprintf("%.3f", sm.scripts)
				notes = append(notes, fmt.Sprintf("%s: commandstats per request (median run): %s", c.name, sm.cmds))
			}

			chk := check(sm, s.id, c.middleware != nil)
			if len(sm.errs) > 0 {
				chk += fmt.Sprintf(" **%d run(s) failed: %s**", len(sm.errs), cell(sm.errs[0], 300))
			}

			fmt.Fprintf(w, "| %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				c.name, sm.rps, strings.Join(runs, " / "), fmtDur(sm.p50), fmtDur(sm.p99), ofNone, vsBuiltin,
				fmtCodes(sm.codes, sm.transErr), redisReq, trips, scripts, chk)
		}

		fmt.Fprintln(w)

		// Machine noise drifts over minutes; runs of the same repetition are
		// close in time, so their ratios show how stable the comparison is.
		for _, pair := range [][2]string{{"tierlimit-memory", "builtin-memory"}, {"tierlimit-redis", "builtin-redis"},
			{"minimal-redis", "builtin-redis"}, {"tierlimit-redis", "minimal-redis"}, {"tierlimit-redis-sync", "tierlimit-memory"},
			{"tierlimit-cluster", "builtin-cluster"}, {"tierlimit-cluster-sync", "tierlimit-redis-sync"}} {
			ours, theirs := results[s.id][pair[0]], results[s.id][pair[1]]

			var ratios []string

			for i := 0; i < len(ours) && i < len(theirs); i++ {
				if ours[i].err == nil && theirs[i].err == nil && theirs[i].rps > 0 {
					ratios = append(ratios, fmt.Sprintf("%.1f%%", 100*ours[i].rps/theirs[i].rps))
				}
			}

			if len(ratios) > 1 {
				notes = append(notes, fmt.Sprintf("%s / %s throughput per repetition: %s", pair[0], pair[1], strings.Join(ratios, ", ")))
			}
		}

		if len(notes) > 0 {
			for _, n := range notes {
				fmt.Fprintf(w, "- %s\n", n)
			}

			fmt.Fprintln(w)
		}
	}

	fmt.Fprintln(w, "Columns: req/s = requests completed per second of the measured phase; p50/p99 = latency of one exchange as the load")
	fmt.Fprintln(w, "generator sees it (send to end of body); % of none and vs built-in (tierlimit-X / builtin-X) compare medians of this")
	fmt.Fprintln(w, "invocation; Redis cmds/req = all calls in INFO commandstats (minus INFO and CONFIG) per request sent, which counts the")
	fmt.Fprintln(w, "commands run inside the Lua scripts too; round trips/req = the same without the scripts' inner commands (scriptInner:")
	fmt.Fprintln(w, "PTTL, INCRBY, SET, GET, ..., HGETALL, HSET, EXPIRE); scripts/req = EVALSHA + EVAL.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Middleware configurations (under http.middlewares.limit; the router uses no middleware for none):")
	fmt.Fprintln(w)

	for _, s := range scenarios {
		for _, c := range b.o.only {
			if c.middleware == nil {
				continue
			}

			addr := "<redis>"
			if b.redis != nil {
				addr = b.redis.Addr
			}

			fmt.Fprintf(w, "```yaml\n# %s, scenario %s\n%s```\n\n", c.name, s.id, c.middleware(s, addr))
		}
	}
}

func fmtDur(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}

	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

func fmtCodes(codes map[int]int64, transportErrs int64) string {
	keys := make([]int, 0, len(codes))
	for k := range codes {
		keys = append(keys, k)
	}

	sort.Ints(keys)

	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d: %d", k, codes[k]))
	}

	if transportErrs > 0 {
		parts = append(parts, fmt.Sprintf("errors: %d", transportErrs))
	}

	if len(parts) == 0 {
		return "none"
	}

	return strings.Join(parts, ", ")
}

// cell makes s safe for one Markdown table cell.
func cell(s string, max int) string {
	return strings.ReplaceAll(oneLine(s, max), "|", `\|`)
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max] + "…"
	}

	return s
}

func commandLine() string {
	args := make([]string, 0, len(os.Args))
	for _, a := range os.Args[1:] {
		args = append(args, shellQuote(a))
	}

	prog := os.Args[0]
	// go run builds into a temporary go-build directory.
	if strings.Contains(prog, "go-build") || strings.HasPrefix(prog, os.TempDir()) {
		prog = "go run ./cmd/loadbench"
	}

	return strings.TrimSpace(prog + " " + strings.Join(args, " "))
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=,:@+", r))
	}) < 0 {
		return s
	}

	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func machine() string {
	model := "unknown CPU"
	processors := 0

	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			key, val, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}

			switch strings.TrimSpace(key) {
			case "model name":
				if model == "unknown CPU" {
					model = strings.TrimSpace(val)
				}
			case "processor":
				processors++
			}
		}
	}

	return fmt.Sprintf("%s, %d logical CPUs in /proc/cpuinfo (runtime.NumCPU %d), %s/%s", model, processors, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
}

func redisVersion() string {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		return "redis-server (version unknown)"
	}

	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return "redis-server " + v
		}
	}

	return strings.TrimSpace(string(out))
}

// treeHash is a short SHA-256 of every file under root (paths and contents).
func treeHash(root string) (string, error) {
	h := sha256.New()

	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}

		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}

		rel, _ := filepath.Rel(root, path)
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.ToSlash(rel), len(data))
		h.Write(data)

		return nil
	})
	if err != nil {
		return "", err
	}

	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// gitState describes the plugin repository's checkout (read-only git commands).
func gitState() string {
	root := harness.RepoRoot()

	head, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "git state unknown"
	}

	state := "HEAD " + strings.TrimSpace(string(head))

	out, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output()
	if err == nil {
		var dirty []string

		for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if len(line) > 3 {
				dirty = append(dirty, strings.TrimSpace(line[3:]))
			}
		}

		if len(dirty) > 0 {
			state += ", uncommitted changes to " + strings.Join(dirty, " ")
		} else {
			state += ", no uncommitted changes to tracked files"
		}
	}

	return state
}

// pluginVersions says which plugin sources the runs loaded (harness.Start
// copies the working tree each time, so concurrent edits would show here).
func pluginVersions(results map[string]map[string][]result) string {
	runs := map[string][]string{}

	var order []string

	for _, sc := range scenarios {
		for name, rs := range results[sc.id] {
			// A -baseline run loads another source on purpose.
			if !strings.HasPrefix(name, "tierlimit-") || strings.Contains(name, "@") {
				continue
			}

			for i, r := range rs {
				if r.pluginHash == "" {
					continue
				}

				if _, ok := runs[r.pluginHash]; !ok {
					order = append(order, r.pluginHash)
				}

				runs[r.pluginHash] = append(runs[r.pluginHash], fmt.Sprintf("%s/%s/run%d", name, sc.id, i+1))
			}
		}
	}

	switch len(order) {
	case 0:
		return "no plugin run"
	case 1:
		return "every plugin run loaded the same source (sha256 " + order[0] + ")"
	}

	sort.Strings(order)

	var parts []string
	for _, h := range order {
		sort.Strings(runs[h])
		parts = append(parts, fmt.Sprintf("%s: %s", h, strings.Join(runs[h], " ")))
	}

	return fmt.Sprintf("**the plugin source changed during the benchmark** (%d versions; sha256 by run: %s)", len(order), strings.Join(parts, "; "))
}

// cpuProfile writes Traefik's CPU profile over the next d (whole seconds,
// at least one) to path.
func cpuProfile(api, path string, d time.Duration) error {
	secs := int(d / time.Second)
	if secs < 1 {
		secs = 1
	}

	client := &http.Client{Timeout: d + 30*time.Second}

	resp, err := client.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", api, secs))
	if err != nil {
		return fmt.Errorf("fetching the profile: %w", err)
	}
	defer resp.Body.Close()

	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching the profile: status %s", resp.Status)
	}

	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("writing the profile: %w", err)
	}

	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing the profile: %w", err)
	}

	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("writing the profile: %w", err)
	}

	return f.Close()
}
