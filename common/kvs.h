/* kvs.h — the one status type, error reporting and small shared utilities of kvsim.
 *
 * Every library function returns a kvs_status (KVS_OK = 0, negative on error) and, on error, leaves a
 * human-readable detail in a thread-local buffer (kvs_last_error()) naming what was wrong: the file,
 * the field, the offending value. Library code never calls exit(); only main() turns a status into an
 * exit code. Style follows ../shared/STYLE.md rule 3 (SQLite integer codes, zstd's one error table).
 */
#ifndef KVS_H
#define KVS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    KVS_OK = 0,
    KVS_ERR_INVALID_ARG = -1,  /* caller passed a bad argument or option value */
    KVS_ERR_NOMEM = -2,        /* allocation failed */
    KVS_ERR_IO = -3,           /* open/read/write/rename failed (errno in the detail) */
    KVS_ERR_FORMAT = -4,       /* input file malformed: bad magic, size, offset or count */
    KVS_ERR_CHECKSUM = -5,     /* stored checksum does not match the data */
    KVS_ERR_VERSION = -6,      /* file format version not supported */
    KVS_ERR_TRUNCATED = -7,    /* file ends before the data it announces */
    KVS_ERR_UNSUPPORTED = -8,  /* well-formed input this build cannot handle (architecture, dtype...) */
    KVS_ERR_RANGE = -9,        /* index out of range: layer, head, position, token id */
    KVS_ERR_COMPRESS = -10,    /* zstd reported an error */
    KVS_ERR_DB = -11,          /* SQLite reported an error */
    KVS_ERR_TOLERANCE = -12,   /* a numeric check exceeded its tolerance */
    KVS_ERR_NO_DEVICE = -13,   /* no CUDA device (or no CUDA support in this build) */
    KVS_ERR_CUDA = -14,        /* a CUDA / cuBLAS call failed */
    KVS_ERR_STATE = -15,       /* call made in the wrong state (e.g. append after close) */
    KVS_ERR_END = -16,         /* end of a stream: not an error for iterators */
    KVS_ERR_EXTERNAL = -17,    /* an external program (gnuplot) failed */
    KVS_ERR_INTERRUPTED = -18, /* stopped on request (SIGINT/SIGTERM) before completion */
} kvs_status;

/*! kvs_strerror() : short fixed description of a status code; never NULL. */
const char *kvs_strerror(kvs_status s);

/*! kvs_fail() : records a formatted detail for status `s` in the calling thread and returns `s`
 *  (arguments may include kvs_last_error() itself, to prefix the previous detail),
 *  so error sites read `return kvs_fail(KVS_ERR_FORMAT, "%s: bad magic", path);`. */
kvs_status kvs_fail(kvs_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*! kvs_last_error() : the calling thread's most recent detail (empty string when none). Borrowed. */
const char *kvs_last_error(void);

/*! kvs_clear_error() : empties the calling thread's detail. */
void kvs_clear_error(void);

/* Propagate a failure: `KVS_TRY(st = f(...));` jumps to `cleanup` with st set when f fails. */
#define KVS_TRY(expr)                     \
    do {                                  \
        if ((expr) != KVS_OK) goto cleanup; \
    } while (0)

/* Internal invariants only (never for external input): abort with file and line when violated. */
void kvs_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define KVS_ASSERT(x) ((x) ? (void)0 : kvs_assert_fail(#x, __FILE__, __LINE__))

/* ---- element types used by traces and checkpoints ---- */
typedef enum { KVS_DTYPE_F32 = 0, KVS_DTYPE_F16 = 1, KVS_DTYPE_BF16 = 2 } kvs_dtype;

/*! kvs_dtype_size() : bytes per element (4 or 2). */
size_t kvs_dtype_size(kvs_dtype t);
/*! kvs_dtype_name() : "fp32", "fp16", "bf16". */
const char *kvs_dtype_name(kvs_dtype t);
/*! kvs_dtype_parse() : inverse of kvs_dtype_name (also accepts f32/f16/float32/float16/bfloat16). */
kvs_status kvs_dtype_parse(const char *s, kvs_dtype *out);

/* IEEE half and bfloat16 conversions, round-to-nearest-even, NaN/Inf preserved. */
uint16_t kvs_f32_to_f16(float f);
float kvs_f16_to_f32(uint16_t h);
uint16_t kvs_f32_to_bf16(float f);
float kvs_bf16_to_f32(uint16_t h);

/*! kvs_encode() / kvs_decode() : convert n floats to/from dtype `t` little-endian bytes. fp16 arrays go
 *  through x86 F16C instructions where the CPU has them (same results as the scalar conversions above);
 *  KVSIM_NO_F16C=1 in the environment forces the scalar path. */
void kvs_encode(kvs_dtype t, const float *src, size_t n, void *dst);
void kvs_decode(kvs_dtype t, const void *src, size_t n, float *dst);
/*! kvs_f16_fast_path() : 1 when kvs_encode/kvs_decode use the F16C path for fp16 on this machine. */
int kvs_f16_fast_path(void);

/*! kvs_crc32() : CRC-32 (IEEE 802.3, reflected 0xEDB88320), continuing from `crc` (start with 0). */
uint32_t kvs_crc32(uint32_t crc, const void *data, size_t n);

/* Bit pattern of a float and back (memcpy: the one well-defined type pun in C). */
static inline uint32_t kvs_f32_bits(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    return u;
}
static inline float kvs_bits_f32(uint32_t u) {
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

/* Little-endian load/store helpers for file formats (the formats are little-endian on every host). */
static inline void kvs_put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void kvs_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvs_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t kvs_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t kvs_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t kvs_get_u64(const uint8_t *p) {
    return (uint64_t)kvs_get_u32(p) | ((uint64_t)kvs_get_u32(p + 4) << 32);
}

/* ---- small file helpers (POSIX) ---- */

/*! kvs_write_all() : write n bytes to fd, retrying short writes; KVS_ERR_IO with errno detail. */
kvs_status kvs_write_all(int fd, const void *buf, size_t n, const char *what);
/*! kvs_pread_all() : read exactly n bytes at offset; KVS_ERR_TRUNCATED if the file is shorter. */
kvs_status kvs_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *what);
/*! kvs_file_sqlite_header() : 1 when the file at `path` starts with SQLite's 16-byte header ("SQLite format 3\0"),
 *  0 when it does not (or is shorter), -1 when it cannot be opened (errno set). Reads 16 bytes, opens nothing as a
 *  database. kvs_file_is_sqlite() : the same as a yes/no (an unreadable file is no). */
int kvs_file_sqlite_header(const char *path);
int kvs_file_is_sqlite(const char *path);

/*! kvs_path_base() : the last component of `path` (after its last '/', unless that ends the path), the path
 *  itself when it has none, "" for NULL. Borrowed from path. For labels: "dir/run.kvt" -> "run.kvt". */
const char *kvs_path_base(const char *path);

/*! kvs_format_real() : v in the shortest form that reads back to exactly v: a whole number below 2^53 as an
 *  integer ("1048576", never "1.04858e+06" or "1e+06"), anything else as the shortest "%.*g" (6 to 17 digits).
 *  For finite v (parameter values, table cells). */
void kvs_format_real(char *buf, size_t cap, double v);

/*! kvs_format_bytes() : a byte count for a table: "512B", "1.50KiB", "12.3MiB" (3 significant digits, binary
 *  prefixes); "-" for NaN. */
void kvs_format_bytes(char *buf, size_t cap, double v);

/*! kvs_read_file() : read a whole file into a malloc'd buffer (caller frees) with a NUL appended. */
kvs_status kvs_read_file(const char *path, char **out, size_t *len);

/*! kvs_alloc_rows() : memory for a large array whose rows kernels read in scattered order (a K/V history, whose
 *  rows a policy's S_t gathers). From 1 MiB up it is aligned to 2 MiB, rounded up to whole 2 MiB, and advised
 *  MADV_HUGEPAGE: where the kernel has transparent huge pages ("madvise" or "always") the array then sits on 2 MiB
 *  pages, one TLB entry where 4 KiB pages need 512. Smaller arrays, or a refused alignment, get plain malloc. The
 *  contents are uninitialised, as malloc's. Freed with free(). NULL when out of memory. */
void *kvs_alloc_rows(size_t bytes);

/*! kvs_now_s() : monotonic time in seconds, for progress lines and benchmarks only. */
double kvs_now_s(void);

/*! kvs_n_cpus() : the CPUs this process may run on (its affinity mask: Slurm's --cpus-per-task, taskset, a
 *  cpuset), else the online CPUs; at least 1. */
int kvs_n_cpus(void);

#endif /* KVS_H */
