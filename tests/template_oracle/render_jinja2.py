#!/usr/bin/env python3
"""The chat template oracle's Jinja side: renders cases.json as transformers' apply_chat_template does.

transformers compiles a chat template in ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension, a tojson filter that is json.dumps(ensure_ascii=False, ...), and the globals raise_exception
and strftime_now; it renders with messages, tools (None when not given), documents (None), add_generation_prompt and
the tokenizer's special tokens. Prints one JSON object per case: {"text": ...} or {"error": ...}.

usage: render_jinja2.py <cases.json>
"""
import json
import sys
from datetime import datetime, timezone

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

with open(sys.argv[1], encoding="utf-8") as f:
    spec = json.load(f)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.fromtimestamp(spec["now"], timezone.utc).strftime(format)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now
compiled = {name: env.from_string(t["source"]) for name, t in spec["templates"].items()}
for case in spec["cases"]:
    t = spec["templates"][case["template"]]
    context = dict(case.get("extra", {}))
    context.update(messages=case["messages"], tools=case.get("tools"), documents=None,
                   add_generation_prompt=case["add_generation_prompt"])
    for key in ["bos_token", "eos_token"]:
        if key in t:
            context[key] = t[key]
    try:
        line = {"text": compiled[case["template"]].render(**context)}
    except Exception as e:  # noqa: BLE001 - any raise counts as "raises"
        line = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(line, ensure_ascii=False))
