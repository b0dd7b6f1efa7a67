# Outpost build, test and lab entry points. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO        ?= go
OUT       := $(CURDIR)/_out
TOOLS     := $(OUT)/tools
# RELEASE is this tree's release, the newest heading of shared/version/CHANGELOG.md. A build reports it, or what
# `git describe` says past its tag (v0.3.0-4-gabc1234) when the tag is present; a clone without tags gets RELEASE.
RELEASE   := $(shell sed -n 's/^## \(v[0-9][^ ]*\).*/\1/p' shared/version/CHANGELOG.md | head -n 1)
VERSION   ?= $(shell git describe --tags --match '$(RELEASE)' --dirty 2>/dev/null || echo $(RELEASE))
LDFLAGS   := -s -w -X github.com/outpost-metal/outpost/shared/version.stamped=$(VERSION)
FUZZTIME  ?= 30s
BENCHTIME ?= 1s
TEST_TIMEOUT ?= 60m
# The lab's Omni for `make e2e` and `make demo`: real (a real Omni v1.9.3, built once into _out/omni) or standin.
# Unset, the demo uses the real one and the e2e test runs both (all against the real one, then the stand-in for
# what only it can show).
OMNI ?=
export CGO_ENABLED ?= 0

PROTOS := $(shell find shared controller edge qemu -name '*.proto' -not -path '*/_out/*' 2>/dev/null | sort)

.PHONY: help
help: ## this list
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: build
build: ## build the controller and edge binaries into _out/bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(OUT)/bin/ ./controller ./edge

.PHONY: version
version: ## print the version a build of this tree reports (VERSION overrides it)
	@echo $(VERSION)

.PHONY: image
image: build ## the edge appliance (Talos extension, OCI image, patch) and the controller (OCI image, systemd unit, Kubernetes manifest) under _out/image (MKIMAGE_* env)
	$(GO) run ./image/cmd/mkimage -edge $(OUT)/bin/edge -controller-binary $(OUT)/bin/controller -out $(OUT)/image -version $(VERSION) \
		-ipxe-dir "$$(hack/ipxe.sh)" -vmedia-loader "$$(hack/vmedia-loader.sh)"

.PHONY: deps
deps: ## install the Debian packages the tests and the lab need (root; skipped with a reason otherwise)
	hack/deps.sh

.PHONY: ipxe
ipxe: ## Debian's iPXE for every firmware the edge serves (BIOS, x86 and arm64 UEFI), cached under _out/ipxe/<suite> (never committed)
	hack/ipxe.sh

$(TOOLS)/.stamp: hack/tools/go.mod hack/tools/go.sum
	cd hack/tools && $(GO) build -o $(TOOLS)/ tool
	touch $@

.PHONY: tools
tools: $(TOOLS)/.stamp ## build the pinned tools (protoc plugins, golangci-lint, gotestsum, deadcode) into _out/tools

.PHONY: generate
generate: tools ## regenerate protobuf code with the pinned generators
	@command -v protoc >/dev/null || { echo "protoc missing: run 'make deps' (Debian protobuf-compiler)"; exit 1; }
	PATH="$(TOOLS):$$PATH" protoc -I . \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		$(PROTOS)

.PHONY: check-dirty
check-dirty: generate ## fail when generated code or go.mod differ from what is committed
	$(GO) mod tidy -diff
	@if [ -n "$$(git status --porcelain -- $(PROTOS:.proto=.pb.go) $(PROTOS:.proto=_grpc.pb.go))" ]; then \
		git status --porcelain; git diff | head -50; echo "generated code is stale: run 'make generate' and commit"; exit 1; fi

.PHONY: lint
lint: tools ## golangci-lint (pinned) and the dead-code check (hack/deadcode.sh)
	$(TOOLS)/golangci-lint run ./...
	hack/deadcode.sh $(TOOLS)/deadcode

.PHONY: test-unit
test-unit: ## the fast loop: unit tests only (-short skips lab tests)
	$(GO) test -short -count=1 ./...

.PHONY: test
test: deps check-dirty tools ## everything: generated code check, vet, lint, all tests including lab tests (root)
	$(GO) vet ./...
	$(TOOLS)/golangci-lint run ./...
	hack/deadcode.sh $(TOOLS)/deadcode
	$(TOOLS)/gotestsum --format testname -- -count=1 -timeout $(TEST_TIMEOUT) ./...

.PHONY: e2e
e2e: deps ## the end-to-end lab test: two emulated sites through the whole lifecycle (root, QEMU; OMNI=real|standin, unset: both); logs and timeline.md under _out/e2e/<mode>
	OMNI='$(OMNI)' $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '^TestE2E$$' -v ./qemu/lab/

.PHONY: demo
demo: deps ## the lab against a real Omni (OMNI=standin: the stand-in): prints the status page's address, a live table (plain lines when not a terminal); from a terminal it stays up until Ctrl-C; logs under _out/demo/runs
# Built, then run: `go run` exits 1 on Ctrl-C even when the demo tears the lab down cleanly.
	$(GO) build -o $(OUT)/bin/demo ./qemu/lab/cmd/demo
	OMNI='$(OMNI)' $(OUT)/bin/demo

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME (default 30s) each
	hack/fuzz.sh $(FUZZTIME)

# The attack suite: the hostile site network and uplink port, each attack against what it would break (also
# part of make test). Root runs the raw-socket and namespace parts; without root they say why they skip.
ATTACK_TESTS = TestFloodLegitimateTransferCompletes|TestRefusalFloodIsBoundedInRepliesEventsAndLogLines|TestSlowClientIsCutOff|TestSlowClientsCannotStopBooting|TestListenerSlowlorisIsEvictedForARealClient|TestTunnelFlood|TestTunnelBindingRefusesRogues|TestServerJunkFloodFromOneMACDoesNotStarveOthers|TestAttackFloodLocksNoEdgeOut|TestWrongJoinTokensInALoopAreLimited|TestSiteLockoutPausesEnrolmentAndTheEdgeWaitsAsTold|TestEnrolmentSessionsAreBoundedAndShortLived|TestIdleConnectionsAreClosedBeforeTLS|TestEdgeCannotNameAnotherSite|TestBinariesLifecycleWithOmniStandIn|TestNetbootOVMFUnderAttack|TestManagerWrongPasswordIsNotRevealed|TestConfigFetchCannotClaimATunnel

.PHONY: attack
attack: ## the attack suite alone: floods, slow clients, rogue tunnels, wrong tokens, an OVMF boot under attack (figures in -v output)
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v -run '^($(ATTACK_TESTS))$$' ./edge/... ./qemu/linklab/ ./qemu/bootlab/ ./qemu/vbmc/ | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|_test.go:[0-9]+: '

.PHONY: chaos
chaos: ## the real binaries under random uplink cuts, lost replies and kills, machines cycling; prints CHAOS ... (CHAOS_CUTS=100, CHAOS_KILLS=10, CHAOS_MACHINES=4)
	CHAOS_CUTS=$${CHAOS_CUTS:-100} CHAOS_KILLS=$${CHAOS_KILLS:-10} CHAOS_MACHINES=$${CHAOS_MACHINES:-4} \
		$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v -run '^TestChaos$$' ./qemu/linklab/ | grep -E '^(CHAOS|--- FAIL|FAIL|ok)|chaos_test.go:[0-9]+: '

.PHONY: bench
bench: ## benchmarks, each side by side with its peer
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...

.PHONY: bench-fleet
bench-fleet: ## fleet simulator against the real controller and the Omni stand-in (FLEET_SITES, FLEET_MACHINES per site, FLEET_DEAD_BMCS, FLEET_OFFLINE_SITES, FLEET_DURATION, ...; see hack/fleet); figures in _out/fleet
	mkdir -p $(OUT)/fleet/bin
	$(GO) build -o $(OUT)/fleet/bin/controller ./controller
	$(GO) build -o $(OUT)/fleet/bin/fleet ./hack/fleet/cmd/fleet
	$(OUT)/fleet/bin/fleet --controller $(OUT)/fleet/bin/controller --out $(OUT)/fleet

.PHONY: bench-wan
bench-wan: ## asset relay over the uplink vs raw TCP through a delay proxy, per RTT, and a cut resumed (WAN_RTTS=0,50,100,200, WAN_SIZE_MB=256, WAN_REPEAT=3, WAN_RESUME_RTT_MS=100)
	WAN_BENCH=1 $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v -run '^(TestWANRelay|TestWANRelayResumesAfterCut)$$' ./hack/bench/wan/ | grep -E '^(WAN|--- FAIL|FAIL|ok)|_test.go:[0-9]+: '

.PHONY: clean
clean: ## remove _out
	rm -rf $(OUT)
