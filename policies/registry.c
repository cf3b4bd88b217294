/* registry.c — the one table of replay policies and the lookups by index and name (registry.h). The table is
 * built from KVS_POLICY_REGISTRY, so a policy is registered by its one line there.
 */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#define KVS_POLICY_ENTRY_(name) &kvs_policy_##name,
static const struct kvs_policy_ops *const registry[] = {KVS_POLICY_REGISTRY(KVS_POLICY_ENTRY_)};
#undef KVS_POLICY_ENTRY_

int kvs_policy_count(void) { return (int)(sizeof registry / sizeof registry[0]); }

const struct kvs_policy_ops *kvs_policy_at(int i) {
    if (i < 0 || i >= kvs_policy_count()) return NULL;
    return registry[i];
}

const struct kvs_policy_ops *kvs_policy_find(const char *name) {
    for (int i = 0; i < kvs_policy_count(); i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    return NULL;
}

kvs_status kvs_policy_parse(const char *spec, kvs_policy_config *cfg) {
    size_t nlen = strcspn(spec, "@:");
    char name[KVS_POLICY_NAME_MAX];
    if (nlen == 0) return kvs_fail(KVS_ERR_INVALID_ARG, "policy spec '%s': missing policy name", spec);
    if (nlen >= sizeof name) return kvs_fail(KVS_ERR_INVALID_ARG, "policy spec '%s': unknown policy", spec);
    memcpy(name, spec, nlen);
    name[nlen] = 0;
    const struct kvs_policy_ops *ops = kvs_policy_find(name);
    if (!ops) return kvs_fail(KVS_ERR_INVALID_ARG, "unknown policy '%s' (see 'kvsim policies')", name);
    return kvs_policy_parse_spec(ops, spec, cfg);
}

void kvs_policy_print_help(void *f) {
    for (int i = 0; i < kvs_policy_count(); i++) kvs_policy_print_ops_help(registry[i], f);
}
