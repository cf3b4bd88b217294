/* json.h — a small strict JSON parser (RFC 8259) for the files kvsim reads: Hugging Face config.json,
 * tokenizer.json, tokenizer_config.json and the safetensors header.
 *
 * Strict means: exactly one value (objects, arrays, strings, numbers, true/false/null) surrounded by
 * optional whitespace (a leading UTF-8 byte-order mark is skipped, RFC 8259 §8.1); strings must be valid
 * UTF-8 with no raw control characters; escapes \" \\ \/ \b \f \n \r \t \uXXXX, where surrogate pairs
 * are combined into one code point and a lone surrogate is an error; numbers follow the RFC grammar
 * (no leading '+', no leading zeros, no NaN/Infinity); duplicate keys within an object are an error;
 * nesting deeper than KVS_JSON_MAX_DEPTH is an error. Any malformed input returns KVS_ERR_FORMAT with
 * a detail "json: <what> at byte <offset>" and never crashes.
 *
 * The parsed tree lives in one arena owned by the root: every pointer returned by the accessors
 * (values, keys, strings) is borrowed and valid until kvs_json_free(root). Objects keep their keys in
 * file order and, when they have more than a few keys, a hash index, so kvs_json_get() on a 10^5-key
 * tokenizer vocabulary is O(1).
 */
#ifndef KVS_JSON_H
#define KVS_JSON_H

#include <stddef.h>

#include "kvs.h"

#define KVS_JSON_MAX_DEPTH 512 /* nesting levels of arrays/objects */

typedef struct kvs_json kvs_json;

typedef enum {
    KVS_JSON_NULL,
    KVS_JSON_BOOL,
    KVS_JSON_NUMBER,
    KVS_JSON_STRING,
    KVS_JSON_ARRAY,
    KVS_JSON_OBJECT
} kvs_json_type;

/*! kvs_json_parse() : parses `len` bytes of `text` (need not be NUL-terminated; embedded NULs outside
 *  strings are errors). @return KVS_OK and *out (caller owns, free with kvs_json_free), or
 *  KVS_ERR_FORMAT (detail names the problem and its byte offset) / KVS_ERR_NOMEM; *out is NULL then. */
kvs_status kvs_json_parse(const char *text, size_t len, kvs_json **out);

/*! kvs_json_free() : frees the whole tree; only the root may be passed. Accepts NULL. */
void kvs_json_free(kvs_json *root);

/*! kvs_json_type_of() : the value's type (KVS_JSON_NULL for a NULL pointer). */
kvs_json_type kvs_json_type_of(const kvs_json *v);

/*! kvs_json_get() : the value of member `key` (NUL-terminated, compared bytewise) of object `obj`;
 *  NULL if `obj` is NULL, not an object, or has no such key. Borrowed. */
const kvs_json *kvs_json_get(const kvs_json *obj, const char *key);

/*! kvs_json_len() : element count of an array, member count of an object, 0 otherwise. */
size_t kvs_json_len(const kvs_json *v);

/*! kvs_json_at() : element i of an array, or the value of member i (file order) of an object;
 *  NULL when out of range or not a container. Borrowed. */
const kvs_json *kvs_json_at(const kvs_json *v, size_t i);

/*! kvs_json_key_at() : key of member i of an object (NUL-terminated UTF-8), NULL otherwise. Borrowed. */
const char *kvs_json_key_at(const kvs_json *obj, size_t i);

/*! kvs_json_number() : the number's value as a double (0 when not a number). */
double kvs_json_number(const kvs_json *v);

/*! kvs_json_string() : the decoded string (UTF-8, NUL-terminated; may contain NULs from \u0000, so use
 *  kvs_json_string_len for the byte count); NULL when not a string. Borrowed. */
const char *kvs_json_string(const kvs_json *v);
/*! kvs_json_string_len() : decoded byte length of a string (0 when not a string). */
size_t kvs_json_string_len(const kvs_json *v);

/*! kvs_json_bool() : 1 for true, 0 for false or when not a boolean. */
int kvs_json_bool(const kvs_json *v);

#endif /* KVS_JSON_H */
