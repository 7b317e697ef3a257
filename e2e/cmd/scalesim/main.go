// Command scalesim simulates tierlimit at scale on one machine: N replicas
// of the compiled plugin (tierlimit.New, one instance per replica, each
// with its own counters, leases and Redis connections, as on a Traefik of
// its own) in one process share a real redis-server and a real Redis
// Cluster of three primaries, which it starts. Requests go through each
// replica's ServeHTTP in process, from several goroutines, to a backend
// that answers 200; each is for a client IP drawn from a Zipf law over the
// configuration's keys, and goes to a replica drawn uniformly. The ip layer
// counts them (points per window), exactly (one script call per request)
// or synced (redis.syncInterval).
//
// Each configuration runs in a child process of its own (a clean heap; no
// state of the previous one), against servers flushed before it, and
// reports:
//
//   - never over: the largest admitted/points of any key in any window
//     (admitted counted per key and per window, the window named by the
//     answer's X-RateLimit-Reset), and how far under: the mean
//     admitted/points of the (key, window) pairs that saw a refusal;
//   - Redis's work: script calls, commands (those the scripts ran
//     included) and round trips (reads of a client socket: one call, or a
//     pipeline of them), per second and per 1,000 requests, from INFO
//     deltas over every node, the lease calls made after the load (leases
//     given back) included;
//   - redis-server CPU per 1,000 requests and as a share of one core;
//     this process's CPU per 1,000 requests (the replicas and the load
//     generator: they share the machine's cores with Redis);
//   - the replicas' heap per key (HeapAlloc delta after a GC over the
//     distinct keys each replica saw, summed over replicas).
//
// Run it from e2e/:
//
//	go run ./cmd/scalesim -quick          # a small grid, under a minute
//	nice go run ./cmd/scalesim            # the full grid, about 8 minutes on 2 cores
//
// Flags choose the grid (-replicas, -keys, -modes, -deployments), the load
// (-rate, -duration, -workers, -zipf) and the limit (-points, -window,
// -sync); -sweep and -sweepwindows add the growth-law runs.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

const childEnv = "SCALESIM_CHILD"

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		child(spec)
		return
	}

	var (
		quick       = flag.Bool("quick", false, "a small grid: 1 and 4 replicas, 10^3 and 10^4 keys, 2s per configuration")
		replicas    = flag.String("replicas", "1,4,16,64", "replica counts")
		keys        = flag.String("keys", "1000,10000,100000,1000000", "key counts")
		modes       = flag.String("modes", "exact,synced", "counting modes")
		deployments = flag.String("deployments", "single,cluster", "Redis deployments: single (one redis-server), cluster (three primaries)")
		rate        = flag.Float64("rate", 10000, "requests per second over all replicas; 0: as fast as the machine goes")
		sweep       = flag.String("sweep", "2500,40000,0", "more rates for the growth-law runs (one server, 4 replicas, 10^3 keys); empty: none")
		sweepWindow = flag.String("sweepwindows", "10s", "more windows for the growth-law runs, at -rate")
		duration    = flag.Duration("duration", 4*time.Second, "load per configuration")
		workers     = flag.Int("workers", 32, "goroutines sending requests (clients in flight)")
		points      = flag.Int("points", 150, "the ip layer's points per window")
		window      = flag.Duration("window", 3*time.Second, "the ip layer's duration (whole seconds, at least 3s)")
		syncEvery   = flag.Duration("sync", 100*time.Millisecond, "redis.syncInterval in synced mode")
		zipf        = flag.Float64("zipf", 1.1, "Zipf exponent s (> 1): P(key k) ∝ (1+k)^-s")
		jsonOut     = flag.String("json", "", "also write every result to this file")
	)

	flag.Parse()

	if *quick { // the grid's defaults, where no flag says otherwise
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		quickly := map[string]string{"replicas": "1,4", "keys": "1000,10000", "duration": "2s", "sweep": "", "sweepwindows": ""}

		for name, value := range quickly {
			if !set[name] {
				_ = flag.Set(name, value)
			}
		}
	}

	proto := simConfig{Rate: *rate, Duration: *duration, Workers: *workers, Points: *points, Window: *window,
		SyncInterval: *syncEvery, Zipf: *zipf, Seed: 1}

	grid, err := makeGrid(proto, *deployments, *modes, *replicas, *keys, *sweep, *sweepWindow)
	if err != nil {
		fail(err)
	}

	results, err := runGrid(grid)
	if err != nil {
		fail(err)
	}

	if *jsonOut != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fail(err)
		}
	}

	fmt.Print(table(results, proto))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scalesim:", err)
	os.Exit(1)
}

func ints(list string) ([]int, error) {
	var out []int

	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}

		n, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, err
		}

		out = append(out, int(n))
	}

	return out, nil
}

// makeGrid is every (deployment, mode, keys, replicas) at proto's rate,
// then the growth-law runs: one server, 4 replicas, 10^3 keys, each mode,
// at each sweep rate, then at proto's rate with each sweep window.
func makeGrid(proto simConfig, deployments, modes, replicas, keys, sweep, windows string) ([]simConfig, error) {
	ns, err := ints(replicas)
	if err != nil {
		return nil, err
	}

	ks, err := ints(keys)
	if err != nil {
		return nil, err
	}

	var grid []simConfig

	for _, d := range strings.Split(deployments, ",") {
		for _, m := range strings.Split(modes, ",") {
			for _, k := range ks {
				for _, n := range ns {
					c := proto
					c.Deployment, c.Mode, c.Keys, c.Replicas = d, m, k, n
					grid = append(grid, c)
				}
			}
		}
	}

	rates, err := ints(sweep)
	if err != nil {
		return nil, err
	}

	var spans []time.Duration

	for _, w := range strings.Split(windows, ",") {
		if w = strings.TrimSpace(w); w != "" {
			d, err := time.ParseDuration(w)
			if err != nil {
				return nil, err
			}

			spans = append(spans, d)
		}
	}

	for i := 0; i < len(rates)+len(spans); i++ {
		for _, m := range strings.Split(modes, ",") {
			c := proto
			c.Deployment, c.Mode, c.Keys, c.Replicas = "single", m, 1000, 4
			if i < len(rates) {
				c.Rate = float64(rates[i])
			} else {
				c.Window = spans[i-len(rates)]
			}

			grid = append(grid, c)
		}
	}

	return grid, nil
}

// runGrid starts the deployments the grid needs, then runs each
// configuration in a child process against them, flushed.
func runGrid(grid []simConfig) ([]*simResult, error) {
	dir, err := os.MkdirTemp("", "scalesim")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	addrs := map[string][]string{}

	for _, c := range grid {
		if addrs[c.Deployment] != nil {
			continue
		}

		seeds, stop, err := startDeployment(dir, c.Deployment)
		if err != nil {
			return nil, err
		}
		defer stop()

		addrs[c.Deployment] = seeds
	}

	var results []*simResult

	for i, c := range grid {
		c.Addrs = addrs[c.Deployment]

		st := newStats(c.Addrs)
		err := st.flush()
		st.close()

		if err != nil {
			return nil, err
		}

		res, err := runChild(c)
		if err != nil {
			return nil, fmt.Errorf("%s %s %d replicas %d keys: %w", c.Deployment, c.Mode, c.Replicas, c.Keys, err)
		}

		fmt.Fprintf(os.Stderr, "[%d/%d] %s\n", i+1, len(grid), row(res))
		results = append(results, res)
	}

	return results, nil
}

func startDeployment(dir, deployment string) ([]string, func(), error) {
	dir += "/" + deployment
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}

	switch deployment {
	case "single":
		r, err := harness.StartRedis(dir)
		if err != nil {
			return nil, nil, err
		}

		return []string{r.Addr}, r.Kill, nil
	case "cluster":
		c, err := harness.StartCluster(dir, 3, 0)
		if err != nil {
			return nil, nil, err
		}

		return c.Seeds(), c.Kill, nil
	}

	return nil, nil, fmt.Errorf("unknown deployment %q", deployment)
}

// runChild runs c in a child process: this program with c in childEnv.
func runChild(c simConfig) (*simResult, error) {
	spec, _ := json.Marshal(c)

	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}

	var out bytes.Buffer

	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = &out, os.Stderr

	if err := cmd.Run(); err != nil {
		return nil, err
	}

	res := &simResult{}
	if err := json.Unmarshal(out.Bytes(), res); err != nil {
		return nil, fmt.Errorf("child's result %q: %w", out.String(), err)
	}

	return res, nil
}

func child(spec string) {
	var c simConfig
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		fail(err)
	}

	res, err := simulate(c, "sim")
	if err != nil {
		fail(err)
	}

	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fail(err)
	}
}
