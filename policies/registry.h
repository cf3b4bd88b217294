/* registry.h — extern declarations of every policy ops table (one per policies/<name>.c); the registry
 * array itself is in policies/registry.c. See sim/policy.h "How to add a policy".
 */
#ifndef KVS_POLICIES_REGISTRY_H
#define KVS_POLICIES_REGISTRY_H

#include "../sim/policy.h"

extern const struct kvs_policy_ops kvs_policy_full;
extern const struct kvs_policy_ops kvs_policy_window;
extern const struct kvs_policy_ops kvs_policy_streaming;
extern const struct kvs_policy_ops kvs_policy_h2o;
extern const struct kvs_policy_ops kvs_policy_tova;
extern const struct kvs_policy_ops kvs_policy_topk;
/* other engineers: add your `extern const struct kvs_policy_ops kvs_policy_<name>;` lines below */
extern const struct kvs_policy_ops kvs_policy_scissorhands;
extern const struct kvs_policy_ops kvs_policy_snapkv;
extern const struct kvs_policy_ops kvs_policy_pyramidkv;
extern const struct kvs_policy_ops kvs_policy_adakv;
extern const struct kvs_policy_ops kvs_policy_keydiff;
extern const struct kvs_policy_ops kvs_policy_knorm;
extern const struct kvs_policy_ops kvs_policy_morphkv;
extern const struct kvs_policy_ops kvs_policy_keyformer;
extern const struct kvs_policy_ops kvs_policy_d2o;
extern const struct kvs_policy_ops kvs_policy_rocketkv;
extern const struct kvs_policy_ops kvs_policy_rocketkv_mt;
extern const struct kvs_policy_ops kvs_policy_hsa;
extern const struct kvs_policy_ops kvs_policy_quest;
extern const struct kvs_policy_ops kvs_policy_sparq;
extern const struct kvs_policy_ops kvs_policy_synckv;

#endif /* KVS_POLICIES_REGISTRY_H */
