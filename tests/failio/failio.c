/* failio.c — TEST-ONLY LD_PRELOAD shim for failure injection (tests/test_failinj.c): makes the N-th
 * and every later call of one I/O operation fail, as a disk that fills up or a device that starts failing
 * would. Never linked into kvsim; test_failinj.c compiles it into its scratch folder (cc -shared) and runs the
 * kvsim binary under test with LD_PRELOAD pointing at it.
 *
 *   KVS_FAILIO_OP      write | fsync | rename | open: which operation fails (write covers write, pwrite, pwrite64
 *                      and writev on regular files only, so the command's own stderr still works; fsync covers
 *                      fsync and fdatasync; rename covers rename and renameat; open is below)
 *   KVS_FAILIO_N       the first call that fails (1-based); unset or 0: nothing fails, calls are only counted
 *   KVS_FAILIO_REPORT  a file to which the process appends "OP COUNT\n" at exit (how many calls it made), so a
 *                      test knows how many failure points a command has
 *   KVS_FAILIO_DIR     open only: the folder whose files the failing calls name (compared as a path prefix
 *                      ending in '/'; the tests give absolute paths, as the command under test is given)
 *   KVS_FAILIO_ERRNO   open only: EACCES (default) or EROFS
 * A failed write sets ENOSPC, a failed fsync EIO, a failed rename EIO.
 *
 * open makes KVS_FAILIO_DIR behave as a folder the user may read but not write (a directory without write
 * permission, or a read-only mount), which tests running as root cannot get from chmod: an open, open64,
 * openat, openat64, creat or creat64 of a path in it that would create or write (O_CREAT, O_WRONLY or O_RDWR)
 * counts as a call, as do access/faccessat asking W_OK there and unlink, unlinkat, rename, renameat, mkdir and
 * rmdir there; counted calls from the N-th on fail with KVS_FAILIO_ERRNO. Opens for reading, and everything
 * outside the folder, pass. libc's internal opens (fopen's) do not go through these symbols and are not seen: SQLite
 * and kvsim's database code call open() itself.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { OP_NONE, OP_WRITE, OP_FSYNC, OP_RENAME, OP_OPEN };

static int op_failing = -1; /* -1: not read yet */
static long fail_from, calls;
static const char *ro_dir;  /* KVS_FAILIO_DIR, open only */
static size_t ro_dir_len;
static int ro_errno = EACCES;

static void init(void) {
    if (op_failing >= 0) return;
    const char *op = getenv("KVS_FAILIO_OP"), *n = getenv("KVS_FAILIO_N");
    op_failing = !op ? OP_NONE : !strcmp(op, "write") ? OP_WRITE : !strcmp(op, "fsync") ? OP_FSYNC
                                 : !strcmp(op, "rename") ? OP_RENAME : !strcmp(op, "open") ? OP_OPEN : OP_NONE;
    fail_from = n ? atol(n) : 0;
    ro_dir = getenv("KVS_FAILIO_DIR");
    ro_dir_len = ro_dir ? strlen(ro_dir) : 0;
    while (ro_dir_len > 1 && ro_dir[ro_dir_len - 1] == '/') ro_dir_len--;
    const char *e = getenv("KVS_FAILIO_ERRNO");
    if (e && !strcmp(e, "EROFS")) ro_errno = EROFS;
}

/* 1 when `path` (relative to dirfd's folder when not absolute: then it is resolved through /proc) lies in
 * KVS_FAILIO_DIR. */
static int in_ro_dir(int dirfd, const char *path) {
    if (!ro_dir || !ro_dir_len || !path) return 0;
    char full[8192];
    if (path[0] == '/') snprintf(full, sizeof full, "%s", path);
    else {
        char link[64], base[4096];
        if (dirfd == AT_FDCWD) snprintf(link, sizeof link, "/proc/self/cwd");
        else snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, base, sizeof base - 1);
        if (n < 0) return 0;
        base[n] = '\0';
        snprintf(full, sizeof full, "%s/%s", base, path);
    }
    return !strncmp(full, ro_dir, ro_dir_len) && full[ro_dir_len] == '/';
}

/* Counts and fails a call that would change the read-only folder: 1 (errno set) when it must fail. */
static int ro_fails(int dirfd, const char *path) {
    init();
    if (op_failing != OP_OPEN || !in_ro_dir(dirfd, path)) return 0;
    calls++;
    if (fail_from > 0 && calls >= fail_from) {
        errno = ro_errno;
        return 1;
    }
    return 0;
}

#define WRITES(flags) (((flags) & (O_CREAT | O_WRONLY | O_RDWR)) != 0)

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
    if (in_ro_dir(AT_FDCWD, from) ? ro_fails(AT_FDCWD, from) : ro_fails(AT_FDCWD, to)) return -1;
    return real(from, to);
}

int renameat(int dfrom, const char *from, int dto, const char *to) {
    REAL("renameat", renameat_fn);
    if (must_fail(OP_RENAME)) { errno = EIO; return -1; }
    if (in_ro_dir(dfrom, from) ? ro_fails(dfrom, from) : ro_fails(dto, to)) return -1;
    return real(dfrom, from, dto, to);
}

/* ---- open: a folder that may be read but not written (see the header) */

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*creat_fn)(const char *, mode_t);
typedef int (*access_fn)(const char *, int);
typedef int (*faccessat_fn)(int, const char *, int, int);
typedef int (*unlink_fn)(const char *);
typedef int (*unlinkat_fn)(int, const char *, int);
typedef int (*mkdir_fn)(const char *, mode_t);

/* The mode argument exists only with O_CREAT or O_TMPFILE; reading it otherwise is harmless on the ABIs we run. */
#define OPEN_MODE(flags, mode)                                                                                \
    do {                                                                                                      \
        va_list ap;                                                                                           \
        va_start(ap, flags);                                                                                  \
        mode = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, mode_t) : 0;                \
        va_end(ap);                                                                                           \
    } while (0)

int open(const char *path, int flags, ...) {
    REAL("open", open_fn);
    mode_t mode;
    OPEN_MODE(flags, mode);
    if (WRITES(flags) && ro_fails(AT_FDCWD, path)) return -1;
    return real(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    REAL("open64", open_fn);
    mode_t mode;
    OPEN_MODE(flags, mode);
    if (WRITES(flags) && ro_fails(AT_FDCWD, path)) return -1;
    return real(path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    REAL("openat", openat_fn);
    mode_t mode;
    OPEN_MODE(flags, mode);
    if (WRITES(flags) && ro_fails(dirfd, path)) return -1;
    return real(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    REAL("openat64", openat_fn);
    mode_t mode;
    OPEN_MODE(flags, mode);
    if (WRITES(flags) && ro_fails(dirfd, path)) return -1;
    return real(dirfd, path, flags, mode);
}

int creat(const char *path, mode_t mode) {
    REAL("creat", creat_fn);
    if (ro_fails(AT_FDCWD, path)) return -1;
    return real(path, mode);
}

int creat64(const char *path, mode_t mode) {
    REAL("creat64", creat_fn);
    if (ro_fails(AT_FDCWD, path)) return -1;
    return real(path, mode);
}

int access(const char *path, int how) {
    REAL("access", access_fn);
    if ((how & W_OK) && ro_fails(AT_FDCWD, path)) return -1;
    return real(path, how);
}

int faccessat(int dirfd, const char *path, int how, int flags) {
    REAL("faccessat", faccessat_fn);
    if ((how & W_OK) && ro_fails(dirfd, path)) return -1;
    return real(dirfd, path, how, flags);
}

int unlink(const char *path) {
    REAL("unlink", unlink_fn);
    if (ro_fails(AT_FDCWD, path)) return -1;
    return real(path);
}

int unlinkat(int dirfd, const char *path, int flags) {
    REAL("unlinkat", unlinkat_fn);
    if (ro_fails(dirfd, path)) return -1;
    return real(dirfd, path, flags);
}

int rmdir(const char *path) {
    REAL("rmdir", unlink_fn);
    if (ro_fails(AT_FDCWD, path)) return -1;
    return real(path);
}

int mkdir(const char *path, mode_t mode) {
    REAL("mkdir", mkdir_fn);
    if (ro_fails(AT_FDCWD, path)) return -1;
    return real(path, mode);
}
