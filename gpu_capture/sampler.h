/* sampler.h — next-token selection for `kvsim capture`: greedy (the default, used by the golden tests),
 * or temperature sampling with optional nucleus (top-p) truncation, as llama2.c run.c `sample` does,
 * driven by an explicitly seeded PCG32 generator (no rand(), no hidden global state: a seed always
 * gives the same tokens).
 */
#ifndef KVS_SAMPLER_H
#define KVS_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"

typedef struct kvs_sampler kvs_sampler;

/*! kvs_sampler_create() : temperature 0 = greedy (argmax, lowest id on ties); top_p in (0, 1] (1 = no
 *  truncation). Caller frees with kvs_sampler_free. KVS_ERR_INVALID_ARG for temperature < 0 or
 *  top_p outside (0, 1]. */
kvs_status kvs_sampler_create(int vocab_size, float temperature, float top_p, uint64_t seed, kvs_sampler **out);
void kvs_sampler_free(kvs_sampler *s);

/*! kvs_sampler_sample() : picks the next token from logits[vocab_size] (not modified). */
int32_t kvs_sampler_sample(kvs_sampler *s, const float *logits);

/*! kvs_pcg32_next() : PCG-XSH-RR 32-bit output of the generator state *st (advanced). */
uint32_t kvs_pcg32_next(uint64_t *st);

#endif /* KVS_SAMPLER_H */
