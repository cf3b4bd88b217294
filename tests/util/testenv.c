/* testenv.c — see testenv.h (test helper). */
#include "testenv.h"

#include <stdlib.h>
#include <sys/stat.h>

const char *kvs_test_root(void) {
    const char *r = getenv("KVSIM_ROOT");
    return r && r[0] ? r : ".";
}

int kvs_test_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
