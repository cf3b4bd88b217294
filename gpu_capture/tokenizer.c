/* tokenizer.c — the public tokenizer API, the pieces shared by both tokenizer families (vocabulary hash
 * map, merge-pair map, the BPE merge engine, UTF-8 helpers) and the llama2.c tokenizer.bin family, which
 * follows llama2.c run.c (`build_tokenizer`, `encode`, `decode`) step by step. tokenizer_hf.c holds the
 * Hugging Face tokenizer.json family. Semantics and limitations are documented in tokenizer.h.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* ============================== byte buffer and word list ============================== */

kvs_status kvs_tok_buf_add(kvs_tok_buf *b, const void *data, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", cap);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return KVS_OK;
}

void kvs_tok_buf_free(kvs_tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

kvs_status kvs_tok_words_add(kvs_tok_words *w, const char *data, size_t n) {
    return n == 0 ? KVS_OK : kvs_tok_words_push(w, data, n);
}

kvs_status kvs_tok_words_push(kvs_tok_words *w, const char *data, size_t n) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        size_t *off = realloc(w->off, cap * sizeof *off);
        if (!off) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory (word list)");
        w->off = off;
        size_t *len = realloc(w->len, cap * sizeof *len);
        if (!len) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory (word list)");
        w->len = len;
        w->cap = cap;
    }
    size_t at = w->text.len;
    kvs_status st = kvs_tok_buf_add(&w->text, data, n);
    if (st != KVS_OK) return st;
    w->off[w->n] = at;
    w->len[w->n] = n;
    w->n++;
    return KVS_OK;
}

void kvs_tok_words_free(kvs_tok_words *w) {
    kvs_tok_buf_free(&w->text);
    free(w->off);
    free(w->len);
    memset(w, 0, sizeof *w);
}

void kvs_tok_out_push(kvs_tok_out *o, int32_t id) {
    if (o->n < o->max) o->ids[o->n] = id;
    o->n++; /* keeps counting past max so the caller learns the size needed */
}

/* ============================== UTF-8 ============================== */

size_t kvs_tok_utf8_next(const char *s, size_t len, uint32_t *cp) {
    const uint8_t *u = (const uint8_t *)s;
    if (len == 0) return 0;
    uint8_t c = u[0];
    size_t n;
    uint32_t v, min;
    if (c < 0x80) { *cp = c; return 1; }
    if (c >= 0xC2 && c <= 0xDF) { n = 2; v = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; v = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; v = c & 0x07; min = 0x10000; }
    else return 0;
    if (len < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (u[i] & 0x3F);
    }
    /* overlong forms, surrogates and values past U+10FFFF are not valid UTF-8 */
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

size_t kvs_tok_utf8_put(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xC0 | (cp >> 6)); o[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* ============================== vocabulary map ============================== */

/* FNV-1a over the concatenation a||b without building it (merge candidates are looked up this way). */
static uint32_t hash2(const char *a, size_t a_len, const char *b, size_t b_len) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < a_len; i++) h = (h ^ (uint8_t)a[i]) * 16777619u;
    for (size_t i = 0; i < b_len; i++) h = (h ^ (uint8_t)b[i]) * 16777619u;
    return h;
}

static int piece_equals2(const kvs_tokenizer *t, int32_t id, const char *a, size_t a_len, const char *b,
                         size_t b_len) {
    return t->piece_len[id] == a_len + b_len && memcmp(t->pieces[id], a, a_len) == 0 &&
           (b_len == 0 || memcmp(t->pieces[id] + a_len, b, b_len) == 0);
}

int32_t kvs_tok_lookup2(const kvs_tokenizer *t, const char *a, size_t a_len, const char *b, size_t b_len) {
    if (!t->map.slot) return -1;
    uint32_t i = hash2(a, a_len, b, b_len) & t->map.mask;
    for (;;) {
        int32_t id = t->map.slot[i];
        if (id < 0) return -1;
        if (piece_equals2(t, id, a, a_len, b, b_len)) return id;
        i = (i + 1) & t->map.mask;
    }
}

/* Parses the exact form "<0xNN>" (two uppercase or lowercase hex digits); -1 otherwise. */
int kvs_tok_byte_piece_value(const char *p, size_t len) {
    if (len != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                                 : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

kvs_status kvs_tok_alloc_vocab(kvs_tokenizer *t, int32_t n) {
    t->n_vocab = n;
    t->pieces = calloc((size_t)n, sizeof *t->pieces);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->byte_of = malloc((size_t)n * sizeof *t->byte_of);
    t->skip = calloc((size_t)n, 1);
    if (!t->pieces || !t->piece_len || !t->byte_of || !t->skip)
        return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory for %d tokens", (int)n);
    for (int32_t i = 0; i < n; i++) t->byte_of[i] = -1;
    return KVS_OK;
}

kvs_status kvs_tok_build_map(kvs_tokenizer *t, const uint8_t *use) {
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)t->n_vocab + 16) cap *= 2;
    t->map.slot = malloc(cap * sizeof *t->map.slot);
    if (!t->map.slot) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory (vocabulary map)");
    t->map.mask = cap - 1;
    for (uint32_t i = 0; i < cap; i++) t->map.slot[i] = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!t->pieces[id] || (use && !use[id])) continue;
        const char *p = t->pieces[id];
        size_t len = t->piece_len[id];
        uint32_t i = hash2(p, len, NULL, 0) & t->map.mask;
        int dup = 0;
        while (t->map.slot[i] >= 0) {
            if (piece_equals2(t, t->map.slot[i], p, len, NULL, 0)) { dup = 1; break; }
            i = (i + 1) & t->map.mask;
        }
        if (!dup) t->map.slot[i] = id;
        int bv = kvs_tok_byte_piece_value(p, len);
        t->byte_of[id] = (int16_t)bv;
        if (bv >= 0 && t->byte_id[bv] < 0) t->byte_id[bv] = id;
    }
    return KVS_OK;
}

/* ============================== merge-pair map ============================== */

static uint32_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

kvs_status kvs_tok_pairmap_init(kvs_tok_pairmap *m, size_t n) {
    uint32_t cap = 16;
    while (cap < 2 * n + 16) cap *= 2;
    m->key = calloc(cap, sizeof *m->key);
    m->rank = malloc(cap * sizeof *m->rank);
    m->new_id = malloc(cap * sizeof *m->new_id);
    m->mask = cap - 1;
    if (!m->key || !m->rank || !m->new_id) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory (merges)");
    return KVS_OK;
}

void kvs_tok_pairmap_put(kvs_tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint32_t i = pair_hash(k) & m->mask;
    while (m->key[i] != 0) {
        if (m->key[i] == k) return;
        i = (i + 1) & m->mask;
    }
    m->key[i] = k;
    m->rank[i] = rank;
    m->new_id[i] = new_id;
}

int kvs_tok_pairmap_get(const kvs_tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *new_id) {
    if (!m->key) return 0;
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint32_t i = pair_hash(k) & m->mask;
    while (m->key[i] != 0) {
        if (m->key[i] == k) {
            *rank = m->rank[i];
            *new_id = m->new_id[i];
            return 1;
        }
        i = (i + 1) & m->mask;
    }
    return 0;
}

void kvs_tok_pairmap_free(kvs_tok_pairmap *m) {
    free(m->key);
    free(m->rank);
    free(m->new_id);
    memset(m, 0, sizeof *m);
}

/* ============================== BPE merge engine ============================== */
/* The symbols form a doubly linked list over ids[]; candidate pairs sit in a binary min-heap ordered by
 * (priority, left position), the order `tokenizers` uses (Word::merge_all), and which for llama2.c (priority
 * = -score) equals its "first pair with the strictly highest score" scan. Entries that went stale after a
 * neighbouring merge are recognised on pop by re-checking both ids. O(n log n) instead of run.c's O(n^2). */

typedef struct {
    double prio;
    uint32_t pos;
    int32_t a, b, new_id;
} heap_entry;

static int heap_less(const heap_entry *x, const heap_entry *y) {
    return x->prio < y->prio || (x->prio == y->prio && x->pos < y->pos);
}

static void heap_push(heap_entry *h, size_t *n, heap_entry e) {
    size_t i = (*n)++;
    h[i] = e;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&h[i], &h[p])) break;
        heap_entry tmp = h[i];
        h[i] = h[p];
        h[p] = tmp;
        i = p;
    }
}

static heap_entry heap_pop(heap_entry *h, size_t *n) {
    heap_entry top = h[0];
    h[0] = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && heap_less(&h[l], &h[m])) m = l;
        if (r < *n && heap_less(&h[r], &h[m])) m = r;
        if (m == i) break;
        heap_entry tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
    return top;
}

kvs_status kvs_tok_bpe(const kvs_tokenizer *t, int32_t *ids, size_t *n, kvs_tok_pair_fn fn) {
    size_t count = *n;
    if (count < 2) return KVS_OK;
    /* Each merge pushes at most 2 entries and there are at most count-1 merges. */
    size_t heap_cap = 3 * count;
    heap_entry *heap = malloc(heap_cap * sizeof *heap);
    int64_t *next = malloc(count * sizeof *next);
    int64_t *prev = malloc(count * sizeof *prev);
    uint8_t *alive = malloc(count);
    if (!heap || !next || !prev || !alive) {
        free(heap); free(next); free(prev); free(alive);
        return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory (BPE of %zu symbols)", count);
    }
    size_t hn = 0;
    for (size_t i = 0; i < count; i++) {
        prev[i] = (int64_t)i - 1;
        next[i] = i + 1 < count ? (int64_t)i + 1 : -1;
        alive[i] = 1;
        double prio;
        int32_t nid;
        if (i + 1 < count && fn(t, ids[i], ids[i + 1], &prio, &nid))
            heap_push(heap, &hn, (heap_entry){prio, (uint32_t)i, ids[i], ids[i + 1], nid});
    }
    while (hn > 0) {
        heap_entry e = heap_pop(heap, &hn);
        size_t p = e.pos;
        if (!alive[p] || next[p] < 0 || ids[p] != e.a) continue;
        size_t q = (size_t)next[p];
        if (ids[q] != e.b) continue;
        ids[p] = e.new_id;
        alive[q] = 0;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = (int64_t)p;
        double prio;
        int32_t nid;
        if (prev[p] >= 0 && fn(t, ids[prev[p]], ids[p], &prio, &nid))
            heap_push(heap, &hn, (heap_entry){prio, (uint32_t)prev[p], ids[prev[p]], ids[p], nid});
        if (next[p] >= 0 && fn(t, ids[p], ids[next[p]], &prio, &nid))
            heap_push(heap, &hn, (heap_entry){prio, (uint32_t)p, ids[p], ids[next[p]], nid});
    }
    size_t m = 0;
    for (size_t i = 0; i < count; i++)
        if (alive[i]) ids[m++] = ids[i];
    *n = m;
    free(heap); free(next); free(prev); free(alive);
    return KVS_OK;
}

/* ============================== llama2.c tokenizer.bin ============================== */

kvs_status kvs_tokenizer_load_llama2c(const char *path, int32_t vocab_size, kvs_tokenizer **out) {
    if (!path || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "tokenizer: NULL path or out");
    *out = NULL;
    if (vocab_size <= 0)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: vocab_size %d must be positive", path, (int)vocab_size);
    char *data = NULL;
    size_t len = 0;
    kvs_status st = kvs_read_file(path, &data, &len);
    if (st != KVS_OK) return st;
    kvs_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { free(data); return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory"); }
    t->family = KVS_TOK_LLAMA2C;
    KVS_TRY(st = kvs_tok_alloc_vocab(t, vocab_size));
    t->scores = malloc((size_t)vocab_size * sizeof *t->scores);
    if (!t->scores) { st = kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory"); goto cleanup; }
    const uint8_t *u = (const uint8_t *)data;
    size_t off = 0;
    if (len < 4) {
        st = kvs_fail(KVS_ERR_TRUNCATED, "%s: %zu bytes, too short for the max_token_length header", path, len);
        goto cleanup;
    }
    int32_t max_len = (int32_t)kvs_get_u32(u);
    off = 4;
    if (max_len <= 0) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: max_token_length %d is not positive", path, (int)max_len);
        goto cleanup;
    }
    for (int32_t i = 0; i < vocab_size; i++) {
        if (len - off < 8) {
            st = kvs_fail(KVS_ERR_TRUNCATED, "%s: file ends at token %d of vocab_size %d (offset %zu)", path,
                          (int)i, (int)vocab_size, off);
            goto cleanup;
        }
        uint32_t sbits = kvs_get_u32(u + off);
        memcpy(&t->scores[i], &sbits, sizeof sbits);
        int32_t n = (int32_t)kvs_get_u32(u + off + 4);
        off += 8;
        if (n < 0 || n > max_len) {
            st = kvs_fail(KVS_ERR_FORMAT, "%s: token %d has length %d outside [0, max_token_length %d]", path,
                          (int)i, (int)n, (int)max_len);
            goto cleanup;
        }
        if (len - off < (size_t)n) {
            st = kvs_fail(KVS_ERR_TRUNCATED, "%s: token %d needs %d bytes at offset %zu, file has %zu", path,
                          (int)i, (int)n, off, len);
            goto cleanup;
        }
        t->pieces[i] = malloc((size_t)n + 1);
        if (!t->pieces[i]) { st = kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory"); goto cleanup; }
        memcpy(t->pieces[i], u + off, (size_t)n);
        t->pieces[i][n] = '\0';
        t->piece_len[i] = (uint32_t)n;
        off += (size_t)n;
    }
    if (off != len) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: %zu trailing bytes after %d tokens (vocab_size smaller than the file?)",
                      path, len - off, (int)vocab_size);
        goto cleanup;
    }
    KVS_TRY(st = kvs_tok_build_map(t, NULL));
    /* llama2.c convention: <unk> 0, BOS 1, EOS 2 (run.c hard-codes 1 and 2). */
    t->unk = 0;
    t->bos = vocab_size > 1 ? 1 : -1;
    t->eos = vocab_size > 2 ? 2 : -1;
    if (t->bos >= 0) t->skip[t->bos] = 1;
    if (t->eos >= 0) t->skip[t->eos] = 1;
    t->add_bos = 1;
    free(data);
    *out = t;
    return KVS_OK;
cleanup:
    free(data);
    kvs_tokenizer_free(t);
    return st;
}

static int llama2c_pair(const kvs_tokenizer *t, int32_t a, int32_t b, double *prio, int32_t *new_id) {
    int32_t id = kvs_tok_lookup2(t, t->pieces[a], t->piece_len[a], t->pieces[b], t->piece_len[b]);
    /* run.c starts best_score at -1e10 and requires a strictly higher score */
    if (id < 0 || !(t->scores[id] > -1e10f)) return 0;
    *prio = -(double)t->scores[id];
    *new_id = id;
    return 1;
}

static kvs_status llama2c_encode(const kvs_tokenizer *t, const char *text, size_t len, int add_bos,
                                 kvs_tok_out *o) {
    int32_t *tok = malloc((len + 3) * sizeof *tok);
    if (!tok) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory (%zu bytes of text)", len);
    size_t n = 0;
    if (add_bos && t->bos >= 0) tok[n++] = t->bos;
    if (len > 0) {
        /* run.c add_dummy_prefix: sentencepiece prepends a space to non-empty text */
        int32_t sp = kvs_tok_lookup2(t, " ", 1, NULL, 0);
        if (sp < 0) sp = t->byte_id[' '];
        if (sp < 0) {
            free(tok);
            return kvs_fail(KVS_ERR_INVALID_ARG, "tokenizer: vocabulary has neither \" \" nor <0x20>");
        }
        tok[n++] = sp;
    }
    /* run.c: gather each UTF-8 codepoint (a lead byte plus at most 3 continuation bytes, without further
     * validation), look it up whole, else emit one byte token per byte (id = byte + 3 in run.c; here the
     * id of the "<0xNN>" piece, which is the same for llama2.c files). */
    char buf[5];
    size_t blen = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)text[i];
        if ((c & 0xC0) != 0x80) blen = 0;
        buf[blen++] = (char)c;
        uint8_t nx = i + 1 < len ? (uint8_t)text[i + 1] : 0;
        if ((nx & 0xC0) == 0x80 && blen < 4) continue;
        int32_t id = kvs_tok_lookup2(t, buf, blen, NULL, 0);
        if (id >= 0) {
            tok[n++] = id;
        } else {
            for (size_t k = 0; k < blen; k++) {
                int32_t bid = t->byte_id[(uint8_t)buf[k]];
                if (bid < 0) bid = (int32_t)(uint8_t)buf[k] + 3;
                if (bid >= t->n_vocab) {
                    free(tok);
                    return kvs_fail(KVS_ERR_INVALID_ARG, "tokenizer: byte 0x%02X has no token (vocab %d)",
                                    (unsigned)(uint8_t)buf[k], (int)t->n_vocab);
                }
                tok[n++] = bid;
            }
        }
        blen = 0;
    }
    kvs_status st = kvs_tok_bpe(t, tok, &n, llama2c_pair);
    if (st == KVS_OK)
        for (size_t i = 0; i < n; i++) kvs_tok_out_push(o, tok[i]);
    free(tok);
    return st;
}

static kvs_status llama2c_decode(const kvs_tokenizer *t, const int32_t *ids, size_t n, int32_t prev,
                                 kvs_tok_buf *out) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (!t->skip[id]) {
            const char *p = t->pieces[id];
            size_t len = t->piece_len[id];
            if (prev == t->bos && prev >= 0 && len > 0 && p[0] == ' ') { p++; len--; }
            int bv = t->byte_of[id];
            char byte = (char)bv;
            kvs_status st = bv >= 0 ? kvs_tok_buf_add(out, &byte, 1) : kvs_tok_buf_add(out, p, len);
            if (st != KVS_OK) return st;
        }
        prev = id;
    }
    return KVS_OK;
}

/* ============================== public API ============================== */

kvs_status kvs_tokenizer_encode(const kvs_tokenizer *t, const char *text, int add_bos, int32_t *ids,
                                size_t max_ids, size_t *n_ids) {
    if (!t || !text || !n_ids || (!ids && max_ids > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG, "kvs_tokenizer_encode: NULL argument");
    *n_ids = 0;
    kvs_tok_out o = {ids, max_ids, 0, NULL};
    size_t len = strlen(text);
    kvs_status st;
    if (t->family == KVS_TOK_LLAMA2C) {
        st = llama2c_encode(t, text, len, add_bos, &o);
    } else {
        if (add_bos && t->add_bos && t->bos >= 0) kvs_tok_out_push(&o, t->bos);
        st = kvs_tok_hf_encode(t, text, len, &o);
    }
    if (st != KVS_OK) return st;
    *n_ids = o.n;
    if (o.n > max_ids)
        return kvs_fail(KVS_ERR_RANGE, "tokenizer: text needs %zu tokens, buffer holds %zu", o.n, max_ids);
    return KVS_OK;
}

kvs_status kvs_tokenizer_pretokenize(const kvs_tokenizer *t, const char *text,
                                     void (*fn)(const char *piece, size_t len, void *ctx), void *ctx) {
    if (!t || !text || !fn) return kvs_fail(KVS_ERR_INVALID_ARG, "kvs_tokenizer_pretokenize: NULL argument");
    if (t->family != KVS_TOK_HF)
        return kvs_fail(KVS_ERR_INVALID_ARG, "kvs_tokenizer_pretokenize: a llama2.c tokenizer has no pre-tokenizer");
    kvs_tok_words w = {0};
    kvs_tok_out o = {NULL, 0, 0, &w};
    kvs_status st = kvs_tok_hf_encode(t, text, strlen(text), &o);
    for (size_t i = 0; st == KVS_OK && i < w.n; i++) fn(w.text.p + w.off[i], w.len[i], ctx);
    kvs_tok_words_free(&w);
    return st;
}

void kvs_tokenizer_use_scanner(kvs_tokenizer *t, int on) {
    if (t) t->no_scanner = !on;
}

static kvs_status check_ids(const kvs_tokenizer *t, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab || !t->pieces[ids[i]])
            return kvs_fail(KVS_ERR_RANGE, "tokenizer: token id %d at position %zu is outside the vocabulary "
                            "(size %d) or unused", (int)ids[i], i, (int)t->n_vocab);
    return KVS_OK;
}

static kvs_status decode_common(const kvs_tokenizer *t, const int32_t *ids, size_t n, int32_t prev,
                                char **text_out) {
    if (!t || !text_out || (!ids && n > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG, "kvs_tokenizer_decode: NULL argument");
    *text_out = NULL;
    kvs_status st = check_ids(t, ids, n);
    if (st != KVS_OK) return st;
    kvs_tok_buf out = {0};
    KVS_TRY(st = kvs_tok_buf_add(&out, "", 0));
    if (t->family == KVS_TOK_LLAMA2C) {
        KVS_TRY(st = llama2c_decode(t, ids, n, prev, &out));
    } else {
        /* The HF decoder's start-of-text rules (Strip, Metaspace) apply when nothing with text came
         * before: at the start, or right after BOS. */
        int at_start = prev < 0 || prev == t->bos;
        KVS_TRY(st = kvs_tok_hf_decode(t, ids, n, at_start, &out));
    }
    *text_out = out.p;
    return KVS_OK;
cleanup:
    kvs_tok_buf_free(&out);
    return st;
}

kvs_status kvs_tokenizer_decode(const kvs_tokenizer *t, const int32_t *ids, size_t n, char **text_out) {
    return decode_common(t, ids, n, -1, text_out);
}

kvs_status kvs_tokenizer_decode_piece(const kvs_tokenizer *t, int32_t prev_id, int32_t id, char **text_out) {
    if (t && (prev_id >= t->n_vocab || prev_id < -1))
        return kvs_fail(KVS_ERR_RANGE, "tokenizer: previous token id %d outside the vocabulary (size %d)",
                        (int)prev_id, (int)t->n_vocab);
    return decode_common(t, &id, 1, prev_id, text_out);
}

const char *kvs_tokenizer_piece(const kvs_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    return t->pieces[id];
}

int32_t kvs_tokenizer_vocab_size(const kvs_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t kvs_tokenizer_bos(const kvs_tokenizer *t) { return t ? t->bos : -1; }
int32_t kvs_tokenizer_eos(const kvs_tokenizer *t) { return t ? t->eos : -1; }
int32_t kvs_tokenizer_unk(const kvs_tokenizer *t) { return t ? t->unk : -1; }

void kvs_tokenizer_free(kvs_tokenizer *t) {
    if (!t) return;
    if (t->pieces)
        for (int32_t i = 0; i < t->n_vocab; i++) free(t->pieces[i]);
    free(t->pieces);
    free(t->piece_len);
    free(t->scores);
    free(t->byte_of);
    free(t->skip);
    free(t->map.slot);
    kvs_tok_pairmap_free(&t->merges);
    for (size_t i = 0; i < t->n_norm; i++) { free(t->norm[i].a); free(t->norm[i].b); kvs_tok_rx_free(t->norm[i].rx); }
    free(t->norm);
    for (size_t i = 0; i < t->n_pre; i++) kvs_tok_rx_free(t->pre[i].rx);
    free(t->pre);
    for (size_t i = 0; i < t->n_dec; i++) { free(t->dec[i].a); free(t->dec[i].b); }
    free(t->dec);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->added_trie[0].nodes);
    free(t->added_trie[1].nodes);
    free(t);
}
