/* failio.c — TEST-ONLY LD_PRELOAD shim for failure injection (tests/test_failinj.c): makes the N-th
 * and every later call of one I/O operation fail, as a disk that fills up or a device that starts failing
 * would. Never linked into kvsim; test_failinj.c compiles it into its scratch folder (cc -shared) and runs the
 * kvsim binary under test with LD_PRELOAD pointing at it.
 *
 *   KVS_FAILIO_OP      write | fsync | rename: which operation fails (write covers write, pwrite, pwrite64 and
 *                      writev on regular files only, so the command's own stderr still works; fsync covers
 *                      fsync and fdatasync; rename covers rename and renameat)
 *   KVS_FAILIO_N       the first call that fails (1-based); unset or 0: nothing fails, calls are only counted
 *   KVS_FAILIO_REPORT  a file to which the process appends "OP COUNT\n" at exit (how many calls it made), so a
 *                      test knows how many failure points a command has
 * A failed write sets ENOSPC, a failed fsync EIO, a failed rename EIO.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { OP_NONE, OP_WRITE, OP_FSYNC, OP_RENAME };

static int op_failing = -1; /* -1: not read yet */
static long fail_from, calls;

static void init(void) {
    if (op_failing >= 0) return;
    const char *op = getenv("KVS_FAILIO_OP"), *n = getenv("KVS_FAILIO_N");
    op_failing = !op ? OP_NONE : !strcmp(op, "write") ? OP_WRITE : !strcmp(op, "fsync") ? OP_FSYNC
                                 : !strcmp(op, "rename") ? OP_RENAME : OP_NONE;
    fail_from = n ? atol(n) : 0;
}

/* Counts a call of `op`; 1 when it must fail. */
static int must_fail(int op) {
    init();
    if (op != op_failing) return 0;
    calls++;
    return fail_from > 0 && calls >= fail_from;
}

static int is_regular(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

__attribute__((destructor)) static void report(void) {
    const char *path = getenv("KVS_FAILIO_REPORT");
    init();
    if (!path || op_failing == OP_NONE) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %ld\n", getenv("KVS_FAILIO_OP"), calls);
    fclose(f);
}

/* The libc function the shim wraps, looked up once (type: a function pointer typedef below). */
#define REAL(name, type)                                                                                       \
    static type real = NULL;                                                                                   \
    if (!real) real = (type)dlsym(RTLD_NEXT, name)

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*pwrite64_fn)(int, const void *, size_t, off64_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef int (*fsync_fn)(int);
typedef int (*rename_fn)(const char *, const char *);
typedef int (*renameat_fn)(int, const char *, int, const char *);

ssize_t write(int fd, const void *buf, size_t n) {
    REAL("write", write_fn);
    if (is_regular(fd) && must_fail(OP_WRITE)) { errno = ENOSPC; return -1; }
    return real(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL("pwrite", pwrite_fn);
    if (is_regular(fd) && must_fail(OP_WRITE)) { errno = ENOSPC; return -1; }
    return real(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off) {
    REAL("pwrite64", pwrite64_fn);
    if (is_regular(fd) && must_fail(OP_WRITE)) { errno = ENOSPC; return -1; }
    return real(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int n) {
    REAL("writev", writev_fn);
    if (is_regular(fd) && must_fail(OP_WRITE)) { errno = ENOSPC; return -1; }
    return real(fd, iov, n);
}

int fsync(int fd) {
    REAL("fsync", fsync_fn);
    if (is_regular(fd) && must_fail(OP_FSYNC)) { errno = EIO; return -1; }
    return real(fd);
}

int fdatasync(int fd) {
    REAL("fdatasync", fsync_fn);
    if (is_regular(fd) && must_fail(OP_FSYNC)) { errno = EIO; return -1; }
    return real(fd);
}

int rename(const char *from, const char *to) {
    REAL("rename", rename_fn);
    if (must_fail(OP_RENAME)) { errno = EIO; return -1; }
    return real(from, to);
}

int renameat(int dfrom, const char *from, int dto, const char *to) {
    REAL("renameat", renameat_fn);
    if (must_fail(OP_RENAME)) { errno = EIO; return -1; }
    return real(dfrom, from, dto, to);
}
