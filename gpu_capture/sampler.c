/* sampler.c — greedy / temperature / top-p sampling (see sampler.h). Top-p follows llama2.c run.c
 * `sample_topp`: sort by probability, keep the smallest prefix whose mass exceeds p, sample within it.
 * Random numbers: PCG32 (O'Neill 2014, PCG-XSH-RR with the reference multiplier and increment).
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

struct kvs_sampler {
    int vocab;
    float temperature, top_p;
    uint64_t rng;
    float *probs;    /* [vocab] */
    struct cand { float p; int32_t id; } *order; /* [vocab] nucleus candidates */
};

uint32_t kvs_pcg32_next(uint64_t *st) {
    uint64_t old = *st;
    *st = old * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

/* Uniform in [0, 1) with 24 random bits (exactly representable as float). */
static float uniform01(uint64_t *st) { return (float)(kvs_pcg32_next(st) >> 8) / 16777216.0f; }

kvs_status kvs_sampler_create(int vocab_size, float temperature, float top_p, uint64_t seed, kvs_sampler **out) {
    *out = NULL;
    if (vocab_size < 1) return kvs_fail(KVS_ERR_INVALID_ARG, "sampler: vocab_size %d < 1", vocab_size);
    if (!(temperature >= 0) || !isfinite(temperature))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--temperature: %g must be >= 0", temperature);
    if (!(top_p > 0 && top_p <= 1)) return kvs_fail(KVS_ERR_INVALID_ARG, "--top-p: %g must be in (0, 1]", top_p);
    kvs_sampler *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "sampler: out of memory");
    s->vocab = vocab_size;
    s->temperature = temperature;
    s->top_p = top_p;
    /* PCG seeding: state = 0, step, add seed, step (pcg32_srandom_r with the default stream) */
    s->rng = 0;
    kvs_pcg32_next(&s->rng);
    s->rng += seed;
    kvs_pcg32_next(&s->rng);
    s->probs = malloc((size_t)vocab_size * sizeof *s->probs);
    s->order = malloc((size_t)vocab_size * sizeof *s->order);
    if (!s->probs || !s->order) {
        kvs_sampler_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "sampler: out of memory");
    }
    *out = s;
    return KVS_OK;
}

void kvs_sampler_free(kvs_sampler *s) {
    if (!s) return;
    free(s->probs);
    free(s->order);
    free(s);
}

/* Descending probability, lower id first on ties, so the order never depends on qsort's algorithm. */
static int by_prob_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

int32_t kvs_sampler_sample(kvs_sampler *s, const float *logits) {
    int n = s->vocab;
    if (s->temperature == 0) {
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    float mx = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->probs[i] = expf((logits[i] - mx) / s->temperature);
        sum += s->probs[i];
    }
    for (int i = 0; i < n; i++) s->probs[i] = (float)(s->probs[i] / sum);
    float r = uniform01(&s->rng);
    if (s->top_p >= 1.0f) {
        double cdf = 0;
        for (int i = 0; i < n; i++) {
            cdf += s->probs[i];
            if (r < cdf) return i;
        }
        return n - 1; /* rounding */
    }
    /* candidates below (1 - p) / (n - 1) can never be in the nucleus (run.c's cutoff) */
    float cutoff = (1.0f - s->top_p) / (float)(n > 1 ? n - 1 : 1);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (s->probs[i] >= cutoff) s->order[m++] = (struct cand){s->probs[i], i};
    if (m == 0) { /* tiny p over a flat distribution: fall back to the most probable token */
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (s->probs[i] > s->probs[best]) best = i;
        return best;
    }
    qsort(s->order, (size_t)m, sizeof *s->order, by_prob_desc);
    double cum = 0;
    int last = m - 1;
    for (int i = 0; i < m; i++) {
        cum += s->order[i].p;
        if (cum > s->top_p) {
            last = i;
            break;
        }
    }
    double target = r * cum, cdf = 0;
    for (int i = 0; i <= last; i++) {
        cdf += s->order[i].p;
        if (target < cdf) return s->order[i].id;
    }
    return s->order[last].id;
}
