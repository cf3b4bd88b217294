/* tokenizer.h — text <-> token ids for `kvsim capture` (../shared/DESIGN.md "Capture").
 *
 * Two file formats, one opaque handle:
 *   1. llama2.c tokenizer.bin (format of llama2.c run.c `build_tokenizer`): int32 max_token_length, then
 *      per token: f32 score, int32 len, len raw bytes. The token count is not stored; it is the model's
 *      vocab_size. Encoding follows run.c `encode` exactly: optional BOS (id 1), the dummy-prefix " " when
 *      the text is non-empty, one token per UTF-8 codepoint when the codepoint is in the vocabulary, else
 *      one token per byte (id = byte + 3, the "<0xNN>" pieces), then repeated merging of the adjacent pair
 *      whose concatenation is a vocabulary piece with the highest score (leftmost on ties).
 *      Decoding follows run.c `decode`: "<0xNN>" pieces become raw bytes and the leading space of the
 *      piece right after BOS is dropped.
 *   2. Hugging Face tokenizer.json with model.type "BPE" (semantics of the `tokenizers` library):
 *      added tokens split out first (non-normalized ones on the raw text, normalized ones after the
 *      normalizer), normalizer (Sequence / Prepend / Replace with a String or Regex pattern / NFC), pre-tokenizer
 *      (Metaspace, ByteLevel, Split with a String or Regex pattern, every behaviour — Isolated, Removed,
 *      MergedWithPrevious, MergedWithNext, Contiguous — and invert, Sequence), BPE by merge rank with
 *      byte_fallback / unk / fuse_unk / ignore_merges, and the decoder chain (Replace, ByteFallback, Fuse, Strip,
 *      Metaspace, ByteLevel). tokenizer_config.json beside the file, when present, gives add_bos_token and the
 *      bos/eos token strings. The real tokenizer.json files of Llama-3.1, Qwen3, Gemma-3, Llama-2 and DeepSeek-V3
 *      give the Rust library's ids on the corpus of tests/test_tokenizer_npm.c, and gpt-oss's o200k pattern its
 *      pre-tokenizer pieces.
 *
 * Limitations (checked, never silent): anything outside the list above is KVS_ERR_UNSUPPORTED naming the
 * JSON field (model.type "Unigram", a decoder Regex Replace, ...). Regex patterns run on a backtracking engine with
 * Oniguruma's semantics (gpu_capture/tokenizer_regex.h: \p{..} general categories, simple case folding, counted
 * repeats, lookahead; backreferences, lookbehind, scripts and other constructs are refused at load naming the
 * construct, and a pattern that backtracks past its step budget on a text is refused at encode). The GPT-2,
 * Llama 3 and Qwen2 Split regexes run by default on a hand-written scanner for those exact patterns, 1.5-2 times as
 * fast, that the engine checks (kvs_tokenizer_use_scanner). \p{L}, \p{N} ... and \s are the general categories and
 * the White_Space property of the Unicode Character Database (gpu_capture/unicode.h, every script). The NFC
 * normalizer is Normalization Form C of the same database version (kvs_uni_ucd_version(); the `tokenizers`
 * library follows its unicode-normalization crate's version, so characters assigned after the older of the two
 * may normalize differently).
 *
 * Special tokens: decode skips BOS, EOS and (HF) every added token marked "special", as the `tokenizers`
 * decode(skip_special_tokens=True) does, so decode(encode(x, add_bos=1)) == x for text the vocabulary
 * can represent. Byte-fallback bytes are emitted raw (a split UTF-8 sequence is not replaced by U+FFFD).
 *
 * Thread safety: a loaded tokenizer is read-only; concurrent encode/decode calls are safe.
 */
#ifndef KVS_TOKENIZER_H
#define KVS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"

typedef struct kvs_tokenizer kvs_tokenizer;

/*! kvs_tokenizer_load_llama2c() : loads a llama2.c tokenizer.bin holding `vocab_size` tokens (the model
 *  header's vocab_size, made positive). BOS is id 1, EOS id 2 (llama2.c convention).
 *  @return KVS_OK and *out (caller owns, free with kvs_tokenizer_free); KVS_ERR_INVALID_ARG for
 *  vocab_size <= 0; KVS_ERR_IO; KVS_ERR_TRUNCATED when the file ends before vocab_size tokens;
 *  KVS_ERR_FORMAT for a negative length or trailing bytes (vocab_size smaller than the file). */
kvs_status kvs_tokenizer_load_llama2c(const char *path, int32_t vocab_size, kvs_tokenizer **out);

/*! kvs_tokenizer_load_hf() : loads a Hugging Face tokenizer.json (model.type "BPE") and, when present,
 *  tokenizer_config.json in the same directory (add_bos_token, bos_token, eos_token; the token strings
 *  may be plain strings or {"content": ...} objects). Without a config, BOS is the first SpecialToken of
 *  the post_processor's "single" template (Llama 3 style) and EOS is unknown (-1).
 *  @return KVS_OK and *out (caller owns, free with kvs_tokenizer_free); KVS_ERR_IO; KVS_ERR_FORMAT for
 *  bad JSON, a missing/ill-typed field, a merge naming a token not in the vocabulary, a duplicate id;
 *  KVS_ERR_RANGE for a negative or huge id; KVS_ERR_UNSUPPORTED naming the field for unsupported
 *  model types, normalizers, pre-tokenizers, regexes or decoders. */
kvs_status kvs_tokenizer_load_hf(const char *tokenizer_json_path, kvs_tokenizer **out);

/*! kvs_tokenizer_encode() : tokenizes NUL-terminated UTF-8 `text` into ids[0..*n_ids). When add_bos is
 *  non-zero and the tokenizer has a BOS that its configuration asks for (llama2.c: always; HF:
 *  tokenizer_config add_bos_token, else whether the post_processor template starts with a special
 *  token), BOS is prepended; otherwise add_bos is ignored.
 *  ids is caller-owned with room for max_ids entries.
 *  @return KVS_OK; KVS_ERR_RANGE when more than max_ids ids would be produced (*n_ids then holds the
 *  number needed); KVS_ERR_INVALID_ARG for NULL arguments or a character the vocabulary cannot
 *  represent at all (no byte fallback and no unk token); KVS_ERR_UNSUPPORTED (see NFC above, or a Split /
 *  Replace regex that backtracks past its step budget on this text, gpu_capture/tokenizer_regex.h). */
kvs_status kvs_tokenizer_encode(const kvs_tokenizer *t, const char *text, int add_bos, int32_t *ids,
                                size_t max_ids, size_t *n_ids);

/*! kvs_tokenizer_pretokenize() : the pieces a tokenizer.json tokenizer cuts `text` into before BPE (after the
 *  normalizer and every pre-tokenizer step, so in the pre-tokenizer's alphabet: "Ġthe" after ByteLevel), an added
 *  token as its content; fn(piece, length, ctx) once per piece in order. For comparing the pre-tokenizer with
 *  another implementation's (tests/npm/split_corpus.js).
 *  @return KVS_OK; KVS_ERR_INVALID_ARG for NULL arguments, a llama2.c tokenizer or text that is not UTF-8; the
 *  encode errors of a Split pattern (KVS_ERR_UNSUPPORTED: it backtracks past its step budget). */
kvs_status kvs_tokenizer_pretokenize(const kvs_tokenizer *t, const char *text,
                                     void (*fn)(const char *piece, size_t len, void *ctx), void *ctx);

/*! kvs_tokenizer_use_scanner() : on (the default) runs the GPT-2, Llama 3 and Qwen2 Split regexes with the
 *  hand-written scanner of tokenizer_pretok.c, off runs them on the regex engine like every other pattern; the
 *  two must agree (tests), the engine being the scanner's independent reference. Split steps only: ByteLevel's
 *  own use_regex split keeps the scanner. No-op for llama2.c. */
void kvs_tokenizer_use_scanner(kvs_tokenizer *t, int on);

/*! kvs_tokenizer_decode() : the text of ids[0..n) as one malloc'd NUL-terminated string (*text_out,
 *  caller frees with free()). Handles "<0xNN>" byte pieces, GPT-2 byte-level characters, "▁" spaces and
 *  each family's leading-space rule (llama2.c: drop the space after BOS; HF: the decoder's Strip /
 *  Metaspace rule on the start of the text). BOS/EOS/special added tokens produce no text.
 *  The result may contain NUL bytes from "<0x00>" pieces; strlen then under-counts.
 *  @return KVS_OK; KVS_ERR_RANGE for an id outside [0, vocab_size) or an id with no piece;
 *  KVS_ERR_NOMEM. */
kvs_status kvs_tokenizer_decode(const kvs_tokenizer *t, const int32_t *ids, size_t n, char **text_out);

/*! kvs_tokenizer_decode_piece() : streaming helper: the text token `id` adds when it follows `prev_id`
 *  (-1 at the start of a sequence). Equivalent to decoding [prev_id, id] and removing the text of
 *  [prev_id], except that raw bytes of a split UTF-8 character come out as they arrive.
 *  *text_out is malloc'd (caller frees). @return as kvs_tokenizer_decode. */
kvs_status kvs_tokenizer_decode_piece(const kvs_tokenizer *t, int32_t prev_id, int32_t id, char **text_out);

/*! kvs_tokenizer_piece() : raw vocabulary string of `id` (llama2.c bytes, or the tokenizer.json key such as
 *  "▁the" / "Ġthe" / "<0x0A>"), borrowed from t; NULL when id is out of range or unused. */
const char *kvs_tokenizer_piece(const kvs_tokenizer *t, int32_t id);

/*! kvs_tokenizer_vocab_size() : number of ids (largest id + 1, added tokens included). */
int32_t kvs_tokenizer_vocab_size(const kvs_tokenizer *t);

/*! kvs_tokenizer_bos() / kvs_tokenizer_eos() : BOS / EOS ids, -1 when the tokenizer has none. */
int32_t kvs_tokenizer_bos(const kvs_tokenizer *t);
int32_t kvs_tokenizer_eos(const kvs_tokenizer *t);

/*! kvs_tokenizer_unk() : the id encode gives text the vocabulary cannot represent (llama2.c: 0, "<unk>", which
 *  its byte fallback never produces for text; HF: model.unk_token), -1 when the tokenizer has none. */
int32_t kvs_tokenizer_unk(const kvs_tokenizer *t);

/*! kvs_tokenizer_free() : releases t; NULL is accepted. */
void kvs_tokenizer_free(kvs_tokenizer *t);

#endif /* KVS_TOKENIZER_H */
