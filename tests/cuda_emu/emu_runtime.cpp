/* emu_runtime.cpp — the CPU emulation of CUDA (tests/cuda_emu, see README.md): the fiber scheduler behind
 * include/emu_device.h (launches, __syncthreads, warp shuffles), a synchronous host-memory CUDA runtime
 * (include/cuda_runtime.h) and cublasGemmEx (include/cublas_v2.h). Test infrastructure only: it lets CI
 * run the real gpu_capture/cuda/ sources without a GPU; it is not a GPU and says so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"

/* ================================================================================================
 * Context switch
 * ============================================================================================== */

/* A fiber switch is one call of ctx_switch: save where this fiber is, resume `to` where it called
 * ctx_switch (or, the first time, at fiber_main). On x86-64 it is a few instructions of assembly: callee-
 * saved registers onto the stack, swap stack pointers, pop, return. Because every fiber switches from the
 * same call site, the `ret` lands where the CPU predicts, which makes it ~4x faster than swapcontext (a
 * system call per switch) or _setjmp/_longjmp (a mispredicted return per switch); the kernel tests are
 * hundreds of millions of shuffle-switches. Elsewhere: swapcontext, correct but slower. */
static void fiber_main(void);

#if defined(__x86_64__)
struct ctx {
    void *sp;
};
extern "C" void emu_ctx_switch(void **save_sp, void *load_sp);
asm(".text\n"
    ".globl emu_ctx_switch\n"
    ".type emu_ctx_switch, @function\n"
    "emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_ctx_switch, .-emu_ctx_switch\n");

static void ctx_switch(ctx *from, ctx *to) { emu_ctx_switch(&from->sp, to->sp); }

/* A new stack as emu_ctx_switch leaves one: six zero registers, then fiber_main as the return address,
 * then a null return address for fiber_main (which never returns); 16-byte aligned as at a call. */
static void ctx_init(ctx *c, char *stack, size_t bytes) {
    uintptr_t top = ((uintptr_t)stack + bytes) & ~(uintptr_t)15;
    void **sp = (void **)(top - 64);
    memset(sp, 0, 64);
    sp[6] = (void *)fiber_main;
    c->sp = sp;
}
#else
struct ctx {
    ucontext_t uc;
};

static void ctx_switch(ctx *from, ctx *to) { swapcontext(&from->uc, &to->uc); }

static void ctx_init(ctx *c, char *stack, size_t bytes) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, fiber_main, 0);
}
#endif

/* ================================================================================================
 * Fibers: one per CUDA thread of the running block
 * ============================================================================================== */

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

enum { MAX_THREADS = 1024, STACK_BYTES = 64 << 10 };

struct fiber {
    ctx c;                /* where it resumes */
    uint3 tid;            /* its threadIdx in the running launch */
    const long *wait_gen; /* NULL: runnable; else blocked until *wait_gen != wait_val (a barrier's generation) */
    long wait_val;
    int done;             /* finished the kernel for this block */
};

struct warp {
    long gen;             /* completed barriers (shuffles and __syncwarp) of this warp in this block */
    int arrived, lanes, exited;
    uint64_t buf[2][32];  /* shuffle values, by barrier parity: buf[g & 1] is free again once barrier g + 1 is */
};

static struct {
    std::mutex launch_mu;  /* one launch at a time: __shared__ statics and this state are process-wide */
    fiber *fib;            /* MAX_THREADS, created on first use; stacks persist across launches */
    int n_created;
    ctx host;              /* the launching thread */
    int n, cur, n_done;    /* threads of the block, the running one, finished ones */
    long bar_gen;          /* completed __syncthreads of this block */
    int bar_arrived;
    warp warps[MAX_THREADS / 32];
    void (*body)(void *);
    void *body_ctx;
    void *dyn_smem;
} S;

static void set_thread(int t) {
    S.cur = t;
    threadIdx = S.fib[t].tid;
}

static void die(const char *what) {
    fprintf(stderr, "cuda_emu: block (%u,%u,%u) thread %d: %s\n", blockIdx.x, blockIdx.y, blockIdx.z, S.cur, what);
    abort();
}

/* The running fiber gives up the CPU: to the next runnable fiber after it (round robin), or to the host
 * when the whole block has finished. Returns when this fiber is resumed. */
static void yield(void) {
    fiber *me = &S.fib[S.cur];
    for (int i = 1; i <= S.n; i++) {
        int t = S.cur + i < S.n ? S.cur + i : S.cur + i - S.n;
        fiber *f = &S.fib[t];
        if (f->done || (f->wait_gen && *f->wait_gen == f->wait_val)) continue;
        f->wait_gen = NULL;
        if (f == me) return;
        set_thread(t);
        ctx_switch(&me->c, &f->c);
        return;
    }
    if (S.n_done == S.n) {
        ctx_switch(&me->c, &S.host);
        return;
    }
    /* a GPU would hang here */
    char msg[160];
    snprintf(msg, sizeof msg, "deadlock: every unfinished thread waits at a barrier (%d of %d threads finished; "
             "__syncthreads reached by %d)", S.n_done, S.n, S.bar_arrived);
    die(msg);
}

static void wait_for(const long *gen) {
    S.fib[S.cur].wait_gen = gen;
    S.fib[S.cur].wait_val = *gen;
    yield();
}

/* Every fiber's code: run the kernel once per block, forever (fibers outlive launches). */
static void fiber_main(void) {
    for (;;) {
        S.body(S.body_ctx);
        fiber *me = &S.fib[S.cur];
        me->done = 1;
        S.n_done++;
        S.warps[S.cur / 32].exited++;
        /* exited threads no longer count for __syncthreads (as hardware does; the Guide leaves it undefined) */
        if (S.bar_arrived > 0 && S.bar_arrived == S.n - S.n_done) {
            S.bar_arrived = 0;
            S.bar_gen++;
        }
        yield();
    }
}

static void create_fibers(int n) {
    if (!S.fib) S.fib = (fiber *)calloc(MAX_THREADS, sizeof *S.fib);
    if (!S.fib) die("out of memory for fibers");
    long page = sysconf(_SC_PAGESIZE);
    while (S.n_created < n) {
        /* a PROT_NONE page below each stack: an overflow faults instead of corrupting the next stack */
        char *mem = (char *)mmap(NULL, STACK_BYTES + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED || mprotect(mem, page, PROT_NONE)) die("cannot map a fiber stack");
        /* stack tops 64 * (t % 61) bytes apart modulo a page, not all page-aligned: the fibers' hot frames
         * then spread over the L1 cache sets instead of evicting each other on every switch */
        ctx_init(&S.fib[S.n_created].c, mem + page, STACK_BYTES - 64 * (size_t)(S.n_created % 61));
        S.n_created++;
    }
}

void emu_syncthreads(void) {
    if (++S.bar_arrived == S.n - S.n_done) {
        S.bar_arrived = 0;
        S.bar_gen++;
        return;
    }
    wait_for(&S.bar_gen);
}

unsigned emu_lane(void) { return (unsigned)S.cur % 32; }

uint64_t emu_warp_exchange(unsigned mask, uint64_t bits, int src) {
    warp *w = &S.warps[S.cur / 32];
    unsigned full = w->lanes == 32 ? 0xffffffffu : (1u << w->lanes) - 1;
    if (mask != full) die("warp shuffle/__syncwarp with a partial lane mask: not emulated (only the whole warp)");
    if (w->exited) die("warp shuffle/__syncwarp while a lane of the warp has exited: undefined on a GPU");
    long g = w->gen;
    w->buf[g & 1][S.cur % 32] = bits;
    if (++w->arrived == w->lanes - w->exited) {
        w->arrived = 0;
        w->gen++;
    } else {
        wait_for(&w->gen);
    }
    if (src < 0 || src >= w->lanes) return bits; /* no such lane: own value */
    return w->buf[g & 1][src];
}

void *emu_dyn_smem(void) { return S.dyn_smem; }

static thread_local cudaError_t last_error = cudaSuccess;

/* CUDA limits of sm_80 / sm_90 (Programming Guide, "Compute capabilities"); shared memory: the default
 * 48 KB dynamic limit without cudaFuncSetAttribute (static __shared__ is not counted here). */
static cudaError_t check_config(dim3 g, dim3 b, size_t smem) {
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (!b.x || !b.y || !b.z || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > MAX_THREADS)
        return cudaErrorInvalidConfiguration;
    if (!g.x || !g.y || !g.z || g.x > 2147483647u || g.y > 65535 || g.z > 65535) return cudaErrorInvalidConfiguration;
    if (smem > 48 * 1024) return cudaErrorInvalidValue;
    return cudaSuccess;
}

void emu_launch_fn(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*body)(void *), void *ctx) {
    (void)stream; /* synchronous: the launch completes before it returns */
    cudaError_t e = check_config(grid, block, smem);
    if (e != cudaSuccess) {
        last_error = e;
        return;
    }
    std::lock_guard<std::mutex> lock(S.launch_mu);
    int n = (int)(block.x * block.y * block.z);
    create_fibers(n);
    S.n = n;
    S.body = body;
    S.body_ctx = ctx;
    S.dyn_smem = smem ? malloc(smem) : NULL;
    if (smem && !S.dyn_smem) die("out of memory for dynamic shared memory");
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                if (smem) memset(S.dyn_smem, 0xff, smem); /* NaN: a read before any write shows */
                S.n_done = 0;
                S.bar_gen = 0;
                S.bar_arrived = 0;
                for (int t = 0; t < n; t++) {
                    S.fib[t].tid = dim3((unsigned)t % block.x, (unsigned)t / block.x % block.y,
                                        (unsigned)t / (block.x * block.y));
                    S.fib[t].done = 0;
                    S.fib[t].wait_gen = NULL;
                }
                for (int w = 0; w < (n + 31) / 32; w++) {
                    S.warps[w].gen = 0;
                    S.warps[w].arrived = 0;
                    S.warps[w].exited = 0;
                    S.warps[w].lanes = n - 32 * w < 32 ? n - 32 * w : 32;
                }
                set_thread(0);
                ctx_switch(&S.host, &S.fib[0].c); /* back when the block's last fiber finishes */
            }
    free(S.dyn_smem);
    S.dyn_smem = NULL;
}

/* ================================================================================================
 * Runtime: host memory, synchronous streams and events
 * ============================================================================================== */

struct CUstream_st {
    unsigned flags;
};
struct CUevent_st {
    unsigned flags;
    int recorded;
    double t; /* host seconds when recorded (the emulator's time, not a GPU's) */
};

static std::mutex mem_mu;
static std::map<uintptr_t, size_t> dev_allocs; /* start -> bytes */

int emu_is_device_range(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mem_mu);
    uintptr_t a = (uintptr_t)p;
    auto it = dev_allocs.upper_bound(a);
    if (it == dev_allocs.begin()) return 0;
    --it;
    return a - it->first <= it->second && bytes <= it->second - (a - it->first);
}

/* KVSIM_REQUIRE_GPU=1 asks for a real GPU (tools/gpu_session.sh): the emulator then reports no device. */
static int gpu_required(void) {
    const char *r = getenv("KVSIM_REQUIRE_GPU");
    return r && !strcmp(r, "1");
}

cudaError_t cudaGetDeviceCount(int *count) {
    static std::once_flag banner;
    std::call_once(banner, [] {
        fprintf(stderr, "cuda_emu: this binary's CUDA runtime is a CPU EMULATION of CUDA (tests/cuda_emu), not a GPU\n");
    });
    if (gpu_required()) {
        fprintf(stderr, "cuda_emu: KVSIM_REQUIRE_GPU=1 asks for a real GPU; the emulation reports none\n");
        *count = 0;
        return cudaErrorNoDevice;
    }
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
    int n;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return e;
    if (device != 0) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", KVS_CUDA_EMU_DEVICE_NAME);
    p->major = 9; /* what the backend requires (sm_80+); nothing of sm_90 is modelled */
    p->minor = 0;
    p->multiProcessorCount = 1;
    p->totalGlobalMem = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    int n;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return e;
    return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorDevicesUnavailable: return "cudaErrorDevicesUnavailable";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorSystemDriverMismatch: return "cudaErrorSystemDriverMismatch";
    case cudaErrorCompatNotSupportedOnDevice: return "cudaErrorCompatNotSupportedOnDevice";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (CPU emulation with KVSIM_REQUIRE_GPU=1)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "error (CPU emulation of CUDA)";
    }
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = new CUstream_st{flags};
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return cudaErrorInvalidResourceHandle;
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
    return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = new CUevent_st{flags, 0, 0.0};
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    if (!e) return cudaErrorInvalidResourceHandle;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    e->recorded = 1;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidResourceHandle; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
        return cudaErrorInvalidResourceHandle;
    if (!a->recorded || !b->recorded) return cudaErrorInvalidResourceHandle;
    *ms = (float)((b->t - a->t) * 1e3);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return cudaErrorInvalidResourceHandle;
    delete e;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = NULL;
    void *m = malloc(bytes ? bytes : 1);
    if (!m) return cudaErrorMemoryAllocation;
    memset(m, 0xff, bytes); /* NaN in every float type: uninitialised reads show */
    std::lock_guard<std::mutex> lock(mem_mu);
    dev_allocs[(uintptr_t)m] = bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lock(mem_mu);
        if (!dev_allocs.erase((uintptr_t)p)) return cudaErrorInvalidValue;
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xff, bytes);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    *total_bytes = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    *free_bytes = (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    return cudaSuccess;
}

/* The device side(s) of a copy must lie inside one allocation: what a GPU would reject or fault on. */
static cudaError_t check_copy(const char *call, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind > cudaMemcpyDefault) return cudaErrorInvalidValue;
    if ((dst_dev && !emu_is_device_range(dst, bytes)) || (src_dev && !emu_is_device_range(src, bytes))) {
        fprintf(stderr, "cuda_emu: %s of %zu bytes: the device %s is not inside one cudaMalloc allocation\n", call,
                bytes, dst_dev && !emu_is_device_range(dst, bytes) ? "destination" : "source");
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    cudaError_t e = check_copy("cudaMemcpy", dst, src, bytes, kind);
    if (e == cudaSuccess && bytes) memmove(dst, src, bytes);
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
    cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, bytes, kind);
    if (e == cudaSuccess && bytes) memmove(dst, src, bytes);
    return e;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    if (!emu_is_device_range(p, bytes)) {
        fprintf(stderr, "cuda_emu: cudaMemset of %zu bytes outside one cudaMalloc allocation\n", bytes);
        return cudaErrorInvalidValue;
    }
    memset(p, value, bytes);
    return cudaSuccess;
}

/* ================================================================================================
 * cuBLAS: cublasGemmEx, column-major, fp32 accumulation
 * ============================================================================================== */

struct cublasContext {
    cudaStream_t stream;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    int n;
    *handle = NULL;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED; /* as without a driver */
    *handle = new cublasContext{NULL};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

static size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

static float load(const void *p, cudaDataType t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    if (t == CUDA_R_16F) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

static void store(void *p, cudaDataType t, size_t i, float v) {
    if (t == CUDA_R_32F) ((float *)p)[i] = v;
    else if (t == CUDA_R_16F) ((__half *)p)[i] = __float2half_rn(v);
    else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}

/* Operand of `rows` x `cols` stored column-major with leading dimension ld: inside one device allocation? */
static int operand_ok(const char *name, const void *p, cudaDataType t, int rows, int cols, int ld) {
    size_t elems = (size_t)ld * (size_t)(cols - 1) + (size_t)rows;
    if (emu_is_device_range(p, elems * type_size(t))) return 1;
    fprintf(stderr, "cuda_emu: cublasGemmEx: %s (%d x %d, ld %d) reaches outside its device allocation\n", name, rows,
            cols, ld);
    return 0;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    (void)algo;
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (transa < CUBLAS_OP_N || transa > CUBLAS_OP_C || transb < CUBLAS_OP_N || transb > CUBLAS_OP_C)
        return CUBLAS_STATUS_INVALID_VALUE;
    int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
    int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC)
        return CUBLAS_STATUS_NOT_SUPPORTED; /* 16F, 64F, TF32 ...: valid cuBLAS, not emulated */
    int types_ok = Atype == Btype && (Ctype == CUDA_R_32F || Ctype == Atype) &&
                   (Atype == CUDA_R_32F || Atype == CUDA_R_16F || Atype == CUDA_R_16BF);
    if (!types_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    float al = *(const float *)alpha, be = *(const float *)beta; /* host pointer mode, fp32 scale type */
    if ((k > 0 && (!operand_ok("A", A, Atype, a_rows, a_cols, lda) || !operand_ok("B", B, Btype, b_rows, b_cols, ldb))) ||
        !operand_ok("C", C, Ctype, m, n, ldc))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    /* op(A) row i and op(B) column j as contiguous fp32 vectors: the k-loop then runs on plain arrays */
    std::vector<float> at((size_t)m * (size_t)k), bt((size_t)k);
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++)
            at[(size_t)i * k + p] = transa == CUBLAS_OP_N ? load(A, Atype, (size_t)i + (size_t)p * lda)
                                                          : load(A, Atype, (size_t)p + (size_t)i * lda);
    for (int j = 0; j < n; j++) {
        for (int p = 0; p < k; p++)
            bt[p] = transb == CUBLAS_OP_N ? load(B, Btype, (size_t)p + (size_t)j * ldb)
                                          : load(B, Btype, (size_t)j + (size_t)p * ldb);
        for (int i = 0; i < m; i++) {
            const float *a = &at[(size_t)i * k];
            float acc = 0.0f; /* fp32 accumulation in index order (cuBLAS: fp32, another order) */
            for (int p = 0; p < k; p++) acc += a[p] * bt[p];
            size_t c = (size_t)i + (size_t)j * ldc;
            store(C, Ctype, c, be == 0.0f ? al * acc : al * acc + be * load(C, Ctype, c)); /* beta 0: C unread */
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}
