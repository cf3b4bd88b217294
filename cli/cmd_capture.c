/* cmd_capture.c — `kvsim capture`: real decoding of a real model on the CPU, recorded as a trace
 * (../shared/DESIGN.md "Capture"). Option parsing, prompt input
 * (files, standard input) and where the trace and the text go (common/kvs_out.h); the work is
 * kvs_capture_run (gpu_capture/capture.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/kvs_out.h"
#include "../gpu_capture/capture.h"
#include "../trace/trace.h"
#include "cli.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define THREADS_MAX STR(KVS_CLI_MAX_THREADS)

static const char *const capture_help =
    "usage: kvsim capture --model PATH (--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3 | --turns FILE)\n"
    "                     (--out TRACE | --no-trace) [options]\n"
    "\n"
    "Decodes with the CPU reference forward pass and records, for every position, layer and head, the\n"
    "post-RoPE q/k, v, attention output and log-sum-exp (trace/FORMAT.md).\n"
    "\n"
    "  --model PATH         llama2.c .bin checkpoint or Hugging Face folder (config.json + *.safetensors)\n"
    "  --tokenizer FILE     tokenizer (default: tok<vocab>.bin / tokenizer.bin beside a .bin, tokenizer.json in a folder)\n"
    "  --prompt TEXT        prompt text\n"
    "  --prompt-file F      prompt text read from file F (- = standard input); ONE trailing newline (\\n or\n"
    "                       \\r\\n), which editors add, is removed: it would otherwise become a token\n"
    "  --prompt-ids LIST    comma-separated token ids (BOS is prepended unless --no-bos or LIST starts with it)\n"
    "  --turns FILE         multi-turn: each non-empty line is one user turn (\\n inside a line = newline; - =\n"
    "                       standard input); each turn's tokens are fed as prompt, then --steps tokens are\n"
    "                       generated; the text is printed turn by turn after \"--- turn T (positions A..B) ---\"\n"
    "                       lines (T numbered from 0, as `kvsim info` does)\n"
    "                       (no prompt option at all: start from BOS alone)\n"
    "  --chat               apply the model folder's own chat template (tokenizer_config.json): the prompt, or\n"
    "                       each turn with the conversation so far (the model's replies included), is rendered\n"
    "                       as a user message with the assistant header after it; only the tokens beyond those\n"
    "                       in the cache are fed, and a template that rewrites earlier turns is refused with\n"
    "                       the reason. `kvsim chat-template` prints a rendering without capturing\n"
    "  --system TEXT        --chat: a system message before the first user message\n"
    "  --chat-date DATE     --chat: the date (YYYY-MM-DD) a template's strftime_now() formats (otherwise refused)\n"
    "  --truncate left|right\n"
    "                       when the prompt and the --steps generated tokens do not fit in the positions\n"
    "                       allowed (model context or --max-positions), drop prompt tokens from the left (the\n"
    "                       start; a leading BOS is kept) or the right (the end) until they do, keeping at least\n"
    "                       one; says how many on stderr. Without it a prompt longer than the positions allowed\n"
    "                       is an error. Not with --turns\n"
    "  --no-bos             do not prepend BOS\n"
    "  --steps N            tokens to generate (per turn), default 64; every one is forwarded and recorded\n"
    "  --ignore-eos         keep generating past the end-of-sequence token\n"
    "  --max-positions N    stop after N positions (default: the model context)\n"
    "  --temperature T      0 = greedy (default), up to 100\n"
    "  --top-p P            nucleus sampling, P in (0, 1] (default 1 = off)\n"
    "  --seed S             sampling seed (default 42)\n"
    "  --dtype D            trace storage of q/k/v/o: fp16 (default), bf16, fp32 (lse is always fp32)\n"
    "  --block N            positions per trace block (default 64)\n"
    "  --record full|qkv    what the trace stores: full (default) q/k/v plus the attention output o and its\n"
    "                       lse; qkv (lean, about 40-50% smaller) q/k/v only: readers recompute o and lse from\n"
    "                       them, and verify can check the chunks but not the recorded outputs\n"
    "  --threads N          worker threads for the CPU forward pass and for trace compression, 1.." THREADS_MAX "\n"
    "                       (default: all cores; with --device cuda, compression only, all cores but one)\n"
    "  --device cpu|cuda    backend (default cpu; cuda needs a build made with `make cuda` and a GPU)\n"
    "  --out TRACE          trace file to write (written as TRACE.partial, renamed when complete; a symbolic\n"
    "                       link is written through to its target, which is replaced; a FIFO or device, or -\n"
    "                       for standard output, gets the finished trace and the text goes to stderr)\n"
    "  --no-trace           decode without recording; prints the token ids and the text\n"
    "  --progress / --quiet progress lines on stderr (default: only when stderr is a terminal): phase (prefill\n"
    "                       = prompt, decode = generated; turn t/T), its positions done/planned, all positions\n"
    "                       done/planned, the phase's tok/s, ETA of the phase and of the whole capture (from each\n"
    "                       phase's own cost per position, fitted as growing with the position; -- until every\n"
    "                       phase left has been timed), trace MB written, time elapsed; rewritten in place every\n"
    "                       0.5 s on a terminal, one line every 2 s otherwise\n"
    "\n"
    "SIGINT (Ctrl-C) or SIGTERM stops the capture at the next position: the positions done stay in\n"
    "TRACE.partial (written out and synced), the message prints the exact `kvsim trace recover` command that\n"
    "turns them into a valid trace, and the exit status is 130 (SIGINT) or 143 (SIGTERM). A second signal\n"
    "ends the process at once (TRACE.partial then holds the blocks written before it, still recoverable).\n"
    "\n"
    "Options take --opt VALUE or --opt=VALUE; each may be given once (a second one is a usage error).\n"
    "Text that the tokenizer maps to its unknown token gets a warning on stderr with the count.\n"
    "Exit status: 0 success, 1 failure (bad model/tokenizer/prompt, I/O), 2 bad usage, 130/143 interrupted.\n";

/* Parses "1,2, 3" into a malloc'd array. */
static kvs_status parse_ids(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ' ') p++;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) {
            free(ids);
            return kvs_fail(KVS_ERR_INVALID_ARG, "--prompt-ids: '%s' is not a comma-separated list of token ids", s);
        }
        if (k == cap) {
            int32_t *m = realloc(ids, 2 * cap * sizeof *ids);
            if (!m) {
                free(ids);
                return kvs_fail(KVS_ERR_NOMEM, "out of memory");
            }
            ids = m;
            cap *= 2;
        }
        ids[k++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            if (!*p) break;
        } else if (*p) {
            free(ids);
            return kvs_fail(KVS_ERR_INVALID_ARG, "--prompt-ids: '%s' is not a comma-separated list of token ids", s);
        }
    }
    if (k == 0) {
        free(ids);
        return kvs_fail(KVS_ERR_INVALID_ARG, "--prompt-ids: empty list");
    }
    *out = ids;
    *n = k;
    return KVS_OK;
}

/* Reads a whole text input: a file of any kind (a pipe, a FIFO, process substitution) or "-" for standard
 * input; *out is malloc'd and NUL-terminated (caller frees). A NUL byte in it is an error. */
static kvs_status read_text(const char *path, char **out) {
    int is_stdin = !strcmp(path, "-");
    const char *name = is_stdin ? "standard input" : path;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) return kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", name, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    kvs_status s = KVS_OK;
    while (buf) {
        if (len + 1 == cap) {
            char *nb = cap < ((size_t)1 << 30) ? realloc(buf, 2 * cap) : NULL;
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - 1 - len, f);
        len += n;
        if (n == 0) break;
    }
    if (!buf || len + 1 == cap) s = kvs_fail(KVS_ERR_NOMEM, "%s: too large or out of memory", name);
    else if (ferror(f)) s = kvs_fail(KVS_ERR_IO, "%s: cannot read: %s", name, strerror(errno));
    else if (memchr(buf, 0, len)) s = kvs_fail(KVS_ERR_FORMAT, "%s: contains a NUL byte", name);
    if (!is_stdin) fclose(f);
    if (s != KVS_OK) {
        free(buf);
        return s;
    }
    buf[len] = '\0';
    *out = buf;
    return KVS_OK;
}

/* Removes ONE trailing newline ("\n" or "\r\n"): the one every editor ends a file with, which would
 * otherwise be encoded as a token of the prompt. A lone trailing "\r" is no newline: it stays, as the help says. */
static void strip_one_newline(char *text) {
    size_t n = strlen(text);
    if (!n || text[n - 1] != '\n') return;
    text[--n] = '\0';
    if (n && text[n - 1] == '\r') text[--n] = '\0';
}

/* A trace for a FIFO, a device or standard output is written to a temporary folder first (the trace writer
 * needs a file it can rename) and copied there once complete. */
typedef struct {
    char dir[4096];
    char path[4200];
} staged_trace;

static kvs_status stage_create(staged_trace *st) {
    const char *tmp = getenv("TMPDIR");
    snprintf(st->dir, sizeof st->dir, "%s/kvsim-capture-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(st->dir)) return kvs_fail(KVS_ERR_IO, "%s: cannot create a temporary folder: %s", st->dir, strerror(errno));
    snprintf(st->path, sizeof st->path, "%s/trace.kvt", st->dir);
    return KVS_OK;
}

static void stage_remove(const staged_trace *st) {
    char partial[4300];
    snprintf(partial, sizeof partial, "%s.partial", st->path);
    unlink(st->path);
    unlink(partial);
    rmdir(st->dir);
}

/* Copies the staged trace to out_path through common/kvs_out.h. A reader that goes away (a closed pipe or
 * FIFO) is a write error here (EPIPE), not a SIGPIPE death, so that the staged copy is still removed. */
static kvs_status stage_deliver(const staged_trace *st, const char *out_path) {
    int fd = open(st->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", st->path, strerror(errno));
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_pipe;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe);
    kvs_out *o = NULL;
    kvs_status s = kvs_out_open(out_path, &o);
    char buf[1 << 16];
    while (s == KVS_OK) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) s = kvs_fail(KVS_ERR_IO, "%s: read failed: %s", st->path, strerror(errno));
        if (n <= 0) break;
        s = kvs_out_write(o, buf, (size_t)n);
    }
    close(fd);
    if (s != KVS_OK) kvs_out_abort(o);
    else s = kvs_out_commit(o);
    sigaction(SIGPIPE, &old_pipe, NULL);
    return s;
}

/* SIGINT/SIGTERM during the capture: the handler only records the signal, which kvs_capture_run polls at each
 * position (opts.stop); SA_RESETHAND gives the second signal its default action, so it ends the process at
 * once. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) { stop_signal = sig; }

static void stop_handlers_install(struct sigaction old[2]) {
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESETHAND | SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old[0]);
    sigaction(SIGTERM, &sa, &old[1]);
}

static void stop_handlers_restore(const struct sigaction old[2]) {
    sigaction(SIGINT, &old[0], NULL);
    sigaction(SIGTERM, &old[1], NULL);
}

/* Writes `s` as one shell word: bare when it holds only characters no shell treats specially, else in single
 * quotes (a ' inside as '\''), so that the printed command can be pasted as it is. */
static void put_shell_word(FILE *f, const char *s) {
    if (s[0] && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./-+,:=@%") == strlen(s)) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputs("'\\''", f);
        else fputc(*s, f);
    }
    fputc('\'', f);
}

/* Says what an interrupted capture left and how to recover it. partial: the .partial file; target: where the
 * recovered trace goes (the trace's own path, or --out as given for a FIFO, a device or standard output).
 * The command names this very program (/proc/self/exe), so it runs as printed whatever PATH holds. A staged
 * trace's temporary folder (stage_dir, else NULL) is left for the recovery and named, for removal after it.
 * @return the exit status, 128 + the signal. */
static int report_interrupted(const kvs_capture_result *r, int sig, const char *partial, const char *target,
                              const char *stage_dir) {
    const char *name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    if (!r->partial_kept) {
        fprintf(stderr, "kvsim capture: interrupted by %s after %lld positions: %s\n", name, (long long)r->n_positions,
                partial ? "no position was recorded, no trace was written" : "no trace was recorded (--no-trace)");
        return 128 + sig;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) self[n] = '\0';
    else snprintf(self, sizeof self, "kvsim");
    fprintf(stderr, "kvsim capture: interrupted by %s after %lld positions; %s holds them. Recover a valid trace of "
                    "those positions with:\n  ", name, (long long)r->n_positions, partial);
    put_shell_word(stderr, self);
    fputs(" trace recover ", stderr);
    put_shell_word(stderr, partial);
    fputc(' ', stderr);
    put_shell_word(stderr, target);
    fputc('\n', stderr);
    if (stage_dir) fprintf(stderr, "kvsim capture: then remove the temporary folder %s\n", stage_dir);
    return 128 + sig;
}

/* The options: each at most once (cli.h kvs_cli_once); --progress and --quiet share one slot. */
/* --chat, --system TEXT, --chat-date DATE (also --opt=VALUE) at argv[*i]: 0 consumed, -1 not one of them, else an
 * exit status. */
static int chat_option(const char *cmd, int argc, char **argv, int *i, kvs_capture_opts *o, int *seen) {
    const char *a = argv[*i];
    if (!strcmp(a, "--chat")) {
        if (kvs_cli_once(cmd, a, &seen[0])) return KVS_EXIT_USAGE;
        o->chat = 1;
        return 0;
    }
    static const char *const names[] = {"--system", "--chat-date"};
    for (int k = 0; k < 2; k++) {
        size_t nl = strlen(names[k]);
        if (strncmp(a, names[k], nl) || (a[nl] && a[nl] != '=')) continue;
        const char *v = a[nl] ? a + nl + 1 : NULL;
        if (!v) {
            if (*i + 1 >= argc) return kvs_cli_usage_error(cmd, "option %s needs a value", names[k]);
            v = argv[++*i];
        }
        if (kvs_cli_once(cmd, names[k], &seen[1 + k])) return KVS_EXIT_USAGE;
        if (k == 0) o->chat_system = v;
        else o->chat_date = v;
        return 0;
    }
    return -1;
}

static const char *const value_opts[] = {"--model",  "--tokenizer",     "--prompt", "--prompt-file", "--prompt-ids",
                                         "--turns",  "--out",           "--device", "--steps",       "--max-positions",
                                         "--block",  "--threads",       "--temperature", "--top-p",  "--seed",
                                         "--dtype",  "--truncate",      "--record"};
#define N_VALUE_OPTS (sizeof value_opts / sizeof value_opts[0])
enum { SEEN_NO_BOS = N_VALUE_OPTS, SEEN_IGNORE_EOS, SEEN_NO_TRACE, SEEN_PROGRESS, N_SEEN };

int kvs_cmd_capture(int argc, char **argv) {
    const char *cmd = "capture";
    kvs_capture_opts o;
    memset(&o, 0, sizeof o);
    o.steps = 64;
    o.top_p = 1.0f;
    o.seed = 42;
    o.dtype = KVS_DTYPE_F16;
    const char *prompt_file = NULL, *prompt_ids = NULL, *turns_file = NULL, *device = "cpu", *out_path = NULL;
    int no_trace = 0, progress = -1, rc = KVS_EXIT_OK, seen[N_SEEN] = {0}, seen_chat[3] = {0};
    int32_t *ids = NULL;
    char *file_text = NULL, **turns = NULL, src[4200], *target = NULL;
    staged_trace stage = {.dir = ""};
    kvs_capture_result res;
    memset(&res, 0, sizeof res);
    kvs_status s;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (kvs_cli_is_help(a)) {
            fputs(capture_help, stdout);
            return kvs_cli_finish_stdout(cmd);
        }
        int co = chat_option(cmd, argc, argv, &i, &o, seen_chat);
        if (co >= 0) {
            if (co > 0) return co;
            continue;
        }
        static const char *const flags[] = {"--no-bos", "--ignore-eos", "--no-trace", "--progress", "--quiet"};
        int fi = -1;
        for (int k = 0; k < 5; k++)
            if (!strcmp(a, flags[k])) fi = k;
        if (fi >= 0) {
            int slot = fi < 3 ? SEEN_NO_BOS + fi : SEEN_PROGRESS;
            if (kvs_cli_once(cmd, fi < 3 ? a : "--progress/--quiet", &seen[slot])) return KVS_EXIT_USAGE;
            if (fi == 0) o.no_bos = 1;
            else if (fi == 1) o.ignore_eos = 1;
            else if (fi == 2) no_trace = 1;
            else progress = fi == 3;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || !a[2]) return kvs_cli_usage_error(cmd, "unexpected argument '%s'", a);
        /* --opt VALUE or --opt=VALUE */
        char name[64];
        const char *eq = strchr(a, '='), *v;
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        snprintf(name, sizeof name, "%.*s", (int)(nl < sizeof name ? nl : sizeof name - 1), a);
        size_t oi = 0;
        while (oi < N_VALUE_OPTS && strcmp(name, value_opts[oi])) oi++;
        if (oi == N_VALUE_OPTS || nl >= sizeof name) return kvs_cli_usage_error(cmd, "unknown option '%s'", a);
        if (eq) {
            v = eq + 1;
        } else {
            if (i + 1 >= argc) return kvs_cli_usage_error(cmd, "option %s needs a value", name);
            v = argv[++i];
        }
        if (kvs_cli_once(cmd, name, &seen[oi])) return KVS_EXIT_USAGE;
        long lv;
        double dv;
        if (!strcmp(name, "--model")) o.model_path = v;
        else if (!strcmp(name, "--tokenizer")) o.tokenizer_path = v;
        else if (!strcmp(name, "--prompt")) o.prompt_text = v;
        else if (!strcmp(name, "--prompt-file")) prompt_file = v;
        else if (!strcmp(name, "--prompt-ids")) prompt_ids = v;
        else if (!strcmp(name, "--turns")) turns_file = v;
        else if (!strcmp(name, "--out")) out_path = v;
        else if (!strcmp(name, "--device")) device = v;
        else if (!strcmp(name, "--steps") || !strcmp(name, "--max-positions") || !strcmp(name, "--block") ||
                 !strcmp(name, "--threads")) {
            long lo = !strcmp(name, "--steps") ? 0 : 1;
            long hi = !strcmp(name, "--block")     ? KVS_TRACE_MAX_BLOCK
                      : !strcmp(name, "--threads") ? KVS_CLI_MAX_THREADS
                                                   : (1L << 24);
            if (kvs_cli_parse_long(name, v, lo, hi, &lv) != KVS_OK) return kvs_cli_usage_error(cmd, "%s", kvs_last_error());
            if (!strcmp(name, "--steps")) o.steps = (int)lv;
            else if (!strcmp(name, "--max-positions")) o.max_positions = (int)lv;
            else if (!strcmp(name, "--block")) o.block = (int)lv;
            else o.threads = (int)lv;
        } else if (!strcmp(name, "--temperature")) {
            if (kvs_cli_parse_double(name, v, 0, 100, &dv) != KVS_OK) return kvs_cli_usage_error(cmd, "%s", kvs_last_error());
            o.temperature = (float)dv;
        } else if (!strcmp(name, "--top-p")) {
            /* (0, 1]: one message for every bad value, the open bound included */
            if (kvs_cli_parse_double(name, v, -1e300, 1e300, &dv) != KVS_OK) return kvs_cli_usage_error(cmd, "%s", kvs_last_error());
            if (!(dv > 0 && dv <= 1)) return kvs_cli_usage_error(cmd, "--top-p: '%s' is out of range (0, 1]", v);
            o.top_p = (float)dv;
        } else if (!strcmp(name, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long sv = strtoull(v, &end, 10);
            if (!v[0] || *end || v[0] == '-' || v[0] == ' ' || v[0] == '+')
                return kvs_cli_usage_error(cmd, "--seed: '%s' is not a non-negative integer", v);
            if (errno == ERANGE) return kvs_cli_usage_error(cmd, "--seed: '%s' is out of range [0, %llu]", v, (unsigned long long)UINT64_MAX);
            o.seed = sv;
        } else if (!strcmp(name, "--dtype")) {
            kvs_dtype dt;
            if (kvs_dtype_parse(v, &dt) != KVS_OK) return kvs_cli_usage_error(cmd, "--dtype: '%s' is not fp32, fp16 or bf16", v);
            o.dtype = dt;
        } else if (!strcmp(name, "--record")) {
            if (!strcmp(v, "qkv")) o.record_qkv = 1;
            else if (strcmp(v, "full")) return kvs_cli_usage_error(cmd, "--record: '%s' is not full or qkv", v);
        } else { /* --truncate */
            if (!strcmp(v, "left")) o.truncate = KVS_CAPTURE_TRUNCATE_LEFT;
            else if (!strcmp(v, "right")) o.truncate = KVS_CAPTURE_TRUNCATE_RIGHT;
            else return kvs_cli_usage_error(cmd, "--truncate: '%s' is not left or right", v);
        }
    }
    if (!o.model_path) return kvs_cli_usage_error(cmd, "--model PATH is required");
    if ((o.prompt_text != NULL) + (prompt_file != NULL) + (prompt_ids != NULL) + (turns_file != NULL) > 1)
        return kvs_cli_usage_error(cmd, "give only one of --prompt, --prompt-file, --prompt-ids, --turns");
    if (!!out_path + no_trace != 1) return kvs_cli_usage_error(cmd, "give exactly one of --out TRACE and --no-trace");
    if (turns_file && o.truncate) return kvs_cli_usage_error(cmd, "--truncate cuts a single prompt, not --turns");
    if ((o.chat_system || o.chat_date) && !o.chat) return kvs_cli_usage_error(cmd, "--system and --chat-date need --chat");
    if (o.chat && (prompt_ids || o.truncate || o.no_bos))
        return kvs_cli_usage_error(cmd, "--chat renders text with the model's template: not with %s",
                                   prompt_ids ? "--prompt-ids" : o.truncate ? "--truncate" : "--no-bos");
    if (o.chat && !o.prompt_text && !prompt_file && !turns_file)
        return kvs_cli_usage_error(cmd, "--chat needs --prompt, --prompt-file or --turns");
    if (strcmp(device, "cpu") && strcmp(device, "cuda"))
        return kvs_cli_usage_error(cmd, "--device: '%s' is not cpu or cuda", device);
    o.device = !strcmp(device, "cuda") ? KVS_CAPTURE_CUDA : KVS_CAPTURE_CPU;
    o.progress = progress < 0 ? isatty(2) : progress;

    /* Where the trace goes: a regular file (or a new name) is written by the trace writer as TARGET.partial,
     * renamed when complete, TARGET being the final target of a symbolic link, so the link stays a link; a
     * FIFO, device or standard output gets the finished trace copied from a temporary folder. */
    int trace_to_stdout = 0;
    if (out_path) {
        kvs_out_kind kind;
        if ((s = kvs_out_resolve(out_path, &kind, &target)) != KVS_OK) return kvs_cli_fail(cmd, s);
        trace_to_stdout = kvs_out_path_is_stdout(out_path);
        if (kind == KVS_OUT_FILE) {
            o.out_path = target;
        } else {
            if ((s = stage_create(&stage)) != KVS_OK) {
                rc = kvs_cli_fail(cmd, s);
                goto done;
            }
            o.out_path = stage.path;
        }
    }
    FILE *text_out = trace_to_stdout ? stderr : stdout; /* the trace bytes own standard output */

    if (o.prompt_text) {
        snprintf(src, sizeof src, "text");
    } else if (prompt_file || turns_file) {
        const char *f = prompt_file ? prompt_file : turns_file;
        const char *fname = strcmp(f, "-") ? f : "standard input";
        if ((s = read_text(f, &file_text)) != KVS_OK) {
            rc = kvs_cli_fail(cmd, s);
            goto done;
        }
        /* the file's name, not its path: one prompt captured from any folder is one trace (identity is content) */
        snprintf(src, sizeof src, "%s:%s", prompt_file ? "file" : "turns", strcmp(f, "-") ? kvs_path_base(f) : "-");
        if (prompt_file) {
            strip_one_newline(file_text);
            o.prompt_text = file_text;
        } else {
            size_t n = 0;
            if ((s = kvs_capture_split_turns(file_text, &turns, &n)) != KVS_OK) {
                rc = kvs_cli_fail(cmd, s);
                goto done;
            }
            if (n == 0) {
                rc = kvs_cli_fail(cmd, kvs_fail(KVS_ERR_FORMAT, "%s: no turns (every line is empty)", fname));
                goto done;
            }
            o.turns = (const char *const *)turns;
            o.n_turns = n;
        }
    } else if (prompt_ids) {
        if ((s = parse_ids(prompt_ids, &ids, &o.n_prompt_ids)) != KVS_OK) {
            rc = s == KVS_ERR_INVALID_ARG ? kvs_cli_usage_error(cmd, "%s", kvs_last_error()) : kvs_cli_fail(cmd, s);
            goto done;
        }
        o.prompt_ids = ids;
        snprintf(src, sizeof src, "ids");
    } else {
        snprintf(src, sizeof src, "bos");
    }
    o.prompt_source = src;

    struct sigaction old_handlers[2];
    stop_signal = 0;
    o.stop = &stop_signal;
    stop_handlers_install(old_handlers);
    s = kvs_capture_run(&o, &res);
    stop_handlers_restore(old_handlers);
    if (res.n_unk > 0)
        fprintf(stderr, "kvsim capture: warning: the tokenizer has no token for %lld piece%s of the prompt text and "
                        "made %s its unknown token (id %d): the model sees <unk> there\n", (long long)res.n_unk,
                res.n_unk == 1 ? "" : "s", res.n_unk == 1 ? "it" : "them", res.unk_id);
    if (s == KVS_ERR_INTERRUPTED && res.interrupted) {
        char partial[4300] = "";
        if (o.out_path) snprintf(partial, sizeof partial, "%s.partial", o.out_path);
        rc = report_interrupted(&res, (int)stop_signal, o.out_path ? partial : NULL, stage.dir[0] ? out_path : o.out_path,
                                stage.dir[0] ? stage.dir : NULL);
        if (res.partial_kept) stage.dir[0] = '\0'; /* a staged .partial stays for the recovery */
        goto done;
    }
    if (s != KVS_OK) {
        rc = kvs_cli_fail(cmd, s);
        goto done;
    }
    if (res.n_chat_retok > 0)
        fprintf(stderr, "kvsim capture: --chat: in %lld turn%s the model's earlier reply re-tokenizes differently from the "
                "tokens it generated; the cache keeps the generated tokens and the turn feeds the rendered text beyond "
                "them\n", (long long)res.n_chat_retok, res.n_chat_retok == 1 ? "" : "s");
    if (res.n_prompt_dropped > 0)
        fprintf(stderr, "kvsim capture: --truncate %s: the prompt was cut from %lld to %lld tokens (%lld dropped from "
                        "the %s) to fit %lld generated tokens in the positions allowed\n",
                o.truncate == KVS_CAPTURE_TRUNCATE_LEFT ? "left" : "right", (long long)res.n_prompt_given,
                (long long)(res.n_prompt_given - res.n_prompt_dropped), (long long)res.n_prompt_dropped,
                o.truncate == KVS_CAPTURE_TRUNCATE_LEFT ? "start" : "end", (long long)o.steps);
    if (out_path && res.max_new_tokens < o.steps)
        fprintf(stderr, "kvsim capture: warning: --steps %lld is more than the %lld positions the context leaves after "
                        "the prompt: the trace records max_new_tokens = %lld\n",
                (long long)o.steps, (long long)res.max_new_tokens, (long long)res.max_new_tokens);
    if (stage.dir[0] && (s = stage_deliver(&stage, out_path)) != KVS_OK) {
        rc = kvs_cli_fail(cmd, s);
        goto done;
    }
    if (no_trace || !res.text) {
        fprintf(text_out, "ids:");
        for (int64_t i = 0; i < res.n_positions; i++) fprintf(text_out, "%s%d", i ? "," : " ", res.tokens[i]);
        fprintf(text_out, "\n");
    }
    if (res.turns_text) fprintf(text_out, "%s\n", res.turns_text);
    else if (res.text) fprintf(text_out, "%s\n", res.text);
    double tps = res.seconds > 0 ? (double)res.n_positions / res.seconds : 0;
    fprintf(text_out, "---\nmodel %s: %lld positions (%lld prompt, %lld generated%s), %.1f tok/s", res.model_name,
            (long long)res.n_positions, (long long)res.n_prompt, (long long)res.n_generated,
            res.stopped_eos ? ", stopped at EOS" : res.stopped_max ? ", stopped at max positions" : "", tps);
    if (out_path)
        fprintf(text_out, ", trace %s %llu bytes", trace_to_stdout ? "to standard output" : out_path,
                (unsigned long long)res.trace_bytes);
    fprintf(text_out, "\n");
    rc = kvs_cli_finish_stdout(cmd);
done:
    if (stage.dir[0]) stage_remove(&stage);
    kvs_capture_result_free(&res);
    free(ids);
    free(turns);
    free(file_text);
    free(target);
    return rc;
}
