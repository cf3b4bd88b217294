/* replay_fixture.c — see replay_fixture.h (test helper over GENERATED data). */
#include "replay_fixture.h"

#include <math.h>
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

int kvs_test_aggs_differ(const char *where, const kvs_results_agg *a, const kvs_results_agg *b, char *why, size_t cap) {
    for (int k = 0; k < KVS_N_METRICS; k++) {
        const kvs_results_stat *x = &a->m[k], *y = &b->m[k];
        const double xs[6] = {(double)x->n, x->mean, x->p50, x->p95, x->min, x->max};
        const double ys[6] = {(double)y->n, y->mean, y->p50, y->p95, y->min, y->max};
        if (memcmp(xs, ys, sizeof xs)) {
            snprintf(why, cap, "%s, %s: fast mean %.17g max %.17g, reference mean %.17g max %.17g", where,
                     kvs_metric_table[k].name, xs[1], xs[5], ys[1], ys[5]);
            return 1;
        }
    }
    return 0;
}

int kvs_test_runs_differ(const kvs_replay_run_result *x, const kvs_replay_run_result *y, char *why, size_t cap) {
    if (x->status != KVS_OK || y->status != KVS_OK) {
        snprintf(why, cap, "fast %s (%s), reference %s (%s)", kvs_strerror(x->status), x->error,
                 kvs_strerror(y->status), y->error);
        return 1;
    }
    if (x->max_attended != y->max_attended) {
        snprintf(why, cap, "largest attended set: fast %lld, reference %lld", (long long)x->max_attended,
                 (long long)y->max_attended);
        return 1;
    }
    if (x->n_layers != y->n_layers) {
        snprintf(why, cap, "layers: fast %d, reference %d", (int)x->n_layers, (int)y->n_layers);
        return 1;
    }
    char where[32];
    for (int l = 0; l < x->n_layers; l++) {
        snprintf(where, sizeof where, "layer %d", l);
        if (kvs_test_aggs_differ(where, &x->layer_aggs[l], &y->layer_aggs[l], why, cap)) return 1;
    }
    if (kvs_test_aggs_differ("whole run", &x->run_agg, &y->run_agg, why, cap)) return 1;
    if (x->n_steps != y->n_steps) {
        snprintf(why, cap, "series samples: fast %lld, reference %lld", (long long)x->n_steps, (long long)y->n_steps);
        return 1;
    }
    for (int64_t k = 0; k < x->n_steps; k++)
        if (x->steps[k].position != y->steps[k].position || x->steps[k].layer != y->steps[k].layer ||
            memcmp(x->steps[k].v, y->steps[k].v, sizeof x->steps[k].v)) {
            snprintf(why, cap, "series sample %lld (position %lld, layer %d) differs", (long long)k,
                     (long long)x->steps[k].position, (int)x->steps[k].layer);
            return 1;
        }
    return 0;
}

void kvs_test_attend_rows(const float *q, const float *k, const float *v, size_t stride, int64_t first, int64_t last,
                          size_t d, double scale, double *o, double *pr) {
    double m = -INFINITY, z = 0;
    for (int64_t j = first; j <= last; j++) {
        double s = 0;
        for (size_t e = 0; e < d; e++) s += (double)q[e] * k[(size_t)j * stride + e];
        pr[j] = s * scale;
        m = fmax(m, pr[j]);
    }
    for (int64_t j = first; j <= last; j++) z += pr[j] = exp(pr[j] - m);
    for (size_t e = 0; e < d; e++) o[e] = 0;
    for (int64_t j = first; j <= last; j++) {
        pr[j] /= z;
        for (size_t e = 0; e < d; e++) o[e] += pr[j] * v[(size_t)j * stride + e];
    }
}
