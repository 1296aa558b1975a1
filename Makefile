# starling — the two commands of the README (`make run`, `make test`) and a few helpers.
BUILD ?= build
JOBS ?= $(shell nproc)
CONFIG ?= configs/swarm-tiny.yaml
CMAKE_FLAGS ?=
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps configure build run test bench fuzz tsan format lint clean

all: build

deps:
	@bash scripts/install-deps

$(BUILD)/CMakeCache.txt:
	@cmake -S . -B $(BUILD) $(GENERATOR) $(CMAKE_FLAGS) >/dev/null

configure: deps $(BUILD)/CMakeCache.txt

# Everything but the benchmarks: the `starling` executable, the examples, the tests.
build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Builds only the `starling` executable and what it links, then runs the main job.
run: configure
	@cmake --build $(BUILD) -j $(JOBS) --target starling
	@$(BUILD)/starling run $(CONFIG)

test: build
	@bash scripts/install-deps --tests
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# Every benchmark, or one with BENCH=name (e.g. `make bench BENCH=codecs`); each one's wall time
# is printed after its table.
bench: configure
	@cmake --build $(BUILD) -j $(JOBS) --target $(if $(filter-out netns-allreduce,$(BENCH)),bench_$(BENCH),benchmarks)
	@bash scripts/run-benchmarks $(BUILD) $(BENCH)

fuzz: deps
	@bash scripts/fuzz $(or $(SECONDS),300)

# The stage and averager tests under ThreadSanitizer, in a separate build ($(BUILD)-tsan;
# TSAN_TESTS=REGEX picks other ctest names, e.g. 'averager_links|swarm_modes' for the tests with
# real threads). Read scripts/tsan.supp first: with Debian's uninstrumented CAF, TSan cannot see
# the synchronization of CAF's mailboxes, and the threaded tests report every message that
# crosses threads.
TSAN_TESTS ?= actors/stage/|actors/averager/(averager_sim|butterfly|chunk|codec|load|matchmaker|round)
tsan: deps
	@cmake -S . -B $(BUILD)-tsan $(GENERATOR) -DSTARLING_TSAN=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD)-tsan -j $(JOBS) --target starling starling_test_actors starling_test_runtime
	@cd $(BUILD)-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/scripts/tsan.supp second_deadlock_stack=1 history_size=4 $(TSAN_OPTIONS)" \
	  ctest --output-on-failure -j $(JOBS) --timeout 3600 -R '$(TSAN_TESTS)'

format:
	@git ls-files '*.hpp' '*.cpp' | xargs clang-format -i

# clang-tidy needs one compile command per source: a configure without unity builds (in
# $(BUILD)-lint), whose generated Cap'n Proto headers are built first.
lint: deps
	@cmake -S . -B $(BUILD)-lint $(GENERATOR) -DSTARLING_UNITY=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD)-lint --target starling_capnp -j $(JOBS)
	@git ls-files 'kernels/*.cpp' 'messages/*.cpp' 'actors/*.cpp' 'runtime/*.cpp' \
	  | xargs clang-tidy -p $(BUILD)-lint --quiet

clean:
	@rm -rf $(BUILD)
