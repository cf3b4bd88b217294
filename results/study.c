/* study.c — loads a STUDY file of `kvsim sweep` and cuts it into its deterministic task list.
 * Format and task sizing: results/STUDY.md; the replay each task runs: sim/replay.h, cli/cmd_replay.c.
 */
#include "study.h"

#include <ctype.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../trace/trace.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/replay.h"
#include "../sim/codec.h"

#define STUDY_LINE_MAX 4096
#define STUDY_MAX_POLICIES 64 /* what one `kvsim replay` accepts */
#define STUDY_MAX_CODECS 16   /* likewise (--codec) */
#define STUDY_MAX_PAGES 8     /* likewise (--page) */

typedef struct {
    char *path;
    int64_t n_positions, prompt_len;
    int32_t n_layers, n_heads, n_kv_heads, head_dim;
    double budget_sum; /* tokens, the study's budgets resolved for this trace */
} study_trace;

struct kvs_study {
    char *name, *budgets, *measure;
    char options[256];
    int64_t series_every;
    int32_t kv_bytes, aux_bytes, threads, policies_per_task, n_budgets;
    study_trace *traces;
    int32_t n_traces;
    char *policies[STUDY_MAX_POLICIES];
    int32_t n_policies;
    /* the codecs (`codec` lines or kvs_study_set_codecs) as canonical specs, "none" = K/V as captured; 0 codecs:
     * none given, every run K/V as captured and no --codec passed to the replay */
    char *codecs[STUDY_MAX_CODECS];
    int32_t n_codecs;
    /* the page sizes (a `page` line or kvs_study_set_pages), 0 = token granularity; 0 sizes: none given, every run
     * at token granularity and no --page passed to the replay. pages_text: the canonical list "0,16" */
    int64_t pages[STUDY_MAX_PAGES];
    int32_t n_pages;
    char pages_text[STUDY_MAX_PAGES * 12];
    kvs_study_task *tasks;
    int32_t n_tasks;
};

/* ---- small helpers ---- */

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* "DIR/rel" when rel is relative and the study file has a folder, else rel; malloc'd. */
static char *resolve_path(const char *study_path, const char *rel) {
    const char *slash = strrchr(study_path, '/');
    if (rel[0] == '/' || !slash) return dup_str(rel);
    size_t dn = (size_t)(slash - study_path) + 1, rn = strlen(rel);
    char *p = malloc(dn + rn + 1);
    if (!p) return NULL;
    memcpy(p, study_path, dn);
    memcpy(p + dn, rel, rn + 1);
    return p;
}

static kvs_status parse_int(const char *path, int line, const char *key, const char *val, long lo, long hi,
                            long *out) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < lo || v > hi)
        return kvs_fail(KVS_ERR_FORMAT, "%s:%d: %s: '%s' is not a whole number in [%ld, %ld]", path, line, key, val,
                        lo, hi);
    *out = v;
    return KVS_OK;
}

/* Opens one trace header and records its shape; `line` is the study line that named it. */
static kvs_status add_trace(kvs_study *s, const char *study_path, int line, const char *trace_path) {
    for (int32_t i = 0; i < s->n_traces; i++)
        if (!strcmp(s->traces[i].path, trace_path)) return KVS_OK; /* a trace named twice is replayed once */
    kvs_trace *t = NULL;
    kvs_status st = kvs_trace_open(trace_path, &t);
    if (st != KVS_OK)
        return kvs_fail(st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st, "%s:%d: trace %s: %s", study_path, line,
                        trace_path, kvs_last_error());
    const kvs_trace_info *info = kvs_trace_info_get(t);
    study_trace *grown = realloc(s->traces, (size_t)(s->n_traces + 1) * sizeof *grown);
    if (!grown) {
        kvs_trace_close(t);
        return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    }
    s->traces = grown;
    study_trace *tr = &s->traces[s->n_traces];
    *tr = (study_trace){.path = dup_str(trace_path), .n_positions = info->n_positions, .prompt_len = info->prompt_len,
                        .n_layers = info->model.n_layers, .n_heads = info->model.n_heads,
                        .n_kv_heads = info->model.n_kv_heads, .head_dim = info->model.head_dim};
    kvs_trace_close(t);
    if (!tr->path) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    s->n_traces++;
    return KVS_OK;
}

static kvs_status add_trace_pattern(kvs_study *s, const char *study_path, int line, const char *pattern) {
    char *full = resolve_path(study_path, pattern);
    if (!full) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    kvs_status st = KVS_OK;
    if (!strpbrk(pattern, "*?[")) {
        st = add_trace(s, study_path, line, full);
    } else {
        glob_t g;
        int rc = glob(full, 0, NULL, &g); /* glob sorts its matches: the task list is deterministic */
        if (rc == GLOB_NOMATCH)
            st = kvs_fail(KVS_ERR_IO, "%s:%d: trace pattern '%s' matches no file", study_path, line, pattern);
        else if (rc != 0)
            st = kvs_fail(KVS_ERR_IO, "%s:%d: trace pattern '%s' cannot be expanded", study_path, line, pattern);
        else
            for (size_t i = 0; i < g.gl_pathc && st == KVS_OK; i++) st = add_trace(s, study_path, line, g.gl_pathv[i]);
        if (rc == 0) globfree(&g);
    }
    free(full);
    return st;
}

/* ---- task sizing (results/STUDY.md "Task sizing") ---- */

/* Each codec is a run of every (policy, budget): the runs of a task, and the attention over their kept tokens,
 * scale with it (no codec line: one representation, K/V as captured). */
static double codec_count(const kvs_study *s) {
    /* each page size is a run too (sim/host.h page granularity: the same attention work per run) */
    return (s->n_codecs > 0 ? (double)s->n_codecs : 1.0) * (s->n_pages > 0 ? (double)s->n_pages : 1.0);
}

/* Estimated multiply-adds of one policy (all budgets) on trace t: the full attention the task computes once,
 * shared by the policies of the task, is counted with each policy so that the per-policy cost orders traces. */
static double policy_cost(const kvs_study *s, const study_trace *t) {
    double lhd = (double)t->n_layers * t->n_heads * t->head_dim, n = (double)t->n_positions;
    return lhd * n * (n / (double)(s->n_policies > 0 ? s->n_policies : 1) + 2.0 * t->budget_sum * codec_count(s));
}

static double task_work(const kvs_study *s, const study_trace *t, int32_t n_pol) {
    double lhd = (double)t->n_layers * t->n_heads * t->head_dim, n = (double)t->n_positions;
    return lhd * n * (n + 2.0 * t->budget_sum * n_pol * codec_count(s));
}

/* Peak replay memory (sim/replay.h "Memory per work unit"): per worker thread one (layer, KV head) stream: K/V
 * history and the longest prompt's queries of the group, in fp32; plus the measured samples of every
 * configuration (7 floats per (query head, step)) and the step series. */
static double task_mem(const kvs_study *s, const study_trace *t, int32_t n_pol) {
    double threads = s->threads > 0 ? s->threads : 1, group = t->n_kv_heads > 0 ? t->n_heads / t->n_kv_heads : 1;
    double n = (double)t->n_positions, d = t->head_dim;
    double unit = n * 2.0 * d * 4.0 + (double)t->prompt_len * group * d * 4.0;
    double samples = (double)n_pol * codec_count(s) * s->n_budgets * t->n_layers * t->n_heads * n * 7.0 * 4.0;
    return threads * unit + samples;
}

static kvs_status build_tasks(kvs_study *s) {
    free(s->tasks); /* rebuilt when the codecs change (kvs_study_set_codecs) */
    s->tasks = NULL;
    s->n_tasks = 0;
    double max_cost = 0;
    for (int32_t i = 0; i < s->n_traces; i++) {
        double c = policy_cost(s, &s->traces[i]);
        if (c > max_cost) max_cost = c;
    }
    int32_t cap = 0;
    int32_t *per = calloc((size_t)s->n_traces + 1, sizeof *per);
    if (!per) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < s->n_traces; i++) {
        double c = policy_cost(s, &s->traces[i]);
        double k = c > 0 ? floor((double)s->policies_per_task * max_cost / c) : s->n_policies;
        per[i] = k < 1 ? 1 : k > s->n_policies ? s->n_policies : (int32_t)k;
        cap += (s->n_policies + per[i] - 1) / per[i];
    }
    s->tasks = calloc((size_t)cap + 1, sizeof *s->tasks);
    if (!s->tasks) {
        free(per);
        return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < s->n_traces; i++)
        for (int32_t p = 0; p < s->n_policies; p += per[i]) {
            int32_t e = p + per[i] < s->n_policies ? p + per[i] : s->n_policies;
            s->tasks[s->n_tasks++] = (kvs_study_task){.trace = i, .policy_begin = p, .policy_end = e,
                                                      .work = task_work(s, &s->traces[i], e - p),
                                                      .mem_bytes = task_mem(s, &s->traces[i], e - p)};
        }
    free(per);
    return KVS_OK;
}

/* ---- page sizes ---- */

/* Parses a page size list "16", "0,16,32" (0 or none = token granularity, each 0..2^31-1 positions) into pages[]
 * (*n sizes) and its canonical text (decimal, ","-separated, "none" written 0); `where` prefixes the messages. A
 * size twice is an error (each is one run of every (policy, codec, budget)). */
static kvs_status parse_pages(const char *where, const char *text, int64_t *pages, int32_t *n, char *canon,
                              size_t cap) {
    *n = 0;
    size_t len = 0;
    canon[0] = '\0';
    for (const char *q = text;;) {
        const char *end = strchr(q, ',');
        size_t k = end ? (size_t)(end - q) : strlen(q);
        char item[32];
        if (k == 0 || k >= sizeof item)
            return kvs_fail(KVS_ERR_FORMAT, "%s: '%s' is not a list of page sizes (0 or none, or 1..%d positions)",
                            where, text, INT32_MAX);
        memcpy(item, q, k);
        item[k] = '\0';
        int64_t v = 0;
        if (strcmp(item, "none")) {
            char *e = NULL;
            errno = 0;
            long long x = item[0] >= '0' && item[0] <= '9' ? strtoll(item, &e, 10) : -1;
            if (x < 0 || !e || *e || errno == ERANGE || x > INT32_MAX)
                return kvs_fail(KVS_ERR_FORMAT, "%s: '%s' is not a page size (0 or none, or 1..%d positions)", where,
                                item, INT32_MAX);
            v = x;
        }
        for (int32_t i = 0; i < *n; i++)
            if (pages[i] == v) return kvs_fail(KVS_ERR_FORMAT, "%s: page size %lld given twice", where, (long long)v);
        if (*n == STUDY_MAX_PAGES) return kvs_fail(KVS_ERR_FORMAT, "%s: at most %d page sizes", where, STUDY_MAX_PAGES);
        pages[(*n)++] = v;
        len += (size_t)snprintf(canon + len, len < cap ? cap - len : 0, "%s%lld", *n > 1 ? "," : "", (long long)v);
        if (!end) break;
        q = end + 1;
    }
    return KVS_OK;
}

/* ---- codecs ---- */

/* Adds codec `spec` ("none" or a sim/codec.h spec) as its canonical spec; `where` prefixes the messages ("PATH:LINE"
 * of the study, or "--codec"). The same codec twice (by its canonical spec) is an error: each codec is one run of
 * every (policy, budget), so a repeated one would be a typo, not a second set of runs. */
static kvs_status add_codec(char **codecs, int32_t *n, const char *where, const char *spec) {
    kvs_codec *c = NULL;
    if (strcmp(spec, "none") && kvs_codec_parse(spec, &c) != KVS_OK)
        return kvs_fail(KVS_ERR_FORMAT, "%s: codec %s: %s", where, spec, kvs_last_error());
    const char *canon = c ? kvs_codec_spec(c) : "none";
    kvs_status st = KVS_OK;
    for (int32_t i = 0; i < *n && st == KVS_OK; i++)
        if (!strcmp(codecs[i], canon)) st = kvs_fail(KVS_ERR_FORMAT, "%s: codec %s given twice (%s)", where, spec, canon);
    if (st == KVS_OK && *n == STUDY_MAX_CODECS)
        st = kvs_fail(KVS_ERR_FORMAT, "%s: at most %d codecs", where, STUDY_MAX_CODECS);
    if (st == KVS_OK && !(codecs[*n] = dup_str(canon))) st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
    if (st == KVS_OK) (*n)++;
    kvs_codec_free(c);
    return st;
}

/* ---- the file ---- */

static kvs_status parse_line(kvs_study *s, const char *path, int line, char *text, int *seen_budgets_line) {
    char *key = text;
    while (*key && isspace((unsigned char)*key)) key++;
    if (!*key || *key == '#') return KVS_OK;
    char *val = key;
    while (*val && !isspace((unsigned char)*val)) val++;
    if (*val) *val++ = '\0';
    while (*val && isspace((unsigned char)*val)) val++;
    char *end = val + strlen(val);
    while (end > val && isspace((unsigned char)end[-1])) *--end = '\0';
    if (!*val) return kvs_fail(KVS_ERR_FORMAT, "%s:%d: '%s' needs a value", path, line, key);
    long v = 0;
    if (!strcmp(key, "trace")) return add_trace_pattern(s, path, line, val);
    if (!strcmp(key, "policy")) {
        kvs_policy_config cfg;
        if (kvs_policy_parse(val, &cfg) != KVS_OK)
            return kvs_fail(KVS_ERR_FORMAT, "%s:%d: policy %s: %s", path, line, val, kvs_last_error());
        if (s->n_policies == STUDY_MAX_POLICIES)
            return kvs_fail(KVS_ERR_FORMAT, "%s:%d: at most %d policies", path, line, STUDY_MAX_POLICIES);
        if (!(s->policies[s->n_policies] = dup_str(val))) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
        s->n_policies++;
        return KVS_OK;
    }
    if (!strcmp(key, "codec")) {
        char where[STUDY_LINE_MAX + 32];
        snprintf(where, sizeof where, "%s:%d", path, line);
        return add_codec(s->codecs, &s->n_codecs, where, val);
    }
    /* every other key is single-valued: given twice is an error, never "the last wins" */
    if (!strcmp(key, "page")) {
        char where[STUDY_LINE_MAX + 32];
        snprintf(where, sizeof where, "%s:%d: page", path, line);
        if (s->n_pages) return kvs_fail(KVS_ERR_FORMAT, "%s:%d: 'page' given twice", path, line);
        return parse_pages(where, val, s->pages, &s->n_pages, s->pages_text, sizeof s->pages_text);
    }
    char **slot = !strcmp(key, "name") ? &s->name : !strcmp(key, "budgets") ? &s->budgets
                                                  : !strcmp(key, "measure") ? &s->measure : NULL;
    if (slot) {
        if (*slot) return kvs_fail(KVS_ERR_FORMAT, "%s:%d: '%s' given twice", path, line, key);
        if (slot == &s->measure && strcmp(val, "decode") && strcmp(val, "prefill") && strcmp(val, "all"))
            return kvs_fail(KVS_ERR_FORMAT, "%s:%d: measure: '%s' is not decode, prefill or all", path, line, val);
        if (slot == &s->budgets) *seen_budgets_line = line;
        return (*slot = dup_str(val)) ? KVS_OK : kvs_fail(KVS_ERR_NOMEM, "out of memory");
    }
    struct { const char *key; long lo, hi; } ints[] = {
        {"series-every", 0, LONG_MAX}, {"kv-bytes", 1, 8}, {"aux-bytes", 1, 8}, {"threads", 1, 1024},
        {"policies-per-task", 1, STUDY_MAX_POLICIES},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (strcmp(key, ints[i].key)) continue;
        kvs_status st = parse_int(path, line, key, val, ints[i].lo, ints[i].hi, &v);
        if (st != KVS_OK) return st;
        int64_t *i64 = i == 0 ? &s->series_every : NULL;
        int32_t *i32 = i == 1 ? &s->kv_bytes : i == 2 ? &s->aux_bytes : i == 3 ? &s->threads
                       : i == 4 ? &s->policies_per_task : NULL;
        if ((i64 && *i64 >= 0) || (i32 && *i32 > 0))
            return kvs_fail(KVS_ERR_FORMAT, "%s:%d: '%s' given twice", path, line, key);
        if (i64) *i64 = v;
        else *i32 = (int32_t)v;
        return KVS_OK;
    }
    return kvs_fail(KVS_ERR_FORMAT,
                    "%s:%d: unknown key '%s' (known: name, trace, policy, codec, page, budgets, measure, series-every, "
                    "kv-bytes, aux-bytes, threads, policies-per-task)",
                    path, line, key);
}

kvs_status kvs_study_load(const char *path, kvs_study **out) {
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return kvs_fail(KVS_ERR_IO, "%s: cannot open the study: %s", path, strerror(errno));
    kvs_study *s = calloc(1, sizeof *s);
    if (!s) {
        fclose(f);
        return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    }
    s->series_every = -1;
    char buf[STUDY_LINE_MAX];
    int line = 0, budgets_line = 0;
    kvs_status st = KVS_OK;
    while (st == KVS_OK && fgets(buf, sizeof buf, f)) {
        line++;
        size_t n = strlen(buf);
        if (n == sizeof buf - 1 && buf[n - 1] != '\n' && !feof(f))
            st = kvs_fail(KVS_ERR_FORMAT, "%s:%d: line longer than %d bytes", path, line, STUDY_LINE_MAX - 2);
        else
            st = parse_line(s, path, line, buf, &budgets_line);
    }
    if (st == KVS_OK && ferror(f)) st = kvs_fail(KVS_ERR_IO, "%s: read error", path);
    fclose(f);
    if (st == KVS_OK && !s->n_traces) st = kvs_fail(KVS_ERR_FORMAT, "%s: no 'trace' line", path);
    if (st == KVS_OK && !s->n_policies) st = kvs_fail(KVS_ERR_FORMAT, "%s: no 'policy' line", path);
    if (st == KVS_OK && !s->budgets) st = kvs_fail(KVS_ERR_FORMAT, "%s: no 'budgets' line", path);
    /* The budgets are checked against every trace now (a percentage resolves per trace; a budget longer than
     * a trace is an error), so that no task fails on them later. */
    for (int32_t i = 0; st == KVS_OK && i < s->n_traces; i++) {
        int64_t *b = NULL;
        double *fr = NULL;
        int nb = 0;
        study_trace *t = &s->traces[i];
        if (kvs_replay_parse_budgets(s->budgets, t->prompt_len, t->n_positions, &b, &fr, &nb) != KVS_OK) {
            st = kvs_fail(KVS_ERR_FORMAT, "%s:%d: budgets for trace %s: %s", path, budgets_line, t->path,
                          kvs_last_error());
        } else {
            s->n_budgets = nb;
            for (int k = 0; k < nb; k++) t->budget_sum += (double)b[k];
        }
        free(b);
        free(fr);
    }
    if (st == KVS_OK) {
        if (!s->measure && !(s->measure = dup_str("decode"))) st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        if (!s->name) {
            const char *base = strrchr(path, '/');
            if (!(s->name = dup_str(base ? base + 1 : path))) st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        }
        if (s->series_every < 0) s->series_every = 0;
        if (!s->policies_per_task) s->policies_per_task = 1;
        snprintf(s->options, sizeof s->options, "measure=%s,series_every=%lld,kv_bytes=%d,aux_bytes=%d",
                 s->measure ? s->measure : "decode", (long long)s->series_every, s->kv_bytes, s->aux_bytes);
    }
    if (st == KVS_OK) st = build_tasks(s);
    if (st != KVS_OK) {
        kvs_study_free(s);
        return st;
    }
    *out = s;
    return KVS_OK;
}

void kvs_study_free(kvs_study *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_traces; i++) free(s->traces[i].path);
    for (int32_t i = 0; i < s->n_policies; i++) free(s->policies[i]);
    for (int32_t i = 0; i < s->n_codecs; i++) free(s->codecs[i]);
    free(s->traces);
    free(s->tasks);
    free(s->name);
    free(s->budgets);
    free(s->measure);
    free(s);
}

const char *kvs_study_name(const kvs_study *s) { return s->name; }
int32_t kvs_study_n_traces(const kvs_study *s) { return s->n_traces; }
const char *kvs_study_trace_path(const kvs_study *s, int32_t i) { return s->traces[i].path; }
int32_t kvs_study_n_policies(const kvs_study *s) { return s->n_policies; }
const char *kvs_study_policy_spec(const kvs_study *s, int32_t i) { return s->policies[i]; }
const char *kvs_study_budgets(const kvs_study *s) { return s->budgets; }
int32_t kvs_study_n_codecs(const kvs_study *s) { return s->n_codecs; }
const char *kvs_study_codec_spec(const kvs_study *s, int32_t i) { return s->codecs[i]; }

kvs_status kvs_study_set_codecs(kvs_study *s, const char *const *specs, int32_t n) {
    char *codecs[STUDY_MAX_CODECS] = {NULL};
    int32_t m = 0;
    kvs_status st = KVS_OK;
    for (int32_t i = 0; i < n && st == KVS_OK; i++) st = add_codec(codecs, &m, "--codec", specs[i]);
    if (st != KVS_OK) {
        for (int32_t i = 0; i < m; i++) free(codecs[i]);
        return st == KVS_ERR_FORMAT ? kvs_fail(KVS_ERR_INVALID_ARG, "%s", kvs_last_error()) : st;
    }
    for (int32_t i = 0; i < s->n_codecs; i++) free(s->codecs[i]);
    memcpy(s->codecs, codecs, sizeof codecs);
    s->n_codecs = m;
    return build_tasks(s);
}
int32_t kvs_study_n_pages(const kvs_study *s) { return s->n_pages; }
const char *kvs_study_pages(const kvs_study *s) { return s->n_pages ? s->pages_text : NULL; }

kvs_status kvs_study_set_pages(kvs_study *s, const char *text) {
    int64_t pages[STUDY_MAX_PAGES];
    int32_t n = 0;
    char canon[sizeof s->pages_text];
    kvs_status st = parse_pages("--page", text, pages, &n, canon, sizeof canon);
    if (st != KVS_OK) return st == KVS_ERR_FORMAT ? kvs_fail(KVS_ERR_INVALID_ARG, "%s", kvs_last_error()) : st;
    memcpy(s->pages, pages, sizeof pages);
    s->n_pages = n;
    memcpy(s->pages_text, canon, sizeof canon);
    return build_tasks(s);
}
int32_t kvs_study_n_budgets(const kvs_study *s) { return s->n_budgets; }
const char *kvs_study_measure(const kvs_study *s) { return s->measure; }
int64_t kvs_study_series_every(const kvs_study *s) { return s->series_every; }
int32_t kvs_study_kv_bytes(const kvs_study *s) { return s->kv_bytes; }
int32_t kvs_study_aux_bytes(const kvs_study *s) { return s->aux_bytes; }
int32_t kvs_study_threads(const kvs_study *s) { return s->threads; }
const char *kvs_study_options(const kvs_study *s) { return s->options; }
int32_t kvs_study_n_tasks(const kvs_study *s) { return s->n_tasks; }
const kvs_study_task *kvs_study_task_get(const kvs_study *s, int32_t i) { return &s->tasks[i]; }
