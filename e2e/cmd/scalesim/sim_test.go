package main

import (
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

// TestNoKeyIsAdmittedOverItsPoints is the simulation at a small N: four
// replicas of the compiled plugin share a redis-server, then a Redis
// Cluster of three primaries, under the simulation's load (a Zipf law over
// 1,000 client IPs, 30 points per 3s each, eight goroutines as fast as
// the machine serves them) for a second and a half, counting exactly and
// synced. No key admits more than its points in any window, and the load
// does reach the limit (keys are refused), so the check is not vacuous.
func TestNoKeyIsAdmittedOverItsPoints(t *testing.T) {
	dir := t.TempDir()

	single, err := harness.StartRedis(dir)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(single.Kill)

	cluster, err := harness.StartCluster(t.TempDir(), 3, 0)
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(cluster.Kill)

	addrs := map[string][]string{"single": {single.Addr}, "cluster": cluster.Seeds()}

	for _, deployment := range []string{"single", "cluster"} {
		for _, mode := range []string{"exact", "synced"} {
			t.Run(deployment+"/"+mode, func(t *testing.T) {
				c := simConfig{Deployment: deployment, Addrs: addrs[deployment], Mode: mode, Replicas: 4, Keys: 1000,
					Duration: 1500 * time.Millisecond, Workers: 8, Points: 30, Window: 3 * time.Second,
					SyncInterval: 100 * time.Millisecond, Zipf: 1.1, Seed: 1}
				neverOver(t, c, "test-"+deployment+"-"+mode)
			})
		}
	}
}

func neverOver(t *testing.T, c simConfig, base string) {
	t.Helper()

	st := newStats(c.Addrs)
	defer st.close()

	if err := st.flush(); err != nil {
		t.Fatal(err)
	}

	res, err := simulate(c, base)
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("%d requests, %d admitted, %d refused; %d (key, window) pairs, %d with refusals (mean fill %.2f); max admitted/points %.2f",
		res.Requests, res.Admitted, res.Refused, res.KeyWindows, res.HotWindows, res.HotFillMean, res.MaxFill)

	if res.Over > 0 {
		t.Errorf("%d of %d (key, window) pairs admitted more than their %d points: at most %.0f",
			res.Over, res.KeyWindows, c.Points, res.MaxFill*float64(c.Points))
	}

	switch {
	case res.Outages > 0:
		t.Errorf("%d Redis outages: memory decided some requests, which is not what this test checks", res.Outages)
	case res.Other > 0 || res.BadReset > 0:
		t.Errorf("%d answers neither 200 nor 429, %d without a usable X-RateLimit-Reset", res.Other, res.BadReset)
	case res.HotWindows == 0:
		t.Errorf("no key was refused: the load never reached the limit")
	}
}
