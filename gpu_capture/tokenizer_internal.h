/* tokenizer_internal.h — the tokenizer handle and helpers shared by tokenizer.c (common parts, llama2.c
 * format), tokenizer_hf.c (tokenizer.json) and tokenizer_pretok.c (Split-regex scanner, Unicode
 * classes). Not part of the public API (see tokenizer.h for the semantics followed).
 */
#ifndef KVS_TOKENIZER_INTERNAL_H
#define KVS_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"
#include "tokenizer_regex.h"

/* ---- growable byte buffer (always NUL-terminated after a successful append) ---- */
typedef struct {
    char *p;
    size_t len, cap;
} kvs_tok_buf;

kvs_status kvs_tok_buf_add(kvs_tok_buf *b, const void *data, size_t n);
void kvs_tok_buf_free(kvs_tok_buf *b);

/* ---- list of byte strings sharing one buffer: the pre-tokenizer's "words" ---- */
typedef struct {
    kvs_tok_buf text;
    size_t *off, *len;  /* [n] byte offset / length of word i in text */
    size_t n, cap;
} kvs_tok_words;

/* Appends data as a new word (empty words are dropped, as `tokenizers` drops empty splits). */
kvs_status kvs_tok_words_add(kvs_tok_words *w, const char *data, size_t n);
/* Appends data as a new word even when empty (the decoder keeps empty tokens: "first token" rules). */
kvs_status kvs_tok_words_push(kvs_tok_words *w, const char *data, size_t n);
void kvs_tok_words_free(kvs_tok_words *w);

/* ---- string -> id hash map over the tokenizer's pieces (open addressing, ids stored, -1 empty) ---- */
typedef struct {
    int32_t *slot;
    uint32_t mask;
} kvs_tok_strmap;

/* ---- (id, id) -> (rank, merged id) map for tokenizer.json merges ---- */
typedef struct {
    uint64_t *key; /* (a << 32 | b) + 1; 0 = empty */
    int32_t *rank, *new_id;
    uint32_t mask;
} kvs_tok_pairmap;

/* ---- tokenizer.json pipeline steps ---- */
enum { KVS_TOK_NORM_PREPEND, KVS_TOK_NORM_REPLACE, KVS_TOK_NORM_NFC };
typedef struct {
    int kind;
    char *a, *b; /* PREPEND: a = text; REPLACE: a = pattern, b = content */
    size_t a_len, b_len;
    kvs_tok_rx *rx; /* REPLACE with a {"Regex": ...} pattern (a is then the pattern text), else NULL */
} kvs_tok_norm_step;

/* Split regexes the scanner implements (exact pattern strings in tokenizer_pretok.c); KVS_TOK_RE_NONE: the pattern
 * runs on the regex engine (tokenizer_regex.h). */
enum { KVS_TOK_RE_NONE = -1, KVS_TOK_RE_GPT2 = 0, KVS_TOK_RE_LLAMA3 = 1, KVS_TOK_RE_QWEN2 = 2 };
/* Split behaviours (pre_tokenizers/split.rs SplitDelimiterBehavior). */
enum {
    KVS_TOK_SPLIT_ISOLATED, KVS_TOK_SPLIT_REMOVED, KVS_TOK_SPLIT_MERGED_PREV, KVS_TOK_SPLIT_MERGED_NEXT,
    KVS_TOK_SPLIT_CONTIGUOUS
};
enum { KVS_TOK_PRE_METASPACE, KVS_TOK_PRE_BYTELEVEL, KVS_TOK_PRE_SPLIT };
enum { KVS_TOK_PREPEND_NEVER = 0, KVS_TOK_PREPEND_ALWAYS = 1, KVS_TOK_PREPEND_FIRST = 2 };
typedef struct {
    int kind;
    char repl[8];     /* METASPACE: replacement character, UTF-8 */
    size_t repl_len;
    int prepend;      /* METASPACE: KVS_TOK_PREPEND_* */
    int split;        /* METASPACE: split into words at the replacement character */
    int add_prefix_space, use_regex; /* BYTELEVEL */
    int regex;        /* SPLIT: KVS_TOK_RE_* (the scanner runs it), or KVS_TOK_RE_NONE */
    kvs_tok_rx *rx;   /* SPLIT: the compiled pattern (always; the scanner's reference) */
    int behavior;     /* SPLIT: KVS_TOK_SPLIT_* */
    int invert;       /* SPLIT: the pattern marks the pieces to keep, not the delimiters */
} kvs_tok_pre_step;

enum {
    KVS_TOK_DEC_REPLACE, KVS_TOK_DEC_BYTEFALLBACK, KVS_TOK_DEC_FUSE, KVS_TOK_DEC_STRIP,
    KVS_TOK_DEC_METASPACE, KVS_TOK_DEC_BYTELEVEL
};
typedef struct {
    int kind;
    char *a, *b; /* REPLACE: pattern, content */
    size_t a_len, b_len;
    char strip[8];   /* STRIP: the character removed, UTF-8; METASPACE: the replacement character */
    size_t strip_len;
    int start, stop; /* STRIP: at most this many characters removed at each end */
    int prepend;     /* METASPACE: KVS_TOK_PREPEND_* (never: keep the first token's space) */
} kvs_tok_dec_step;

typedef struct {
    int32_t id;
    char *content;
    size_t len;
    int special, normalized, lstrip, rstrip;
} kvs_tok_added;

/* A byte trie of the added tokens' contents, so that finding the leftmost-longest added token costs the length of
 * the match at each position, not a comparison with every added token (Llama-3 has 256 of them). Node 0 is the root;
 * children are a singly linked list of siblings; token = the added token ending at the node (the first of equal
 * contents, as a scan in file order finds), -1 for none. */
typedef struct {
    int32_t child, sibling, token;
    uint8_t byte;
} kvs_tok_trie_node;

typedef struct {
    kvs_tok_trie_node *nodes;
    size_t n, cap;
} kvs_tok_trie;

enum { KVS_TOK_LLAMA2C = 1, KVS_TOK_HF = 2 };

struct kvs_tokenizer {
    int family;          /* KVS_TOK_* */
    int32_t n_vocab;
    char **pieces;       /* [n_vocab] NUL-terminated; NULL for ids the file never defines */
    uint32_t *piece_len; /* [n_vocab] bytes */
    float *scores;       /* [n_vocab] llama2.c merge scores; NULL for HF */
    int16_t *byte_of;    /* [n_vocab] b for a "<0xNN>" piece, else -1 */
    uint8_t *skip;       /* [n_vocab] 1: decode produces no text (BOS/EOS/special) */
    kvs_tok_strmap map;  /* model vocabulary (HF: model.vocab only, not the added tokens) */
    int32_t byte_id[256]; /* id of the "<0xNN>" piece, -1 when absent */
    int32_t bos, eos, unk;
    int add_bos;         /* honour encode's add_bos */
    /* tokenizer.json only */
    kvs_tok_pairmap merges;
    int byte_fallback, fuse_unk, ignore_merges;
    kvs_tok_norm_step *norm;
    size_t n_norm;
    kvs_tok_pre_step *pre;
    size_t n_pre;
    kvs_tok_dec_step *dec;
    size_t n_dec;
    kvs_tok_added *added;
    size_t n_added;
    kvs_tok_trie added_trie[2]; /* the added tokens with normalized 0 / 1 */
    int no_scanner;      /* kvs_tokenizer_use_scanner(t, 0): every Split pattern runs on the regex engine */
};

/* Allocates the per-id arrays of t for n ids (pieces NULL, byte_of -1, skip 0). */
kvs_status kvs_tok_alloc_vocab(kvs_tokenizer *t, int32_t n);
/* Builds t->map over the pieces for which use[id] is non-zero (all when use is NULL); the first id
 * wins for duplicate strings. Also fills byte_of / byte_id from "<0xNN>" pieces. */
kvs_status kvs_tok_build_map(kvs_tokenizer *t, const uint8_t *use);
/* id of the piece a||b (b may be empty), -1 when absent. */
int32_t kvs_tok_lookup2(const kvs_tokenizer *t, const char *a, size_t a_len, const char *b, size_t b_len);

kvs_status kvs_tok_pairmap_init(kvs_tok_pairmap *m, size_t n);
/* Inserts (a, b) -> (rank, new_id) unless the pair is already there (the first rank wins). */
void kvs_tok_pairmap_put(kvs_tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id);
int kvs_tok_pairmap_get(const kvs_tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *new_id);
void kvs_tok_pairmap_free(kvs_tok_pairmap *m);

/* One BPE word: ids[0..*n) are merged in place. fn reports whether the pair (a, b) merges, its priority
 * (lower merges first; ties go to the leftmost pair) and the merged id. */
typedef int (*kvs_tok_pair_fn)(const kvs_tokenizer *t, int32_t a, int32_t b, double *prio, int32_t *new_id);
kvs_status kvs_tok_bpe(const kvs_tokenizer *t, int32_t *ids, size_t *n, kvs_tok_pair_fn fn);

/* Output id sink used by the encoders: counts past max and reports KVS_ERR_RANGE at the end. */
typedef struct {
    int32_t *ids;
    size_t max, n;
    kvs_tok_words *pieces; /* non-NULL: collect the pre-tokenized pieces instead of ids (kvs_tokenizer_pretokenize) */
} kvs_tok_out;
void kvs_tok_out_push(kvs_tok_out *o, int32_t id);

/* UTF-8: byte length of the sequence starting at s[0] when it is a valid, complete sequence within
 * len bytes (code point in *cp), else 0. */
size_t kvs_tok_utf8_next(const char *s, size_t len, uint32_t *cp);
/* Encodes cp as UTF-8 into out (4 bytes room); returns the length. */
size_t kvs_tok_utf8_put(uint32_t cp, char *out);

/* Value of a piece of the exact form "<0xNN>", else -1. */
int kvs_tok_byte_piece_value(const char *p, size_t len);

/* Unicode classes used by the Split regexes: \p{L}, \p{N}, \s (gpu_capture/unicode.h). */
int kvs_tok_is_letter(uint32_t cp);
int kvs_tok_is_number(uint32_t cp);
int kvs_tok_is_space(uint32_t cp);

/* Length of the regex match starting at s[pos] (valid UTF-8 in s[0..len)); always >= 1 when pos < len.
 * The scanner is the leftmost-first match of the pattern `regex` (KVS_TOK_RE_*) at pos. */
size_t kvs_tok_pretok_match(int regex, const char *s, size_t len, size_t pos);

/* One piece of a Split: [start, end) of the word and whether the pattern matched it. */
typedef struct {
    size_t start, end;
    int match;
} kvs_tok_piece;

/* The pieces of w[0..n) under a Split step: the pattern's matches and the gaps between them (the library's
 * find_matches), using the scanner when use_scanner and the step has one, else the regex engine; then the
 * behaviour and invert. *out (malloc'd, caller frees) holds *n_out pieces, empty ones included. */
kvs_status kvs_tok_split_pieces(const kvs_tok_pre_step *ps, const char *w, size_t n, int use_scanner,
                                kvs_tok_piece **out, size_t *n_out);

/* tokenizer_hf.c: encode/decode of the tokenizer.json family (text already checked for NULL). */
kvs_status kvs_tok_hf_encode(const kvs_tokenizer *t, const char *text, size_t len, kvs_tok_out *o);
kvs_status kvs_tok_hf_decode(const kvs_tokenizer *t, const int32_t *ids, size_t n, int at_start,
                             kvs_tok_buf *out);

#endif /* KVS_TOKENIZER_INTERNAL_H */
