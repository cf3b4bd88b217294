/* test_sha256.c — common/sha256.c against the FIPS 180-4 / NIST example vectors, split feeding, and files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/sha256.h"

static void test_nist_vectors(void **state) {
    (void)state;
    char h[65];
    kvs_sha256_hex("abc", 3, h);
    assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    kvs_sha256_hex("", 0, h);
    assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    kvs_sha256_hex(m448, strlen(m448), h);
    assert_string_equal(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void test_million_a_fed_in_odd_pieces(void **state) {
    (void)state;
    char *m = malloc(1000000);
    assert_non_null(m);
    memset(m, 'a', 1000000);
    kvs_sha256_ctx c;
    kvs_sha256_init(&c);
    size_t off = 0, piece = 1;
    while (off < 1000000) {
        size_t n = piece < 1000000 - off ? piece : 1000000 - off;
        kvs_sha256_update(&c, m + off, n);
        off += n;
        piece = piece * 3 % 997 + 1; /* 1..997 bytes: crosses block boundaries at every offset */
    }
    uint8_t d[32];
    kvs_sha256_final(&c, d);
    static const uint8_t want[32] = {0xcd, 0xc7, 0x6e, 0x5c, 0x99, 0x14, 0xfb, 0x92, 0x81, 0xa1, 0xc7,
                                     0xe2, 0x84, 0xd7, 0x3e, 0x67, 0xf1, 0x80, 0x9a, 0x48, 0xa4, 0x97,
                                     0x20, 0x0e, 0x04, 0x6d, 0x39, 0xcc, 0xc7, 0x11, 0x2c, 0xd0};
    assert_memory_equal(d, want, 32);
    free(m);
}

static void test_file_hash_and_errors(void **state) {
    (void)state;
    char path[] = "/tmp/kvs_sha256_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "abc", 3), 3);
    close(fd);
    char h[65];
    assert_int_equal(kvs_sha256_file_hex(path, h), KVS_OK);
    assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    unlink(path);
    assert_int_equal(kvs_sha256_file_hex(path, h), KVS_ERR_IO);
    assert_non_null(strstr(kvs_last_error(), path));
    assert_int_equal(kvs_sha256_file_hex("/tmp", h), KVS_ERR_IO);
    assert_non_null(strstr(kvs_last_error(), "directory"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nist_vectors),
        cmocka_unit_test(test_million_a_fed_in_odd_pieces),
        cmocka_unit_test(test_file_hash_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
