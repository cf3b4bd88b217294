# cuda.mk — build rules of the CUDA capture backend (included by the top-level Makefile with
# `-include gpu_capture/cuda/cuda.mk`). Targets:
#   make cuda         build/cuda/kvsim with the CUDA backend (objects in build/cuda/); without nvcc: a message,
#                     exit 0
#   make cuda-test    build and run the test suite of that build (GPU tests skip with "no CUDA device")
#   make bench-cuda   build and run bench/bench_cuda.c against that build (needs a GPU to measure anything)
# The C sources are compiled again with -DKVS_WITH_CUDA (which drops gpu_capture/cuda_absent.c's fallback);
# the .cu files go through nvcc; both land in build/cuda/libkvs.a through the Makefile's EXTRA_* hooks.
# CUDA_KVSIM names the binary: build/cuda/kvsim by default, so `make cuda` never overwrites the CPU ./kvsim
# of `make` (a shared tree keeps both); CUDA_KVSIM=kvsim puts the CUDA build at ./kvsim on purpose.

# nvcc: /usr/local/cuda first, else the PATH; CUDA_HOME (libraries) follows from where nvcc is
NVCC ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_BUILD = build/cuda
CUDA_KVSIM ?= $(CUDA_BUILD)/kvsim
CUDA_ARCH = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
            -gencode arch=compute_90,code=compute_90
NVCC_FLAGS = -std=c++17 -O2 -g -lineinfo $(CUDA_ARCH) -I. --Werror all-warnings \
             -Xcompiler -Wall,-Wextra,-Wshadow,-fno-strict-aliasing -D_GNU_SOURCE -DKVS_WITH_CUDA
CUDA_CU_SRCS = $(sort $(wildcard gpu_capture/cuda/*.cu))
CUDA_C_SRCS = $(sort $(wildcard gpu_capture/cuda/*.c))
CUDA_OBJS = $(CUDA_CU_SRCS:%.cu=$(CUDA_BUILD)/%.cu.o) $(CUDA_C_SRCS:%.c=$(CUDA_BUILD)/%.o)
# -rpath so the CUDA kvsim finds libcublas without LD_LIBRARY_PATH; cudart is linked statically
CUDA_LDLIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart_static -ldl -lrt -lstdc++
CUDA_MAKE = $(MAKE) BUILD=$(CUDA_BUILD) KVSIM=$(CUDA_KVSIM) EXTRA_CFLAGS=-DKVS_WITH_CUDA \
            EXTRA_LIB_OBJS="$(CUDA_OBJS)" EXTRA_LDLIBS="$(CUDA_LDLIBS)"

.PHONY: cuda cuda-test bench-cuda

# -MMD writes build/cuda/.../x.cu.d beside the object; the Makefile's `find $(BUILD) -name '*.d'` picks it up
$(CUDA_BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

ifeq ($(NVCC),)
cuda cuda-test bench-cuda:
	@echo "nvcc not found: CUDA backend not built"
else
cuda:
	+@$(CUDA_MAKE) all
	@echo "make cuda: the kvsim with the CUDA backend is $(CUDA_KVSIM)"

cuda-test:
	+@$(CUDA_MAKE) test

bench-cuda:
	+@$(CUDA_MAKE) all $(CUDA_BUILD)/bench/bench_cuda
	@KVSIM_BIN=$(abspath $(CUDA_KVSIM)) KVSIM_ROOT=$(abspath .) $(CUDA_BUILD)/bench/bench_cuda
endif
