/* tokenizer_pretok.c — the Split pre-tokenizer regexes of GPT-2, Llama 3 and Qwen2 run by a dedicated
 * hand-written scanner (no regex engine), and the Unicode classes they need.
 *
 * Patterns (tokenizer.json pre_tokenizer Split.pattern.Regex, or ByteLevel use_regex for GPT-2):
 *   GPT-2 : 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2 : the Llama 3 pattern with \p{N} instead of \p{N}{1,3}
 * kvs_tok_pretok_match() returns the length of the leftmost-first (Perl/Oniguruma semantics) match at a
 * position; each alternative is worked out by hand below, including the backtracking of \s*[\r\n]+ and
 * \s+(?!\S). Every character is matched by some alternative of these patterns, so splitting is a
 * sequence of matches with no gaps ("Isolated" behaviour).
 *
 * The regex engine (tokenizer_regex.c) runs every other pattern and is this scanner's reference: both give the Rust
 * library's pieces on the comparison corpus (tests/test_tokenizer_npm.c, kvsim tokenize --engine). Below the
 * scanner: the Split step itself (matches and gaps, then the behaviour), for both.
 *
 * Unicode classes: \p{L} (Lu Ll Lt Lm Lo) and \p{N} (Nd Nl No) are general categories and \s is the
 * White_Space property, all from the Unicode Character Database tables of gpu_capture/unicode.c (every
 * script, generated from the UCD by tools/gen_unicode_tables.py).
 */
#include "tokenizer_internal.h"

#include <stdlib.h>

#include "unicode.h"

int kvs_tok_is_letter(uint32_t cp) { return kvs_uni_is_letter(cp); }
int kvs_tok_is_number(uint32_t cp) { return kvs_uni_is_number(cp); }
int kvs_tok_is_space(uint32_t cp) { return kvs_uni_is_white_space(cp); }

/* ---- scanner ---- */

/* Code point at s[pos] (the caller validated the UTF-8) and its byte length. */
static size_t cp_at(const char *s, size_t len, size_t pos, uint32_t *cp) {
    if (pos >= len) { *cp = 0; return 0; }
    size_t n = kvs_tok_utf8_next(s + pos, len - pos, cp);
    if (n == 0) { *cp = (uint8_t)s[pos]; n = 1; } /* defensive: treat a stray byte as one "other" char */
    return n;
}

static int is_other(uint32_t cp) { return !kvs_tok_is_space(cp) && !kvs_tok_is_letter(cp) && !kvs_tok_is_number(cp); }

/* End of the run of characters satisfying pred starting at pos. */
static size_t run_end(const char *s, size_t len, size_t pos, int (*pred)(uint32_t)) {
    uint32_t cp;
    size_t n;
    while (pos < len && (n = cp_at(s, len, pos, &cp)) > 0 && pred(cp)) pos += n;
    return pos;
}

static int is_cr_lf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

static size_t contraction(const char *s, size_t len, size_t pos, int ignore_case) {
    if (s[pos] != '\'' || pos + 1 >= len) return 0;
    char c1 = s[pos + 1], c2 = pos + 2 < len ? s[pos + 2] : 0;
    if (ignore_case) {
        if (c1 >= 'A' && c1 <= 'Z') c1 = (char)(c1 + 32);
        if (c2 >= 'A' && c2 <= 'Z') c2 = (char)(c2 + 32);
    }
    /* (?i:'s) also matches U+017F LATIN SMALL LETTER LONG S, whose simple case folding is 's' (CaseFolding.txt);
     * no other code point folds to one of s t r e v m l d */
    if (ignore_case && (uint8_t)c1 == 0xC5 && (uint8_t)c2 == 0xBF) return 3;
    /* alternatives in pattern order: 's 't 're 've 'm 'll 'd */
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if ((c1 == 'r' || c1 == 'v') && c2 == 'e') return 3;
    if (c1 == 'l' && c2 == 'l') return 3;
    return 0;
}

/* \s*[\r\n]+ | \s+(?!\S) | \s+ starting at a whitespace character (tail alternatives shared by all
 * three patterns; the first only for Llama 3 / Qwen2). */
static size_t space_tail(const char *s, size_t len, size_t pos, int with_newline_alt) {
    size_t e = run_end(s, len, pos, kvs_tok_is_space);
    if (with_newline_alt) {
        /* \s* backtracks from the whole run until [\r\n]+ can match: the match ends just after the last
         * \r or \n of the run. */
        size_t last = 0, found = 0;
        for (size_t i = pos; i < e; i++)
            if (s[i] == '\r' || s[i] == '\n') { last = i; found = 1; }
        if (found) return last + 1 - pos;
    }
    if (e == len) return e - pos;                 /* \s+(?!\S) at the end of the text */
    /* \s+(?!\S): give back the last whitespace character so that whitespace (not \S) follows */
    uint32_t cp;
    size_t last_start = pos, i = pos;
    while (i < e) { last_start = i; i += cp_at(s, len, i, &cp); }
    if (last_start > pos) return last_start - pos;
    return e - pos;                               /* \s+ : a single whitespace character */
}

size_t kvs_tok_pretok_match(int regex, const char *s, size_t len, size_t pos) {
    uint32_t c0, c1;
    size_t n0 = cp_at(s, len, pos, &c0);
    if (n0 == 0) return 0;
    size_t n1 = cp_at(s, len, pos + n0, &c1);
    size_t m = contraction(s, len, pos, regex != KVS_TOK_RE_GPT2);
    if (m) return m;
    if (regex == KVS_TOK_RE_GPT2) {
        /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' */
        int (*cls[3])(uint32_t) = {kvs_tok_is_letter, kvs_tok_is_number, is_other};
        for (int k = 0; k < 3; k++) {
            if (c0 == ' ' && n1 && cls[k](c1)) return run_end(s, len, pos + 1, cls[k]) - pos;
            if (cls[k](c0)) return run_end(s, len, pos, cls[k]) - pos;
        }
        return space_tail(s, len, pos, 0);
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (!is_cr_lf(c0) && !kvs_tok_is_letter(c0) && !kvs_tok_is_number(c0) && n1 && kvs_tok_is_letter(c1))
        return run_end(s, len, pos + n0, kvs_tok_is_letter) - pos;
    if (kvs_tok_is_letter(c0)) return run_end(s, len, pos, kvs_tok_is_letter) - pos;
    /* \p{N}{1,3} (Llama 3) or \p{N} (Qwen2) */
    if (kvs_tok_is_number(c0)) {
        size_t e = pos, max = regex == KVS_TOK_RE_LLAMA3 ? 3 : 1;
        uint32_t cp;
        for (size_t k = 0; k < max && e < len; k++) {
            size_t n = cp_at(s, len, e, &cp);
            if (!kvs_tok_is_number(cp)) break;
            e += n;
        }
        return e - pos;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t start = pos;
    int other = 0;
    if (c0 == ' ' && n1 && is_other(c1)) { start = pos + 1; other = 1; }
    else if (is_other(c0)) other = 1;
    if (other) {
        size_t e = run_end(s, len, start, is_other);
        e = run_end(s, len, e, is_cr_lf);
        return e - pos;
    }
    return space_tail(s, len, pos, 1);
}

/* ---- Split steps: pattern matches and gaps, then the behaviour (pre_tokenizers/split.rs with
 * tokenizer/normalizer.rs NormalizedString::split and utils/pattern.rs find_matches / Invert) ---- */

typedef struct {
    kvs_tok_piece *p;
    size_t n, cap;
} piece_list;

static kvs_status piece_push(piece_list *l, size_t start, size_t end, int match) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        kvs_tok_piece *p = realloc(l->p, cap * sizeof *p);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
        l->p = p;
        l->cap = cap;
    }
    l->p[l->n++] = (kvs_tok_piece){start, end, match};
    return KVS_OK;
}

/* find_matches: the matches in order with the gaps between them as non-matches. Like Oniguruma's find_iter, an
 * empty match right after the previous match is skipped (the search moves on one character). */
static kvs_status find_matches(const kvs_tok_pre_step *ps, const char *w, size_t n, int use_scanner, piece_list *l) {
    kvs_status st = KVS_OK;
    if (n == 0) return piece_push(l, 0, 0, 0);
    if (use_scanner && ps->regex != KVS_TOK_RE_NONE) {
        /* every character is covered by some alternative of the scanner's patterns: matches only, no gaps */
        for (size_t pos = 0; pos < n && st == KVS_OK;) {
            size_t m = kvs_tok_pretok_match(ps->regex, w, n, pos);
            if (m == 0) m = 1;
            st = piece_push(l, pos, pos + m, 1);
            pos += m;
        }
        return st;
    }
    size_t prev = 0, search = 0;
    uint64_t steps = 0; /* one budget for all the searches through this word */
    int have_last = 0;
    size_t last_end = 0;
    while (search <= n) {
        int found;
        size_t ms, me;
        if ((st = kvs_tok_rx_find(ps->rx, w, n, search, &steps, &found, &ms, &me)) != KVS_OK) return st;
        if (!found) break;
        if (ms == me && have_last && me == last_end) {
            if (ms >= n) break;
            uint32_t cp;
            search = ms + cp_at(w, n, ms, &cp);
            continue;
        }
        if (prev != ms && (st = piece_push(l, prev, ms, 0)) != KVS_OK) return st;
        if ((st = piece_push(l, ms, me, 1)) != KVS_OK) return st;
        prev = me;
        have_last = 1;
        last_end = me;
        search = me;
    }
    if (prev != n) st = piece_push(l, prev, n, 0);
    return st;
}

kvs_status kvs_tok_split_pieces(const kvs_tok_pre_step *ps, const char *w, size_t n, int use_scanner,
                                kvs_tok_piece **out, size_t *n_out) {
    piece_list m = {0}, r = {0};
    kvs_status st = find_matches(ps, w, n, use_scanner, &m);
    if (st != KVS_OK) goto done;
    if (ps->invert)
        for (size_t i = 0; i < m.n; i++) m.p[i].match = !m.p[i].match;
    int prev_match = 0;
    switch (ps->behavior) {
    case KVS_TOK_SPLIT_ISOLATED:
        r = m;
        m = (piece_list){0};
        break;
    case KVS_TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < m.n && st == KVS_OK; i++)
            if (!m.p[i].match) st = piece_push(&r, m.p[i].start, m.p[i].end, 0);
        break;
    case KVS_TOK_SPLIT_MERGED_PREV:
        /* a match joins the piece before it, unless that piece was itself a match */
        for (size_t i = 0; i < m.n && st == KVS_OK; i++) {
            if (m.p[i].match && !prev_match && r.n) r.p[r.n - 1].end = m.p[i].end;
            else st = piece_push(&r, m.p[i].start, m.p[i].end, m.p[i].match && !prev_match);
            prev_match = m.p[i].match;
        }
        break;
    case KVS_TOK_SPLIT_MERGED_NEXT:
        /* the same walking backwards: a match joins the piece after it */
        for (size_t i = m.n; i-- > 0 && st == KVS_OK;) {
            if (m.p[i].match && !prev_match && r.n) r.p[r.n - 1].start = m.p[i].start;
            else st = piece_push(&r, m.p[i].start, m.p[i].end, m.p[i].match && !prev_match);
            prev_match = m.p[i].match;
        }
        for (size_t i = 0; i < r.n / 2; i++) {
            kvs_tok_piece tmp = r.p[i];
            r.p[i] = r.p[r.n - 1 - i];
            r.p[r.n - 1 - i] = tmp;
        }
        break;
    default: /* KVS_TOK_SPLIT_CONTIGUOUS: runs of matches, and runs of non-matches, become one piece each */
        for (size_t i = 0; i < m.n && st == KVS_OK; i++) {
            if (m.p[i].match == prev_match && r.n) r.p[r.n - 1].end = m.p[i].end;
            else st = piece_push(&r, m.p[i].start, m.p[i].end, m.p[i].match);
            prev_match = m.p[i].match;
        }
        break;
    }
done:
    free(m.p);
    if (st != KVS_OK) {
        free(r.p);
        r = (piece_list){0};
    }
    *out = r.p;
    *n_out = r.n;
    return st;
}
