/* codec_fixture.h — TEST HELPER: what the tests of sim/codec.c share (tests/test_codec.c, tests/test_codec_think.c):
 * reading the NumPy references' fixtures (tests/fixtures/codec/, written by tools/gen_codec_fixtures.py and
 * tools/gen_think_fixtures.py; each generator's docstring gives its format: "case" lines, rows of float32 bit
 * patterns in hex, "end"; '#' lines are comments), and parsing a codec spec that must parse or must be rejected.
 * No cmocka here (bench programs link these objects too): the functions answer, the tests assert.
 */
#ifndef KVS_TEST_CODEC_FIXTURE_H
#define KVS_TEST_CODEC_FIXTURE_H

#include <stdint.h>

#include "../../sim/codec.h"

/*! kvs_test_codec_fixture() : the text of tests/fixtures/codec/FILE under kvs_test_root() (caller frees), NULL when
 *  it cannot be read (the path printed). */
char *kvs_test_codec_fixture(const char *file);

/*! kvs_test_fixture_line() : the next line of *cursor that is neither empty nor a '#' comment, NUL-terminated in
 *  place, *cursor moved past it; NULL at the end (a last line without its newline is not read). */
char *kvs_test_fixture_line(char **cursor);

/*! kvs_test_hex_floats() : n float32 bit patterns in hex ("3f800000 ...") read from *p, which moves past them, into
 *  a new array of at least one element (caller frees); NULL when one is missing or memory runs out. */
float *kvs_test_hex_floats(char **p, int64_t n);

/*! kvs_test_codec_parse() : kvs_codec_parse(spec): the codec (free with kvs_codec_free), or NULL with the error
 *  printed. */
kvs_codec *kvs_test_codec_parse(const char *spec);

/*! kvs_test_codec_rejects() : 1 when kvs_codec_parse(spec) returns KVS_ERR_INVALID_ARG, sets the codec to NULL and,
 *  when msg is not NULL, leaves exactly msg as kvs_last_error(); else 0, with what it did printed. */
int kvs_test_codec_rejects(const char *spec, const char *msg);

#endif /* KVS_TEST_CODEC_FIXTURE_H */
