# kvsim — build, test, sanitizer and benchmark targets.
#   make            build ./kvsim (CPU only; never needs CUDA)
#   make test       build and run the cmocka suite (tests/test_*.c)
#   make asan       build everything with AddressSanitizer + UndefinedBehaviorSanitizer and run the suite
#   make check-layers  the include graph follows the folders' layers (tools/check_layers.sh)
#   make bench      build and run the benchmarks (bench/*.c); numbers go to stdout, never asserted
#   make cuda       build build/cuda/kvsim with the CUDA capture backend when nvcc is present (./kvsim stays
#                   the CPU build; gpu_capture/cuda/cuda.mk)
# Sources are picked up by directory, so a new module file needs no Makefile edit. gcc and clang both work
# (make CC=clang; give each compiler its own BUILD=... folder).

CC      ?= cc
BUILD   ?= build
SAN     ?=
# -fvect-cost-model=dynamic is gcc's (clang rejects it): added only when $(CC) accepts it, probed once when
# make reads this file (-Werror: a compiler that merely warns about an unsupported flag counts as rejecting it).
CC_VECT_COST := $(shell $(CC) -Werror -fvect-cost-model=dynamic -x c -c -o /dev/null /dev/null >/dev/null 2>&1 \
                  && echo -fvect-cost-model=dynamic)
OPT     ?= -O2 $(CC_VECT_COST)
CFLAGS_WARN = -std=c11 -g -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 \
              -Wvla -Werror
CFLAGS  ?=
ALL_CFLAGS = $(CFLAGS_WARN) $(OPT) $(SAN) -D_GNU_SOURCE -pthread -I. $(CFLAGS) $(EXTRA_CFLAGS)
LDLIBS_BASE = -lzstd -lsqlite3 -lpthread -lm
LDFLAGS ?=

LIB_DIRS = common trace sim policies gpu_capture analysis results plots
LIB_SRCS = $(sort $(wildcard $(addsuffix /*.c,$(LIB_DIRS))))
CLI_SRCS = $(sort $(wildcard cli/*.c))
TEST_SRCS = $(sort $(wildcard tests/test_*.c))
TEST_UTIL_SRCS = $(sort $(wildcard tests/util/*.c))
BENCH_SRCS = $(sort $(wildcard bench/bench_*.c))

LIB_OBJS = $(LIB_SRCS:%.c=$(BUILD)/%.o) $(EXTRA_LIB_OBJS)
CLI_OBJS = $(CLI_SRCS:%.c=$(BUILD)/%.o)
TEST_UTIL_OBJS = $(TEST_UTIL_SRCS:%.c=$(BUILD)/%.o)
# The suite's longest binaries start first (tests/run_tests.sh hands them out in this order, TEST_JOBS at a time), so
# no core sits idle at the end waiting on one that started late; the log reads in this order too.
TEST_LONGEST = test_examples test_failinj test_chat_template test_replay_ref test_tokenizer_npm test_policy_memo \
               test_simd test_report test_python_trace test_samples test_cli_generate test_sweep test_policy_conformance
TEST_FIRST = $(foreach t,$(TEST_LONGEST),$(filter tests/$(t).c,$(TEST_SRCS))) $(filter tests/test_findings_%.c,$(TEST_SRCS))
TEST_BINS = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_FIRST) $(filter-out $(TEST_FIRST),$(TEST_SRCS)))
BENCH_BINS = $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)
LIB = $(BUILD)/libkvs.a
KVSIM ?= kvsim

.PHONY: all test asan bench bench-build clean mpi mpi-test slurm-test check-layers
all: $(KVSIM)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(KVSIM): $(CLI_OBJS) $(LIB)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(CLI_OBJS) $(LIB) $(EXTRA_LDLIBS) $(LDLIBS_BASE)

# Named in this explicit rule, the test helper objects are ordinary prerequisites, not intermediate files of
# the pattern rules below (make deleted those after a fresh build, and the next `make test` rebuilt them and
# relinked every test and benchmark).
$(TEST_BINS) $(BENCH_BINS): $(TEST_UTIL_OBJS) $(LIB)

$(BUILD)/tests/%: tests/%.c $(TEST_UTIL_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP $(LDFLAGS) -o $@ $< $(TEST_UTIL_OBJS) $(LIB) $(EXTRA_LDLIBS) $(TEST_LDLIBS) -lcmocka $(LDLIBS_BASE)

# test_report decodes the report's PNG images (and chromium's screenshot) with zlib; kvsim itself does not use it.
$(BUILD)/tests/test_report: TEST_LDLIBS = -lz

$(BUILD)/bench/%: bench/%.c $(TEST_UTIL_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(TEST_UTIL_OBJS) $(LIB) $(EXTRA_LDLIBS) $(LDLIBS_BASE)

# Tests find the binary under test and the shared models through the environment (TEST_ENV: more of it; the
# sanitizer run sets KVS_TEST_SANITIZED=1, under which the tests that run whole study scripts skip: minutes of real
# decoding under ASan; they run in the plain suite, and the commands they call have their own tests in both).
# TEST_JOBS binaries run at
# once (tests/run_tests.sh; the log is the same whatever the count): the cores by default, TEST_JOBS=1 one by one.
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
test: $(KVSIM) $(TEST_BINS)
	@$(TEST_ENV) TEST_JOBS=$(TEST_JOBS) KVSIM_BIN=$(abspath $(KVSIM)) KVSIM_ROOT=$(abspath .) sh tests/run_tests.sh $(TEST_BINS)

asan:
	$(MAKE) BUILD=build/asan KVSIM=build/asan/kvsim OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined" TEST_ENV=KVS_TEST_SANITIZED=1 test

bench: $(KVSIM) $(BENCH_BINS)
	@KVSIM_BIN=$(abspath $(KVSIM)) KVSIM_ROOT=$(abspath .) sh bench/run_bench.sh $(BENCH_BINS)

# `make bench-prefill`: the CPU blocked prefill / 16-bit decode / peak RSS rows of gpu_capture/BENCH.md alone.
bench-prefill: $(BUILD)/bench/bench_prefill
	@$(BUILD)/bench/bench_prefill

# Every benchmark and bench tool built, none run: CI builds them (.ci/run) so that none rots unseen.
BENCH_TOOLS = $(BUILD)/bench/gen_cmp_trace $(BUILD)/bench/neighbor
bench-build: $(BENCH_BINS) $(BENCH_TOOLS)

# The include graph against ../shared/DESIGN.md's layers (common, trace, gpu_capture, sim, policies, analysis,
# results, plots, cli): no include from a lower folder to a higher one, no cycle across folders.
check-layers:
	sh tools/check_layers.sh

clean:
	rm -rf build kvsim

# `make mpi`: build/mpi/kvsim with the MPI launcher of `kvsim sweep STUDY --db DIR/` (Debian libopenmpi-dev:
# mpicc); `make mpi-test` runs a study on 2 ranks and compares the merged database with a one-process sweep.
MPICC ?= mpicc
mpi:
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "make mpi: $(MPICC) not found (Debian: libopenmpi-dev)"; exit 1; }
	$(MAKE) CC=$(MPICC) BUILD=build/mpi KVSIM=build/mpi/kvsim EXTRA_CFLAGS=-DKVS_WITH_MPI build/mpi/kvsim
mpi-test: mpi $(KVSIM)
	sh tests/mpi_sweep.sh $(abspath build/mpi/kvsim) $(abspath $(KVSIM))
# `make slurm-test`: examples/slurm/ on a private single-node Slurm the test starts (Debian slurm-wlm, munge; it
# skips with a message when they are missing or cannot start here).
slurm-test: $(KVSIM)
	sh tests/slurm_sweep.sh $(abspath $(KVSIM))

# The CUDA backend's rules (targets cuda, cuda-test, bench-cuda) live beside its sources.
-include gpu_capture/cuda/cuda.mk
# `make cuda-emu-test`: the CUDA backend's tests on a CPU emulation of CUDA (g++ only; tests/cuda_emu/).
-include tests/cuda_emu/emu.mk
# `make fuzz FUZZ_SECONDS=N`: the libFuzzer harnesses (clang; fuzz/fuzz.mk, fuzz/README.md).
-include fuzz/fuzz.mk

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
