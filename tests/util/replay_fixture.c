/* replay_fixture.c — see replay_fixture.h (test helper over GENERATED data). */
#include "replay_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvs_status kvs_test_replay_fixture_make(const kvs_gen_trace_opts *o, int kv_bytes, int block_positions,
                                        kvs_test_replay_fixture *f) {
    memset(f, 0, sizeof *f);
    kvs_status s = kvs_gen_trace_create(o, &f->g);
    if (s != KVS_OK) return s;
    kvs_model_config mc;
    kvs_capture_config cc;
    kvs_gen_trace_configs(f->g, &mc, &cc);
    s = kvs_trace_turns_from_roles(f->g->roles, f->g->turn, o->n_positions, &f->turns, &f->n_turns, NULL);
    if (s != KVS_OK) {
        kvs_test_replay_fixture_free(f);
        return s;
    }
    f->L = mc.n_layers;
    f->H = mc.n_heads;
    f->Hkv = mc.n_kv_heads;
    f->G = mc.n_heads / mc.n_kv_heads;
    f->d = mc.head_dim;
    f->N = o->n_positions;
    f->scale = mc.attn_scale;
    kvs_policy_model *m = &f->mem.model;
    m->n_layers = f->L;
    m->n_heads = f->H;
    m->n_kv_heads = f->Hkv;
    m->group = f->G;
    m->head_dim = f->d;
    m->scale = f->scale;
    m->kv_bytes = kv_bytes;
    m->aux_bytes = 4;
    m->n_positions = f->N;
    m->prompt_len = f->turns[0].prompt_end;
    m->max_new_tokens = f->N - f->turns[0].prompt_end;
    m->rope_theta = mc.rope_theta;
    m->rope_layout = mc.rope_layout;
    snprintf(m->model_name, sizeof m->model_name, "%s", mc.model_name);
    f->mem.turns = f->turns;
    f->mem.n_turns = f->n_turns;
    f->mem.q = f->g->q;
    f->mem.k = f->g->k;
    f->mem.v = f->g->v;
    f->mem.block_positions = block_positions;
    return KVS_OK;
}

void kvs_test_replay_fixture_free(kvs_test_replay_fixture *f) {
    kvs_gen_trace_free(f->g);
    free(f->turns);
    memset(f, 0, sizeof *f);
}

kvs_gen_trace_opts kvs_test_grouped_opts(int n_turns, int group, int n_pos, int prompt_len, int d, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 2;
    o.n_positions = n_pos;
    o.n_turns = n_turns;
    o.prompt_len = prompt_len;
    o.n_kv_heads = 2;
    o.n_heads = 2 * group;
    o.head_dim = d;
    o.block_positions = 11;
    o.seed = seed;
    o.q_scale = 2.0f;
    return o;
}

void kvs_test_scramble_rows(float *k, float *v, int64_t n, int d, const char *keep, uint64_t *rng) {
    for (int64_t j = 0; j < n; j++)
        if (!keep[j])
            for (int i = 0; i < d; i++) {
                *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
                float x = ((float)(*rng >> 40) / (float)(1u << 24) - 0.5f) * 1000.0f;
                k[(size_t)j * (size_t)d + (size_t)i] = x;
                v[(size_t)j * (size_t)d + (size_t)i] = -x;
            }
}
