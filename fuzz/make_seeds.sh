#!/bin/sh
# make_seeds.sh — regenerates the seed corpora of fuzz/corpus/ from the repository and ../shared/models (run from
# the repository root after `make`; KVSIM_BIN names the kvsim binary, default ./kvsim). Every seed is a small real
# file: traces captured by kvsim from the real stories260K model, the tokenizers of the test fixtures and the
# shared models, a tiny llama2.c checkpoint and a tiny safetensors model written by fuzz/make_tiny_models.py, a
# results database of a real replay, and the option strings the README documents.
set -eu
K=${KVSIM_BIN:-./kvsim}
M=../shared/models
C=fuzz/corpus
mkdir -p $C/trace $C/model_llama2c $C/safetensors $C/config_json $C/tokenizer_json $C/tokenizer_bin \
         $C/tokenizer_encode $C/policy_spec $C/budgets $C/turns $C/results_db $C/study $C/head_clusters \
         $C/plan_config $C/plan_options $C/merge
# traces: fp16 / bf16 / fp32, several blocks, a partial last block, a multi-turn capture, and a killed capture's
# .partial (the complete trace less its footer and last chunk)
"$K" capture --model $M/stories260K.bin --prompt-ids 1,403,407 --steps 5 --block 3 --dtype fp16 --threads 1 \
    --out $C/trace/fp16_block3.kvt >/dev/null
"$K" capture --model $M/stories260K.bin --prompt-ids 1,403 --steps 2 --block 4 --dtype bf16 --threads 1 \
    --out $C/trace/bf16_one_block.kvt >/dev/null
"$K" capture --model $M/stories260K.bin --prompt-ids 1,403 --steps 1 --block 1 --dtype fp32 --threads 1 \
    --out $C/trace/fp32_block1.kvt >/dev/null
# a lean record (o and lse recomputed by the reader)
"$K" capture --model $M/stories260K.bin --prompt-ids 1,403,407 --steps 5 --block 3 --dtype bf16 --record qkv \
    --threads 1 --out $C/trace/lean_bf16_block3.kvt >/dev/null
printf 'Once\nupon\n' >/tmp/kvs_seed_turns.txt
"$K" capture --model $M/stories260K.bin --turns /tmp/kvs_seed_turns.txt --steps 2 --ignore-eos --block 2 \
    --threads 1 --out $C/trace/multiturn.kvt >/dev/null
rm -f /tmp/kvs_seed_turns.txt
python3 - "$C/trace/fp16_block3.kvt" "$C/trace/killed_partial.kvt" <<'PY'
import struct, sys
d = open(sys.argv[1], 'rb').read()
foff = struct.unpack_from('<Q', d, len(d) - 32)[0]
open(sys.argv[2], 'wb').write(d[:foff - 20])  # the footer never written, the last chunk torn
PY
python3 fuzz/make_tiny_models.py $C/model_llama2c/tiny.bin fuzz/fixed
# and traces of the tiny checkpoint (1 layer, 2 heads of 4 dims): about 2 KB each, so the trace harness
# runs many times faster on them than on the stories260K captures
"$K" capture --model $C/model_llama2c/tiny.bin --prompt-ids 1,2,3 --steps 5 --block 3 --dtype fp16 --threads 1 \
    --out $C/trace/tiny_fp16_block3.kvt >/dev/null
"$K" capture --model $C/model_llama2c/tiny.bin --prompt-ids 1,2 --steps 1 --block 1 --dtype fp32 --threads 1 \
    --out $C/trace/tiny_fp32_block1.kvt >/dev/null
"$K" capture --model $C/model_llama2c/tiny.bin --prompt-ids 1,2,3 --steps 5 --block 3 --dtype fp16 --record qkv \
    --threads 1 --out $C/trace/tiny_lean_fp16_block3.kvt >/dev/null
# sliding-window layers: the header's layer-window table (trace/FORMAT.md "Layer windows"), tiny Gemma-3 fixture
"$K" capture --model tests/fixtures/gemma3_tiny --prompt-ids 17,42,5 --steps 5 --ignore-eos --block 4 --dtype fp16 \
    --threads 1 --out $C/trace/tiny_gemma3_windows.kvt >/dev/null
cp fuzz/fixed/model.safetensors $C/safetensors/tiny.safetensors
cp fuzz/fixed/config.json $C/config_json/tiny.json
cp tests/fixtures/llama3_tiny/config.json $C/config_json/llama3_rope_scaling.json
cp $M/tinystories-656K/config.json $C/config_json/tinystories.json
cp tests/fixtures/tokenizer/bytelevel_llama3/tokenizer.json $C/tokenizer_json/bytelevel_llama3.json
cp tests/fixtures/tokenizer/bytelevel_qwen2/tokenizer.json $C/tokenizer_json/bytelevel_qwen2.json
cp $M/tinystories-656K/tokenizer.json $C/tokenizer_json/tinystories.json
cp $M/tok512.bin $C/tokenizer_bin/tok512.bin
cp examples/prompt.txt $C/tokenizer_encode/prompt.txt
printf 'caf\303\251 \342\226\201na\303\257ve \360\237\230\200 <|eot_id|> 1234 \r\n\t x' >$C/tokenizer_encode/unicode.txt
printf '\377\376 invalid \300\200 utf-8 \355\240\200' >$C/tokenizer_encode/invalid_utf8.txt
cp examples/turns.txt $C/turns/turns.txt
printf 'first\\nline\r\n\n\nsecond' >$C/turns/escapes.txt
printf 'h2o' >$C/policy_spec/h2o.txt
printf 'snapkv:window=8,kernel=5' >$C/policy_spec/snapkv.txt
printf 'morphkv@longwriter' >$C/policy_spec/morphkv_preset.txt
printf 'rocketkv@paper:token_budget_ratio=0.5' >$C/policy_spec/rocketkv.txt
printf 'keyformer:tau_init=1,tau_end=2' >$C/policy_spec/keyformer.txt
printf '16,32,64' >$C/budgets/tokens.txt
printf '10%%,20%%,100%%' >$C/budgets/percent.txt
printf '1,50%%,8' >$C/budgets/mixed.txt
rm -f $C/results_db/window.db
"$K" replay examples/stories260K.kvt --db $C/results_db/window.db --policy window --budgets 8 --threads 1 \
    >/dev/null 2>&1
# study files: fuzz_study writes them beside a.kvt and b.kvt (copies of the two tiny traces)
printf 'name s\ntrace a.kvt\npolicy h2o\npolicy snapkv:window=2\nbudgets 2,50%%\n' >$C/study/basic.study
printf '# every key\nname all\ntrace *.kvt\ntrace b.kvt\npolicy window\npolicy tova\npolicy streaming@paper\nbudgets 1,2\nmeasure all\nseries-every 2\nkv-bytes 2\naux-bytes 4\nthreads 1\npolicies-per-task 2\n' >$C/study/all_keys.study
printf 'trace [ab].kvt\npolicy quest:page=2\n\n  budgets   1   \n' >$C/study/glob.study
# results databases of every table family, from the tiny traces (small files: the harnesses run faster on them)
T=$C/trace/tiny_fp16_block3.kvt
tmp=$(mktemp -d)
"$K" heads $T --db $tmp/heads.db --k 2 --clusters 1 --clusters-out $C/head_clusters/tiny.txt >/dev/null
"$K" heads examples/stories260K.kvt --db $tmp/heads_big.db --k 4 --clusters 2 \
    --clusters-out $C/head_clusters/stories260K.txt >/dev/null
printf 'kvsim-head-clusters 1\n# hand-written: blank lines, comments\nlayers 2 units 3\n\n0 0 0 1\n0 1 1 1\n0 2 0 0\n1 0 0 1\n1 1 0 0\n1 2 0 0\n' \
    >$C/head_clusters/handwritten.txt
"$K" drift $T --db $C/results_db/drift.db --k 2 --prefill-score last >/dev/null
cp $tmp/heads.db $C/results_db/heads.db
"$K" plan --model Llama-3.1-8B --gpu-mem 80GB --db $C/results_db/plan.db >/dev/null
"$K" generate --model $C/model_llama2c/tiny.bin --trace $T --policy window --budgets 2 \
    --db $C/results_db/closed.db >/dev/null 2>&1
"$K" replay $T --db $C/results_db/series.db --policy h2o --budgets 2 --series-every 1 --threads 1 >/dev/null 2>&1
# every family in one database: replay runs (so that `report` renders), then drift, heads, plan, generate
A=$C/results_db/all_families.db
rm -f $A
"$K" replay $T --db $A --policy window --policy h2o --budgets 2,3 --series-every 1 --threads 1 >/dev/null 2>&1
"$K" drift $T --db $A --k 2 --prefill-score last >/dev/null
"$K" heads $T --db $A --k 2 --clusters 1 >/dev/null
"$K" plan --trace $T --gpu-mem 1GB --db $A >/dev/null
"$K" generate --model $C/model_llama2c/tiny.bin --trace $T --policy window --budgets 2 --db $A >/dev/null 2>&1
# shards of `kvsim sweep` for the merge harness (merged into a copy of results_db/window.db)
cp $C/trace/tiny_fp16_block3.kvt $tmp/a.kvt
printf 'trace a.kvt\npolicy window\npolicy h2o\nbudgets 2\n' >$tmp/s.study
"$K" sweep $tmp/s.study --db $C/merge/shard_task0.db --task 0 >/dev/null 2>&1
"$K" sweep $tmp/s.study --db $C/merge/shard_all.db >/dev/null 2>&1
cp $C/results_db/window.db $C/merge/same_as_out.db
cp $C/results_db/series.db $C/merge/replay.db
cp $C/results_db/all_families.db $C/merge/all_families.db
rm -rf $tmp
cp fuzz/fixed/config.json $C/plan_config/tiny.json
cp tests/fixtures/llama3_tiny/config.json $C/plan_config/llama3.json
cp tests/fixtures/qwen2_tiny/config.json $C/plan_config/qwen2.json
cp $M/tinystories-656K/config.json $C/plan_config/tinystories.json
printf '{"model_type":"opt","num_hidden_layers":2,"num_attention_heads":4,"hidden_size":64,"ffn_dim":256,"vocab_size":100,"max_position_embeddings":2048}' \
    >$C/plan_config/opt.json
printf '\000Llama-3.1-8B' >$C/plan_options/preset.txt
printf '\001fp16' >$C/plan_options/dtype.txt
printf '\0020,1024,2048' >$C/plan_options/responses.txt
printf '\003256+1024,512+2048' >$C/plan_options/settings.txt
python3 fuzz/make_dicts.py "$K"
echo "seeds written under $C, dictionaries under fuzz/dict"
