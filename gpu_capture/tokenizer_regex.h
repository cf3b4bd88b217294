/* tokenizer_regex.h — the small backtracking regex engine that runs tokenizer.json patterns (pre_tokenizer Split,
 * normalizer Replace) with the semantics of the Oniguruma library Hugging Face's `tokenizers` compiles them with:
 * leftmost-first alternation, greedy (or lazy) quantifiers, Unicode general categories, White_Space \s and simple
 * case folding. Not part of the public API (gpu_capture/tokenizer.h is).
 *
 * Supported syntax (anything else is refused at compile time, the message naming the construct):
 *   literals; escapes \t \n \r \f \v \a \e \0 \xHH \x{H..} \uHHHH and escaped punctuation; . (any character but
 *   \n); classes [...] with ranges, negation [^...], escapes and \s \S \d \D \w \W \p{..} \P{..} inside;
 *   \s (White_Space) \S \d (Nd) \D \w (L, M, N, Pc) \W; \p{X} \P{X} \p{^X} \pX for the general categories and
 *   their groups (L Lu Ll Lt Lm Lo LC M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So Z Zs Zl Zp C Cc
 *   Cf Cs Co Cn, plus the long group names Letter Mark Number Punctuation Symbol Separator Other); alternation;
 *   groups ( ) (?: ) (?i: ) (?-i: ) and (?i) for the rest of the group; quantifiers * + ? {n} {n,} {n,m} greedy
 *   or lazy (a trailing ?); possessive quantifiers and atomic groups are refused; anchors ^ $ (line) \A \z;
 *   lookahead (?= ) (?! ). Refused: backreferences, lookbehind, \b \B, scripts such as \p{Han}, class
 *   intersection, more than 32 unbounded repeats of expressions that can match empty in one pattern (each needs a
 *   register for Oniguruma's empty check: an iteration that matches empty ends the loop).
 * \w is L, M, N and Pc (Oniguruma's Word also holds the Other_Alphabetic symbols such as U+24B6 CIRCLED LATIN
 * CAPITAL LETTER A, So; no real tokenizer pattern uses \w). Oniguruma refuses a repeat of an anchor-only group such as
 * (?:$|^){0,2} ("target of repeat operator is invalid"); this engine runs it (it matches empty).
 *
 * Work is bounded: a pattern compiles to at most KVS_TOK_RX_MAX_PROG instructions (counted repeats are expanded,
 * at most 1000 each), and one search executes at most a step budget of instructions (see kvs_tok_rx_find); a
 * hostile pattern such as (a|a)*b is then refused with a message instead of running for ever.
 */
#ifndef KVS_TOKENIZER_REGEX_H
#define KVS_TOKENIZER_REGEX_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"

#define KVS_TOK_RX_MAX_PROG 65536

typedef struct kvs_tok_rx kvs_tok_rx;

/*! kvs_tok_rx_compile() : compiles pat[0..len) (UTF-8). literal non-zero: the bytes are matched as they are (a
 *  tokenizer.json {"String": ...} pattern). @return KVS_OK and *out (free with kvs_tok_rx_free);
 *  KVS_ERR_UNSUPPORTED naming the construct and its offset; KVS_ERR_FORMAT for malformed syntax or invalid
 *  UTF-8; KVS_ERR_RANGE when the program would be too large. */
kvs_status kvs_tok_rx_compile(const char *pat, size_t len, int literal, kvs_tok_rx **out);

/*! kvs_tok_rx_find() : the leftmost-first match in s[0..len) (valid UTF-8) that starts at or after `from` (a
 *  character boundary). *found 1 and [*ms, *me) the match (possibly empty), or *found 0.
 *  *steps accumulates the instructions executed: a caller that searches one text repeatedly (a Split walking
 *  through it) passes the same counter, so the budget — max(2^24, 4096 * len) instructions, or the one set by
 *  kvs_tok_rx_set_step_budget — bounds all the searches of the text together and the work stays linear in its size.
 *  @return KVS_OK; KVS_ERR_UNSUPPORTED when the budget is exhausted: the pattern backtracks too much on this text
 *  (not KVS_ERR_RANGE, which kvs_tokenizer_encode reserves for "the id buffer is too small"). */
kvs_status kvs_tok_rx_find(const kvs_tok_rx *rx, const char *s, size_t len, size_t from, uint64_t *steps, int *found,
                           size_t *ms, size_t *me);

/*! kvs_tok_rx_set_step_budget() : overrides the step budget of every later search with rx (0: the default);
 *  the fuzz harness lowers it so that a hostile pattern is refused fast. */
void kvs_tok_rx_set_step_budget(kvs_tok_rx *rx, uint64_t steps);

/*! kvs_tok_rx_free() : releases rx; NULL is accepted. */
void kvs_tok_rx_free(kvs_tok_rx *rx);

#endif /* KVS_TOKENIZER_REGEX_H */
