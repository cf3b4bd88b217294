/* replay_mem.h — a replay source over arrays already in memory (tests, benchmarks, generated data), in the
 * same layout kvs_gen_trace (tests/util/gen_trace.h) and `kvsim export` use. The engine reads it exactly as
 * it reads a trace file (sim/replay.h kvs_replay_source), block by block.
 */
#ifndef KVS_REPLAY_MEM_H
#define KVS_REPLAY_MEM_H

#include <stdint.h>

#include "replay.h"

/* Borrowed arrays; they must outlive every use of the source. Blocks handed out carry q, k and v only
 * (o and lse are NULL: the engine recomputes full attention itself). */
typedef struct {
    kvs_policy_model model;   /* n_layers, n_heads, n_kv_heads, group, head_dim, scale, kv_bytes, ... */
    const kvs_turn *turns;    /* [n_turns] */
    int64_t n_turns;
    const float *q;           /* [n_layers][n_positions][n_heads][head_dim] */
    const float *k, *v;       /* [n_layers][n_positions][n_kv_heads][head_dim] */
    int32_t block_positions;  /* positions per block handed to the engine, >= 1 */
} kvs_replay_mem;

/*! kvs_replay_source_from_memory() : fills *out reading `m` (borrowed). KVS_ERR_INVALID_ARG for
 *  inconsistent shapes. */
kvs_status kvs_replay_source_from_memory(const kvs_replay_mem *m, kvs_replay_source *out);


/* Turn tables of in-memory sources come from kvs_trace_turns_from_roles() (trace/trace.h), the rule the
 * trace reader applies. */

#endif /* KVS_REPLAY_MEM_H */
