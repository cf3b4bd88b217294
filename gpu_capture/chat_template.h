/* chat_template.h — a model's own chat template (tokenizer_config.json "chat_template", a Jinja template) rendered
 * for `kvsim capture --chat` and `kvsim chat-template` (../shared/DESIGN.md "Capture").
 *
 * The interpreter implements the subset of the Jinja2 template language (its documented semantics: Template
 * Designer Documentation) that real chat templates use, with the settings Hugging Face renders them with:
 * trim_blocks and lstrip_blocks on, the one trailing newline of the template dropped (keep_trailing_newline off),
 * whitespace control with "-" and "+" on tags. The reference for the output is transformers.js's
 * apply_chat_template (its Jinja engine @huggingface/jinja) on the same messages; tests/npm/chat_ref.js renders the
 * test corpus with it and tests/test_chat_template.c compares byte for byte.
 *
 * Supported: {% if/elif/else/endif %}, {% for x in xs [if cond] %} (tuple targets, {% else %}, loop.index,
 * index0, revindex, revindex0, first, last, length, previtem, nextitem), {% set x = e %}, {% set ns.attr = e %},
 * {% set x %}...{% endset %}, comments; literals (strings with Python escapes, ints, floats, true/false/none in
 * either case, lists, tuples, dicts), names, .attr, [index] with negative indices, [a:b:c] slices, calls,
 * filters (abs capitalize count d default first int items join last length list lower replace reverse string
 * tojson trim upper), tests (defined undefined none string number integer float boolean true false mapping
 * iterable sequence callable odd even divisibleby eq equalto ne lower upper in), unary not/-/+, and or,
 * comparisons == != < <= > >= in "not in", + - * / // % ** ~, the conditional "a if c else b", string methods
 * (startswith endswith split strip lstrip rstrip replace upper lower capitalize title count find), dict methods
 * (items keys values get), and the globals raise_exception(msg), range(), namespace(...), strftime_now(fmt)
 * (only with a fixed date from the caller: the clock would make a capture irreproducible).
 *
 * Everything else — macros, call/filter blocks, include/extends/import, raw, break/continue, other filters,
 * tests or methods, chained comparisons, printing a boolean, none, list or dict (Python Jinja prints "True"/"None"/
 * "['a']", transformers.js "true"/""/'["a"]': no single right answer), attribute access on an undefined value,
 * str + number — is KVS_ERR_UNSUPPORTED with a detail naming the construct and its template line; nothing is
 * approximated. String whitespace (trim, strip(), split()) is the JavaScript String.prototype.trim set
 * (transformers.js's engine runs on it; Python's str.isspace differs only on U+001C..U+001F, U+0085 and U+FEFF).
 * String length, indexing and slicing count code points.
 *
 * Hostile templates: the output is limited to KVS_CHAT_MAX_OUTPUT bytes, evaluation to KVS_CHAT_MAX_STEPS
 * steps (every expression node and loop iteration is one), scratch memory to KVS_CHAT_MAX_MEMORY bytes and
 * nesting to KVS_CHAT_MAX_DEPTH levels; past any of them rendering fails with KVS_ERR_RANGE naming the limit.
 *
 * Thread safety: a parsed template is read-only while rendering; concurrent renders of one template are safe.
 */
#ifndef KVS_CHAT_TEMPLATE_H
#define KVS_CHAT_TEMPLATE_H

#include <stddef.h>

#include "../common/json.h"
#include "../common/kvs.h"

#define KVS_CHAT_MAX_OUTPUT ((size_t)64 << 20)  /* bytes of rendered text */
#define KVS_CHAT_MAX_STEPS 20000000L            /* expression evaluations + loop iterations per render */
#define KVS_CHAT_MAX_MEMORY ((size_t)512 << 20) /* scratch bytes per render (strings, lists, dicts) */
#define KVS_CHAT_MAX_DEPTH 200                  /* nesting of statements and expressions */

typedef struct kvs_chat_template kvs_chat_template;

/* One message: role ("system", "user", "assistant", ...) and its text. */
typedef struct {
    const char *role;
    const char *content;
} kvs_chat_message;

typedef struct {
    int add_generation_prompt; /* 1: end with the assistant header, as a serving stack does before generating */
    const char *date;          /* "YYYY-MM-DD" that strftime_now formats; NULL: strftime_now is refused */
} kvs_chat_render_opts;

/*! kvs_chat_template_parse() : parses template source src[0..len) (UTF-8). No special tokens are set (see
 *  kvs_chat_template_set_token). @return KVS_OK and *out (free with kvs_chat_template_free); KVS_ERR_FORMAT
 *  for a syntax error and KVS_ERR_UNSUPPORTED for a construct outside the subset (detail names it and the
 *  line); KVS_ERR_NOMEM. */
kvs_status kvs_chat_template_parse(const char *src, size_t len, kvs_chat_template **out);

/*! kvs_chat_template_load() : the chat template of the model folder `dir`: tokenizer_config.json's
 *  "chat_template" (a string, or a list of {name, template} of which "default" is taken, as transformers.js does
 *  without tools), else a chat_template.jinja file; and the special tokens bos/eos/unk/sep/pad/cls/mask_token of
 *  tokenizer_config.json (a string or {"content": ...}). @return KVS_OK and *out; KVS_ERR_IO when neither file
 *  can be read; KVS_ERR_UNSUPPORTED "... has no chat template" when the model has none (Llama-2's released
 *  tokenizer_config.json, say: transformers.js refuses it too); parse errors as above. */
kvs_status kvs_chat_template_load(const char *dir, kvs_chat_template **out);

/*! kvs_chat_template_set_token() : sets global `name` (bos_token, eos_token, ...) to the string `value`
 *  (copied); NULL value unsets it. @return KVS_OK, KVS_ERR_INVALID_ARG for another name, KVS_ERR_NOMEM. */
kvs_status kvs_chat_template_set_token(kvs_chat_template *t, const char *name, const char *value);

/*! kvs_chat_template_token() : the string of special token `name`, NULL when unset. Borrowed. */
const char *kvs_chat_template_token(const kvs_chat_template *t, const char *name);

/*! kvs_chat_template_hash() : hex SHA-256 of the template source (64 characters + NUL), borrowed. */
const char *kvs_chat_template_hash(const kvs_chat_template *t);

/*! kvs_chat_render() : renders messages m[0..n) with `o` (NULL = add_generation_prompt 0, no date) into a
 *  malloc'd NUL-terminated *out of *out_len bytes (caller frees). tools and documents are none and
 *  enable_thinking is undefined, as transformers.js's apply_chat_template leaves them without options.
 *  @return KVS_OK; KVS_ERR_UNSUPPORTED (construct outside the subset, reached while rendering);
 *  KVS_ERR_FORMAT "template raised: ..." for raise_exception and for type errors (e.g. an attribute of an
 *  undefined value); KVS_ERR_RANGE for a limit; KVS_ERR_NOMEM. The text never holds a NUL byte (refused). */
kvs_status kvs_chat_render(const kvs_chat_template *t, const kvs_chat_message *m, size_t n,
                           const kvs_chat_render_opts *o, char **out, size_t *out_len);

/*! kvs_chat_render_json() : as kvs_chat_render with `messages` a JSON array of message objects (any fields:
 *  role, content, tool_calls, reasoning_content ... are visible to the template as they are). */
kvs_status kvs_chat_render_json(const kvs_chat_template *t, const kvs_json *messages, const kvs_chat_render_opts *o,
                                char **out, size_t *out_len);

/*! kvs_chat_template_free() : releases t; NULL is accepted. */
void kvs_chat_template_free(kvs_chat_template *t);

#endif /* KVS_CHAT_TEMPLATE_H */
