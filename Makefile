# make demo: Traefik with the plugin in local mode, a demo backend, a short burst.
# make test: every test (unit tests with -race, then the real-Traefik tests).
# make unit: the fast loop: root module tests (the scripts on a redis-server they start: it must be installed),
#   then the Lua script and RESP client against miniredis (e2e/storetest) and the check that paths_gen.go
#   is what paths.tmpl makes.
# make generate: paths_gen.go, memstore/take_gen.go, rule/allow_gen.go and redisstore/reply_gen.go from paths.tmpl.
# make kube: kube-apiserver and kine for the Kubernetes e2e test, built once into e2e/.cache.
# make config-check: the configuration check (cmd/tierlimit-check) on dynamic.yml and every example, and its tests.
GO ?= go
TRAEFIK := e2e/.cache/traefik-v3.6.12
# The Kubernetes e2e test's API server and its storage (e2e/harness/kube.go).
KUBE_APISERVER := e2e/.cache/kube-apiserver-v1.34.4
KINE_VERSION := v0.17.5
KINE := e2e/.cache/kine-$(KINE_VERSION)
# Pinned; fetched from the Go module proxy by go run, so a fresh machine needs nothing installed.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: prereq test unit fuzz e2e dashboard demo traefik kube vendor-check catalog-check config-check bench generate

test: prereq vendor-check catalog-check config-check unit fuzz dashboard e2e

# Go, gcc (for -race) and redis-server, checked before any test: installed with apt-get as root
# (CI, containers), else a stop within seconds with the command to run (.ci/prereq).
prereq:
	@GO=$(GO) sh .ci/prereq

unit: prereq
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^vendor/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^vendor/'); echo 'gofmt: files above need formatting'; exit 1; }
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run 'TestCanonicalPathFastPath' ./request
	cd e2e && $(GO) vet ./storetest ./cmd/genpaths && $(GO) test -race -count=1 ./storetest ./cmd/genpaths

# paths_gen.go, memstore/take_gen.go, rule/allow_gen.go and redisstore/reply_gen.go, the request path, from its template
# paths.tmpl (doc.go: generated paths).
generate:
	cd e2e && $(GO) run ./cmd/genpaths -root ..

# Short runs of the RESP reply, canonical path and configuration fuzzers on top of their seed corpora (which
# `unit` and `e2e` run); the configuration fuzzer (e2e/configfuzz) is New under Traefik's decoding.
# Counted in executions, not seconds: a duration races Go's fuzz coordinator at its deadline and fails
# with a bare "context deadline exceeded" on a loaded machine (go.dev/issue/75804, fixed in Go 1.27).
# The configuration fuzzer minimises each new input in 10 runs at most: minimising takes up to a minute
# each by default, uncounted, where a clean run finds hundreds of new inputs.
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzReadReply -fuzztime=150000x ./redisresp
	$(GO) test -run='^$$' -fuzz=FuzzCanonicalPath -fuzztime=100000x ./request
	cd e2e && $(GO) test -run='^$$' -fuzz=FuzzNewNeverPanics -fuzztime=150000x -fuzzminimizetime=10x ./configfuzz

# The e2e tests start redis-server themselves: prereq checks that it is installed.
# e2e/sdk (the official LLM SDKs' tests, a module of its own: see e2e/sdk/doc.go) runs the same Traefik binary.
# kube-apiserver and kine are built first, so that no test's timeout counts their build.
e2e: prereq $(TRAEFIK) $(KUBE_APISERVER) $(KINE)
	cd e2e && $(GO) vet ./...
	cd e2e && $(GO) run $(STATICCHECK) ./...
	cd e2e && $(GO) test -count=1 -timeout 20m ./...
	cd e2e/sdk && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./... && $(GO) test -count=1 ./...

# The check users run before a reload (cmd/tierlimit-check, a module of its own: it needs Traefik),
# its tests, and the check itself on dynamic.yml, docker-compose.yml and every example.
config-check:
	cd cmd/tierlimit-check && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./... && $(GO) test -count=1 ./...
	cd cmd/tierlimit-check && $(GO) run . ../../dynamic.yml ../../docker-compose.yml ../../examples

# examples/grafana's PromQL against the metrics the plugin exports (a module of its own: see e2e/dashboard/doc.go).
dashboard:
	cd e2e/dashboard && $(GO) vet ./... && $(GO) test -count=1 ./...

# Figures for BENCHMARKS.md: compiled cost; under Yaegi (Traefik's loader, in
# process) the ratios to the minimal limiters side by side, the allocation
# budgets, cost and memory; the real Traefik binary under load. Several minutes.
bench: $(TRAEFIK)
	@echo '== compiled: go test -run ^$$ -bench . -benchmem -count 5 .'
	$(GO) test -run '^$$' -bench . -benchmem -count 5 .
	@echo '== Yaegi (Traefik loader, in process): ratios, allocation budgets, cost and memory'
	cd e2e && $(GO) test -count=1 -run '^$$' -bench 'RatioTable|RedisTable|CostTable' -benchtime 1x ./yaegibench 2>/dev/null | grep -v RATE_LIMIT_TRIGGERED
	cd e2e && $(GO) test -count=1 -v -run TestAllocationBudgets ./yaegibench 2>/dev/null | grep -v RATE_LIMIT_TRIGGERED
	@# A process of its own: the million keys it holds would slow the garbage collector of the timed tables.
	cd e2e && $(GO) test -count=1 -run '^$$' -bench 'MemoryTable' -benchtime 1x ./yaegibench 2>/dev/null | grep -v RATE_LIMIT_TRIGGERED
	@echo '== real Traefik under load'
	cd e2e && $(GO) run ./cmd/loadbench

demo: $(TRAEFIK)
	cd e2e && $(GO) run ./cmd/demo

traefik: $(TRAEFIK)

# Built once from the Go module proxy (e2e/go.mod pins the version); git-ignored.
$(TRAEFIK):
	cd e2e && $(GO) build -o .cache/traefik-v3.6.12.tmp github.com/traefik/traefik/v3/cmd/traefik
	mv $(TRAEFIK).tmp $(TRAEFIK)

kube: $(KUBE_APISERVER) $(KINE)

# kube-apiserver from the Go module proxy (e2e/kube/apiserver, a module of its own, pins
# k8s.io/kubernetes and its staging modules); kine (etcd's API on SQLite, cgo) by go install.
# Built once into e2e/.cache (git-ignored); the harness builds them too when they are missing.
$(KUBE_APISERVER):
	mkdir -p e2e/.cache
	cd e2e/kube/apiserver && $(GO) build -o ../../.cache/kube-apiserver-v1.34.4.tmp k8s.io/kubernetes/cmd/kube-apiserver
	mv $(KUBE_APISERVER).tmp $(KUBE_APISERVER)

# kine's go.mod asks for Go 1.26.5: an older go fetches that toolchain itself (GOTOOLCHAIN=auto).
$(KINE):
	mkdir -p e2e/.cache
	rm -rf $(KINE).tmpdir
	GOBIN=$(CURDIR)/$(KINE).tmpdir CGO_ENABLED=1 $(GO) install github.com/k3s-io/kine@$(KINE_VERSION)
	mv $(KINE).tmpdir/kine $(KINE)
	rmdir $(KINE).tmpdir

# What the plugin catalog checks before it lists the plugin: .traefik.yml, go.mod, vendor/, and
# the module as the Go proxy zips it loaded by Traefik's Yaegi loader with testData (e2e/cmd/catalogcheck).
catalog-check:
	cd e2e && $(GO) run ./cmd/catalogcheck -root ..

# The catalog loads dependencies from vendor/ only: it must match go.mod.
vendor-check:
	$(GO) mod verify
	@rm -rf .vendor-check && $(GO) mod vendor -o .vendor-check 2>/dev/null; \
	if [ -d .vendor-check ] || [ -d vendor ]; then diff -r vendor .vendor-check || { rm -rf .vendor-check; echo 'vendor/ is out of date: run go mod vendor'; exit 1; }; fi; \
	rm -rf .vendor-check
