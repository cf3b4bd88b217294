/* findings_blocks.c — see findings_blocks.h (test helper). */
#include "findings_blocks.h"

#include "common/kvs.h"
#include "trace/trace.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *trim(char *s) {
    while (*s == ' ') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\n')) s[--n] = '\0';
    return s;
}

int kvs_test_row_cells(char *line, char **cells, int max) {
    if (line[0] != '|' || !strncmp(line, "|---", 4)) return 0;
    int n = 0;
    char *p = line + 1;
    while (n < max) {
        char *bar = strchr(p, '|');
        if (!bar) break;
        *bar = '\0';
        cells[n++] = trim(p);
        p = bar + 1;
    }
    return n;
}

/* Cell `col` of the row at `line` (up to its newline), trimmed, into out; 0 when the row has fewer cells. */
static int nth_cell(const char *line, int col, char *out, size_t cap) {
    const char *c = line; /* the '|' before the cell */
    for (int i = 0; i < col; i++) {
        c = strchr(c + 1, '|');
        if (!c || c > line + strcspn(line, "\n")) return 0;
    }
    const char *e = strchr(c + 1, '|');
    if (!e || e > line + strcspn(line, "\n")) return 0;
    const char *b = c + 1;
    while (b < e && *b == ' ') b++;
    while (e > b && e[-1] == ' ') e--;
    size_t n = (size_t)(e - b);
    if (n >= cap) return 0;
    memcpy(out, b, n);
    out[n] = '\0';
    return 1;
}

const char *kvs_test_block_row(const char *text, const char *first, const char *second, int match) {
    char c0[512], c1[512];
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (line[0] != '|' || !nth_cell(line, 0, c0, sizeof c0) || strcmp(c0, first) != 0) continue;
        if (!nth_cell(line, 1, c1, sizeof c1)) continue;
        if (match == KVS_TEST_CELL_PREFIX ? strncmp(c1, second, strlen(second)) == 0 : strcmp(c1, second) == 0)
            return line;
    }
    return NULL;
}

int kvs_test_block_cell(const char *text, const char *first, const char *second, int match, int col, char *out,
                        size_t cap) {
    const char *row = kvs_test_block_row(text, first, second, match);
    if (!row) return 0;
    return nth_cell(row, col, out, cap) ? 1 : -1;
}

int kvs_test_block_after(const char *text, const char *start, const char *key, double *v) {
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *eol = strchr(line, '\n');
        const char *k = strstr(line, key);
        if (strncmp(line, start, strlen(start)) != 0 || !k || (eol && k > eol)) continue;
        *v = strtod(k + strlen(key), NULL);
        return 1;
    }
    return 0;
}

int kvs_test_parse_iv(const char *cell, kvs_test_iv *v) {
    v->n_of = 0;
    int k = sscanf(cell, "%lf [%lf, %lf]", &v->mean, &v->lo, &v->hi);
    if (k < 0) k = 0;
    const char *n = strstr(cell, "(n = ");
    if (n) v->n_of = atoi(n + 5);
    return k;
}

int kvs_test_sig_equal(double printed, double value, int sig) {
    double a = fabs(value);
    double half = a > 0 ? 0.5 * pow(10.0, floor(log10(a)) - (sig - 1)) : 0;
    return fabs(printed - value) <= half * (1 + 1e-9) + 1e-15;
}

int kvs_test_trace_shape_of(const char *path, kvs_test_trace_shape *t) {
    kvs_trace *tr = NULL;
    if (kvs_trace_open(path, &tr) != KVS_OK) return -1;
    const kvs_trace_info *in = kvs_trace_info_get(tr);
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", path);
    t->P = in->prompt_len;
    t->N = in->n_positions;
    t->T = in->n_positions - in->prompt_len;
    t->H = in->model.n_kv_heads;
    t->G = in->model.n_kv_heads > 0 ? in->model.n_heads / in->model.n_kv_heads : 0;
    t->d = in->model.head_dim;
    t->kv_bytes = (int64_t)kvs_dtype_size((kvs_dtype)in->capture.dtype);
    kvs_trace_close(tr);
    return 0;
}

static int cmp_shape_path(const void *a, const void *b) {
    return strcmp(((const kvs_test_trace_shape *)a)->path, ((const kvs_test_trace_shape *)b)->path);
}

int kvs_test_findings_prompts(const char *out, const char *model, kvs_test_trace_shape *t, int max) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/prompts/%s", out, model);
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    int n = 0, bad = 0;
    struct dirent *e;
    while (!bad && (e = readdir(dp)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".kvt") != 0) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        bad = n >= max || strlen(path) >= sizeof t[n].path || kvs_test_trace_shape_of(path, &t[n]) != 0;
        n++;
    }
    closedir(dp);
    if (bad) return -1;
    qsort(t, (size_t)n, sizeof *t, cmp_shape_path);
    return n;
}

int kvs_test_csv_col(char *const *fields, int nf, const char *name) {
    for (int i = 0; i < nf; i++)
        if (!strcmp(fields[i], name)) return i;
    return -1;
}

int kvs_test_trace_pairs_add(kvs_test_trace_pairs *tp, const char *sha, int k, double v) {
    int t = 0;
    while (t < tp->n_traces && strcmp(tp->sha[t], sha) != 0) t++;
    if (t == tp->n_traces) {
        if (t == KVS_TEST_PAIR_TRACES) return -1;
        snprintf(tp->sha[t], sizeof tp->sha[t], "%s", sha);
        tp->n_traces++;
    }
    if (tp->has[k][t]) return 0;
    tp->v[k][t] = v;
    tp->has[k][t] = 1;
    return 1;
}

double kvs_test_trace_pairs_mean(const kvs_test_trace_pairs *tp, int *n) {
    double s = 0;
    *n = 0;
    for (int t = 0; t < tp->n_traces; t++)
        if (tp->has[0][t] && tp->has[1][t]) s += tp->v[1][t] - tp->v[0][t], (*n)++;
    return *n ? s / *n : NAN;
}
