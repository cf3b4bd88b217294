/* registry.h — the one table of replay policies and the lookups above the engine: by index, by name, and the
 * parsing of a "NAME[@PRESET][:key=value,...]" spec (sim/policy.h kvs_policy_parse_spec does the parameters once
 * the name has found the ops table). The engine (sim/) never calls these: its callers resolve policies here and
 * hand it ops tables. STYLE.md rule 5: one static const registry array, as zstd's strategy table.
 *
 * To add a policy: one line X(<name>) below, for the ops table kvs_policy_<name> that policies/<name>.c exports
 * (see sim/policy.h "How to add a policy"). Listing order is the order of `kvsim policies`.
 */
#ifndef KVS_POLICIES_REGISTRY_H
#define KVS_POLICIES_REGISTRY_H

#include "../sim/policy.h"

#define KVS_POLICY_REGISTRY(X)                                                                                     \
    X(full)                                                                                                       \
    X(window)                                                                                                     \
    X(streaming)                                                                                                  \
    X(h2o)                                                                                                        \
    X(tova)                                                                                                       \
    X(topk)                                                                                                       \
    X(scissorhands)                                                                                               \
    X(snapkv)                                                                                                     \
    X(pyramidkv)                                                                                                  \
    X(adakv)                                                                                                      \
    X(keydiff)                                                                                                    \
    X(knorm)                                                                                                      \
    X(morphkv)                                                                                                    \
    X(keyformer)                                                                                                  \
    X(d2o)                                                                                                        \
    X(rocketkv)                                                                                                   \
    X(rocketkv_mt)                                                                                                \
    X(hsa)                                                                                                        \
    X(quest)                                                                                                      \
    X(sparq)                                                                                                      \
    X(synckv)                                                                                                     \
    X(cake)                                                                                                       \
    X(simlayerkv)                                                                                                 \
    X(duo)                                                                                                        \
    X(duo_heuristic)                                                                                              \
    X(qfilters)                                                                                                   \
    X(ea)                                                                                                         \
    X(ea_decode)                                                                                                  \
    X(shadowkv)                                                                                                   \
    X(chunkkv)                                                                                                    \
    X(lagkv)                                                                                                      \
    X(cur)                                                                                                        \
    X(rkv)

#define KVS_POLICY_EXTERN_(name) extern const struct kvs_policy_ops kvs_policy_##name;
KVS_POLICY_REGISTRY(KVS_POLICY_EXTERN_)
#undef KVS_POLICY_EXTERN_

/*! kvs_policy_count() / kvs_policy_at() : the registry, in listing order (NULL outside [0, count)). */
int kvs_policy_count(void);
const struct kvs_policy_ops *kvs_policy_at(int i);

/*! kvs_policy_find() : registry lookup by name; NULL if unknown. */
const struct kvs_policy_ops *kvs_policy_find(const char *name);

/*! kvs_policy_parse() : parses "NAME", "NAME:key=value,key=value", "NAME@PRESET" or "NAME@PRESET:key=value,..." of a
 *  registered policy into *cfg (kvs_policy_parse_spec's rules). KVS_ERR_INVALID_ARG (detail names the policy,
 *  preset, key or value) for an unknown policy or preset, unknown or repeated key, malformed or out-of-range value. */
kvs_status kvs_policy_parse(const char *spec, kvs_policy_config *cfg);

/*! kvs_policy_print_help() : writes every registered policy, its summary, presets and parameter table to f (a
 *  FILE *, void * to keep stdio out of this header). */
void kvs_policy_print_help(void *f);

#endif /* KVS_POLICIES_REGISTRY_H */
