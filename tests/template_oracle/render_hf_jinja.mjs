// The chat template oracle's @huggingface/jinja side (the pinned npm package): renders cases.json with the same
// context as render_jinja2.py; prints one JSON object per case: {"text": ...} or {"error": ...}.
//
// usage: node render_hf_jinja.mjs <cases.json>
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const spec = JSON.parse(readFileSync(process.argv[2], "utf8"));
// @huggingface/jinja has strftime_now built in (and refuses a context that redefines it); it formats `new Date()`:
// the clock is fixed at the cases' time, and the test runs node with TZ=UTC as the other renderers format UTC.
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) { super(...(args.length ? args : [spec.now * 1000])); }
  static now() { return spec.now * 1000; }
};
const compiled = {};
for (const [name, t] of Object.entries(spec.templates)) {
  try {
    compiled[name] = new Template(t.source);
  } catch (e) {
    compiled[name] = e;
  }
}
const lines = [];
for (const c of spec.cases) {
  const t = spec.templates[c.template];
  const context = { ...(c.extra ?? {}), messages: c.messages, tools: c.tools ?? null, documents: null,
                    add_generation_prompt: c.add_generation_prompt };
  for (const key of ["bos_token", "eos_token"]) if (key in t) context[key] = t[key];
  try {
    if (compiled[c.template] instanceof Error) throw compiled[c.template];
    lines.push(JSON.stringify({ text: compiled[c.template].render(context) }));
  } catch (e) {
    lines.push(JSON.stringify({ error: String(e && e.message ? e.message : e) }));
  }
}
process.stdout.write(lines.join("\n") + "\n");
