package main

import (
	"fmt"
	"strings"
)

// perK is n per 1,000 requests.
func perK(n float64, r *simResult) float64 {
	if r.Requests == 0 {
		return 0
	}

	return n * 1000 / float64(r.Requests)
}

func perS(n float64, r *simResult) float64 {
	return n / r.Elapsed
}

// heapPerKey is the replicas' heap growth over the keys they hold.
func heapPerKey(r *simResult) string {
	if r.ReplicaKeys == 0 {
		return "–"
	}

	return fmt.Sprintf("%d", r.HeapDelta/r.ReplicaKeys)
}

func rateName(rate float64) string {
	if rate == 0 {
		return "max"
	}

	return fmt.Sprintf("%.0f", rate)
}

const header = "| Redis | counting | replicas | keys | limit | keys requested | target req/s | req/s | replica-keys/s | max admitted/points | fill, refused keys | fill, flooded keys | script calls/s | commands/s | round trips/s | scripts /1k req | commands /1k req | round trips /1k req | Redis CPU ms /1k req | Redis CPU (cores) | sim CPU ms /1k req | heap B/key/replica | outages |\n" +
	"|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"

// row is one result as a table row.
func row(r *simResult) string {
	c, d := r.Config, r.Redis
	over := fmt.Sprintf("%.2f", r.MaxFill)
	if r.Over > 0 {
		over = fmt.Sprintf("**%.2f (%d over)**", r.MaxFill, r.Over)
	}

	return fmt.Sprintf("| %s | %s | %d | %d | %d/%s | %d | %s | %.0f | %.0f | %s | %.2f | %.2f | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f | %s | %d |",
		c.Deployment, c.Mode, c.Replicas, c.Keys, c.Points, c.Window, r.Touched, rateName(c.Rate), perS(float64(r.Requests), r), perS(float64(r.ReplicaKeyWindows), r), over, r.HotFillMean, r.FloodFillMean,
		perS(float64(d.Scripts), r), perS(float64(d.Commands), r), perS(float64(d.RoundTrips), r),
		perK(float64(d.Scripts), r), perK(float64(d.Commands), r), perK(float64(d.RoundTrips), r),
		perK(d.CPU*1000, r), d.CPU/r.Elapsed, perK(r.ClientCPU*1000, r), heapPerKey(r), r.Outages)
}

// table is the results as a markdown table, with what the columns mean.
func table(results []*simResult, proto simConfig) string {
	var b strings.Builder

	fmt.Fprintf(&b, "ip layer: %d points per %s; Zipf s = %.2f; %d workers; %s of load per configuration; syncInterval %s (synced)\n\n",
		proto.Points, proto.Window, proto.Zipf, proto.Workers, proto.Duration, proto.SyncInterval)
	b.WriteString(header)

	for _, r := range results {
		b.WriteString(row(r))
		b.WriteString("\n")
	}

	return b.String()
}
