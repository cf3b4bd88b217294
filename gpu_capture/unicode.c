/* unicode.c — character properties by binary search in the generated UCD tables and Normalization Form C
 * (Unicode Standard Annex #15 sections 1.3 and 3; Unicode Standard chapter 3.11 canonical ordering and
 * composition, 3.12 Hangul syllable decomposition and composition). Semantics in unicode.h.
 */
#include "unicode.h"

#include <stdint.h>
#include <stdlib.h>

#include "unicode_tables.h"

const char *kvs_uni_ucd_version(void) { return kvs_unitab_version; }

static int range_value(const kvs_uni_range *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return r[mid].value;
    }
    return 0;
}

/* Index of the triple whose (a, b) is (a, b) (b ignored when use_b is 0), or -1. */
static long triple_find(const kvs_uni_triple *t, size_t n, uint32_t a, uint32_t b, int use_b) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int lt = t[mid].a < a || (use_b && t[mid].a == a && t[mid].b < b);
        int gt = t[mid].a > a || (use_b && t[mid].a == a && t[mid].b > b);
        if (lt) lo = mid + 1;
        else if (gt) hi = mid;
        else return (long)mid;
    }
    return -1;
}

kvs_uni_category_t kvs_uni_category(uint32_t cp) {
    if (cp > 0x10FFFF) return KVS_UNI_CN;
    /* the last run whose start (entry >> 5) is <= cp; the first run starts at U+0000 */
    size_t lo = 0, hi = kvs_unitab_n_gc;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((kvs_unitab_gc[mid] >> 5) <= cp) lo = mid;
        else hi = mid;
    }
    return (kvs_uni_category_t)(kvs_unitab_gc[lo] & 31);
}

int kvs_uni_is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z'; /* the common case without a search */
    kvs_uni_category_t c = kvs_uni_category(cp);
    return c >= KVS_UNI_LU && c <= KVS_UNI_LO;
}

int kvs_uni_is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    kvs_uni_category_t c = kvs_uni_category(cp);
    return c >= KVS_UNI_ND && c <= KVS_UNI_NO;
}

int kvs_uni_is_white_space(uint32_t cp) {
    return range_value(kvs_unitab_white_space, kvs_unitab_n_white_space, cp);
}

uint32_t kvs_uni_simple_fold(uint32_t cp) {
    long i = triple_find(kvs_unitab_fold, kvs_unitab_n_fold, cp, 0, 0);
    return i >= 0 ? kvs_unitab_fold[i].b : cp;
}

/* A linear scan: only (?i:...) character classes ask, once per character they test. */
size_t kvs_uni_fold_sources(uint32_t f, uint32_t *out, size_t max) {
    size_t k = 0;
    for (size_t i = 0; i < kvs_unitab_n_fold; i++)
        if (kvs_unitab_fold[i].b == f && kvs_unitab_fold[i].a != f) {
            if (k < max) out[k] = kvs_unitab_fold[i].a;
            k++;
        }
    return k;
}

int kvs_uni_ccc(uint32_t cp) {
    if (cp < 0x300) return 0; /* the first non-zero class is U+0300 */
    return range_value(kvs_unitab_ccc, kvs_unitab_n_ccc, cp);
}

/* ---- Hangul (chapter 3.12) ---- */
enum {
    H_SBASE = 0xAC00, H_LBASE = 0x1100, H_VBASE = 0x1161, H_TBASE = 0x11A7,
    H_LCOUNT = 19, H_VCOUNT = 21, H_TCOUNT = 28, H_NCOUNT = H_VCOUNT * H_TCOUNT, H_SCOUNT = H_LCOUNT * H_NCOUNT
};

/* Appends the full canonical decomposition of cp to out (room for 4 more: no canonical decomposition is longer). */
static size_t decompose(uint32_t cp, uint32_t *out) {
    if (cp >= H_SBASE && cp < H_SBASE + H_SCOUNT) {
        uint32_t s = cp - H_SBASE, t = s % H_TCOUNT;
        out[0] = H_LBASE + s / H_NCOUNT;
        out[1] = H_VBASE + (s % H_NCOUNT) / H_TCOUNT;
        if (t == 0) return 2;
        out[2] = H_TBASE + t;
        return 3;
    }
    long i = cp < 0xC0 ? -1 : triple_find(kvs_unitab_decomp, kvs_unitab_n_decomp, cp, 0, 0);
    if (i < 0) {
        out[0] = cp;
        return 1;
    }
    /* only the first element of a canonical mapping can decompose further */
    size_t k = decompose(kvs_unitab_decomp[i].b, out);
    if (kvs_unitab_decomp[i].c) out[k++] = kvs_unitab_decomp[i].c;
    return k;
}

/* Primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= H_LBASE && a < H_LBASE + H_LCOUNT && b >= H_VBASE && b < H_VBASE + H_VCOUNT)
        return H_SBASE + ((a - H_LBASE) * H_VCOUNT + (b - H_VBASE)) * H_TCOUNT;
    if (a >= H_SBASE && a < H_SBASE + H_SCOUNT && (a - H_SBASE) % H_TCOUNT == 0 && b > H_TBASE &&
        b < H_TBASE + H_TCOUNT)
        return a + (b - H_TBASE);
    if (b < 0x300) return 0; /* every second element of a primary composite is U+0300 or above */
    long i = triple_find(kvs_unitab_comp, kvs_unitab_n_comp, a, b, 1);
    return i < 0 ? 0 : kvs_unitab_comp[i].c;
}

kvs_status kvs_uni_nfc(const uint32_t *in, size_t n, uint32_t **out, size_t *out_n) {
    *out = NULL;
    *out_n = 0;
    /* 4 per input code point: the longest full canonical decomposition; +1 so that n == 0 allocates */
    uint32_t *d = n < (SIZE_MAX / sizeof *d - 1) / 4 ? malloc((4 * n + 1) * sizeof *d) : NULL;
    if (!d) return kvs_fail(KVS_ERR_NOMEM, "unicode: out of memory for NFC of %zu code points", n);
    size_t len = 0;
    for (size_t i = 0; i < n; i++) len += decompose(in[i], d + len);

    /* canonical ordering: a stable insertion sort of each run of non-starters by combining class (runs are
     * short; an adversarial run of m marks costs m^2 / 2 moves, bounded by the text) */
    for (size_t i = 1; i < len; i++) {
        int c = kvs_uni_ccc(d[i]);
        if (c == 0) continue;
        uint32_t x = d[i];
        size_t j = i;
        while (j > 0) {
            int prev = kvs_uni_ccc(d[j - 1]);
            if (prev <= c) break; /* also stops at a starter (class 0) */
            d[j] = d[j - 1];
            j--;
        }
        d[j] = x;
    }

    /* canonical composition: each character composes with the last starter unless blocked (an intervening
     * character of class >= its own, or a starter) */
    if (len > 0) {
        /* d[0] serves as the starter even when it is a non-starter: harmless, since no primary composite begins
         * with a non-starter (those have Full_Composition_Exclusion) */
        size_t starter = 0, w = 1;
        int last_cc = 0;
        for (size_t i = 1; i < len; i++) {
            uint32_t ch = d[i];
            int cc = kvs_uni_ccc(ch);
            uint32_t comp = compose(d[starter], ch);
            if (comp && (last_cc < cc || last_cc == 0)) {
                d[starter] = comp;
                continue;
            }
            if (cc == 0) {
                starter = w;
                last_cc = 0;
            } else {
                last_cc = cc;
            }
            d[w++] = ch;
        }
        len = w;
    }
    *out = d;
    *out_n = len;
    return KVS_OK;
}
