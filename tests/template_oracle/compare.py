#!/usr/bin/env python3
"""Compares the three renderings of the chat template oracle byte for byte (test_template_oracle.sh).

usage: compare.py <cases.json> <ours.jsonl> <jinja2.jsonl> <hf_jinja.jsonl>

Jinja2 (rendering as transformers does) is the reference. A case is equal when both texts are the same bytes, or when
both renderers raised (the template refused the conversation). Where @huggingface/jinja disagrees with Jinja2 the case
is listed as that package's own difference and ours is compared against Jinja2 alone there. Exit 1 on any difference
between ours and Jinja2, printing the first with both texts.
"""
import json
import sys
from collections import Counter

cases = json.load(open(sys.argv[1], encoding="utf-8"))["cases"]
ours, jinja2, hf = ([json.loads(line) for line in open(p, encoding="utf-8")] for p in sys.argv[2:5])
for name, rows in [("rotary", ours), ("jinja2", jinja2), ("@huggingface/jinja", hf)]:
    if len(rows) != len(cases):
        print(f"FAIL: {name} rendered {len(rows)} cases of {len(cases)}")
        sys.exit(1)


def same(a, b):
    return ("error" in a and "error" in b) or ("text" in a and "text" in b and a["text"] == b["text"])


per_template, raised, hf_differs, differences = Counter(), Counter(), Counter(), []
for k, case in enumerate(cases):
    name = case["template"]
    per_template[name] += 1
    raised[name] += "error" in jinja2[k]
    if not same(hf[k], jinja2[k]):
        hf_differs[name] += 1
        if hf_differs[name] == 1:
            print(f"note: @huggingface/jinja differs from Jinja2 on case {k} ({name}); ours is compared with Jinja2 there")
            print(f"  jinja2:             {json.dumps(jinja2[k], ensure_ascii=False)[:400]}")
            print(f"  @huggingface/jinja: {json.dumps(hf[k], ensure_ascii=False)[:400]}")
    if not same(ours[k], jinja2[k]):
        differences.append(k)
for name in per_template:
    print(f"{name}: {per_template[name]} cases ({raised[name]} raise in Jinja2), "
          f"{sum(1 for k in differences if cases[k]['template'] == name)} differences from Jinja2, "
          f"@huggingface/jinja differs from Jinja2 on {hf_differs[name]}")
print(f"total: {len(cases)} cases, {len(differences)} differences")
if differences:
    k = differences[0]
    print(f"FAIL: first difference: case {k} ({cases[k]['template']}): {json.dumps(cases[k], ensure_ascii=False)[:1500]}")
    print(f"  ours:   {json.dumps(ours[k], ensure_ascii=False)}")
    print(f"  jinja2: {json.dumps(jinja2[k], ensure_ascii=False)}")
    sys.exit(1)
