// Command demo runs the plugin for real: Traefik v3.6.12 with the plugin in
// local mode on the memory store, the repository's dynamic.yml, a demo backend,
// and a short burst that shows 200s turning into 429s. Run it with `make demo`.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/e2e/harness"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	dynamic, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "dynamic.yml"))
	if err != nil {
		return err
	}

	_, stopBackend, err := harness.ServeBackend("127.0.0.1:8001")
	if err != nil {
		return fmt.Errorf("%w (dynamic.yml points the demo at this port)", err)
	}
	defer stopBackend()

	dir, err := os.MkdirTemp("", "tierlimit-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	tr, err := harness.Start(harness.Options{Dir: dir, Dynamic: string(dynamic), BuildLog: os.Stderr})
	if err != nil {
		return err
	}
	defer tr.Stop()

	states, err := tr.WaitRouters(30*time.Second, "demo")
	if err != nil {
		return err
	}

	if s := states["demo"]; s.Status != "enabled" {
		return fmt.Errorf("router demo is %s: %v", s.Status, s.Error)
	}

	fmt.Printf("\nTraefik %s is serving %s with the tierlimit plugin (local mode, memory store).\n", harness.TraefikVersion, tr.Web)
	fmt.Println("dynamic.yml: ip 5 per 10s, POST /auth/login 3 per 60s per client IP.")

	fmt.Println("\n== 7 requests from one client (ip layer: 5 per 10s)")
	for i := 0; i < 7; i++ {
		show(http.MethodGet, tr.Web+"/api/items", "198.51.100.7")
	}

	fmt.Println("\n== another client behind the same trusted proxy has its own bucket")
	show(http.MethodGet, tr.Web+"/api/items", "198.51.100.8")

	fmt.Println("\n== 4 logins from a third client (route auth_login: 3 per 60s)")
	for i := 0; i < 4; i++ {
		show(http.MethodPost, tr.Web+"/auth/login", "198.51.100.9")
	}

	time.Sleep(200 * time.Millisecond) // let Traefik flush its log before we read it
	fmt.Println("\n== security events Traefik logged (one per layer, key and window)")
	sc := bufio.NewScanner(strings.NewReader(tr.Logs()))
	for sc.Scan() {
		if line := sc.Text(); strings.Contains(line, "RATE_LIMIT_TRIGGERED") {
			fmt.Println("  " + line[strings.Index(line, "{"):])
		}
	}

	fmt.Println("\n== who is limited right now: GET /_ratelimit?limited=true (status endpoint, from loopback)")
	if err := showStatus(tr.Web + "/_ratelimit?limited=true"); err != nil {
		fmt.Println("  error:", err)
	}

	fmt.Println("\nStopping Traefik and the backend.")

	return nil
}

// showStatus prints the status endpoint's limited keys, one per line.
func showStatus(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()

	var status struct {
		Keys struct {
			Items []struct {
				Layer string `json:"layer"`
				Key   string `json:"key"`
				Count int64  `json:"count"`
				Limit int64  `json:"limit"`
				Reset string `json:"reset"`
			} `json:"items"`
		} `json:"keys"`
	}

	if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
		return fmt.Errorf("decoding the status (HTTP %d): %w", resp.StatusCode, err)
	}

	for _, k := range status.Keys.Items {
		fmt.Printf("  layer %-10s key %-13s count %d of %d, resets %s\n", k.Layer, k.Key, k.Count, k.Limit, k.Reset)
	}

	return nil
}

// show sends one request as client (forwarded by the trusted loopback proxy)
// and prints the status and rate-limit headers.
func show(method, url, client string) {
	req, _ := http.NewRequest(method, url, nil)
	req.Header.Set("X-Forwarded-For", client)

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println("  error:", err)
		return
	}
	defer resp.Body.Close()

	body, _ := io.ReadAll(resp.Body)
	h := resp.Header

	fmt.Printf("  %-4s %-12s from %-13s -> %d  X-RateLimit-Limit=%s Remaining=%s Reset=%s  RateLimit: %s",
		method, req.URL.Path, client, resp.StatusCode,
		h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"), h.Get("RateLimit"))

	if resp.StatusCode == http.StatusTooManyRequests {
		fmt.Printf("  Retry-After=%s\n       %s", h.Get("Retry-After"), strings.TrimSpace(string(body)))
	}

	fmt.Println()
}
