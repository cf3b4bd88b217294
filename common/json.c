/* json.c — strict RFC 8259 JSON parser (see json.h): recursive descent with a depth limit, one arena
 * per parsed tree, and an open-addressing hash index for objects with many keys (tokenizer.json's
 * vocabulary has ~10^5 keys and is looked up once per token).
 */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Objects with at most this many keys are searched linearly; larger ones get a hash index. */
#define JSON_LINEAR_MAX 8

struct kvs_json {
    kvs_json_type type;
    int boolean;
    double number;
    size_t len;          /* string: decoded bytes; array/object: member count */
    char *str;           /* string, NUL-terminated */
    kvs_json **items;    /* [len] array elements / object values */
    char **keys;         /* [len] object keys, NUL-terminated */
    size_t *key_lens;    /* [len] */
    uint32_t *index;     /* [index_cap] member index + 1, 0 = empty slot; NULL for small objects */
    size_t index_cap;    /* power of two */
};

/* ---- arena: every allocation of one tree, freed at once ---- */

typedef struct json_block {
    struct json_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} json_block;

typedef struct {
    kvs_json node; /* the root value; must stay first so kvs_json_free can recover the arena */
    json_block *blocks;
} json_root;

static void *arena_alloc(json_root *r, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    json_block *b = r->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        json_block *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->used = 0;
        nb->cap = cap;
        if (b && n > 65536) { /* big one-off block: keep the current block as the bump target */
            nb->next = b->next;
            b->next = nb;
            nb->used = n;
            return nb->data;
        }
        nb->next = b;
        r->blocks = nb;
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

/* ---- parser ---- */

typedef struct {
    const unsigned char *s;
    size_t len, pos;
    json_root *root;
    char *scratch; /* string decoding buffer */
    size_t scratch_cap;
    kvs_status st;
} parser;

static kvs_status perr(parser *p, size_t at, const char *what) {
    if (p->st == KVS_OK) p->st = kvs_fail(KVS_ERR_FORMAT, "json: %s at byte %zu", what, at);
    return p->st;
}

static kvs_status pnomem(parser *p) {
    if (p->st == KVS_OK) p->st = kvs_fail(KVS_ERR_NOMEM, "json: out of memory at byte %zu", p->pos);
    return p->st;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int scratch_reserve(parser *p, size_t need) {
    if (need <= p->scratch_cap) return 1;
    size_t cap = p->scratch_cap ? p->scratch_cap : 256;
    while (cap < need) cap *= 2;
    char *n = realloc(p->scratch, cap);
    if (!n) return 0;
    p->scratch = n;
    p->scratch_cap = cap;
    return 1;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads 4 hex digits at p->pos (after "\u"). */
static int read_hex4(parser *p, uint32_t *out) {
    if (p->len - p->pos < 4) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[p->pos + i]);
        if (h < 0) return 0;
        v = (v << 4) | (uint32_t)h;
    }
    p->pos += 4;
    *out = v;
    return 1;
}

static size_t put_utf8(char *d, uint32_t cp) {
    if (cp < 0x80) {
        d[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6));
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12));
        d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18));
    d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence starting at s[0] (n bytes available), 0 if invalid
 * (overlong forms, surrogates and code points above U+10FFFF are invalid, RFC 3629). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) { k = 2; cp = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { k = 3; cp = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { k = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

/* Parses a string starting at the opening quote; returns the decoded bytes in p->scratch (NUL-terminated)
 * and their count in *n. */
static kvs_status parse_string_raw(parser *p, size_t *n) {
    size_t start = p->pos;
    p->pos++; /* opening quote */
    size_t o = 0;
    for (;;) {
        if (p->pos >= p->len) return perr(p, start, "unterminated string");
        if (!scratch_reserve(p, o + 8)) return pnomem(p);
        unsigned char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            p->scratch[o] = '\0';
            *n = o;
            return KVS_OK;
        }
        if (c < 0x20) return perr(p, p->pos, "raw control character in string");
        if (c == '\\') {
            size_t esc = p->pos;
            if (p->pos + 1 >= p->len) return perr(p, start, "unterminated string");
            unsigned char e = p->s[p->pos + 1];
            p->pos += 2;
            switch (e) {
            case '"': p->scratch[o++] = '"'; break;
            case '\\': p->scratch[o++] = '\\'; break;
            case '/': p->scratch[o++] = '/'; break;
            case 'b': p->scratch[o++] = '\b'; break;
            case 'f': p->scratch[o++] = '\f'; break;
            case 'n': p->scratch[o++] = '\n'; break;
            case 'r': p->scratch[o++] = '\r'; break;
            case 't': p->scratch[o++] = '\t'; break;
            case 'u': {
                uint32_t cp;
                if (!read_hex4(p, &cp)) return perr(p, esc, "bad \\u escape (need 4 hex digits)");
                if (cp >= 0xDC00 && cp <= 0xDFFF) return perr(p, esc, "lone low surrogate in \\u escape");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                        return perr(p, esc, "high surrogate not followed by a \\u low surrogate");
                    p->pos += 2;
                    if (!read_hex4(p, &lo)) return perr(p, p->pos - 2, "bad \\u escape (need 4 hex digits)");
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return perr(p, esc, "high surrogate not followed by a \\u low surrogate");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                o += put_utf8(p->scratch + o, cp);
                break;
            }
            default: return perr(p, esc, "invalid escape in string");
            }
            continue;
        }
        size_t k = utf8_seq(p->s + p->pos, p->len - p->pos);
        if (!k) return perr(p, p->pos, "invalid UTF-8 in string");
        memcpy(p->scratch + o, p->s + p->pos, k);
        o += k;
        p->pos += k;
    }
}

static kvs_json *new_node(parser *p, kvs_json_type t) {
    kvs_json *v = arena_alloc(p->root, sizeof *v);
    if (!v) {
        pnomem(p);
        return NULL;
    }
    memset(v, 0, sizeof *v);
    v->type = t;
    return v;
}

static char *arena_strdup(parser *p, const char *s, size_t n) {
    char *d = arena_alloc(p->root, n + 1);
    if (!d) {
        pnomem(p);
        return NULL;
    }
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static kvs_status parse_number(parser *p, double *out) {
    size_t start = p->pos, i = p->pos;
    const unsigned char *s = p->s;
    if (i < p->len && s[i] == '-') i++;
    if (i >= p->len || !(s[i] >= '0' && s[i] <= '9')) return perr(p, start, "invalid number");
    if (s[i] == '0') {
        i++;
        if (i < p->len && s[i] >= '0' && s[i] <= '9') return perr(p, start, "leading zero in number");
    } else {
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && s[i] == '.') {
        i++;
        if (i >= p->len || !(s[i] >= '0' && s[i] <= '9')) return perr(p, start, "digit expected after '.' in number");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || !(s[i] >= '0' && s[i] <= '9')) return perr(p, start, "digit expected in number exponent");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    size_t n = i - start;
    if (!scratch_reserve(p, n + 1)) return pnomem(p);
    memcpy(p->scratch, s + start, n);
    p->scratch[n] = '\0';
    errno = 0;
    double v = strtod(p->scratch, NULL);
    if (!isfinite(v)) return perr(p, start, "number out of range");
    *out = v;
    p->pos = i;
    return KVS_OK;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Builds the hash index of a large object; reports duplicate keys. */
static kvs_status build_index(parser *p, kvs_json *obj, size_t obj_start) {
    size_t cap = 16;
    while (cap < obj->len * 2) cap *= 2;
    obj->index = arena_alloc(p->root, cap * sizeof *obj->index);
    if (!obj->index) return pnomem(p);
    memset(obj->index, 0, cap * sizeof *obj->index);
    obj->index_cap = cap;
    for (size_t i = 0; i < obj->len; i++) {
        size_t slot = (size_t)hash_bytes(obj->keys[i], obj->key_lens[i]) & (cap - 1);
        while (obj->index[slot]) {
            size_t j = obj->index[slot] - 1;
            if (obj->key_lens[j] == obj->key_lens[i] && !memcmp(obj->keys[j], obj->keys[i], obj->key_lens[i]))
                return perr(p, obj_start, "duplicate key in object");
            slot = (slot + 1) & (cap - 1);
        }
        obj->index[slot] = (uint32_t)(i + 1);
    }
    return KVS_OK;
}

static kvs_status parse_value(parser *p, int depth, kvs_json **out);

/* Growable temporary vectors for container members (copied into the arena when complete). */
typedef struct {
    kvs_json **items;
    char **keys;
    size_t *key_lens;
    size_t n, cap;
} members;

static int members_push(members *m, kvs_json *v, char *key, size_t key_len, int with_keys) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        kvs_json **it = realloc(m->items, cap * sizeof *it);
        if (!it) return 0;
        m->items = it;
        if (with_keys) {
            char **k = realloc(m->keys, cap * sizeof *k);
            if (!k) return 0;
            m->keys = k;
            size_t *kl = realloc(m->key_lens, cap * sizeof *kl);
            if (!kl) return 0;
            m->key_lens = kl;
        }
        m->cap = cap;
    }
    m->items[m->n] = v;
    if (with_keys) {
        m->keys[m->n] = key;
        m->key_lens[m->n] = key_len;
    }
    m->n++;
    return 1;
}

static void members_free(members *m) {
    free(m->items);
    free(m->keys);
    free(m->key_lens);
}

static kvs_status parse_container(parser *p, int depth, int is_object, kvs_json **out) {
    size_t start = p->pos;
    if (depth >= KVS_JSON_MAX_DEPTH) return perr(p, start, "nesting too deep");
    p->pos++; /* '[' or '{' */
    members m = {0};
    kvs_json *node = new_node(p, is_object ? KVS_JSON_OBJECT : KVS_JSON_ARRAY);
    char close = is_object ? '}' : ']';
    if (!node) goto fail;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        *out = node;
        return KVS_OK;
    }
    for (;;) {
        char *key = NULL;
        size_t key_len = 0;
        skip_ws(p);
        if (is_object) {
            if (p->pos >= p->len) { perr(p, p->pos, "unexpected end of input in object"); goto fail; }
            if (p->s[p->pos] != '"') { perr(p, p->pos, "expected string key in object"); goto fail; }
            if (parse_string_raw(p, &key_len) != KVS_OK) goto fail;
            if (!(key = arena_strdup(p, p->scratch, key_len))) goto fail;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') { perr(p, p->pos, "expected ':' after object key"); goto fail; }
            p->pos++;
        }
        kvs_json *v;
        if (parse_value(p, depth + 1, &v) != KVS_OK) goto fail;
        if (!members_push(&m, v, key, key_len, is_object)) { pnomem(p); goto fail; }
        skip_ws(p);
        if (p->pos >= p->len) { perr(p, p->pos, is_object ? "unexpected end of input in object" : "unexpected end of input in array"); goto fail; }
        unsigned char c = p->s[p->pos];
        if (c == ',') {
            p->pos++;
            continue;
        }
        if (c == (unsigned char)close) {
            p->pos++;
            break;
        }
        perr(p, p->pos, is_object ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
        goto fail;
    }
    node->len = m.n;
    if (m.n > UINT32_MAX - 1) { perr(p, start, "too many members"); goto fail; }
    node->items = arena_alloc(p->root, m.n * sizeof *node->items);
    if (!node->items) { pnomem(p); goto fail; }
    memcpy(node->items, m.items, m.n * sizeof *node->items);
    if (is_object) {
        node->keys = arena_alloc(p->root, m.n * sizeof *node->keys);
        node->key_lens = arena_alloc(p->root, m.n * sizeof *node->key_lens);
        if (!node->keys || !node->key_lens) { pnomem(p); goto fail; }
        memcpy(node->keys, m.keys, m.n * sizeof *node->keys);
        memcpy(node->key_lens, m.key_lens, m.n * sizeof *node->key_lens);
        if (m.n > JSON_LINEAR_MAX) {
            if (build_index(p, node, start) != KVS_OK) goto fail;
        } else {
            for (size_t i = 0; i < m.n; i++)
                for (size_t j = 0; j < i; j++)
                    if (m.key_lens[i] == m.key_lens[j] && !memcmp(m.keys[i], m.keys[j], m.key_lens[i])) {
                        perr(p, start, "duplicate key in object");
                        goto fail;
                    }
        }
    }
    members_free(&m);
    *out = node;
    return KVS_OK;
fail:
    members_free(&m);
    return p->st != KVS_OK ? p->st : pnomem(p);
}

static int match_lit(parser *p, const char *lit) {
    size_t n = strlen(lit);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n)) return 0;
    p->pos += n;
    return 1;
}

static kvs_status parse_value(parser *p, int depth, kvs_json **out) {
    skip_ws(p);
    if (p->pos >= p->len) return perr(p, p->pos, "unexpected end of input, value expected");
    unsigned char c = p->s[p->pos];
    kvs_json *v;
    switch (c) {
    case '{': return parse_container(p, depth, 1, out);
    case '[': return parse_container(p, depth, 0, out);
    case '"': {
        size_t n;
        if (parse_string_raw(p, &n) != KVS_OK) return p->st;
        if (!(v = new_node(p, KVS_JSON_STRING))) return p->st;
        if (!(v->str = arena_strdup(p, p->scratch, n))) return p->st;
        v->len = n;
        *out = v;
        return KVS_OK;
    }
    case 't':
    case 'f':
    case 'n': {
        size_t at = p->pos;
        int b = 0;
        kvs_json_type t;
        if (match_lit(p, "true")) { t = KVS_JSON_BOOL; b = 1; }
        else if (match_lit(p, "false")) t = KVS_JSON_BOOL;
        else if (match_lit(p, "null")) t = KVS_JSON_NULL;
        else return perr(p, at, "invalid literal (expected true, false or null)");
        if (!(v = new_node(p, t))) return p->st;
        v->boolean = b;
        *out = v;
        return KVS_OK;
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            double d = 0;
            if (parse_number(p, &d) != KVS_OK) return p->st;
            if (!(v = new_node(p, KVS_JSON_NUMBER))) return p->st;
            v->number = d;
            *out = v;
            return KVS_OK;
        }
        return perr(p, p->pos, "unexpected character, value expected");
    }
}

kvs_status kvs_json_parse(const char *text, size_t len, kvs_json **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "json: NULL output pointer");
    *out = NULL;
    if (!text && len) return kvs_fail(KVS_ERR_INVALID_ARG, "json: NULL text");
    json_root *root = calloc(1, sizeof *root);
    if (!root) return kvs_fail(KVS_ERR_NOMEM, "json: out of memory");
    parser p = {.s = (const unsigned char *)text, .len = len, .root = root};
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) p.pos = 3; /* UTF-8 BOM, RFC 8259 §8.1 */
    kvs_json *v = NULL;
    if (parse_value(&p, 0, &v) == KVS_OK) {
        skip_ws(&p);
        if (p.pos != p.len) perr(&p, p.pos, "trailing characters after the JSON value");
    }
    free(p.scratch);
    if (p.st != KVS_OK) {
        kvs_json_free(&root->node);
        return p.st;
    }
    /* The root value was allocated in the arena; copy it into the root slot so that the pointer handed
     * out is the one kvs_json_free expects. Children point to their own nodes, never to the root. */
    root->node = *v;
    *out = &root->node;
    return KVS_OK;
}

void kvs_json_free(kvs_json *root) {
    if (!root) return;
    json_root *r = (json_root *)root;
    json_block *b = r->blocks;
    while (b) {
        json_block *n = b->next;
        free(b);
        b = n;
    }
    free(r);
}

kvs_json_type kvs_json_type_of(const kvs_json *v) { return v ? v->type : KVS_JSON_NULL; }

const kvs_json *kvs_json_get(const kvs_json *obj, const char *key) {
    if (!obj || obj->type != KVS_JSON_OBJECT || !key) return NULL;
    size_t n = strlen(key);
    if (obj->index) {
        size_t slot = (size_t)hash_bytes(key, n) & (obj->index_cap - 1);
        while (obj->index[slot]) {
            size_t j = obj->index[slot] - 1;
            if (obj->key_lens[j] == n && !memcmp(obj->keys[j], key, n)) return obj->items[j];
            slot = (slot + 1) & (obj->index_cap - 1);
        }
        return NULL;
    }
    for (size_t i = 0; i < obj->len; i++)
        if (obj->key_lens[i] == n && !memcmp(obj->keys[i], key, n)) return obj->items[i];
    return NULL;
}

size_t kvs_json_len(const kvs_json *v) {
    return v && (v->type == KVS_JSON_ARRAY || v->type == KVS_JSON_OBJECT) ? v->len : 0;
}

const kvs_json *kvs_json_at(const kvs_json *v, size_t i) {
    if (!v || (v->type != KVS_JSON_ARRAY && v->type != KVS_JSON_OBJECT) || i >= v->len) return NULL;
    return v->items[i];
}

const char *kvs_json_key_at(const kvs_json *obj, size_t i) {
    if (!obj || obj->type != KVS_JSON_OBJECT || i >= obj->len) return NULL;
    return obj->keys[i];
}

double kvs_json_number(const kvs_json *v) { return v && v->type == KVS_JSON_NUMBER ? v->number : 0.0; }

const char *kvs_json_string(const kvs_json *v) { return v && v->type == KVS_JSON_STRING ? v->str : NULL; }

size_t kvs_json_string_len(const kvs_json *v) { return v && v->type == KVS_JSON_STRING ? v->len : 0; }

int kvs_json_bool(const kvs_json *v) { return v && v->type == KVS_JSON_BOOL ? v->boolean : 0; }
