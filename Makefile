# The two set-up commands of the README are `make run` and `make test`; both
# find (or, as root on Debian/Ubuntu, install) the PostgreSQL binaries first.
SHELL := /bin/bash
GO ?= go
BIN := bin
# Extra flags for the server, e.g. make run ARGS="--listen :9090".
ARGS ?=
# Extra flags for the benchmark, e.g. make bench BENCH_ARGS="-concurrency-list 32 -runs 5".
BENCH_ARGS ?=
CEILING ?= ../shared/bench/db-ceiling.sh
# How long make fuzz explores each fuzz target, e.g. make fuzz FUZZTIME=1m.
FUZZTIME ?= 5s
# How long one package's tests may run in make test. internal/cilium runs
# its scenarios against real API servers one after the other: about 8
# minutes on two quiet cores, over go test's default of 10 on a loaded
# machine.
TEST_TIMEOUT ?= 30m

.PHONY: run test bench generate lint lint-api build postgres tools check-generated check-schema schema fuzz manifests nodejs

postgres:
	@scripts/ensure-postgres.sh >/dev/null

# The README tour test runs curl and the CNI end-to-end test ip (iproute2);
# install them like PostgreSQL when missing. The alert rules test runs
# promtool, unpacked into .tools/bin from Debian's package when missing.
# The Kubernetes controller tests run a real kube-apiserver and etcd, built
# from tools/kube into ~/.cache/ipam-tools (scripts/ensure-kube.sh): a cold
# build takes 15-40 minutes on two cores, and is cached across runs and
# checkouts. The failover tests run pg_auto_failover, installed like
# PostgreSQL from Debian's packages (scripts/ensure-pg-auto-failover.sh).
# The Helm chart's tests run helm, built like kube-apiserver from tools/helm
# (scripts/ensure-helm.sh, a few minutes cold). The web view's browser test
# drives Debian's headless Chromium (scripts/ensure-chromium.sh).
tools:
	@{ command -v curl >/dev/null && command -v ip >/dev/null; } || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl ca-certificates iproute2 >&2; } || \
		{ echo "curl or ip is missing: sudo apt-get install -y curl iproute2"; exit 1; }
	@scripts/ensure-promtool.sh >/dev/null
	@scripts/ensure-kube.sh >/dev/null
	@scripts/ensure-pg-auto-failover.sh >/dev/null
	@scripts/ensure-helm.sh >/dev/null
	@scripts/ensure-chromium.sh >/dev/null

build:
	@GO=$(GO) scripts/build-progress.sh $(BIN)/ipam-server ./cmd/server
	@$(GO) build -o $(BIN)/ipamctl ./cmd/ipamctl && echo "build: built $(BIN)/ipamctl (the command-line client, docs/ipamctl.md)" >&2

## run: serve the API on :8080 over plain HTTP for local development (loopback callers act as admin; others need a token); without IPAM_DATABASE_URL a private PostgreSQL starts under the data dir it prints
run: postgres build
	$(BIN)/ipam-server serve --insecure-http --dev-no-auth $(ARGS)

## test: every test, against throwaway PostgreSQL clusters; then the fault tests' figures (failover, switchover, restart) and, when one failed, the failures again
# A failing test's logs (a replica's, pg_auto_failover's) can run to
# thousands of lines after its error; the failures are repeated last, so
# the tail of the output, which is what CI shows, names them.
test: postgres tools
	@figures=$$(mktemp); out=$$(mktemp); rc=0; \
		IPAM_TEST_FIGURES=$$figures $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./... 2>&1 | tee $$out; rc=$${PIPESTATUS[0]}; \
		if [ -s $$figures ]; then echo "== figures of the fault tests"; cat $$figures; fi; \
		if [ $$rc != 0 ]; then echo "== the failures again (each line cut at 400 characters)"; \
			grep -E -A2 '^panic: test timed out' $$out; \
			grep -E '^\s*--- FAIL|^FAIL|^\s+[A-Za-z0-9_]+\.go:[0-9]+: ' $$out | grep -v -E '^\s+[a-z_]+\.go:[0-9]+: log of ' | cut -c1-400 | tail -60; fi; \
		rm -f $$figures $$out; exit $$rc

## fuzz: run every fuzz target (func FuzzX in a _test.go file) in turn for FUZZTIME each; a failure leaves its input under testdata/fuzz
fuzz: postgres
	@set -e; for f in $$(git ls-files '*_test.go' | xargs grep -l '^func Fuzz'); do \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$$f"); do \
			echo "== $$t ./$$(dirname "$$f")"; \
			out=$$($(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) "./$$(dirname "$$f")" 2>&1) && echo "$$out" | tail -1 || { \
				echo "$$out"; \
				echo "$$out" | grep -q 'context deadline exceeded' && ! echo "$$out" | grep -q 'Failing input written' || exit 1; \
				echo "== $$t again: the fuzzer hit its own deadline mid-input (slow, database-backed target), which is no finding"; \
				$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) "./$$(dirname "$$f")"; }; \
		done; \
	done

## bench: the server as its own process over mutual TLS: mixed runs at 8/32/64 clients, a hot node and the fill curve (0/100k/550k leases), each mixed and hot-node run followed by the database ceiling, then the Cilium operator phase (5,000 CiliumNodes at once against the kube-apiserver of make tools, two replicas, the leader SIGKILLed) and the LB IPAM phase (5,000 Services, the same); skipped with a message without make tools; about 15-20 minutes on 2 cores
bench: postgres
	$(GO) run ./cmd/ipam-bench -ceiling $(CEILING) $(BENCH_ARGS)

# Node.js and npm, for the TypeScript client (api/typescript) and the API
# checks (api/lint); installed like PostgreSQL when missing.
nodejs:
	@command -v npm >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm >&2; } || \
		{ echo "node and npm are missing: sudo apt-get install -y nodejs npm"; exit 1; }

## generate: regenerate the API code from api/openapi.yaml: the Go server and client (go generate), and the TypeScript client's types and version (api/typescript, openapi-typescript pinned there)
generate: nodejs
	$(GO) generate ./...
	cd api/typescript && npm ci --no-audit --no-fund --loglevel=error && npm run --silent generate

## manifests: render deploy/kubernetes and deploy/cni from the Helm chart deploy/helm/ipam (deploy/helm_test.go fails when they differ from it)
manifests:
	@scripts/ensure-helm.sh >/dev/null
	IPAM_UPDATE_MANIFESTS=1 $(GO) test -count=1 -run '^TestRenderedManifests$$' ./deploy

## check-generated: fail when generated code differs from what is committed
check-generated: generate
	@git diff --exit-code -- api/ || { echo "generated code is stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api/)" || { git status --porcelain -- api/; echo "generate left untracked files"; exit 1; }

## schema: rewrite migrations/schema.sql, the schema the migrations build in one piece (pg_dump of a migrated database, normalised)
schema: postgres
	$(GO) test -count=1 -run '^TestSchemaIsCurrent$$' ./migrations -update

## check-schema: fail when migrations/schema.sql differs from what the migrations build
check-schema: postgres
	@$(GO) test -count=1 -run '^TestSchemaIsCurrent$$' ./migrations || { echo "migrations/schema.sql is stale: run make schema and commit it"; exit 1; }

## lint-api: lint api/openapi.yaml with Redocly's strict rules, and type-check the README tour against a TypeScript client generated by openapi-typescript with its default options (tsc --strict); npm packages pinned in api/lint. Then pack the TypeScript client (api/typescript), install the tarball into a new project and type-check its example and the tour through it there
lint-api: nodejs
	cd api/lint && npm ci --no-audit --no-fund --loglevel=error
	cd api/lint && node_modules/.bin/redocly lint --config redocly.yaml ../openapi.yaml
	@# openapi-typescript with its defaults (and not Redocly's strict configuration above)
	rm -rf api/lint/build && mkdir -p api/lint/build
	cd api/lint/build && ../node_modules/.bin/openapi-typescript ../../openapi.yaml -o ipam.d.ts
	node api/lint/tour.mjs README.md api/openapi.yaml api/lint/build/tour.ts api/lint/build/tour-client.ts
	cd api/lint && node_modules/.bin/tsc -p tsconfig.json
	cd api/typescript && npm ci --no-audit --no-fund --loglevel=error
	api/typescript/scripts/check-package.sh api/lint/build/tour-client.ts

## lint: gofmt, go vet and staticcheck
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt would change:"; echo "$$out"; exit 1; }
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
