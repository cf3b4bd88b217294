#!/usr/bin/env node
// split_corpus.js — the Rust `tokenizers` library's own pre-tokenizer splits of every corpus record for each Split
// pre_tokenizer of tests/fixtures/tokenizer/corpus/split_patterns.json (the real tokenizers' regexes, among them
// the gpt-oss / o200k pattern that no npm package ships, and one synthetic pattern per Split behaviour): the
// reference that tests/test_tokenizer_regex.c holds kvsim's regex engine to. A tokenizer.json with an empty BPE
// model (a one-token vocabulary) and that pre_tokenizer is written to OUTDIR/<name>.tokenizer.json and loaded with
// Tokenizer.fromFile; getPreTokenizer().preTokenizeString gives the pieces. Writes OUTDIR/<name>.rust.pieces: one
// JSON array of the pieces (JSON.stringify) per record, the format of `kvsim tokenize --pieces` on the same file,
// or one line "ERROR <message>" when the library refuses the pattern.
//
//   node tests/npm/split_corpus.js PATTERNS.json CORPUS OUTDIR
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

const path = require('path');
const [patFile, corpusFile, outDir] = process.argv.slice(2);
if (!outDir) { console.error('usage: split_corpus.js PATTERNS.json CORPUS OUTDIR'); process.exit(2); }
fs.mkdirSync(outDir, { recursive: true });
const corpus = fs.readFileSync(corpusFile, 'utf8').split('\n')
  .filter((l) => l.trim() !== '' && !l.trimStart().startsWith('#')).map((l) => JSON.parse(l));
for (const p of JSON.parse(fs.readFileSync(patFile, 'utf8'))) {
  const tj = {
    version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: p.pre_tokenizer, post_processor: null, decoder: null,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, vocab: { a: 0 }, merges: [] },
  };
  const file = path.join(outDir, p.name + '.tokenizer.json');
  fs.writeFileSync(file, JSON.stringify(tj));
  let lines;
  try {
    const pre = Tokenizer.fromFile(file).getPreTokenizer();
    lines = corpus.map((s) => JSON.stringify(pre.preTokenizeString(s).map((x) => x[0])));
  } catch (e) {
    lines = ['ERROR ' + String(e.message || e).replace(/\s+/g, ' ')]; // the library (Oniguruma) refused the pattern
  }
  fs.writeFileSync(path.join(outDir, p.name + '.rust.pieces'), lines.join('\n') + '\n');
}
