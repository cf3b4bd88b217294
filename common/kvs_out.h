/* kvs_out.h — output files that do what their path names: the one way kvsim commands write a result file
 * (`export --out`, `capture --out`, `trace recover IN OUT`, `plot --out`: gnuplot draws into a temporary
 * folder and plots/plot.c copies the image in with kvs_out_write()).
 *
 * What a path names, and how it is written:
 *   "-"                        standard output (descriptor 1), written in place.
 *   /dev/stdout, /dev/stderr,  the descriptor itself (dup'd), written in place: its offset and O_APPEND
 *   /dev/fd/N, /proc/self/fd/N are honoured, as a shell redirection would (never reopened or truncated).
 *   a character or block device, a FIFO, a socket (after following symbolic links):
 *                              opened with O_WRONLY and written directly: no temporary file, no rename.
 *   anything else: a regular file, a new name, or a symbolic link (also a dangling one) to either:
 *                              the link chain of the last path component is followed to its final target;
 *                              the data goes to a temporary file beside that target (TARGET.tmp.XXXXXX,
 *                              created 0666 & ~umask, or with the mode of the file it replaces) which
 *                              kvs_out_commit() fsyncs and renames over TARGET. The links stay links and
 *                              now point at the new content; a failed or abandoned write removes the
 *                              temporary file, so TARGET is either the old content or the complete new
 *                              one, never half-written.
 *   a directory: an error.
 * Directly written outputs (the first three kinds) cannot be made atomic: a failure may leave part of the
 * data written there.
 *
 * Life cycle: kvs_out_open() -> write through kvs_out_write(), kvs_out_fd() or kvs_out_stream() (one of
 * them: kvs_out_write() flushes the stream first, so mixing them in order is safe) -> kvs_out_commit() on
 * success or kvs_out_abort() on failure; both free the handle. Not thread-safe (one writer).
 * Errors are KVS_ERR_IO (or KVS_ERR_NOMEM) with a detail naming the path as given and the errno text.
 */
#ifndef KVS_OUT_H
#define KVS_OUT_H

#include <stddef.h>
#include <stdio.h>

#include "kvs.h"

typedef struct kvs_out kvs_out;

/* How an output is written (see above). */
typedef enum {
    KVS_OUT_FILE = 0,   /* temporary file beside the (symlink-resolved) target, renamed by commit */
    KVS_OUT_DIRECT = 1, /* a device, FIFO or socket opened and written in place */
    KVS_OUT_FD = 2,     /* an inherited descriptor: "-" (standard output), /dev/stdout, /dev/fd/N, ... */
} kvs_out_kind;

/*! kvs_out_resolve() : classifies `path` without opening or creating anything: *kind receives how it would
 *  be written and *target (malloc'd, caller frees; may be NULL) the path that would be replaced: the final
 *  target of the symbolic links of the last component for KVS_OUT_FILE, else `path` itself ("-" for
 *  standard output). @return KVS_OK; KVS_ERR_IO for a directory, a link loop (more than 40 links), an
 *  unreadable link or a path component that cannot be searched; KVS_ERR_NOMEM. */
kvs_status kvs_out_resolve(const char *path, kvs_out_kind *kind, char **target);

/*! kvs_out_path_is_stdout() : 1 when writing to `path` would write to this process's standard output
 *  ("-", /dev/stdout, /dev/fd/1, a link to one of them), so that a command can print its messages to stderr
 *  before the output even exists; 0 otherwise (also when `path` cannot be resolved). */
int kvs_out_path_is_stdout(const char *path);

/*! kvs_out_open() : opens `path` for writing a complete new content (see the table above).
 *  @return KVS_OK and *out (caller must end it with kvs_out_commit or kvs_out_abort); KVS_ERR_IO naming
 *  `path` (no file is left behind); KVS_ERR_NOMEM. */
kvs_status kvs_out_open(const char *path, kvs_out **out);

/*! kvs_out_kind_of() : how `o` is being written. */
kvs_out_kind kvs_out_kind_of(const kvs_out *o);

/*! kvs_out_is_stdout() : 1 when `o` writes to this process's standard output (descriptor 1: "-",
 *  /dev/stdout, /dev/fd/1, ...): a command then prints its own messages to stderr. */
int kvs_out_is_stdout(const kvs_out *o);

/*! kvs_out_name() : the path as given, or "standard output" for "-": for messages. Borrowed from o. */
const char *kvs_out_name(const kvs_out *o);

/*! kvs_out_fd() : the descriptor to write to (the temporary file for KVS_OUT_FILE). Borrowed: never
 *  close it. */
int kvs_out_fd(const kvs_out *o);

/*! kvs_out_stream() : a stdio stream on kvs_out_fd() (the process's `stdout` itself when writing to
 *  descriptor 1, so output stays ordered with printf). Borrowed: never fclose it; kvs_out_commit flushes it
 *  and checks its error flag. NULL (KVS_ERR_NOMEM detail) if the stream cannot be created. */
FILE *kvs_out_stream(kvs_out *o);

/*! kvs_out_write_path() : a path through which ANOTHER program (gnuplot) may open and write the output
 *  before kvs_out_commit(): the temporary file (KVS_OUT_FILE), the device path (KVS_OUT_DIRECT) or
 *  "/dev/fd/N" for an inherited descriptor (valid in child processes, which inherit it). Borrowed. */
const char *kvs_out_write_path(const kvs_out *o);

/*! kvs_out_write() : writes n bytes (flushing the stream first if one was created); KVS_ERR_IO naming
 *  the output. */
kvs_status kvs_out_write(kvs_out *o, const void *buf, size_t n);

/*! kvs_out_commit() : completes the output: flushes the stream (its error flag and the flush are checked),
 *  then for KVS_OUT_FILE fsyncs, closes, renames the temporary file over the target and fsyncs its
 *  folder; for the others closes what it opened (descriptor 1 stays open, flushed). Frees o in every case;
 *  on failure the temporary file is removed. Accepts NULL (KVS_OK). @return KVS_OK or KVS_ERR_IO naming
 *  the output ("writing to standard output failed: No space left on device", ...). */
kvs_status kvs_out_commit(kvs_out *o);

/*! kvs_out_abort() : abandons the output: removes the temporary file (KVS_OUT_FILE; the target keeps its
 *  old content), closes what it opened, frees o. Keeps the calling thread's error detail. Accepts NULL. */
void kvs_out_abort(kvs_out *o);

#endif /* KVS_OUT_H */
