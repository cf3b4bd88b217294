#!/usr/bin/env python3
"""make_dicts.py -- regenerates the libFuzzer dictionaries fuzz/dict/{policy_spec,config_json,tokenizer_json,study,
head_clusters,plan_config}.dict
from the sources: the policy names, parameter keys, choices and presets `kvsim policies --json` lists (argv[1]:
the kvsim binary), the config.json keys gpu_capture/model.c reads and the tokenizer.json names
gpu_capture/tokenizer_hf.c compares against. Run from the repository root (fuzz/make_seeds.sh does)."""
import json, re, subprocess, sys

d = json.loads(subprocess.check_output([sys.argv[1] if len(sys.argv) > 1 else './kvsim', 'policies', '--json']))
words = set()
for p in d['policies']:
    words.add(p['name'])
    for q in p['params']:
        words.add(q['key'] + '=')
        for c in q.get('choices', []) or []:
            words.add(c)
    for s in p['presets']:
        words.add('@' + s['name'])
with open('fuzz/dict/policy_spec.dict', 'w') as f:
    f.write('# policy, preset and parameter names of `kvsim policies --json` (fuzz/make_dicts.py regenerates)\n')
    for w in sorted(words) + [':', ',', '=', '@', '1e-3', '0.5', 'inf', 'nan', '-1', '1048576']:
        f.write(json.dumps(w) + '\n')
src = open('gpu_capture/model.c').read()
keys = sorted(set(re.findall(r'cfg_\w+\(cfg, "(\w+)"', src)) | set(re.findall(r'"(\w+_\w+)"', src)))
with open('fuzz/dict/config_json.dict', 'w') as f:
    f.write('# config.json keys and values gpu_capture/model.c reads (fuzz/make_dicts.py regenerates)\n')
    for k in keys:
        f.write(json.dumps('"%s":' % k) + '\n')
    for w in ['"LlamaForCausalLM"', '"MistralForCausalLM"', '"Qwen2ForCausalLM"', '"llama"', '"llama3"', '"silu"',
              'true', 'false', 'null', '[', ']', '{', '}', '1e309', '-0', '4294967296']:
        f.write(json.dumps(w) + '\n')
src = open('gpu_capture/tokenizer_hf.c').read()
with open('fuzz/dict/tokenizer_json.dict', 'w') as f:
    f.write('# tokenizer.json keys and step types gpu_capture/tokenizer_hf.c reads (fuzz/make_dicts.py regenerates)\n')
    for w in sorted(set(re.findall(r'"([A-Za-z_]{3,})"', src))):
        f.write(json.dumps('"%s"' % w) + '\n')
    for w in ['\\u2581', '\\u0120', '<0x0A>', '[', ']', '{', '}', ':', ',']:
        f.write(json.dumps(w) + '\n')
def dict_entry(w):
    """libFuzzer's dictionary syntax: a quoted string, only \\, \" and \\xAB escapes (no \\n)."""
    return '"' + ''.join(c if 32 <= ord(c) < 127 and c not in '\\"' else
                         ('\\' + c if c in '\\"' else '\\x%02X' % ord(c)) for c in w) + '"'
# the study keys results/study.c compares against, with values of each kind
src = open('results/study.c').read()
keys = sorted(set(re.findall(r'"([a-z]+(?:-[a-z]+)*)"', src)) & {
    'name', 'trace', 'policy', 'budgets', 'measure', 'series-every', 'kv-bytes', 'aux-bytes', 'threads',
    'policies-per-task'})
with open('fuzz/dict/study.dict', 'w') as f:
    f.write('# STUDY keys results/study.c reads and values of each kind (fuzz/make_dicts.py regenerates)\n')
    for w in [k + ' ' for k in keys] + ['a.kvt', 'b.kvt', '*.kvt', '[ab]', '?', 'decode', 'prefill', 'all',
                                       'h2o', 'snapkv:window=2', 'window', '50%', '1,2', '\n', '#']:
        f.write(dict_entry(w) + '\n')
# the head clusters file form (common/head_clusters.h)
with open('fuzz/dict/head_clusters.dict', 'w') as f:
    f.write('# head clusters file words (common/head_clusters.h; fuzz/make_dicts.py regenerates)\n')
    for w in ['kvsim-head-clusters 1\n', 'layers ', ' units ', '# layer unit cluster representative\n', '\n',
              ' 0', ' 1', ' -1', ' 4096', ' 4097', ' 2147483648']:
        f.write(dict_entry(w) + '\n')
# the config.json keys the planner reads (analysis/plan.c)
src = open('analysis/plan.c').read()
keys = sorted(set(re.findall(r'cfg_int\(cfg, file, "(\w+)"', src)) |
              {'head_dim', 'tie_word_embeddings', 'model_type', 'ffn_dim', 'intermediate_size'})
with open('fuzz/dict/plan_config.dict', 'w') as f:
    f.write('# config.json keys analysis/plan.c reads (fuzz/make_dicts.py regenerates)\n')
    for k in keys:
        f.write(dict_entry('"%s":' % k) + '\n')
    for w in ['"opt"', '"qwen2"', '"llama"', 'true', 'false', 'null', '16777216', '16777217', '2147483647',
              '4294967296', '-1', '0', '1e309', '{', '}']:
        f.write(dict_entry(w) + '\n')
