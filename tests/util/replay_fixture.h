/* replay_fixture.h — TEST HELPER: a GENERATED trace (tests/util/gen_trace.h, seeded Gaussian q/k/v, never a
 * model's) exposed as an in-memory replay source (sim/replay_mem.h), for the tests of sim/ and policies/.
 */
#ifndef KVS_TEST_REPLAY_FIXTURE_H
#define KVS_TEST_REPLAY_FIXTURE_H

#include <stdint.h>

#include "../../sim/replay.h"
#include "../../sim/replay_mem.h"
#include "gen_trace.h"

typedef struct {
    kvs_gen_trace *g;     /* owned */
    kvs_replay_mem mem;   /* borrows g's arrays and turns */
    kvs_turn *turns;      /* owned, [n_turns] */
    int64_t n_turns;
    int L, H, Hkv, G, d;  /* layers, query heads, KV heads, group, head_dim */
    int64_t N;            /* positions */
    float scale;          /* softmax scale */
} kvs_test_replay_fixture;

/*! kvs_test_replay_fixture_make() : generates the data of `o` and describes it to the engine with `kv_bytes`
 *  bytes per stored K/V element, 4-byte auxiliary elements, `block_positions` positions per block and
 *  max_new_tokens = the generated positions after the first prompt. Free with kvs_test_replay_fixture_free. */
kvs_status kvs_test_replay_fixture_make(const kvs_gen_trace_opts *o, int kv_bytes, int block_positions,
                                        kvs_test_replay_fixture *f);
void kvs_test_replay_fixture_free(kvs_test_replay_fixture *f);

/*! kvs_test_grouped_opts() : the data the seed-method tests share: 2 layers, 2 KV heads with `group` query heads
 *  each, n_pos positions in n_turns turns (n_turns > 1 splits them evenly, half prompt and half generated per
 *  turn; prompt_len sets a single turn's prompt, -1 = half), head_dim d, blocks of 11 positions, q scaled by 2
 *  (sharper attention, so the policies' choices depend on the scores), the given seed. */
kvs_gen_trace_opts kvs_test_grouped_opts(int n_turns, int group, int n_pos, int prompt_len, int d, uint64_t seed);

/*! kvs_test_scramble_rows() : the leak check's overwrite (from an on_step_end hook): every K/V row j < n with
 *  keep[j] == 0 becomes noise from the LCG state *rng (k = x, v = -x, |x| <= 500), so a policy that reads a row it
 *  does not hold makes different choices. k and v are [n][d]. */
void kvs_test_scramble_rows(float *k, float *v, int64_t n, int d, const char *keep, uint64_t *rng);

/*! kvs_test_attend_rows() : attention in double of query q [d] over rows first..last of k and v (row j at
 *  j * stride floats), scaled by `scale`: the output into o [d], the probabilities into pr[first..last] (a window's
 *  reference, written plainly). */
void kvs_test_attend_rows(const float *q, const float *k, const float *v, size_t stride, int64_t first, int64_t last,
                          size_t d, double scale, double *o, double *pr);

/*! kvs_test_aggs_differ() : 0 when two statistic sets (every metric's n, mean, p50, p95, min, max) are the same bit
 *  for bit; else 1 with `where` and the first metric that differs written to why (cap bytes). */
int kvs_test_aggs_differ(const char *where, const kvs_results_agg *a, const kvs_results_agg *b, char *why, size_t cap);

/*! kvs_test_runs_differ() : 0 when the fast engine's run x and the reference engine's run y (sim/replay_ref.h) are
 *  the same bit for bit — both KVS_OK, the largest attended set, every statistic (n, mean, p50, p95, min, max) of
 *  every metric of every layer and of the whole run, every series sample (position and values); else 1 with the
 *  first difference written to why (cap bytes). */
int kvs_test_runs_differ(const kvs_replay_run_result *x, const kvs_replay_run_result *y, char *why, size_t cap);

#endif /* KVS_TEST_REPLAY_FIXTURE_H */
