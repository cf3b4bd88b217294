/* test_report.c — tests of `kvsim report DB --out DIR` (plots/report.c; ../shared/DESIGN.md "Results (SQLite) and
 * plots"), run through the binary ($KVSIM_BIN) as a user runs it:
 *  - the summary on a hand-made database whose winner at every memory level is computed by hand (interpolation
 *    in log x between the bracketing runs, POLICY_SPEC.md §1.5; oracle and prompt-only marks);
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
#include "results/results.h"
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
                    double err) {
    kvs_results_trace tr = {.path = "/nonexistent/a.kvt", .model_name = "m1", .n_positions = 128, .prompt_len = 64,
                            .n_turns = 1, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16,
                            .dtype = "fp16", .file_bytes = 4096};
    kvs_results_run run = {.policy = policy, .params = "", .budget_tokens = budget, .budget_fraction = -1,
                           .is_oracle = oracle, .measure = "decode", .budget_scope = scope, .status = "complete",
                           .wall_seconds = 0.1, .kvsim_version = "0.1.0"};
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

/* Levels: the powers of two within the non-oracle x range [1 KiB, 8 KiB]. By hand (interpolation in ln x):
 *   1 KiB: window .5, h2o .3, snapkv out of range [2 KiB, 8 KiB], topk .1           -> h2o .3, window .5
 *   2 KiB: window .5 + (1/2)(.2 - .5) = .35, h2o .3, snapkv .4, topk .1 + (1/3)(.01 - .1) = .07 -> h2o, window
 *   4 KiB: window .2, h2o .3, snapkv .4 + (1/2)(.05 - .4) = .225, topk .1 + (2/3)(-.09) = .04 -> window, snapkv
 *   8 KiB: window and h2o out of range, snapkv .05, topk .01                          -> snapkv alone */
static void test_summary_by_hand(void **state) {
    (void)state;
    if (!kvs_test_kvsim_bin()) skip();
    char db_path[128], out[128];
    path_in(db_path, sizeof db_path, "hand.db");
    path_in(out, sizeof out, "hand_report");
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(db_path, &db), KVS_OK);
    put_run(db, "window", 0, "every_step", 32, 1024, .5);
    put_run(db, "window", 0, "every_step", 128, 4096, .2);
    put_run(db, "h2o", 0, "every_step", 32, 1024, .3);
    put_run(db, "h2o", 0, "every_step", 128, 4096, .3);
    put_run(db, "snapkv", 0, "prompt", 16, 2048, .4);
    put_run(db, "snapkv", 0, "prompt", 128, 8192, .05);
    put_run(db, "topk", 1, "every_step", 32, 1024, .1);
    put_run(db, "topk", 1, "every_step", 256, 8192, .01);
    kvs_results_close(db);
    const char *args[] = {"report", db_path, "--out", out, NULL};
    assert_int_equal(kvsim(args), 0);
    char p[256];
    snprintf(p, sizeof p, "%s/report.md", out);
    char *md = kvs_test_slurp(p, NULL);
    assert_non_null(md);
    static const char *const rows[] = {
        "| 1.00KiB | 3 of 4 | h2o | 0.3 | window | 0.5 | topk (oracle): 0.1 |",
        "| 2.00KiB | 4 of 4 | h2o | 0.3 | window | 0.35 | topk (oracle): 0.07 |",
        "| 4.00KiB | 4 of 4 | window | 0.2 | snapkv (prompt-only budget) | 0.225 | topk (oracle): 0.04 |",
        "| 8.00KiB | 2 of 4 | snapkv (prompt-only budget) | 0.05 | - | - | topk (oracle): 0.01 |",
    };
    for (size_t i = 0; i < 4; i++)
        if (!strstr(md, rows[i])) fail_msg("summary row missing: %s\n--- report.md:\n%s", rows[i], md);
    assert_non_null(strstr(md, "h2o has the lowest mean output error at 2 of the 4 levels"));
    /* The equal-memory table defaults to the middle level, 2 KiB, and says how to reproduce it. */
    assert_non_null(strstr(md, "kvsim compare hand.db --match mem --at 2048"));
    assert_non_null(strstr(md, "| h2o | - | - | a.kvt | decode | 0.3 | 0.6 |"));
    assert_non_null(strstr(md, "| window | - | - | a.kvt | decode | 0.35 |"));
    /* No steps: the position section is absent, with its reason; the unreadable trace is said so. */
    assert_non_null(strstr(md, "## Not in this database"));
    assert_non_null(strstr(md, "- **Error vs decode position**: "));
    assert_null(strstr(md, "## Error vs decode position"));
    assert_non_null(strstr(md, "Capture settings not shown: the trace file /nonexistent/a.kvt is not readable"));
    free(md);
    /* --mem-at moves the equal-memory table. */
    const char *args2[] = {"report", db_path, "--out", out, "--mem-at", "4KiB", NULL};
    assert_int_equal(kvsim(args2), 0);
    md = kvs_test_slurp(p, NULL);
    assert_non_null(md);
    assert_non_null(strstr(md, "kvsim compare hand.db --match mem --at 4096"));
    assert_non_null(strstr(md, "| window | - | - | a.kvt | decode | 0.2 |"));
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
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
