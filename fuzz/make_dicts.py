#!/usr/bin/env python3
"""make_dicts.py -- regenerates the libFuzzer dictionaries fuzz/dict/{policy_spec,config_json,tokenizer_json}.dict
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
