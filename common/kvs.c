/* kvs.c — status strings, thread-local error detail, dtype conversion, CRC-32 and POSIX file helpers.
 * See kvs.h. The half/bfloat16 conversions follow IEEE 754-2008 binary16 and the bfloat16 truncation
 * of binary32 with round-to-nearest-even.
 */
#include "kvs.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------------
 * Status and error detail
 * ---------------------------------------------------------------------------------------------- */

static const char *const kvs_status_names[] = {
    [0] = "ok",
    [1] = "invalid argument",
    [2] = "out of memory",
    [3] = "I/O error",
    [4] = "malformed file",
    [5] = "checksum mismatch",
    [6] = "unsupported format version",
    [7] = "truncated file",
    [8] = "unsupported input",
    [9] = "index out of range",
    [10] = "compression error",
    [11] = "database error",
    [12] = "tolerance exceeded",
    [13] = "no CUDA device",
    [14] = "CUDA error",
    [15] = "invalid state",
    [16] = "end of stream",
    [17] = "external program failed",
    [18] = "interrupted",
};

const char *kvs_strerror(kvs_status s) {
    int i = -(int)s;
    if (i < 0 || i >= (int)(sizeof kvs_status_names / sizeof kvs_status_names[0]) || !kvs_status_names[i])
        return "unknown status";
    return kvs_status_names[i];
}

static _Thread_local char kvs_err_buf[1024];

kvs_status kvs_fail(kvs_status s, const char *fmt, ...) {
    /* Format into a scratch buffer first: callers often prefix the previous detail
     * (kvs_fail(st, "%s: %s", path, kvs_last_error())), which aliases kvs_err_buf. */
    char tmp[sizeof kvs_err_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(kvs_err_buf, tmp, sizeof tmp);
    return s;
}

const char *kvs_last_error(void) { return kvs_err_buf; }
void kvs_clear_error(void) { kvs_err_buf[0] = '\0'; }

void kvs_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "kvsim: internal invariant violated: %s (%s:%d)\n", expr, file, line);
    abort();
}

/* ------------------------------------------------------------------------------------------------
 * dtypes
 * ---------------------------------------------------------------------------------------------- */

size_t kvs_dtype_size(kvs_dtype t) { return t == KVS_DTYPE_F32 ? 4 : 2; }

const char *kvs_dtype_name(kvs_dtype t) {
    switch (t) {
    case KVS_DTYPE_F32: return "fp32";
    case KVS_DTYPE_F16: return "fp16";
    case KVS_DTYPE_BF16: return "bf16";
    }
    return "?";
}

kvs_status kvs_dtype_parse(const char *s, kvs_dtype *out) {
    if (!strcmp(s, "fp32") || !strcmp(s, "f32") || !strcmp(s, "float32")) *out = KVS_DTYPE_F32;
    else if (!strcmp(s, "fp16") || !strcmp(s, "f16") || !strcmp(s, "float16")) *out = KVS_DTYPE_F16;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *out = KVS_DTYPE_BF16;
    else return kvs_fail(KVS_ERR_INVALID_ARG, "unknown dtype '%s' (expected fp16, bf16 or fp32)", s);
    return KVS_OK;
}


uint16_t kvs_f32_to_f16(float f) {
    uint32_t x = kvs_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t man = x & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0)); /* inf/nan */
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
    if (e <= 0) {                                    /* subnormal half or zero */
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++; /* may carry into exponent: correct */
    return (uint16_t)half;
}

float kvs_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return kvs_bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    /* NaNs come out quiet (bit 22 set), as IEEE conversion and F16C's vcvtph2ps give them */
    if (exp == 31) return kvs_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
    return kvs_bits_f32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

uint16_t kvs_f32_to_bf16(float f) {
    uint32_t x = kvs_f32_bits(f);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) return (uint16_t)((x >> 16) | 0x40u); /* nan */
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
}

float kvs_bf16_to_f32(uint16_t h) { return kvs_bits_f32((uint32_t)h << 16); }

/* fp16 arrays through x86's F16C instructions (8 values per instruction) when the CPU has them: the
 * conversion writers and readers spend most of their non-zstd time in. vcvtps2ph with round-to-nearest-even
 * and vcvtph2ps give, value for value, what kvs_f32_to_f16 / kvs_f16_to_f32 give (subnormals, inf and NaN
 * included; tests/test_common.c compares them over every half and every rounding boundary), and x86 is
 * little-endian like the stored bytes, so files never depend on the machine that wrote them. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define KVS_HAVE_F16C_PATH 1

__attribute__((target("avx,f16c"))) static void encode_f16_f16c(const float *src, size_t n, uint8_t *dst) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i), h);
    }
    for (; i < n; i++) kvs_put_u16(dst + 2 * i, kvs_f32_to_f16(src[i]));
}

__attribute__((target("avx,f16c"))) static void decode_f16_f16c(const uint8_t *src, size_t n, float *dst) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i))));
    for (; i < n; i++) dst[i] = kvs_f16_to_f32(kvs_get_u16(src + 2 * i));
}

/* 1 when the fast path may run: the CPU has F16C and KVSIM_NO_F16C is unset (tests compare both paths). */
static int use_f16c(void) {
    static int cached = -1; /* racing first calls store the same value */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        const char *off = getenv("KVSIM_NO_F16C");
        /* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c"; "avx"
         * (which both compilers know) also checks that the OS saves the YMM state the fast path uses. */
        unsigned a = 0, b = 0, c = 0, d = 0;
        int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        v = f16c && __builtin_cpu_supports("avx") && !(off && off[0] && strcmp(off, "0"));
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

int kvs_f16_fast_path(void) {
#ifdef KVS_HAVE_F16C_PATH
    return use_f16c();
#else
    return 0;
#endif
}

void kvs_encode(kvs_dtype t, const float *src, size_t n, void *dst) {
    uint8_t *d = dst;
    switch (t) {
    case KVS_DTYPE_F32:
        for (size_t i = 0; i < n; i++) kvs_put_u32(d + 4 * i, kvs_f32_bits(src[i]));
        break;
    case KVS_DTYPE_F16:
#ifdef KVS_HAVE_F16C_PATH
        if (use_f16c()) {
            encode_f16_f16c(src, n, d);
            break;
        }
#endif
        for (size_t i = 0; i < n; i++) kvs_put_u16(d + 2 * i, kvs_f32_to_f16(src[i]));
        break;
    case KVS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) kvs_put_u16(d + 2 * i, kvs_f32_to_bf16(src[i]));
        break;
    }
}

void kvs_decode(kvs_dtype t, const void *src, size_t n, float *dst) {
    const uint8_t *s = src;
    switch (t) {
    case KVS_DTYPE_F32:
        for (size_t i = 0; i < n; i++) dst[i] = kvs_bits_f32(kvs_get_u32(s + 4 * i));
        break;
    case KVS_DTYPE_F16:
#ifdef KVS_HAVE_F16C_PATH
        if (use_f16c()) {
            decode_f16_f16c(s, n, dst);
            break;
        }
#endif
        for (size_t i = 0; i < n; i++) dst[i] = kvs_f16_to_f32(kvs_get_u16(s + 2 * i));
        break;
    case KVS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = kvs_bf16_to_f32(kvs_get_u16(s + 2 * i));
        break;
    }
}

/* ------------------------------------------------------------------------------------------------
 * CRC-32 (slicing-by-1 table; fast enough next to zstd, which dominates)
 * ---------------------------------------------------------------------------------------------- */

static uint32_t crc_table[256];
static int crc_table_ready;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
    __atomic_store_n(&crc_table_ready, 1, __ATOMIC_RELEASE);
}

uint32_t kvs_crc32(uint32_t crc, const void *data, size_t n) {
    /* Table construction is idempotent, so a benign race between threads only repeats the work. */
    if (!__atomic_load_n(&crc_table_ready, __ATOMIC_ACQUIRE)) crc_init();
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

/* ------------------------------------------------------------------------------------------------
 * Files and time
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_write_all(int fd, const void *buf, size_t n, const char *what) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return kvs_fail(KVS_ERR_IO, "%s: write failed: %s", what, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return KVS_OK;
}

kvs_status kvs_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *what) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return kvs_fail(KVS_ERR_IO, "%s: read failed: %s", what, strerror(errno));
        }
        if (r == 0) return kvs_fail(KVS_ERR_TRUNCATED, "%s: file ends early (needed %zu more bytes at offset %llu)",
                                    what, n, (unsigned long long)off);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return KVS_OK;
}

kvs_status kvs_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kvs_fail(KVS_ERR_IO, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, n + 1);
    }
    kvs_status s = kvs_pread_all(fd, buf, n, 0, path);
    close(fd);
    if (s != KVS_OK) {
        free(buf);
        return s;
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return KVS_OK;
}

/* Why huge pages: on 4 KiB pages S_t over positions drawn across a 1 MiB history runs 10-25% slower than over a
 * window of the same size (bench_speed kernels, d 64 and 128), each gathered row a first-level TLB miss; on 2 MiB
 * pages the scattered rows cost about what contiguous ones do (sim/BENCH.md "Huge pages for the K/V history"). */
void *kvs_alloc_rows(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge / 2 || bytes > SIZE_MAX - huge) return malloc(bytes);
    size_t rounded = (bytes + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, rounded);
    if (!p) return malloc(bytes);
#ifdef MADV_HUGEPAGE
    (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice only: without THP the pages stay 4 KiB and all works */
#endif
    return p;
}

double kvs_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int kvs_n_cpus(void) {
    /* The CPUs this process may run on, not the machine's: under Slurm (--cpus-per-task), taskset or a container's
     * cpuset a thread per online CPU would oversubscribe the cores the job was given. */
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
        int n = CPU_COUNT(&allowed);
        if (n >= 1) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

void kvs_format_real(char *buf, size_t cap, double v) {
    if (v == floor(v) && fabs(v) < 9007199254740992.0) { /* every integer below 2^53 is exact */
        snprintf(buf, cap, "%.0f", v);
        return;
    }
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

void kvs_format_bytes(char *buf, size_t cap, double v) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (isnan(v)) {
        snprintf(buf, cap, "-");
        return;
    }
    int u = 0;
    double a = fabs(v);
    while (a >= 1024.0 && u < 5) {
        a /= 1024.0;
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%.0f%s", v, units[0]);
    else snprintf(buf, cap, "%.*f%s", a < 10 ? 2 : a < 100 ? 1 : 0, v, units[u]);
}

const char *kvs_path_base(const char *path) {
    if (!path) return "";
    const char *b = strrchr(path, '/');
    return b && b[1] ? b + 1 : path;
}

int kvs_file_sqlite_header(const char *path) {
    static const char magic[16] = "SQLite format 3";
    char hdr[16];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, hdr, sizeof hdr);
    close(fd);
    return n == (ssize_t)sizeof hdr && memcmp(hdr, magic, sizeof magic) == 0;
}

int kvs_file_is_sqlite(const char *path) { return kvs_file_sqlite_header(path) == 1; }
