/* gen_cmp_trace.c — writes the GENERATED trace bench/cmp_runs.sh replays to compare two kvsim builds number for
 * number (a speed change must leave the replay's numbers as they were; sim/BENCH.md "Comparing two builds").
 * Random Gaussian q/k/v (tests/util/gen_trace), 2 layers, 8 query heads over 2 KV heads, d 64, 400 positions with
 * a 150-token prompt; fp32, or fp16 with a second argument "f16".
 * Usage: gen_cmp_trace OUT.kvt [f16]
 */
#include <stdio.h>
#include <string.h>

#include "tests/util/gen_trace.h"

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "f16"))) {
        fprintf(stderr, "usage: gen_cmp_trace OUT.kvt [f16]\n");
        return 2;
    }
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 2;
    o.n_heads = 8;
    o.n_kv_heads = 2;
    o.head_dim = 64;
    o.n_positions = 400;
    o.prompt_len = 150;
    o.q_scale = 2.0f;
    if (argc == 3) o.dtype = KVS_DTYPE_F16;
    kvs_gen_trace *g = NULL;
    kvs_status st = kvs_gen_trace_create(&o, &g);
    if (st == KVS_OK) st = kvs_gen_trace_write(g, argv[1]);
    kvs_gen_trace_free(g);
    if (st != KVS_OK) {
        fprintf(stderr, "gen_cmp_trace: %s: %s\n", argv[1], kvs_strerror(st));
        return 1;
    }
    return 0;
}
