# emu.mk — the CUDA backend's tests under a CPU emulation of CUDA (tests/cuda_emu/README.md), included by
# the top-level Makefile with `-include tests/cuda_emu/emu.mk`. Target:
#   make cuda-emu-test   rewrite gpu_capture/cuda/*.cu for g++, build kvsim and tests/test_cuda.c against the
#                        emulated runtime and cuBLAS (build/cuda_emu/), run the emulator's self-test and
#                        test_cuda. Needs g++ only (no nvcc, no GPU). NOT a GPU run: tools/gpu_session.sh is.
# Mirrors gpu_capture/cuda/cuda.mk: the C sources again with -DKVS_WITH_CUDA, the .cu objects (and the
# emulator) into build/cuda_emu/libkvs.a through the Makefile's EXTRA_* hooks.

EMU_DIR = tests/cuda_emu
EMU_BUILD = build/cuda_emu
EMU_KVSIM = $(EMU_BUILD)/kvsim
EMU_CXX ?= g++
# -include cuda_runtime.h: nvcc force-includes the real one into every .cu; ours brings the device language
EMU_CXXFLAGS = -std=c++17 -O2 -g -Wall -Wextra -Wshadow -Werror -fno-strict-aliasing -pthread -D_GNU_SOURCE \
               -DKVS_WITH_CUDA -I. -I$(EMU_DIR)/include
# .cu sources only: `#pragma unroll` is nvcc's (g++ warns it is unknown; the loops are correct either way)
EMU_CU_FLAGS = -include cuda_runtime.h -Wno-unknown-pragmas
EMU_CU_SRCS = $(sort $(wildcard gpu_capture/cuda/*.cu))
EMU_CU_OBJS = $(EMU_CU_SRCS:%.cu=$(EMU_BUILD)/%.cu.o)
EMU_RT_OBJ = $(EMU_BUILD)/$(EMU_DIR)/emu_runtime.o
EMU_SELFTEST = $(EMU_BUILD)/$(EMU_DIR)/selftest
EMU_MAKE = $(MAKE) BUILD=$(EMU_BUILD) KVSIM=$(EMU_KVSIM) EXTRA_CFLAGS=-DKVS_WITH_CUDA \
           EXTRA_LIB_OBJS="$(EMU_CU_OBJS) $(EMU_RT_OBJ)" EXTRA_LDLIBS="-lstdc++"

# The one source change the emulator needs, made on a copy: `k<<<grid, block[, smem[, stream]]>>>(args);`
# becomes `emu_launch(grid, block[, smem[, stream]], [&] { k(args); });` and `extern __shared__ T x[];`
# becomes `T *x = (T *)emu_dyn_smem();` (sed -z: a launch may span lines; args must hold no ';'). #line keeps
# diagnostics on the .cu; a launch the pattern missed stops the build.
EMU_SED = sed -E -z \
  -e 's/extern[[:space:]]+__shared__[[:space:]]+([A-Za-z_][A-Za-z0-9_]*)[[:space:]]+([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\[\][[:space:]]*;/\1 *\2 = (\1 *)emu_dyn_smem();/g' \
  -e 's/([A-Za-z_][A-Za-z0-9_]*(<[^<>;]*>)?)[[:space:]]*<<<([^;]*)>>>[[:space:]]*\(([^;]*)\)[[:space:]]*;/emu_launch(\3, [\&] { \1(\4); });/g'

.PHONY: cuda-emu-test
.PRECIOUS: $(EMU_BUILD)/%.cu.cpp

$(EMU_BUILD)/%.cu.cpp: %.cu
	@mkdir -p $(dir $@)
	@{ echo '#line 1 "$<"'; $(EMU_SED) $<; } > $@.tmp
	@if grep -n '<<<\|extern[[:space:]]*__shared__' $@.tmp; then \
	  echo "$<: launch or dynamic shared memory syntax emu.mk cannot rewrite" >&2; rm -f $@.tmp; exit 1; fi
	@mv $@.tmp $@

# -iquote: the copy's quoted includes ("kernels.cuh", "../../trace/trace.h") resolve from the .cu's folder
$(EMU_BUILD)/%.cu.o: $(EMU_BUILD)/%.cu.cpp
	$(EMU_CXX) $(EMU_CXXFLAGS) $(EMU_CU_FLAGS) -iquote $(dir $*) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(EMU_RT_OBJ): $(EMU_DIR)/emu_runtime.cpp
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

# built by the sub-make (BUILD=$(EMU_BUILD)), where $(LIB) is $(EMU_BUILD)/libkvs.a
$(EMU_SELFTEST): $(EMU_SELFTEST).cu.o $(LIB)
	$(EMU_CXX) $(EMU_CXXFLAGS) -o $@ $< $(LIB) -lcmocka $(LDLIBS_BASE)

# KVSIM_REQUIRE_GPU is dropped: it asks for a real GPU, which the emulation refuses to impersonate;
# KVS_TEST_CUDA_EMU=1 tells test_cuda the device is emulated (it leaves out its largest attention shapes there)
cuda-emu-test:
	+@$(EMU_MAKE) $(EMU_KVSIM) $(EMU_BUILD)/tests/test_cuda $(EMU_SELFTEST)
	@echo "== CUDA backend tests under a CPU EMULATION of CUDA (tests/cuda_emu): NOT a GPU run"
	@env -u KVSIM_REQUIRE_GPU KVS_TEST_CUDA_EMU=1 KVSIM_BIN=$(abspath $(EMU_KVSIM)) KVSIM_ROOT=$(abspath .) \
	  sh tests/run_tests.sh $(EMU_SELFTEST) $(EMU_BUILD)/tests/test_cuda
	@echo "== (the above ran on the CPU emulation of CUDA; a GPU run is tools/gpu_session.sh)"
