# fuzz.mk — `make fuzz`: builds the libFuzzer harnesses fuzz/fuzz_*.c with clang (-fsanitize=fuzzer,address,
# undefined; the library in its own folder, $(FUZZ_BUILD), with coverage instrumentation) and runs each for
# FUZZ_SECONDS seconds on its seed corpus (fuzz/run.sh; fuzz/README.md), FUZZ_JOBS harnesses at once (the cores by
# default, each on its own). `make fuzz-build` only builds.
#   make fuzz FUZZ_SECONDS=10            every harness 10 s (what CI runs)
#   make fuzz FUZZ_ONLY=fuzz_trace       one harness
#   make fuzz FUZZ_SECONDS=600 FUZZ_RUNS=1000000   each until 10^6 executions, at most 600 s (the long run)
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build/fuzz
FUZZ_SECONDS ?= 10
FUZZ_ONLY    ?=
FUZZ_RUNS    ?=
FUZZ_JOBS    ?= $(shell nproc 2>/dev/null || echo 1)
FUZZ_SAN      = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_SRCS     = $(sort $(wildcard fuzz/fuzz_*.c))
FUZZ_BINS     = $(FUZZ_SRCS:fuzz/%.c=$(FUZZ_BUILD)/bin/%)

.PHONY: fuzz fuzz-build
fuzz-build:
	$(MAKE) CC=$(FUZZ_CC) BUILD=$(FUZZ_BUILD) OPT="-O1" SAN="-fsanitize=fuzzer-no-link $(FUZZ_SAN)" $(FUZZ_BINS)

fuzz: fuzz-build
	@KVSIM_ROOT=$(abspath .) FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_JOBS=$(FUZZ_JOBS) sh fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) \
	  $(if $(FUZZ_ONLY),$(FUZZ_BUILD)/bin/$(FUZZ_ONLY),$(FUZZ_BINS))

$(FUZZ_BUILD)/bin/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz.h $(FUZZ_BUILD)/libkvs.a
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CFLAGS_WARN) -O1 -fsanitize=fuzzer $(FUZZ_SAN) -D_GNU_SOURCE -pthread -I. -o $@ $< \
	  $(FUZZ_BUILD)/libkvs.a $(LDLIBS_BASE)
