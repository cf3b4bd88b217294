/* test_report.c — tests of `kvsim report DB --out DIR` (plots/report.c; ../shared/DESIGN.md "Results (SQLite) and
 * plots"), run through the binary ($KVSIM_BIN) as a user runs it:
 *  - the summary on a hand-made database whose rows are computed by hand (each policy at its best unflagged run
 *    using no more memory than the level: a policy reaching a level with less memory, a one-candidate level, a
 *    degenerate run with the lowest error, oracle runs, a tie), and recomputed from `kvsim runs --csv --summary`
 *    for that database and the real study;
 *  - the summary and equal-memory table over four traces of one model: means summed here, intervals by a
 *    bootstrap done here with the seed the report states, a level won (paired interval below 0) and one not
 *    resolved; a one-trace database saying it has no interval;
 *  - the capacity table of a small plan (bytes, KB, MB and GB as kvsim plan prints them; a measured series'
 *    text whole and the plan's policy), every point recomputed from the stored bytes;
 *  - a damaged database (pages in the middle overwritten): exit 1, "database disk image is malformed", nothing
 *    written and a previous report left as it was;
 *  - a real study (the bundled stories260K trace replayed): every section title in report.html and report.md,
 *    every plot embedded as a data:image/png URI, each decoded (base64, then PNG with zlib) and checked to be
 *    non-blank and identical to the PNG file report.md references, no external reference in the page;
 *  - the page rendered by a real browser (Debian chromium, headless) to a screenshot that must show the
 *    coloured plots; skipped with a message only when chromium is absent (CI installs it);
 *  - bad input (empty file, database without runs, not a kvsim database, bad options, an --out folder that is
 *    not a report, gnuplot failing): a clear error, exit 1 or 2, and nothing written.
 */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "common/kvs_rng.h"
#include "results/results.h"
#include "results/results_sweep.h"
#include "results/results_check.h"
#include "results/results_plan.h"
#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

/* The section titles of the report, as a reader sees them (plots/report.c `sections`). */
static const char *const titles[] = {
    "Summary: which policy wins at each memory level",
    "Traces used",
    "Runs",
    "Equal-memory comparison",
    "Equal-traffic comparison",
    "Error vs measured memory and traffic (Pareto frontier)",
    "Error and memory vs nominal budget",
    "Error vs decode position",
    "Attention drift and temporal locality",
    "Head similarity and clusters",
    "Capacity planning",
};
#define N_TITLES (sizeof titles / sizeof titles[0])

static char tmp_dir[64];

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmp_dir, name); }


/* Runs kvsim with the NULL-terminated args; stdout and stderr into tmp_dir/out.txt, err.txt. */
static int kvsim(const char *const *args) {
    char o[128], e[128];
    path_in(o, sizeof o, "out.txt");
    path_in(e, sizeof e, "err.txt");
    fflush(NULL);
    return kvs_test_cli(o, e, args);
}

static char *err_text(void) {
    char e[128];
    path_in(e, sizeof e, "err.txt");
    return kvs_test_slurp(e, NULL);
}

static int dir_has_tmp(const char *dir) { /* a leftover .NAME.tmp.* or .NAME.old.* folder */
    DIR *d = opendir(dir);
    int found = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] == '.' && (strstr(e->d_name, ".tmp.") || strstr(e->d_name, ".old."))) found = 1;
    if (d) closedir(d);
    return found;
}

/* ---- PNG decoding (8-bit, non-interlaced; what gnuplot's pngcairo and chromium write) ---- */

typedef struct {
    uint32_t w, h;
    int ch;          /* channels per pixel */
    uint8_t *pix;    /* [h][w][ch] */
} image;

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static int paeth(int a, int b, int c) {
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* 0 on success. */
static int png_decode(const uint8_t *d, size_t n, image *im) {
    static const uint8_t sig[8] = {137, 80, 78, 71, 13, 10, 26, 10};
    memset(im, 0, sizeof *im);
    if (n < 8 || memcmp(d, sig, 8)) return -1;
    uint8_t *idat = NULL;
    size_t idat_n = 0, off = 8;
    int depth = 0, ctype = -1, interlace = 0;
    while (off + 12 <= n) {
        uint32_t len = be32(d + off);
        const uint8_t *type = d + off + 4, *data = d + off + 8;
        if (len > n - off - 12) break;
        if (!memcmp(type, "IHDR", 4) && len >= 13) {
            im->w = be32(data);
            im->h = be32(data + 4);
            depth = data[8];
            ctype = data[9];
            interlace = data[12];
        } else if (!memcmp(type, "IDAT", 4)) {
            uint8_t *ni = realloc(idat, idat_n + len + 1);
            if (!ni) break;
            idat = ni;
            memcpy(idat + idat_n, data, len);
            idat_n += len;
        } else if (!memcmp(type, "IEND", 4)) break;
        off += 12 + (size_t)len;
    }
    static const int channels[] = {1, 0, 3, 1, 2, 0, 4};
    if (depth != 8 || interlace || ctype < 0 || ctype > 6 || !channels[ctype] || !im->w || !im->h || !idat) {
        free(idat);
        return -1;
    }
    im->ch = channels[ctype];
    size_t stride = (size_t)im->w * (size_t)im->ch;
    uLongf raw_n = (uLongf)((stride + 1) * im->h);
    uint8_t *raw = malloc(raw_n);
    im->pix = malloc(stride * im->h);
    int rc = raw && im->pix && uncompress(raw, &raw_n, idat, (uLong)idat_n) == Z_OK && raw_n == (stride + 1) * im->h
                 ? 0
                 : -1;
    for (uint32_t y = 0; rc == 0 && y < im->h; y++) {
        const uint8_t *f = raw + y * (stride + 1);
        uint8_t *row = im->pix + y * stride, *up = y ? row - stride : NULL;
        for (size_t x = 0; x < stride; x++) {
            int a = x >= (size_t)im->ch ? row[x - (size_t)im->ch] : 0, b = up ? up[x] : 0,
                c = up && x >= (size_t)im->ch ? up[x - (size_t)im->ch] : 0, v = f[1 + x];
            switch (f[0]) {
            case 0: break;
            case 1: v += a; break;
            case 2: v += b; break;
            case 3: v += (a + b) / 2; break;
            case 4: v += paeth(a, b, c); break;
            default: rc = -1;
            }
            row[x] = (uint8_t)v;
        }
    }
    free(raw);
    free(idat);
    if (rc) {
        free(im->pix);
        im->pix = NULL;
    }
    return rc;
}

/* How much of the image is not its background (the first pixel's value), how many distinct values appear among
 * the first 64 seen, and how many pixels are strongly coloured (channel spread > 96: a plot line, never the
 * page's greys). */
typedef struct {
    double foreground;
    int distinct;
    size_t saturated;
} image_stats;

static image_stats stats_of(const image *im) {
    image_stats s = {0};
    uint32_t seen[64];
    size_t fg = 0, n = (size_t)im->w * im->h;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = im->pix + i * (size_t)im->ch;
        uint32_t v = 0;
        for (int c = 0; c < im->ch; c++) v = v << 8 | p[c];
        fg += memcmp(p, im->pix, (size_t)im->ch) != 0;
        int known = 0;
        for (int k = 0; k < s.distinct && !known; k++) known = seen[k] == v;
        if (!known && s.distinct < 64) seen[s.distinct++] = v;
        if (im->ch >= 3) {
            int mx = p[0], mn = p[0];
            for (int c = 1; c < 3; c++) {
                if (p[c] > mx) mx = p[c];
                if (p[c] < mn) mn = p[c];
            }
            s.saturated += mx - mn > 96;
        }
    }
    s.foreground = (double)fg / (double)n;
    return s;
}

static uint8_t *base64_decode(const char *s, size_t n, size_t *out_n) {
    uint8_t *out = malloc(n / 4 * 3 + 3);
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; out && i < n && s[i] != '='; i++) {
        const char *tab = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const char *q = strchr(tab, s[i]);
        if (!q || !s[i]) {
            free(out);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)(q - tab);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    *out_n = o;
    return out;
}

static void assert_nonblank_png(const uint8_t *png, size_t n, const char *what) {
    image im;
    if (png_decode(png, n, &im) != 0) fail_msg("%s: not a decodable 8-bit PNG", what);
    image_stats s = stats_of(&im);
    if (s.distinct < 3 || s.foreground < 0.005)
        fail_msg("%s: blank (%d distinct values, %.4f of the pixels not background)", what, s.distinct, s.foreground);
    free(im.pix);
}

/* ---- the hand-made study ---- */

static void put_run(kvs_results_db *db, const char *policy, int oracle, const char *scope, int64_t budget, double bytes,
                    double err, const char *notes) {
    kvs_results_trace tr = {.path = "/nonexistent/a.kvt", .model_name = "m1", .n_positions = 128, .prompt_len = 64,
                            .n_turns = 1, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16,
                            .dtype = "fp16", .file_bytes = 4096};
    kvs_results_run run = {.policy = policy, .params = "", .budget_tokens = budget, .budget_fraction = -1,
                           .is_oracle = oracle, .measure = "decode", .budget_scope = scope, .status = "complete",
                           .wall_seconds = 0.1, .kvsim_version = "0.1.0", .notes = notes};
    kvs_results_agg a = {.layer = -1};
    for (int m = 0; m < KVS_N_METRICS; m++) a.m[m] = (kvs_results_stat){0};
    kvs_results_stat v = {.n = 10, .mean = err, .p50 = err, .p95 = 2 * err, .max = 2 * err, .min = err / 2};
    kvs_results_stat b = {.n = 10, .mean = bytes, .p50 = bytes, .p95 = bytes, .max = bytes, .min = bytes};
    kvs_results_stat r = {.n = 10, .mean = 1 - err, .p50 = 1 - err, .p95 = 1 - err, .max = 1, .min = 1 - err};
    a.out_err = v;
    a.attn_recall = r;
    a.topk_overlap = r;
    a.storage_bytes = b;
    a.traffic_bytes = b;
    a.attended_tokens = (kvs_results_stat){.n = 10, .mean = (double)budget, .p50 = (double)budget,
                                           .p95 = (double)budget, .max = (double)budget, .min = (double)budget};
    assert_int_equal(kvs_results_write_run(db, &tr, &run, NULL, 0, &a, NULL, 0, NULL), KVS_OK);
}

/* ---- the summary recomputed from `kvsim runs DB --csv --summary` ----
 * The rule the report states: at each level M (powers of two within the memory range of the complete non-oracle
 * runs, at most 8), each (policy, params, codec) qualifies through its best unflagged run (no oracle, no note) with
 * storage_bytes_mean <= M; flagged runs are listed when an oracle's, or when at most the winner's error. Computed
 * here from the CSV the runs command prints (another reader of the database than the report's), in loops of
 * its own, and compared with the rows of report.md. */

typedef struct {
    char *f[16]; /* the fields below, by index */
} csv_run;

enum { F_POLICY, F_PARAMS, F_ID, F_TRACE, F_ORACLE, F_STATUS, F_MEASURE, F_SCOPE, F_NOTES, F_MEM, F_ERR, F_CODEC, F_PAGE,
       F_PAGE_SCORE, N_F };
static const char *const csv_names[N_F] = {"policy", "params",  "run_id",       "trace", "is_oracle", "status",
                                           "measure", "budget_scope", "notes", "storage_bytes_mean", "out_err_mean",
                                           "codec", "page", "page_score"};

/* Do CSV runs a and b belong to one candidate of the summary: (policy, params, codec, page, page score rule)? */
static int same_candidate(const csv_run *a, const csv_run *b) {
    return !strcmp(a->f[F_POLICY], b->f[F_POLICY]) && !strcmp(a->f[F_PARAMS], b->f[F_PARAMS]) &&
           !strcmp(a->f[F_CODEC], b->f[F_CODEC]) && !strcmp(a->f[F_PAGE], b->f[F_PAGE]) &&
           !strcmp(a->f[F_PAGE_SCORE], b->f[F_PAGE_SCORE]);
}

/* RFC 4180: the next field of *p into a malloc'd string; *eol set when the record ends after it. */
static char *csv_field(const char **p, int *eol) {
    const char *s = *p;
    size_t cap = 64, n = 0;
    char *out = malloc(cap);
    int quoted = *s == '"';
    if (quoted) s++;
    for (;;) {
        if (n + 2 >= cap) out = realloc(out, cap *= 2);
        if (quoted && *s == '"' && s[1] == '"') out[n++] = '"', s += 2;
        else if (quoted && *s == '"') s++, quoted = 0;
        else if (!quoted && (*s == ',' || *s == '\n' || !*s)) break;
        else out[n++] = *s++;
    }
    out[n] = '\0';
    *eol = *s != ',';
    *p = *s ? s + 1 : s;
    return out;
}

/* Parses the runs CSV into runs[]; returns how many. */
static int parse_runs_csv(const char *text, csv_run *runs, int cap) {
    const char *p = text;
    int col[512], n_col = 0, eol = 0, n = 0; /* the summary CSV has 160-odd columns: a header cut short would be
                                              * read as a first record */
    while (!eol) {
        assert_true(n_col < 512);
        char *name = csv_field(&p, &eol);
        col[n_col] = -1;
        for (int k = 0; k < N_F; k++) {
            int first = 1;
            for (int c = 0; c < n_col; c++) first &= col[c] != k;
            if (first && !strcmp(name, csv_names[k])) col[n_col] = k;
        }
        n_col++;
        free(name);
    }
    while (*p && n < cap) {
        memset(&runs[n], 0, sizeof runs[n]);
        eol = 0;
        for (int c = 0; !eol; c++) {
            char *v = csv_field(&p, &eol);
            if (c < n_col && col[c] >= 0) runs[n].f[col[c]] = v;
            else free(v);
        }
        for (int k = 0; k < N_F; k++)
            if (!runs[n].f[k]) fail_msg("runs CSV: column %s missing", csv_names[k]);
        n++;
    }
    return n;
}

/* Appends to a NUL-terminated buffer (vsnprintf: truncation is what the buffer size already bounds). */
static void append(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t cap, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

static double csv_num(const char *s) { return s[0] ? strtod(s, NULL) : NAN; }

typedef struct {
    int run;          /* index into the CSV runs */
    double mem, err;
} pick;

/* a better than b: lower error, then less memory, then the smaller run id */
static int pick_better(const csv_run *runs, pick a, pick b) {
    if (b.run < 0) return 1;
    if (a.err != b.err) return a.err < b.err;
    if (a.mem != b.mem) return a.mem < b.mem;
    return atol(runs[a.run].f[F_ID]) < atol(runs[b.run].f[F_ID]);
}

/* Checks report.md's summary of DB against the CSV; returns the number of table rows checked. */
static int check_summary_against_csv(const char *db_path, const char *md) {
    const char *args[] = {"runs", db_path, "--csv", "--summary", NULL};
    assert_int_equal(kvsim(args), 0);
    char o[128];
    path_in(o, sizeof o, "out.txt");
    char *csv = kvs_test_slurp(o, NULL);
    assert_non_null(csv);
    static csv_run runs[512];
    int n = parse_runs_csv(csv, runs, 512), checked = 0;
    free(csv);
    assert_true(n > 0);
    /* one (trace, measure) group at a time */
    for (int g = 0; g < n; g++) {
        int first = 1;
        for (int h = 0; h < g; h++)
            first &= strcmp(runs[h].f[F_TRACE], runs[g].f[F_TRACE]) || strcmp(runs[h].f[F_MEASURE], runs[g].f[F_MEASURE]);
        if (!first) continue;
        int in[512], m = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(runs[i].f[F_TRACE], runs[g].f[F_TRACE]) && !strcmp(runs[i].f[F_MEASURE], runs[g].f[F_MEASURE]) &&
                !strcmp(runs[i].f[F_STATUS], "complete"))
                in[m++] = i;
        double lo = INFINITY, hi = -INFINITY;
        for (int k = 0; k < m; k++) {
            double x = csv_num(runs[in[k]].f[F_MEM]);
            if (atoi(runs[in[k]].f[F_ORACLE]) || !(x > 0) || !isfinite(x)) continue;
            lo = fmin(lo, x);
            hi = fmax(hi, x);
        }
        if (!(lo <= hi)) continue;
        double lv[8];
        int n_lv = 0;
        int p0 = (int)ceil(log2(lo)), p1 = (int)floor(log2(hi));
        if (p0 > p1) lv[n_lv++] = lo;
        else {
            int step = (p1 - p0 + 1 + 7) / 8;
            for (int q = p0; q <= p1 && n_lv < 8; q += step) lv[n_lv++] = ldexp(1, q);
        }
        /* the policies (policy, params, codec) in the order of their first run, with their labels */
        int pol[512], n_pol = 0;
        char label[512][400];
        for (int k = 0; k < m; k++) {
            const csv_run *w = &runs[in[k]];
            double x = csv_num(w->f[F_MEM]), e = csv_num(w->f[F_ERR]);
            if (!(x > 0) || !isfinite(x) || !isfinite(e)) continue;
            int known = 0;
            for (int q = 0; q < n_pol && !known; q++)
                known = same_candidate(&runs[pol[q]], w);
            if (!known) pol[n_pol++] = in[k];
        }
        for (int q = 0; q < n_pol; q++) {
            int prompt = 0, oracle = 0;
            for (int k = 0; k < m; k++) {
                const csv_run *w = &runs[in[k]];
                double x = csv_num(w->f[F_MEM]), e = csv_num(w->f[F_ERR]);
                if (!(x > 0) || !isfinite(x) || !isfinite(e) || !same_candidate(w, &runs[pol[q]])) continue;
                prompt |= !strcmp(w->f[F_SCOPE], "prompt");
                oracle |= atoi(w->f[F_ORACLE]);
            }
            const char *pp = runs[pol[q]].f[F_PARAMS], *cc = runs[pol[q]].f[F_CODEC], *pg = runs[pol[q]].f[F_PAGE];
            const char *ps = runs[pol[q]].f[F_PAGE_SCORE];
            char page[48] = "";
            if (atoll(pg) > 0) snprintf(page, sizeof page, " [page %s%s%s]", pg, ps[0] ? " " : "", ps);
            snprintf(label[q], sizeof label[q], "%s%s%s%s%s%s%s%s%s%s", runs[pol[q]].f[F_POLICY], pp[0] ? " (" : "",
                     pp, pp[0] ? ")" : "", cc[0] ? " [" : "", cc, cc[0] ? "]" : "", page,
                     prompt ? " (prompt-only budget)" : "", oracle ? " (oracle)" : "");
        }
        int wins[512] = {0}, contested = 0;
        for (int l = 0; l < n_lv; l++) {
            pick clean[512], flag[512];
            for (int q = 0; q < n_pol; q++) clean[q].run = flag[q].run = -1;
            for (int k = 0; k < m; k++) {
                const csv_run *w = &runs[in[k]];
                pick c = {in[k], csv_num(w->f[F_MEM]), csv_num(w->f[F_ERR])};
                if (!(c.mem > 0) || !isfinite(c.mem) || !isfinite(c.err) || c.mem > lv[l]) continue;
                int q = 0;
                while (!same_candidate(&runs[pol[q]], w)) q++;
                int flagged = atoi(w->f[F_ORACLE]) || w->f[F_NOTES][0];
                pick *slot = flagged ? &flag[q] : &clean[q];
                if (pick_better(runs, c, *slot)) *slot = c;
            }
            /* candidates by error, then label (selection sort: a few policies) */
            int order[512], nc = 0;
            for (int q = 0; q < n_pol; q++)
                if (clean[q].run >= 0) order[nc++] = q;
            for (int a = 0; a < nc; a++)
                for (int b = a + 1; b < nc; b++) {
                    int qa = order[a], qb = order[b];
                    if (clean[qb].err < clean[qa].err || (clean[qb].err == clean[qa].err && strcmp(label[qb], label[qa]) < 0))
                        order[a] = qb, order[b] = qa;
                }
            int top = 0, second = 0;
            while (top < nc && clean[order[top]].err == clean[order[0]].err) top++;
            while (top + second < nc && clean[order[top + second]].err == clean[order[top]].err) second++;
            char row[8192], lvl[64], who[2048 + 8] = "", runc[1024] = "", who2[2048] = "", e1[64] = "-", e2[64] = "-",
                                                                                  fl[2048] = "";
            kvs_format_bytes(lvl, sizeof lvl, lv[l]);
            for (int k = 0; k < top; k++) {
                char mb[64];
                kvs_format_bytes(mb, sizeof mb, clean[order[k]].mem);
                append(who, sizeof who, "%s%s", k ? "; " : "", label[order[k]]);
                append(runc, sizeof runc, "%s#%s (%s)", k ? "; " : "", runs[clean[order[k]].run].f[F_ID], mb);
            }
            for (int k = top; k < top + second; k++)
                append(who2, sizeof who2, "%s%s", k > top ? "; " : "", label[order[k]]);
            if (nc) {
                double x = clean[order[0]].err, y = second ? clean[order[top]].err : x;
                for (int d = 4; d <= 17; d++) {
                    snprintf(e1, sizeof e1, "%.*g", d, x);
                    snprintf(e2, sizeof e2, "%.*g", d, y);
                    if (x == y || strcmp(e1, e2)) break;
                }
                if (!second) snprintf(e2, sizeof e2, "-");
            }
            if (nc == 1) strcat(who, " (only candidate: not a win)");
            else if (top > 1) {
                memmove(who + 5, who, strlen(who) + 1);
                memcpy(who, "tie: ", 5);
            } else if (nc > 1)
                contested++, wins[order[0]]++;
            for (int q = 0; q < n_pol; q++) {
                if (flag[q].run < 0) continue;
                int oracle = atoi(runs[flag[q].run].f[F_ORACLE]);
                if (!oracle && nc && flag[q].err > clean[order[0]].err) continue;
                char mb[64];
                kvs_format_bytes(mb, sizeof mb, flag[q].mem);
                append(fl, sizeof fl, "%s%s #%s (%s%s, %s): %.4g", fl[0] ? "; " : "", label[q], runs[flag[q].run].f[F_ID],
                       oracle ? "O" : "", runs[flag[q].run].f[F_NOTES][0] ? "N" : "", mb, flag[q].err);
            }
            snprintf(row, sizeof row, "| %s | %d | %s | %s | %s | %s | %s | %s |", lvl, nc, nc ? who : "-", e1,
                     nc ? runc : "-", who2[0] ? who2 : "-", e2, fl[0] ? fl : "-");
            if (!strstr(md, row)) fail_msg("summary row not as recomputed from kvsim runs --csv:\n%s\n--- report.md:\n%s", row, md);
            checked++;
        }
        /* the sentence: the most wins over the contested levels */
        int most = 0;
        for (int q = 0; q < n_pol; q++) most = wins[q] > most ? wins[q] : most;
        char want[256];
        if (!contested) snprintf(want, sizeof want, "No level is contested");
        else if (most == contested)
            snprintf(want, sizeof want, "at every contested level (%d of the %d levels)", most, n_lv);
        else snprintf(want, sizeof want, "the lowest mean output error at %d of the %d contested levels (of %d levels)", most, contested, n_lv);
        if (!strstr(md, want)) fail_msg("summary sentence missing: %s\n--- report.md:\n%s", want, md);
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < N_F; k++) free(runs[i].f[k]);
    return checked;
}

/* Levels: the powers of two within the non-oracle memory range [512 B, 8 KiB]. By hand, each policy at its best
 * unflagged run at no more memory than the level:
 *   512 B: only tova (.6)                                        -> one candidate, not a win
 *   1 KiB: h2o .3 (#3), window .5, tova .6                       -> h2o; topk oracle .1 (#7) marked
 *   2 KiB: no run of window or h2o at 2 KiB: their 1 KiB runs qualify (h2o .3, window .5); snapkv's only run
 *          here (#5, .01) is degenerate (N): never crowned, listed because it is below the winner's .3
 *   4 KiB: window .2 (#2) and tova .2 (#10) tie; h2o's best is still its 1 KiB run .3 (its 4 KiB run is .35)
 *   8 KiB: snapkv .05 (#6) over tova and window .2 (tied runners-up); snapkv's N run .01 and topk .01 (#8) marked
 * Contested levels: 1, 2 and 8 KiB; h2o has two of them. */
static void test_summary_by_hand(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    char db_path[128], out[128];
    path_in(db_path, sizeof db_path, "hand.db");
    path_in(out, sizeof out, "hand_report");
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_path, &db), KVS_OK);
    const char *note = "the budget is at most window=32: no position is scored (a window)";
    put_run(db, "window", 0, "every_step", 32, 1024, .5, NULL);    /* #1 */
    put_run(db, "window", 0, "every_step", 128, 4096, .2, NULL);   /* #2 */
    put_run(db, "h2o", 0, "every_step", 32, 1024, .3, NULL);       /* #3 */
    put_run(db, "h2o", 0, "every_step", 128, 4096, .35, NULL);     /* #4 */
    put_run(db, "snapkv", 0, "prompt", 16, 2048, .01, note);       /* #5 */
    put_run(db, "snapkv", 0, "prompt", 128, 8192, .05, NULL);      /* #6 */
    put_run(db, "topk", 1, "every_step", 32, 1024, .1, NULL);      /* #7 */
    put_run(db, "topk", 1, "every_step", 256, 8192, .01, NULL);    /* #8 */
    put_run(db, "tova", 0, "every_step", 16, 512, .6, NULL);       /* #9 */
    put_run(db, "tova", 0, "every_step", 128, 4096, .2, NULL);     /* #10 */
    kvs_results_close(db);
    const char *args[] = {"report", db_path, "--out", out, NULL};
    assert_int_equal(kvsim(args), 0);
    char p[256];
    snprintf(p, sizeof p, "%s/report.md", out);
    char *md = kvs_test_slurp(p, NULL);
    assert_non_null(md);
    static const char *const rows[] = {
        "| 512B | 1 | tova (only candidate: not a win) | 0.6 | #9 (512B) | - | - | - |",
        "| 1.00KiB | 3 | h2o | 0.3 | #3 (1.00KiB) | window | 0.5 | topk (oracle) #7 (O, 1.00KiB): 0.1 |",
        "| 2.00KiB | 3 | h2o | 0.3 | #3 (1.00KiB) | window | 0.5 | snapkv (prompt-only budget) #5 (N, 2.00KiB): 0.01; "
        "topk (oracle) #7 (O, 1.00KiB): 0.1 |",
        "| 4.00KiB | 3 | tie: tova; window | 0.2 | #10 (4.00KiB); #2 (4.00KiB) | h2o | 0.3 | snapkv (prompt-only "
        "budget) #5 (N, 2.00KiB): 0.01; topk (oracle) #7 (O, 1.00KiB): 0.1 |",
        "| 8.00KiB | 4 | snapkv (prompt-only budget) | 0.05 | #6 (8.00KiB) | tova; window | 0.2 | snapkv (prompt-only "
        "budget) #5 (N, 2.00KiB): 0.01; topk (oracle) #8 (O, 8.00KiB): 0.01 |",
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (!strstr(md, rows[i])) fail_msg("summary row missing: %s\n--- report.md:\n%s", rows[i], md);
    assert_non_null(strstr(md, "h2o has the lowest mean output error at 2 of the 3 contested levels (of 5 levels)"));
    assert_non_null(strstr(md, "Only one policy qualifies at 512B (tova): no contest, not counted as a win."));
    assert_non_null(strstr(md, "Tied for the lowest error at 4.00KiB (tova; window): not counted as a win."));
    /* The rule is written beside the table, in both outputs. */
    assert_non_null(strstr(md, "qualifies when it has a complete run whose memory is at most M"));
    assert_int_equal(check_summary_against_csv(db_path, md), 5);
    snprintf(p, sizeof p, "%s/report.html", out);
    char *html = kvs_test_slurp(p, NULL);
    assert_non_null(html);
    assert_non_null(strstr(html, "qualifies when it has a complete run whose memory is at most M"));
    assert_non_null(strstr(html, "<td>tie: tova; window</td><td>0.2</td><td>#10 (4.00KiB); #2 (4.00KiB)</td>"));
    assert_non_null(strstr(html, "<td>tova (only candidate: not a win)</td>"));
    free(html);
    /* The equal-memory table defaults to the middle level, 2 KiB, and says how to reproduce it: h2o halfway in
     * ln x between its 1 KiB (.3, p95 .6) and 4 KiB (.35, p95 .7) runs. */
    assert_non_null(strstr(md, "kvsim compare hand.db --match mem --at 2048"));
    assert_non_null(strstr(md, "| h2o | - | - | - | a.kvt | decode | 0.325 | 0.65 |"));
    assert_non_null(strstr(md, "| window | - | - | - | a.kvt | decode | 0.35 |"));
    /* No steps: the position section is absent, with its reason; the unreadable trace is said so. */
    assert_non_null(strstr(md, "## Not in this database"));
    assert_non_null(strstr(md, "- **Error vs decode position**: "));
    assert_null(strstr(md, "## Error vs decode position"));
    assert_non_null(strstr(md, "Capture settings not shown: the trace file /nonexistent/a.kvt is not readable"));
    /* One trace: today's tables, and no interval said so. */
    assert_non_null(strstr(md, "One trace of model m1: no interval (the values are this trace's)."));
    assert_non_null(strstr(md, "One trace per model: no interval"));
    free(md);
    /* --mem-at moves the equal-memory table. */
    const char *args2[] = {"report", db_path, "--out", out, "--mem-at", "4KiB", NULL};
    assert_int_equal(kvsim(args2), 0);
    snprintf(p, sizeof p, "%s/report.md", out);
    md = kvs_test_slurp(p, NULL);
    assert_non_null(md);
    assert_non_null(strstr(md, "kvsim compare hand.db --match mem --at 4096"));
    assert_non_null(strstr(md, "| window | - | - | - | a.kvt | decode | 0.2 |"));
    free(md);
    assert_int_equal(dir_has_tmp(tmp_dir), 0);
}

/* ---- KV codecs ---- */

#define INT4 "int:bits=4,group=32,k_axis=token,v_axis=channel"

/* Paged runs (kvsim replay --page N) are candidates of their own in the summary, recomputed from `runs --csv` (its
 * page column), and their runs-table rows say "page N". */
static void test_paged_runs_in_the_report(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    char trace[512], db[128], out[128], p[256];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    path_in(db, sizeof db, "page.db");
    path_in(out, sizeof out, "page_report");
    const char *replay[] = {"replay", trace, "--db", db, "--policy", "window", "--policy", "h2o", "--page", "0,16",
                            "--budgets", "32,64,128", "--threads", "2", NULL};
    assert_int_equal(kvsim(replay), 0);
    const char *report[] = {"report", db, "--out", out, "--mem-at", "2KiB", NULL};
    assert_int_equal(kvsim(report), 0);
    snprintf(p, sizeof p, "%s/report.md", out);
    char *md = kvs_test_slurp(p, NULL);
    assert_non_null(md);
    assert_true(check_summary_against_csv(db, md) >= 3);
    assert_non_null(strstr(md, "window [page 16]"));
    assert_non_null(strstr(md, "| window | - | - page 16 | "));
    assert_non_null(strstr(md, "block=0 | - page 16 max | ")); /* H2O's pages by its own scores */
    free(md);
}

/* A study with a KV codec beside the eviction policies (the bundled trace, window and h2o with and without int4):
 * each (policy, codec) is a candidate of its own in the summary, recomputed here from `kvsim runs --csv` keyed by
 * (policy, params, codec) and labelled "policy (params) [codec]"; the runs table names each run's codec (from the CSV);
 * the equal-memory table has a row per (policy, codec), window+int4's value interpolated here in log bytes between
 * its two CSV runs bracketing the level. Before, a codec's runs were the same candidate as the policy's own (the
 * best of both represented "window") and no table said which codec a row used. */
static void test_codec_runs_in_the_report(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    char trace[512], db[128], out[128], p[256];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    path_in(db, sizeof db, "codec.db");
    path_in(out, sizeof out, "codec_report");
    const char *replay[] = {"replay", trace, "--db", db, "--policy", "window", "--policy", "h2o", "--codec", "none",
                            "--codec", "int:bits=4", "--budgets", "32,64,128", "--threads", "2", NULL};
    assert_int_equal(kvsim(replay), 0);
    const char *report[] = {"report", db, "--out", out, "--mem-at", "1KiB", NULL};
    assert_int_equal(kvsim(report), 0);
    snprintf(p, sizeof p, "%s/report.md", out);
    char *md = kvs_test_slurp(p, NULL);
    assert_non_null(md);
    assert_true(check_summary_against_csv(db, md) >= 3);
    /* int4 holds window's 64 tokens in less than window's 32 on K/V as captured: at 1 KiB it is a candidate, with
     * its own label, and the rule says codecs are candidates of their own */
    assert_non_null(strstr(md, "window [" INT4 "]"));
    assert_non_null(strstr(md, "a codec's runs, named \"policy (params) [codec]\", are a candidate of their own"));
    /* the runs table and the equal-memory table from the CSV */
    const char *args[] = {"runs", db, "--csv", "--summary", NULL};
    assert_int_equal(kvsim(args), 0);
    char o[128];
    path_in(o, sizeof o, "out.txt");
    char *csv = kvs_test_slurp(o, NULL);
    assert_non_null(csv);
    static csv_run runs[64];
    int n = parse_runs_csv(csv, runs, 64), n_codec = 0;
    free(csv);
    assert_int_equal(n, 12);
    double bx[2] = {0, INFINITY}, be[2] = {NAN, NAN}; /* window+int4: the runs just below and above 1 KiB */
    for (int i = 0; i < n; i++) {
        char row[512];
        snprintf(row, sizeof row, "| #%s | %s | %s | %s | ", runs[i].f[F_ID], runs[i].f[F_POLICY],
                 runs[i].f[F_PARAMS][0] ? runs[i].f[F_PARAMS] : "-", runs[i].f[F_CODEC][0] ? runs[i].f[F_CODEC] : "-");
        if (!strstr(md, row)) fail_msg("runs table row missing: %s\n--- report.md:\n%s", row, md);
        n_codec += !strcmp(runs[i].f[F_CODEC], INT4);
        if (strcmp(runs[i].f[F_POLICY], "window") || strcmp(runs[i].f[F_CODEC], INT4)) continue;
        double x = csv_num(runs[i].f[F_MEM]), e = csv_num(runs[i].f[F_ERR]);
        if (x <= 1024 && x > bx[0]) bx[0] = x, be[0] = e;
        if (x >= 1024 && x < bx[1]) bx[1] = x, be[1] = e;
    }
    assert_int_equal(n_codec, 6);
    assert_true(bx[0] > 0 && isfinite(bx[1]));
    double t = bx[1] > bx[0] ? (log(1024) - log(bx[0])) / (log(bx[1]) - log(bx[0])) : 0;
    char want[256];
    snprintf(want, sizeof want, "| window | - | " INT4 " | - | stories260K@");
    const char *row = strstr(md, "kvsim compare codec.db --match mem --at 1024");
    assert_non_null(row);
    row = strstr(row, want);
    assert_non_null(row);
    snprintf(want, sizeof want, "| decode | %.4g |", be[0] + t * (be[1] - be[0]));
    const char *eol = strchr(row, '\n');
    if (!strstr(row, want) || strstr(row, want) > eol) fail_msg("equal-memory row lacks %s: %.*s", want, (int)(eol - row), row);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < N_F; k++) free(runs[i].f[k]);
    free(md);
}

/* ---- several traces of one model: means, bootstrap intervals, paired differences ---- */

static const char *const TR_SHA[4] = {
    "1000000000000000000000000000000000000000000000000000000000000000",
    "2000000000000000000000000000000000000000000000000000000000000000",
    "3000000000000000000000000000000000000000000000000000000000000000",
    "4000000000000000000000000000000000000000000000000000000000000000",
};

/* One complete run of policy on trace i (content hash TR_SHA[i]) at `bytes` resident per KV head with mean error
 * err (the rest as put_run). */
static void put_trace_run(kvs_results_db *db, int i, const char *policy, double bytes, double err) {
    char path[64];
    snprintf(path, sizeof path, "/nonexistent/p%d.kvt", i);
    kvs_results_trace tr = {.path = path, .model_name = "m1", .n_positions = 128, .prompt_len = 64, .n_turns = 1,
                            .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16, .dtype = "fp16",
                            .file_bytes = 4096};
    int64_t trace_id = 0;
    assert_int_equal(kvs_results_sweep_trace(db, &tr, TR_SHA[i], &trace_id), KVS_OK);
    kvs_results_run run = {.policy = policy, .params = "", .budget_tokens = (int64_t)bytes / 32, .budget_fraction = -1,
                           .measure = "decode", .budget_scope = "every_step", .status = "complete",
                           .wall_seconds = 0.1, .kvsim_version = "0.1.0"};
    kvs_results_agg a = {.layer = -1};
    kvs_results_stat v = {.n = 10, .mean = err, .p50 = err, .p95 = 2 * err, .max = 2 * err, .min = err / 2};
    kvs_results_stat b = {.n = 10, .mean = bytes, .p50 = bytes, .p95 = bytes, .max = bytes, .min = bytes};
    kvs_results_stat r = {.n = 10, .mean = 1 - err, .p50 = 1 - err, .p95 = 1 - err, .max = 1, .min = 1 - err};
    a.out_err = v;
    a.attn_recall = r;
    a.topk_overlap = r;
    a.storage_bytes = b;
    a.traffic_bytes = b;
    a.attended_tokens = (kvs_results_stat){.n = 10, .mean = 32, .p50 = 32, .p95 = 32, .max = 32, .min = 32};
    assert_int_equal(kvs_results_write_run(db, &tr, &run, NULL, 0, &a, NULL, 0, NULL), KVS_OK);
}

static uint64_t fnv1a(const char *s) { /* the seed hash results/compare.h states */
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* kvs_stats.h's percentile bootstrap by hand: 2000 resamples by PCG32 (seed, stream "boot"), unit (u32 * n) >> 32,
 * the type-7 2.5 % and 97.5 % quantiles of the resampled means. */
static void boot_by_hand(const double *x, size_t n, uint64_t seed, double *lo, double *hi) {
    double m[2000];
    kvs_rng g;
    kvs_rng_seed(&g, seed, 0x626f6f74);
    for (int b = 0; b < 2000; b++) {
        long double s = 0;
        for (size_t i = 0; i < n; i++) s += x[((uint64_t)kvs_rng_u32(&g) * n) >> 32];
        m[b] = (double)(s / (long double)n);
    }
    qsort(m, 2000, sizeof *m, cmp_dbl);
    double p = 0.025 * 1999, q = 0.975 * 1999;
    size_t i = (size_t)p, j = (size_t)q;
    *lo = m[i] + (p - (double)i) * (m[i + 1] - m[i]);
    *hi = m[j] + (q - (double)j) * (m[j + 1] - m[j]);
}

/* "mean [lo, hi] (n)" as the report prints an interval, recomputed: the mean summed here, the interval by hand. */
static void expect_interval(const char *md, const char *prefix, const double *x, size_t n, const char *seed_id) {
    long double sum = 0; /* as kvs_stats.h sums: the printed digits then match even at a rounding tie */
    double lo, hi;
    for (size_t i = 0; i < n; i++) sum += x[i];
    boot_by_hand(x, n, fnv1a(seed_id), &lo, &hi);
    char want[512];
    snprintf(want, sizeof want, "%s%.4g [%.4g, %.4g] (%zu) |", prefix, (double)(sum / (long double)n), lo, hi, n);
    if (!strstr(md, want)) fail_msg("not in report.md: %s\n--- report.md:\n%s", want, md);
}

/* Two policies on four traces of m1 (levels 1, 2 and 4 KiB; per trace i, a and b at 1 KiB and 4 KiB):
 *   a: 1 KiB .5 .6 .4 .7    4 KiB .2 .3 .1 .26
 *   b: 1 KiB a + .05        4 KiB a + .02 -.02 .01 -.015
 * At 1 and 2 KiB (their 1 KiB runs) a leads by .05 on every trace: the paired interval is [-.05, -.05], a win. At
 * 4 KiB b leads on the mean (.2138 vs .215) but the traces disagree: not resolved, no one's win. Equal memory at
 * 2 KiB (the middle level): each trace halfway in ln x, a (.35 .45 .25 .48), b (.385 .465 .28 .4975). */
static void test_summary_over_traces(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    char db_path[128], out[128], p[256];
    path_in(db_path, sizeof db_path, "traces4.db");
    path_in(out, sizeof out, "traces4_report");
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_path, &db), KVS_OK);
    const double a1[4] = {.5, .6, .4, .7}, a4[4] = {.2, .3, .1, .26}, d4[4] = {.02, -.02, .01, -.015};
    double b1[4], b4[4], am[4], bm[4], d[4];
    for (int i = 0; i < 4; i++) {
        b1[i] = a1[i] + .05;
        b4[i] = a4[i] + d4[i];
        put_trace_run(db, i, "a", 1024, a1[i]);
        put_trace_run(db, i, "a", 4096, a4[i]);
        put_trace_run(db, i, "b", 1024, b1[i]);
        put_trace_run(db, i, "b", 4096, b4[i]);
        /* halfway in ln x, computed as results/compare.h states it (t is 1/2 up to rounding) */
        double t = (log(2048.0) - log(1024.0)) / (log(4096.0) - log(1024.0));
        am[i] = a1[i] + t * (a4[i] - a1[i]);
        bm[i] = b1[i] + t * (b4[i] - b1[i]);
    }
    kvs_results_close(db);
    const char *args[] = {"report", db_path, "--out", out, NULL};
    assert_int_equal(kvsim(args), 0);
    snprintf(p, sizeof p, "%s/report.md", out);
    char *md = kvs_test_slurp(p, NULL);
    assert_non_null(md);
    const char *ids = "1000000000000000000000000000000000000000000000000000000000000000,"
                      "2000000000000000000000000000000000000000000000000000000000000000,"
                      "3000000000000000000000000000000000000000000000000000000000000000,"
                      "4000000000000000000000000000000000000000000000000000000000000000";
    char id[1024];
    assert_non_null(strstr(md, "### Model m1, measure decode: 4 traces\n"));
    /* 1 KiB: a leads, b runner-up, the paired difference -.05 on every trace: resolved */
    snprintf(id, sizeof id, "summary|1024|a|%s", ids);
    expect_interval(md, "| 1.00KiB | 2 | a | ", a1, 4, id);
    snprintf(id, sizeof id, "summary|1024|b|%s", ids);
    expect_interval(md, "| b | ", b1, 4, id);
    assert_non_null(strstr(md, "| -0.05 [-0.05, -0.05] (4) | win: resolved over 4 traces |"));
    /* 4 KiB: b leads on the mean, the paired difference b - a holds 0 */
    snprintf(id, sizeof id, "summary|4096|b|%s", ids);
    expect_interval(md, "| 4.00KiB | 2 | b | ", b4, 4, id);
    double lo, hi;
    for (int i = 0; i < 4; i++) d[i] = b4[i] - a4[i];
    snprintf(id, sizeof id, "summary|4096|b|-|a|%s", ids);
    boot_by_hand(d, 4, fnv1a(id), &lo, &hi);
    assert_true(lo < 0 && hi > 0);
    char want[256];
    snprintf(want, sizeof want, "| %+.4g [%+.4g, %+.4g] (4) | not resolved over 4 traces |",
             (double)(((long double)d[0] + d[1] + d[2] + d[3]) / 4), lo, hi);
    if (!strstr(md, want)) fail_msg("not in report.md: %s\n%s", want, md);
    assert_non_null(strstr(md, "a has the lowest mean output error, resolved against the runner-up over the traces, "
                               "at 2 of the 3 contested levels (of 3 levels)."));
    assert_non_null(strstr(md, "Not resolved (not counted as a win): 4.00KiB (b vs a, 4 traces)."));
    /* equal memory at 2 KiB over the traces: each trace's interpolated value, their mean and interval */
    snprintf(id, sizeof id, "mem|storage_bytes_mean|2048|out_err_mean|a||decode|-1|-1|m1|%s", ids);
    expect_interval(md, "| a | - | - | - | 4 of 4 | ", am, 4, id);
    snprintf(id, sizeof id, "mem|storage_bytes_mean|2048|out_err_mean|b||decode|-1|-1|m1|%s", ids);
    expect_interval(md, "| b | - | - | - | 4 of 4 | ", bm, 4, id);
    for (int i = 0; i < 4; i++) d[i] = bm[i] - am[i];
    snprintf(id, sizeof id, "mem|storage_bytes_mean|2048|out_err_mean|b||decode|-1|-1|m1|-|a||decode|-1|-1|m1|%s", ids);
    boot_by_hand(d, 4, fnv1a(id), &lo, &hi);
    assert_true(lo > 0); /* b above a on every trace at 2 KiB: .035 .015 .03 .0175 */
    snprintf(want, sizeof want, "Resolved orderings: a lower than b (paired difference %+.4g [%+.4g, %+.4g] over 4 "
                                "traces)",
             -(double)(((long double)d[0] + d[1] + d[2] + d[3]) / 4), -hi, -lo);
    if (!strstr(md, want)) fail_msg("not in report.md: %s\n%s", want, md);
    assert_non_null(strstr(md, "### Per trace\n"));
    assert_null(strstr(md, "One trace"));
    free(md);
    assert_int_equal(dir_has_tmp(tmp_dir), 0);
}

/* ---- the real study ---- */

static char real_out[128];

static void make_real_report(void) {
    if (real_out[0]) return;
    char trace[512], db[128];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    path_in(db, sizeof db, "real.db");
    path_in(real_out, sizeof real_out, "real_report");
    const char *replay[] = {"replay", trace, "--db", db, "--policy", "window", "--policy", "h2o", "--policy", "snapkv",
                            "--policy", "topk", "--budgets", "16,64,256", "--series-every", "8", "--threads", "2",
                            NULL};
    assert_int_equal(kvsim(replay), 0);
    /* The analyses and a capacity plan in the same study database: their sections appear. */
    const char *drift[] = {"drift", trace, "--db", db, "--k", "8,32", "--delta-max", "4", NULL};
    assert_int_equal(kvsim(drift), 0);
    const char *heads[] = {"heads", trace, "--db", db, "--k", "16", NULL};
    assert_int_equal(kvsim(heads), 0);
    const char *plan[] = {"plan", "--model", "Llama-3.1-70B", "--batch", "32", "--context", "32768", "--db", db, NULL};
    assert_int_equal(kvsim(plan), 0);
    const char *report[] = {"report", db, "--out", real_out, NULL};
    assert_int_equal(kvsim(report), 0);
}

static void test_real_study_page(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    make_real_report();
    char p[256];
    snprintf(p, sizeof p, "%s/report.html", real_out);
    char *html = kvs_test_slurp(p, NULL);
    snprintf(p, sizeof p, "%s/report.md", real_out);
    char *md = kvs_test_slurp(p, NULL);
    assert_non_null(html);
    assert_non_null(md);
    for (size_t i = 0; i < N_TITLES; i++) {
        char want_html[256], want_md[256];
        snprintf(want_html, sizeof want_html, "<h2>%s</h2>", titles[i]);
        snprintf(want_md, sizeof want_md, "\n## %s\n", titles[i]);
        if (!strstr(html, want_html)) fail_msg("report.html lacks the section %s", titles[i]);
        if (!strstr(md, want_md)) fail_msg("report.md lacks the section %s", titles[i]);
    }
    assert_null(strstr(html, "Not in this database"));
    /* Self-contained: nothing fetched from anywhere. */
    assert_null(strstr(html, "http://"));
    assert_null(strstr(html, "https://"));
    assert_null(strstr(html, "<link"));
    assert_null(strstr(html, "<script"));
    assert_null(strstr(html, "url("));
    /* Every image a data URI, every plot of report.md embedded, each non-blank and the same bytes as the file. */
    int n_img = 0;
    for (const char *s = strstr(html, "src=\""); s; s = strstr(s + 1, "src=\"")) {
        const char *pre = "src=\"data:image/png;base64,";
        if (strncmp(s, pre, strlen(pre))) fail_msg("an image that is not an embedded PNG: %.60s", s);
        const char *b = s + strlen(pre), *e = strchr(b, '"');
        assert_non_null(e);
        size_t n = 0;
        uint8_t *png = base64_decode(b, (size_t)(e - b), &n);
        assert_non_null(png);
        char what[32];
        snprintf(what, sizeof what, "embedded image %d", n_img + 1);
        assert_nonblank_png(png, n, what);
        /* The n-th image of report.md: ![caption](file) */
        const char *m = md;
        for (int k = 0; k <= n_img && m; k++) m = strstr(k ? m + 1 : m, "![");
        assert_non_null(m);
        const char *f = strstr(m, "](");
        assert_non_null(f);
        char file[256];
        snprintf(file, sizeof file, "%s/%.*s", real_out, (int)(strcspn(f + 2, ")")), f + 2);
        char *disk = NULL;
        size_t disk_n = 0;
        assert_int_equal(kvs_read_file(file, &disk, &disk_n), KVS_OK);
        assert_int_equal(disk_n, n);
        assert_memory_equal(disk, png, n);
        free(disk);
        free(png);
        n_img++;
    }
    /* error vs memory, vs traffic, vs budget, recall vs budget, memory vs budget, error vs position, drift curve,
     * drift locality, head similarity, layer similarity */
    assert_int_equal(n_img, 10);
    /* The capacity table: rocketkv §1's figure (Llama-3.1-70B, batch 32, 32K context, fp16). */
    assert_non_null(strstr(md, "343.6 GB = 320.0 GiB"));
    /* The summary, recomputed from kvsim runs --csv: real runs with degenerate (N) and oracle ones. */
    char db[128];
    path_in(db, sizeof db, "real.db");
    assert_true(check_summary_against_csv(db, md) >= 3);
    assert_non_null(strstr(md, "| Llama-3.1-70B |"));
    assert_int_equal(dir_has_tmp(tmp_dir), 0);
    free(html);
    free(md);
}

/* chromium on PATH (Debian's package), or $KVSIM_CHROMIUM. */
static const char *find_chromium(void) {
    static char found[512];
    const char *env = getenv("KVSIM_CHROMIUM");
    if (env && env[0]) return env;
    const char *path = getenv("PATH");
    for (const char *p = path; p && *p;) {
        size_t n = strcspn(p, ":");
        snprintf(found, sizeof found, "%.*s/chromium", (int)n, p);
        if (access(found, X_OK) == 0) return found;
        p += n + (p[n] == ':');
    }
    return NULL;
}

/* The report groups and compares runs as kvsim compare does: one trace through two path spellings is one trace
 * (one summary group, its content label), and a policy's jump wider than compare's ratio is a gap with the two
 * runs named, never an interpolated value (MorphKV: 1 KiB at budget 32, 18 KiB at 64 on the bundled trace). */
static void test_report_identity_and_gaps(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    char trace[512], link[128], db[128], out[128], md[160];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    path_in(link, sizeof link, "other_spelling.kvt");
    assert_int_equal(symlink(trace, link), 0);
    path_in(db, sizeof db, "ident.db");
    path_in(out, sizeof out, "ident_report");
    const char *a[] = {"replay", trace, "--db", db, "--policy", "morphkv", "--policy", "window", "--budgets",
                       "16,32,64,128", "--threads", "2", NULL};
    assert_int_equal(kvsim(a), 0);
    const char *b[] = {"replay", link, "--db", db, "--policy", "window", "--budgets", "256", "--threads", "2", NULL};
    assert_int_equal(kvsim(b), 0);
    const char *r[] = {"report", db, "--out", out, "--mem-at", "4KiB", NULL};
    assert_int_equal(kvsim(r), 0);
    snprintf(md, sizeof md, "%s/report.md", out);
    char *text = kvs_test_slurp(md, NULL);
    assert_non_null(text);
    /* one summary group, labelled by model and content hash */
    int groups = 0;
    for (const char *p = text; (p = strstr(p, "), measure decode\n")) != NULL; p++) groups++;
    assert_int_equal(groups, 1);
    assert_non_null(strstr(text, "### stories260K@"));
    /* both trace rows carry the same content label */
    const char *t1 = strstr(text, "### Trace #1: stories260K.kvt (stories260K@");
    const char *t2 = strstr(text, "### Trace #2: other_spelling.kvt (stories260K@");
    assert_non_null(t1);
    assert_non_null(t2);
    assert_memory_equal(strstr(t1, "@"), strstr(t2, "@"), 9);
    /* MorphKV at 4 KiB: a gap between its budget-32 and budget-64 runs (#2 and #3), no value */
    const char *mem = strstr(text, "--match mem --at 4096");
    assert_non_null(mem);
    const char *row = strstr(mem, "| morphkv | ");
    assert_non_null(row);
    char line[1024];
    size_t n = strcspn(row, "\n");
    assert_true(n < sizeof line);
    memcpy(line, row, n);
    line[n] = '\0';
    if (!strstr(line, "| - | - | - | - | - | - | - | gap: #2 at 1.00KiB .. #3 at 18.0KiB |"))
        fail_msg("morphkv's equal-memory row is not a gap: %s", line);
    free(text);
}

static void test_browser_renders_the_page(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    const char *chromium = find_chromium();
    if (!chromium) {
        fprintf(stderr, "test_report: chromium not found (apt-get install chromium, or "
                        "sh tools/install-debian-deps.sh --with-chromium): browser rendering test skipped\n");
        skip();
    }
    make_real_report();
    char shot[128], page[256], cmd[1400], log[128];
    path_in(shot, sizeof shot, "shot.png");
    path_in(log, sizeof log, "chromium.log");
    snprintf(page, sizeof page, "file://%s/report.html", real_out);
    /* A private profile folder, so that concurrent runs and the user's own browser never meet. */
    snprintf(cmd, sizeof cmd,
             "timeout 120 '%s' --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run "
             "--user-data-dir='%s/chromium-profile' --window-size=1280,6000 --screenshot='%s' '%s' >'%s' 2>&1",
             chromium, tmp_dir, shot, page, log);
    int rc = system(cmd);
    if (rc != 0) {
        char *l = kvs_test_slurp(log, NULL);
        fail_msg("chromium failed (%d): %s", rc, l ? l : "");
    }
    char *png = NULL;
    size_t n = 0;
    assert_int_equal(kvs_read_file(shot, &png, &n), KVS_OK);
    image im;
    assert_int_equal(png_decode((const uint8_t *)png, n, &im), 0);
    assert_int_equal(im.w, 1280);
    image_stats s = stats_of(&im);
    if (s.distinct < 3 || s.foreground < 0.01)
        fail_msg("the screenshot is blank (%d distinct values, %.4f not background)", s.distinct, s.foreground);
    /* The page itself is black on white with grey rules: strongly coloured pixels come from the plots the browser
     * decoded and drew (the page without its images shows under 200 such pixels, with them over 20000). */
    if (s.saturated < 2000) fail_msg("the screenshot shows no plot (%zu coloured pixels)", s.saturated);
    free(im.pix);
    free(png);
}

/* ---- bad input ---- */

static void expect_fail(const char *const *args, int want_rc, const char *want_msg, const char *out_dir) {
    int rc = kvsim(args);
    char *e = err_text();
    if (rc != want_rc || !e || !strstr(e, want_msg))
        fail_msg("kvsim %s %s: exit %d (want %d), stderr: %s (want '%s')", args[0], args[1] ? args[1] : "", rc, want_rc,
                 e ? e : "", want_msg);
    free(e);
    if (out_dir) assert_int_equal(kvs_test_exists(out_dir), 0);
    assert_int_equal(dir_has_tmp(tmp_dir), 0);
}

static void test_bad_input(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    char empty[128], text[128], norun[128], missing[128], out[128], hand[128];
    path_in(empty, sizeof empty, "empty.db");
    path_in(text, sizeof text, "text.db");
    path_in(norun, sizeof norun, "norun.db");
    path_in(missing, sizeof missing, "missing.db");
    path_in(out, sizeof out, "bad_report");
    path_in(hand, sizeof hand, "hand.db");
    FILE *f = fopen(empty, "w");
    assert_non_null(f);
    fclose(f);
    f = fopen(text, "w");
    assert_non_null(f);
    fputs("policy,budget\nh2o,16\n", f);
    fclose(f);
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(norun, &db), KVS_OK);
    kvs_results_close(db);

    const char *a1[] = {"report", empty, "--out", out, NULL};
    expect_fail(a1, 1, "empty results database: no runs recorded", out); /* a 0-byte file: what a replay killed before its schema leaves */
    const char *a2[] = {"report", text, "--out", out, NULL};
    expect_fail(a2, 1, "not a kvsim results database", out);
    const char *a3[] = {"report", norun, "--out", out, NULL};
    expect_fail(a3, 1, "no runs in the database: nothing to report", out);
    const char *a4[] = {"report", missing, "--out", out, NULL};
    expect_fail(a4, 1, "missing.db", out);
    /* usage */
    const char *u1[] = {"report", norun, NULL};
    expect_fail(u1, 2, "missing --out DIR", out);
    const char *u2[] = {"report", "--out", out, NULL};
    expect_fail(u2, 2, "missing the results database DB", out);
    const char *u3[] = {"report", norun, "--out", out, "--color", NULL};
    expect_fail(u3, 2, "unknown option '--color'", out);
    const char *u4[] = {"report", norun, "--out", out, "--mem-at", "lots", NULL};
    expect_fail(u4, 2, "--mem-at", out);
    const char *u5[] = {"report", norun, "--out", out, "--out", out, NULL};
    expect_fail(u5, 2, "--out given twice", out);
    const char *u6[] = {"report", norun, "--out", "-", NULL};
    expect_fail(u6, 2, "not standard output", NULL);

    /* An --out folder that holds something else is never replaced, nor touched. */
    assert_int_equal(mkdir(out, 0755), 0);
    char keep[256];
    snprintf(keep, sizeof keep, "%s/thesis.tex", out);
    f = fopen(keep, "w");
    assert_non_null(f);
    fputs("precious\n", f);
    fclose(f);
    if (kvs_test_exists(hand)) {
        const char *a5[] = {"report", hand, "--out", out, NULL};
        int rc = kvsim(a5);
        char *e = err_text();
        assert_int_equal(rc, 1);
        assert_non_null(strstr(e, "which is not part of a kvsim report"));
        free(e);
        char *k = kvs_test_slurp(keep, NULL);
        assert_string_equal(k, "precious\n");
        free(k);
        snprintf(keep, sizeof keep, "%s/report.html", out);
        assert_int_equal(kvs_test_exists(keep), 0);
        assert_int_equal(dir_has_tmp(tmp_dir), 0);

        /* gnuplot failing mid-report: exit 1 and nothing written, no temporary folder left. */
        char fake_dir[128], fake[160], fresh[128];
        path_in(fake_dir, sizeof fake_dir, "fakebin");
        path_in(fresh, sizeof fresh, "fresh_report");
        assert_int_equal(mkdir(fake_dir, 0755), 0);
        snprintf(fake, sizeof fake, "%s/gnuplot", fake_dir);
        f = fopen(fake, "w");
        assert_non_null(f);
        fputs("#!/bin/sh\ncat >/dev/null\necho 'gnuplot: simulated failure' >&2\nexit 3\n", f);
        fclose(f);
        assert_int_equal(chmod(fake, 0755), 0);
        char *old_path = strdup(getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
        char new_path[1024];
        snprintf(new_path, sizeof new_path, "%s:%s", fake_dir, old_path);
        setenv("PATH", new_path, 1);
        const char *a6[] = {"report", hand, "--out", fresh, NULL};
        rc = kvsim(a6);
        setenv("PATH", old_path, 1);
        free(old_path);
        assert_int_equal(rc, 1);
        assert_int_equal(kvs_test_exists(fresh), 0);
        assert_int_equal(dir_has_tmp(tmp_dir), 0);
    }
}

/* ---- the capacity table ---- */

/* A byte count with decimal and binary prefixes, each chosen by its own power (log10 / 3, log2 / 10): what the
 * table must print whatever the size, never "0.0 GB" for a small model's plan. */
static void plan_bytes(char *buf, size_t cap, double b) {
    static const char *const dec[] = {"B", "KB", "MB", "GB", "TB", "PB"}, *const bin[] = {"B", "KiB", "MiB", "GiB",
                                                                                          "TiB", "PiB"};
    if (!isfinite(b)) {
        snprintf(buf, cap, "-");
        return;
    }
    int i = b >= 1000 ? (int)floor(log10(b) / 3) : 0, j = b >= 1024 ? (int)floor(log2(b) / 10) : 0;
    i = i > 5 ? 5 : i;
    j = j > 5 ? 5 : j;
    if (i == 0) snprintf(buf, cap, "%.0f B", b);
    else snprintf(buf, cap, "%#.4g %s = %#.4g %s", b / pow(1000, i), dec[i], b / pow(1024, j), bin[j]);
}

static void count_cell(char *buf, size_t cap, int64_t v) {
    if (v == -1) snprintf(buf, cap, "unbounded");
    else if (v < -1) snprintf(buf, cap, "-");
    else snprintf(buf, cap, "%lld", (long long)v);
}

static void test_capacity_small_plan(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    char db_path[128], out[128], trace[512];
    path_in(db_path, sizeof db_path, "plan.db");
    path_in(out, sizeof out, "plan_report");
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_path, &db), KVS_OK);
    put_run(db, "window", 0, "every_step", 32, 1024, .5, NULL);
    /* A plan whose sizes span bytes to gigabytes, and a measured series whose text names the policy, its params
     * and budget: shown whole. */
    const char *series = "measured snapkv (window=32,kernel=7,pool=max,gqa=expand,block=0) B=64 (run 12 of study.db)";
    kvs_results_plan plan = {.model = "tiny", .n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = 8,
                             .params = NAN, .kv_dtype = "fp16", .kv_bytes_per_token = 32, .weight_bytes = 0,
                             .n_gpus = 1, .gpu_bytes = NAN, .reserve_bytes = 0, .kv_pool_bytes = NAN, .batch = 1,
                             .context = 16, .response = 0, .policy = "measured", .budget = 64, .kv_a = NAN,
                             .kv_b = NAN, .aux_a = NAN, .aux_b = NAN, .host_a = NAN, .host_b = NAN,
                             .transfer_a = NAN, .transfer_b = NAN, .fit_r2 = NAN, .kvsim_version = "0.1.0"};
    kvs_results_plan_point pts[] = {
        {.series = "full", .context = 16, .response = 0, .batch = 1, .seq_device_bytes = 512, .total_bytes = 1536,
         .max_batch = -2, .max_context = -2},
        {.series = series, .budget = 64, .context = 16, .response = 0, .batch = 1, .seq_device_bytes = 5e7,
         .total_bytes = 3.2e10, .max_batch = -1, .max_context = 4096},
    };
    assert_int_equal(kvs_results_write_plan(db, &plan, NULL, pts, 2, NULL), KVS_OK);
    kvs_results_close(db);
    /* and a real one: stories260K (640 bytes per token at fp16: 2 x 5 layers x 4 KV heads x head_dim 8 x 2) */
    const char *args_plan[] = {"plan", "--trace", trace, "--policy", "constant", "--budget", "64", "--batch", "2",
                               "--context", "239", "--response", "256", "--db", db_path, NULL};
    assert_int_equal(kvsim(args_plan), 0);
    const char *args[] = {"report", db_path, "--out", out, NULL};
    assert_int_equal(kvsim(args), 0);
    char p[256];
    snprintf(p, sizeof p, "%s/report.md", out);
    char *md = kvs_test_slurp(p, NULL);
    snprintf(p, sizeof p, "%s/report.html", out);
    char *html = kvs_test_slurp(p, NULL);
    assert_non_null(md);
    assert_non_null(html);
    /* By hand: 495 tokens x 640 bytes = 316800 per sequence, 633600 for the batch of 2. */
    assert_non_null(strstr(md, "| 239 + 256 | 2 | 316.8 KB = 309.4 KiB | 633.6 KB = 618.8 KiB |"));
    assert_non_null(strstr(md, "| 1 | tiny | fp16 | measured | full | - | 16 + 0 | 1 | 512 B | 1.536 KB = 1.500 KiB | - | - |"));
    char row[1024];
    snprintf(row, sizeof row, "| 1 | tiny | fp16 | measured | %s | 64 | 16 + 0 | 1 | 50.00 MB = 47.68 MiB | "
                              "32.00 GB = 29.80 GiB | unbounded | 4096 |", series);
    if (!strstr(md, row)) fail_msg("capacity row missing: %s\n--- report.md:\n%s", row, md);
    snprintf(row, sizeof row, "<td>measured</td><td>%s</td><td>64</td>", series);
    assert_non_null(strstr(html, row));
    assert_null(strstr(md, "0.0 GB"));
    assert_null(strstr(html, "0.0 GB"));
    /* Every point of every plan, recomputed from the stored bytes with the formatter above. */
    assert_int_equal(kvs_results_open_readonly(db_path, &db), KVS_OK);
    kvs_results_plan_row *rows = NULL;
    int64_t n = 0, checked = 0;
    assert_int_equal(kvs_results_query_plans(db, &rows, &n), KVS_OK);
    assert_int_equal(n, 2);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < rows[i].n_points; j++) {
            const kvs_results_plan_point *q = &rows[i].points[j];
            char bud[32], seq[64], tot[64], mb[32], mc[32];
            if (q->budget > 0) snprintf(bud, sizeof bud, "%lld", (long long)q->budget);
            else snprintf(bud, sizeof bud, "-");
            plan_bytes(seq, sizeof seq, q->seq_device_bytes);
            plan_bytes(tot, sizeof tot, q->total_bytes);
            count_cell(mb, sizeof mb, q->max_batch);
            count_cell(mc, sizeof mc, q->max_context);
            snprintf(row, sizeof row, "| %lld | %s | %s | %s | %s | %s | %lld + %lld | %lld | %s | %s | %s | %s |",
                     (long long)rows[i].id, rows[i].model, rows[i].kv_dtype, rows[i].policy, q->series, bud,
                     (long long)q->context, (long long)q->response, (long long)q->batch, seq, tot, mb, mc);
            if (!strstr(md, row)) fail_msg("capacity row not as recomputed: %s\n--- report.md:\n%s", row, md);
            checked++;
        }
    assert_true(checked > 10);
    kvs_results_plan_rows_free(rows, n);
    kvs_results_close(db);
    free(md);
    free(html);
}

/* ---- a damaged database ---- */

static void test_corrupt_database(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    make_real_report();
    char good[128], bad[128], out[128], keep[128], p[256];
    path_in(good, sizeof good, "real.db");
    path_in(bad, sizeof bad, "bad.db");
    path_in(out, sizeof out, "bad_db_report");
    path_in(keep, sizeof keep, "kept_report");
    size_t n = 0;
    char *bytes = kvs_test_slurp(good, &n);
    assert_non_null(bytes);
    assert_true(n > 64 * 1024);
    /* Four pages in the middle of the file (SQLite pages are 4 KiB here) overwritten: what a bad disk or a
     * copy cut short and patched leaves; the replay's per-step series live there. */
    size_t at = n / 2 / 4096 * 4096;
    memset(bytes + at, 0xde, 4 * 4096);
    assert_int_equal(kvs_test_spit(bad, bytes, n), 0);
    free(bytes);

    /* The library: the intact database passes the check, the damaged one does not; row counts read 0 for a
     * table that was never created. */
    kvs_results_db *db = NULL;
    int64_t rows = -1;
    assert_int_equal(kvs_results_open_readonly(good, &db), KVS_OK);
    assert_int_equal(kvs_results_check(db), KVS_OK);
    assert_int_equal(kvs_results_table_rows(db, "plans", &rows), KVS_OK);
    assert_int_equal(rows, 1);
    assert_int_equal(kvs_results_table_rows(db, "no_such_table", &rows), KVS_OK);
    assert_int_equal(rows, 0);
    assert_int_equal(kvs_results_table_rows(db, "runs; DROP TABLE runs", &rows), KVS_ERR_INVALID_ARG);
    kvs_results_close(db);
    if (kvs_results_open_readonly(bad, &db) == KVS_OK) {
        assert_int_equal(kvs_results_check(db), KVS_ERR_DB);
        assert_non_null(strstr(kvs_last_error(), "database disk image is malformed"));
        kvs_results_close(db);
    }

    /* The command: exit 1, the reason, nothing written. */
    const char *a1[] = {"report", bad, "--out", out, NULL};
    expect_fail(a1, 1, "database disk image is malformed", out);
    char *e = err_text();
    assert_non_null(strstr(e, "bad.db"));
    free(e);
    /* A previous report in --out stays as it was. */
    const char *a2[] = {"report", good, "--out", keep, NULL};
    assert_int_equal(kvsim(a2), 0);
    snprintf(p, sizeof p, "%s/report.md", keep);
    char *before = kvs_test_slurp(p, NULL);
    assert_non_null(before);
    const char *a3[] = {"report", bad, "--out", keep, NULL};
    expect_fail(a3, 1, "database disk image is malformed", NULL);
    char *after = kvs_test_slurp(p, NULL);
    assert_non_null(after);
    assert_string_equal(before, after);
    free(before);
    free(after);
}

static int setup(void **state) {
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/kvs_report_XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary_by_hand),
        cmocka_unit_test(test_real_study_page),
        cmocka_unit_test(test_browser_renders_the_page),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_capacity_small_plan),
        cmocka_unit_test(test_corrupt_database),
        cmocka_unit_test(test_report_identity_and_gaps),
        cmocka_unit_test(test_summary_over_traces),
        cmocka_unit_test(test_codec_runs_in_the_report),
        cmocka_unit_test(test_paged_runs_in_the_report),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
