# starling — the two commands of the README (`make run`, `make test`) and a few helpers.
BUILD ?= build
JOBS ?= $(shell nproc)
CONFIG ?= configs/swarm-tiny.yaml
CMAKE_FLAGS ?=
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps configure build run test bench fuzz format lint clean

all: build

deps:
	@bash scripts/install-deps

$(BUILD)/CMakeCache.txt:
	@cmake -S . -B $(BUILD) $(GENERATOR) $(CMAKE_FLAGS) >/dev/null

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	@$(BUILD)/starling run $(CONFIG)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

bench: build
	@cmake --build $(BUILD) -j $(JOBS) --target benchmarks
	@bash scripts/run-benchmarks $(BUILD)

fuzz: deps
	@bash scripts/fuzz $(or $(SECONDS),300)

format:
	@git ls-files '*.hpp' '*.cpp' | xargs clang-format -i

lint: configure
	@git ls-files 'kernels/*.cpp' 'messages/*.cpp' 'actors/*.cpp' 'runtime/*.cpp' \
	  | xargs clang-tidy -p $(BUILD) --quiet

clean:
	@rm -rf $(BUILD)
