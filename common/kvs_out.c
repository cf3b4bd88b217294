/* kvs_out.c — output files that write through symbolic links, write special files in place and accept
 * "-" for standard output (see kvs_out.h). POSIX: lstat/readlink to follow the link chain of the last
 * component, a temporary file created O_EXCL beside the final target, fsync + rename(2) to replace it
 * atomically, and an fsync of the folder so the rename survives a crash.
 */
#include "kvs_out.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KVS_OUT_MAX_LINKS 40 /* Linux's own limit on a path's symbolic links */

struct kvs_out {
    kvs_out_kind kind;
    int fd;           /* where the bytes go (the temporary file for KVS_OUT_FILE) */
    int own_fd;       /* 1: fd is ours to close */
    FILE *stream;     /* NULL until kvs_out_stream() */
    int own_stream;   /* 1: stream is ours to fclose (it then owns its own dup of fd) */
    char *name;       /* the path as given, or "standard output" */
    char *target;     /* KVS_OUT_FILE: the final target, replaced by commit */
    char *temp;       /* KVS_OUT_FILE: the temporary file */
    char write_path[32]; /* KVS_OUT_FD: "/dev/fd/N" */
};

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Parses a whole non-negative decimal descriptor number; -1 if s is not one. */
static int parse_fd_number(const char *s) {
    if (!*s) return -1;
    long v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 1000000) return -1;
        v = v * 10 + (*s - '0');
    }
    return (int)v;
}

/* The descriptor a path stands for when it names one of this process's open descriptors (/dev/stdout,
 * /dev/stderr, /dev/fd/N, /proc/self/fd/N, /proc/thread-self/fd/N, /proc/<our pid>/fd/N), else -1. Such a
 * path must not be reopened: the kernel would give a new open file description at offset 0 without the
 * shell's O_APPEND, and a link to a pipe ("pipe:[123]") cannot be followed by name at all. */
static int fd_alias(const char *p) {
    if (!strcmp(p, "/dev/stdout")) return 1;
    if (!strcmp(p, "/dev/stderr")) return 2;
    if (!strncmp(p, "/dev/fd/", 8)) return parse_fd_number(p + 8);
    if (strncmp(p, "/proc/", 6) != 0) return -1;
    const char *rest = p + 6;
    char pid[32];
    snprintf(pid, sizeof pid, "%ld/", (long)getpid());
    if (!strncmp(rest, "self/", 5)) rest += 5;
    else if (!strncmp(rest, "thread-self/", 12)) rest += 12;
    else if (!strncmp(rest, pid, strlen(pid))) rest += strlen(pid);
    else return -1;
    if (strncmp(rest, "fd/", 3) != 0) return -1;
    return parse_fd_number(rest + 3);
}

/* *out = `link`'s target, joined to link's folder when relative (malloc'd). */
static kvs_status follow_link(const char *path, const char *link, const struct stat *st, char **out) {
    size_t cap = st->st_size > 0 ? (size_t)st->st_size + 1 : 256;
    char *buf = NULL;
    for (;;) {
        char *nb = realloc(buf, cap);
        if (!nb) {
            free(buf);
            return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
        }
        buf = nb;
        ssize_t n = readlink(link, buf, cap);
        if (n < 0) {
            kvs_status s = kvs_fail(KVS_ERR_IO, "%s: cannot read the symbolic link %s: %s", path, link, strerror(errno));
            free(buf);
            return s;
        }
        if ((size_t)n < cap) {
            buf[n] = '\0';
            break;
        }
        cap *= 2; /* the link changed under us, or st_size was 0 (procfs): grow */
    }
    if (buf[0] == '/') {
        *out = buf;
        return KVS_OK;
    }
    const char *slash = strrchr(link, '/');
    size_t dl = slash ? (size_t)(slash - link) + 1 : 0, bl = strlen(buf);
    char *joined = malloc(dl + bl + 1);
    if (!joined) {
        free(buf);
        return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(joined, link, dl);
    memcpy(joined + dl, buf, bl + 1);
    free(buf);
    *out = joined;
    return KVS_OK;
}

/* kvs_out_resolve() plus what kvs_out_open needs: the descriptor of KVS_OUT_FD, and for KVS_OUT_FILE
 * whether the target exists (then *st_out is its stat). */
static kvs_status resolve(const char *path, kvs_out_kind *kind, char **target, int *fd, int *exists,
                          struct stat *st_out) {
    *fd = -1;
    *exists = 0;
    if (!path || !path[0]) return kvs_fail(KVS_ERR_IO, "output: empty path");
    if (!strcmp(path, "-")) {
        *kind = KVS_OUT_FD;
        *fd = 1;
        return (*target = dup_str("-")) ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "output: out of memory");
    }
    char *cur = dup_str(path);
    if (!cur) return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
    for (int hops = 0;; hops++) {
        int n = fd_alias(cur);
        if (n >= 0) {
            free(cur);
            *kind = KVS_OUT_FD;
            *fd = n;
            return (*target = dup_str(path)) ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
        }
        struct stat st;
        if (lstat(cur, &st) != 0) {
            if (errno == ENOENT) { /* a new file (or a dangling link's target); a missing folder fails on create */
                *kind = KVS_OUT_FILE;
                *target = cur;
                return KVS_OK;
            }
            kvs_status s = kvs_fail(KVS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
            free(cur);
            return s;
        }
        if (S_ISLNK(st.st_mode)) {
            if (hops >= KVS_OUT_MAX_LINKS) {
                free(cur);
                return kvs_fail(KVS_ERR_IO, "%s: cannot write: more than %d symbolic links", path, KVS_OUT_MAX_LINKS);
            }
            char *next = NULL;
            kvs_status s = follow_link(path, cur, &st, &next);
            free(cur);
            if (s != KVS_OK) return s;
            cur = next;
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            free(cur);
            return kvs_fail(KVS_ERR_IO, "%s: cannot write: is a directory", path);
        }
        if (S_ISREG(st.st_mode)) {
            *kind = KVS_OUT_FILE;
            *exists = 1;
            if (st_out) *st_out = st;
            *target = cur;
            return KVS_OK;
        }
        free(cur); /* a device, FIFO or socket: written in place through the path as given */
        *kind = KVS_OUT_DIRECT;
        return (*target = dup_str(path)) ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
    }
}

kvs_status kvs_out_resolve(const char *path, kvs_out_kind *kind, char **target) {
    char *t = NULL;
    int fd, exists;
    kvs_out_kind k;
    kvs_status s = resolve(path, &k, &t, &fd, &exists, NULL);
    if (s != KVS_OK) return s;
    *kind = k;
    if (target) *target = t;
    else free(t);
    return KVS_OK;
}

int kvs_out_path_is_stdout(const char *path) {
    char *t = NULL;
    int fd = -1, exists;
    kvs_out_kind k;
    if (resolve(path, &k, &t, &fd, &exists, NULL) != KVS_OK) {
        kvs_clear_error();
        return 0;
    }
    free(t);
    return k == KVS_OUT_FD && fd == 1;
}

/* Creates target.tmp.XXXXXX exclusively (0666 & ~umask, as open(2) would create the target itself). */
static kvs_status create_temp(kvs_out *o) {
    static const char digits[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    size_t tl = strlen(o->target);
    o->temp = malloc(tl + 12);
    if (!o->temp) return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", o->name);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40) ^ (uintptr_t)o;
    for (int attempt = 0; attempt < 100; attempt++) {
        memcpy(o->temp, o->target, tl);
        memcpy(o->temp + tl, ".tmp.", 5);
        for (int i = 0; i < 6; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull; /* LCG step (Knuth MMIX) */
            o->temp[tl + 5 + i] = digits[(x >> 33) % 36];
        }
        o->temp[tl + 11] = '\0';
        o->fd = open(o->temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (o->fd >= 0) {
            o->own_fd = 1;
            return KVS_OK;
        }
        if (errno != EEXIST) break;
    }
    kvs_status s = kvs_fail(KVS_ERR_IO, "%s: cannot create %s: %s", o->name, o->temp, strerror(errno));
    free(o->temp);
    o->temp = NULL;
    return s;
}

static void out_free(kvs_out *o) {
    free(o->name);
    free(o->target);
    free(o->temp);
    free(o);
}

kvs_status kvs_out_open(const char *path, kvs_out **out) {
    *out = NULL;
    kvs_out *o = calloc(1, sizeof *o);
    if (!o) return kvs_fail(KVS_ERR_NOMEM, "output: out of memory");
    o->fd = -1;
    o->name = dup_str(path && !strcmp(path, "-") ? "standard output" : path ? path : "");
    if (!o->name) {
        free(o);
        return kvs_fail(KVS_ERR_NOMEM, "output: out of memory");
    }
    int fd = -1, exists = 0;
    struct stat st;
    kvs_status s = resolve(path, &o->kind, &o->target, &fd, &exists, &st);
    if (s != KVS_OK) {
        out_free(o);
        return s;
    }
    switch (o->kind) {
    case KVS_OUT_FD:
        if (fcntl(fd, F_GETFL) < 0) {
            s = kvs_fail(KVS_ERR_IO, "%s: cannot write: descriptor %d is not open", o->name, fd);
            break;
        }
        o->fd = fd;
        if (fd == 1 || fd == 2) o->stream = fd == 1 ? stdout : stderr; /* flushed before every write: in order */
        snprintf(o->write_path, sizeof o->write_path, "/dev/fd/%d", fd);
        break;
    case KVS_OUT_DIRECT:
        o->fd = open(path, O_WRONLY | O_CLOEXEC);
        if (o->fd < 0) s = kvs_fail(KVS_ERR_IO, "%s: cannot open for writing: %s", o->name, strerror(errno));
        else o->own_fd = 1;
        break;
    case KVS_OUT_FILE:
    default:
        if ((s = create_temp(o)) != KVS_OK) break;
        if (exists) { /* the replacement keeps the mode (and, where allowed, the owner) of what it replaces */
            (void)fchmod(o->fd, st.st_mode & 07777);
            if (st.st_uid != geteuid() || st.st_gid != getegid()) (void)!fchown(o->fd, st.st_uid, st.st_gid);
        }
        break;
    }
    if (s != KVS_OK) {
        kvs_out_abort(o);
        return s;
    }
    *out = o;
    return KVS_OK;
}

kvs_out_kind kvs_out_kind_of(const kvs_out *o) { return o->kind; }
int kvs_out_is_stdout(const kvs_out *o) { return o->kind == KVS_OUT_FD && o->fd == 1; }
const char *kvs_out_name(const kvs_out *o) { return o->name; }
int kvs_out_fd(const kvs_out *o) { return o->fd; }

const char *kvs_out_write_path(const kvs_out *o) {
    switch (o->kind) {
    case KVS_OUT_FILE: return o->temp;
    case KVS_OUT_FD: return o->write_path;
    case KVS_OUT_DIRECT:
    default: return o->target;
    }
}

FILE *kvs_out_stream(kvs_out *o) {
    if (o->stream) return o->stream; /* also stdout / stderr themselves, set by kvs_out_open */
    int d = dup(o->fd); /* the stream owns its own descriptor; commit still fsyncs/closes o->fd */
    if (d >= 0) {
        (void)fcntl(d, F_SETFD, FD_CLOEXEC);
        o->stream = fdopen(d, "wb");
        if (!o->stream) close(d);
    }
    if (!o->stream) {
        kvs_fail(KVS_ERR_NOMEM, "%s: cannot create an output stream: %s", o->name, strerror(errno));
        return NULL;
    }
    o->own_stream = 1;
    return o->stream;
}

/* "writing to standard output failed: <err>" or "<name>: write failed: <err>" */
static kvs_status write_error(const kvs_out *o, int err) {
    if (kvs_out_is_stdout(o)) return kvs_fail(KVS_ERR_IO, "writing to standard output failed: %s", strerror(err));
    return kvs_fail(KVS_ERR_IO, "%s: write failed: %s", o->name, strerror(err));
}

/* Flushes the stream (if any) and checks its error flag. */
static kvs_status flush_stream(kvs_out *o) {
    if (!o->stream) return KVS_OK;
    errno = 0;
    if (fflush(o->stream) != 0 || ferror(o->stream)) return write_error(o, errno ? errno : EIO);
    return KVS_OK;
}

kvs_status kvs_out_write(kvs_out *o, const void *buf, size_t n) {
    kvs_status s = flush_stream(o);
    if (s != KVS_OK) return s;
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = write(o->fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return write_error(o, errno);
        }
        p += w;
        n -= (size_t)w;
    }
    return KVS_OK;
}

/* fsync the folder of `path` so a rename into it survives a crash (best effort: some file systems refuse
 * fsync on folders, which is not an error here). */
static void fsync_folder(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? malloc((size_t)(slash - path) + 2) : NULL;
    if (slash && !dir) return;
    if (dir) {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    int fd = open(dir ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

kvs_status kvs_out_commit(kvs_out *o) {
    if (!o) return KVS_OK;
    kvs_status s = flush_stream(o);
    if (o->own_stream) {
        if (fclose(o->stream) != 0 && s == KVS_OK) s = write_error(o, errno);
        o->stream = NULL;
        o->own_stream = 0;
    }
    if (s == KVS_OK && o->kind == KVS_OUT_FILE && fsync(o->fd) != 0)
        s = kvs_fail(KVS_ERR_IO, "%s: fsync failed: %s", o->name, strerror(errno));
    if (o->own_fd) {
        int rc = close(o->fd);
        o->own_fd = 0;
        o->fd = -1;
        if (rc != 0 && s == KVS_OK) s = write_error(o, errno);
    }
    if (s == KVS_OK && o->kind == KVS_OUT_FILE) {
        if (rename(o->temp, o->target) != 0) {
            s = kvs_fail(KVS_ERR_IO, "%s: cannot rename %s to %s: %s", o->name, o->temp, o->target, strerror(errno));
        } else {
            free(o->temp); /* renamed: nothing left to remove */
            o->temp = NULL;
            fsync_folder(o->target);
        }
    }
    if (s != KVS_OK) {
        kvs_out_abort(o);
        return s;
    }
    out_free(o);
    return KVS_OK;
}

void kvs_out_abort(kvs_out *o) {
    if (!o) return;
    if (o->own_stream) fclose(o->stream); /* its own dup: the error detail of the failure is what matters */
    if (o->own_fd) close(o->fd);
    if (o->temp) unlink(o->temp);
    out_free(o);
}
