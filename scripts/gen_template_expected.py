#!/usr/bin/env python3
"""Expected chat-template renders for tests/test_template.c, from Python jinja2 set up
exactly as transformers sets it up (transformers/utils/chat_template_utils.py:
_compile_jinja_template / render_jinja_template):

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    filters["tojson"] = json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)
    globals["raise_exception"] raises TemplateError(message); globals["strftime_now"]
    template.render(messages=..., tools=..., documents=..., add_generation_prompt=...,
                    **special_tokens, **extra_kwargs)

The real templates live in tests/templates/*.jinja (copied from
../shared/data/tokenizers/chat_templates/ and the chat_template fields of
../shared/data/tokenizers/*/tokenizer_config.json). Writes tests/templates/expected.json:
a list of {"name", "template" | "template_file", "context", and "output" or "error"}
where context is the render variables as JSON text and error is {"type", "message", "line"}; the C test checks outputs byte for byte and,
for raise_exception, the message.

Run from the repository root:  python3 scripts/gen_template_expected.py
"""
import copy
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TDIR = os.path.join(ROOT, "tests", "templates")


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag: the body renders as is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    import datetime
    return datetime.datetime.now().strftime(fmt)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[AssistantTracker, jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = strftime_now


def render(src, ctx):
    try:
        return {"output": ENV.from_string(src).render(**copy.deepcopy(ctx))}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": {"type": "TemplateSyntaxError", "message": e.message, "line": e.lineno}}
    except jinja2.exceptions.TemplateError as e:
        return {"error": {"type": type(e).__name__, "message": str(e) if e.message is not None else ""}}
    except Exception as e:
        return {"error": {"type": type(e).__name__, "message": str(e)}}


# ---- conversations for the real templates ----
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather \u2014 in \u00b0C or \u00b0F",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
        "days": {"type": "integer", "description": "Number of days", "nullable": True},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags"},
        "opts": {"type": "object", "description": "Options",
                 "properties": {"verbose": {"type": "boolean", "description": "Verbose"}}, "required": ["verbose"]}},
        "required": ["location"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "Query"}},
                   "required": ["query"]},
    "response": {"type": "object", "description": "Results"}}}
TOOLS = [WEATHER, SEARCH]

UNI = "H\u00e9llo \"w\u00f6rld\" it's\n\u65e5\u672c\u8a9e \U0001F642\tend  "
ARGS = {"location": "Paris", "days": 3, "ratio": 0.5, "flags": [True, None], "nested": {"a": 1.0, "b": "x\"y"}}

CONVS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why is the sky blue?"}],
    "multi_turn": [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why?"}],
    "unicode": [{"role": "system", "content": "  " + UNI}, {"role": "user", "content": UNI},
                {"role": "assistant", "content": UNI}, {"role": "user", "content": "\u00bfY t\u00fa? \u2019quoted\u2019"}],
    "tool_calls": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21.5 \u00b0C and clear."},
        {"role": "user", "content": "Thanks"}],
    "tool_calls_pending": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}},
            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"}],
    "reasoning": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Simple arithmetic: 2+2=4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n6"}],
    "think_inline_last": [
        {"role": "user", "content": "Hi /no_think"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\nHello there"}],
    "content_parts": [
        {"role": "system", "content": [{"type": "text", "text": "Parts system."}]},
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"}, {"type": "text", "text": " what?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "text", "text": "Sure?"}]}],
    "bad_alternation": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "system_only": [{"role": "system", "content": "Only a system prompt /think"}],
    "empty": [],
}

SPECIAL = {  # bos/eos as each model's tokenizer_config.json has them (absent when null)
    "HuggingFaceTB-SmolLM3-3B": {"bos_token": None, "eos_token": "<|im_end|>"},
    "Qwen-Qwen3-0.6B": {"eos_token": "<|im_end|>"},
    "Qwen3.5-4B": {"eos_token": "<|im_end|>"},
    "google-gemma-2-2b-it": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "google-gemma-4-31B-it": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "meta-llama-Llama-3.1-8B-Instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "meta-llama-Llama-3.2-3B-Instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "microsoft-Phi-3.5-mini-instruct": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "tokenizer_config-gemma3": {"bos_token": "<bos>", "eos_token": "<end_of_turn>"},
    "tokenizer_config-llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
}

EXTRAS = [  # (suffix, extra kwargs, use tools, conversations it applies to)
    ("", {}, False, None),
    ("_tools", {}, True, ("system_user", "tool_calls", "tool_calls_pending")),
    ("_think_on", {"enable_thinking": True}, False, ("system_user", "reasoning", "think_inline_last")),
    ("_think_off", {"enable_thinking": False}, False, ("system_user", "reasoning", "think_inline_last", "unicode")),
    ("_tools_think_off", {"enable_thinking": False}, True, ("tool_calls",)),
]


def real_template_cases():
    cases = []
    for fname in sorted(os.listdir(TDIR)):
        if not fname.endswith(".jinja"):
            continue
        model = fname[:-len(".jinja")]
        src = open(os.path.join(TDIR, fname), encoding="utf-8").read()
        special = {k: v for k, v in SPECIAL.get(model, {}).items() if v is not None}
        if "Llama-3.2" in model:  # its default date comes from strftime_now(): pin it
            special["date_string"] = "26 Jul 2024"
        for conv_name, conv in CONVS.items():
            for suffix, extra, use_tools, only in EXTRAS:
                for agp in (False, True):
                    if only is not None and (conv_name not in only or not agp):
                        continue
                    ctx = {"messages": conv, "tools": TOOLS if use_tools else None, "documents": None,
                           "add_generation_prompt": agp}
                    ctx.update(special)
                    ctx.update(extra)
                    case = {"name": "%s/%s%s%s" % (model, conv_name, suffix, "_gen" if agp else ""),
                            "template_file": fname, "context": ctx}
                    case.update(render(src, ctx))
                    cases.append(case)
        if "Llama-3.1" in model:
            for name, extra in (("builtin_tools", {"builtin_tools": ["code_interpreter", "brave_search"]}),
                                ("date_string", {"date_string": "01 Jan 2025"}),
                                ("tools_in_system", {"tools_in_user_message": False})):
                conv = copy.deepcopy(CONVS["tool_calls"])
                if name == "builtin_tools":
                    conv[2]["tool_calls"][0]["function"] = {"name": "brave_search", "arguments": {"query": "weather \"Paris\""}}
                ctx = {"messages": conv, "tools": TOOLS, "documents": None, "add_generation_prompt": True}
                ctx.update(special)
                ctx.update(extra)
                case = {"name": "%s/%s" % (model, name), "template_file": fname, "context": ctx}
                case.update(render(src, ctx))
                cases.append(case)
    return cases


# ---- small templates: every construct, filter and test ----
UNIT = [
    ("text", "hello world", {}),
    ("var", "{{ a }} {{ b }} {{ c }} {{ d }} {{ e }} {{ f }}", {"a": 1, "b": "x", "c": None, "d": True, "e": 1.5, "f": [1, "a", None, {"k": False}]}),
    ("float_repr", "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e16 }} {{ 123456789012345.0 }} {{ 1.5e-7 }} {{ 100.0 }} {{ -0.0 }} {{ 2.5e300 * 1e10 }} {{ x }}", {"x": 3.14159}),
    ("tuple_repr", "{{ (1, 2) }}{{ () }}{{ (1,) }}{{ 1, 2 }}{{ ('a', [1.0]) }}", {}),
    ("str_repr", "{{ ['it\\'s', \"q\\\"\", 'n\\nl', 't\\tb', 'b\\\\s', '\\x01', '\\u00e9\\u00a0'] }}", {}),
    ("dict_repr", "{{ {'a': 1, 'b': {'c': [True, None]}} }} {{ d }}", {"d": {"z": 1, "a": "\u00e9"}}),
    ("string_escapes", "{{ 'a\\tb\\nc\\\\d\\'e\\\"f\\x41\\u00e9\\U0001F642\\101\\q' }}", {}),
    ("adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("comment", "a{# c #}b{#- d -#}  c", {}),
    ("ws_minus", "a  {{- 'b' -}}  c\n  {%- if true -%}  d  {%- endif -%}  e", {}),
    ("trim_lstrip", "<ul>\n  {% for x in xs %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n", {"xs": [1, 2]}),
    ("lstrip_plus", "x\n    {%+ if true %}y{% endif %}\n  {{ 'v' }}\n  {# c #}\nz", {}),
    ("trim_plus", "{% if true +%}\nkept{% endif %}\n", {}),
    ("trailing_newline", "a\n\n", {}),
    ("crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", {}),
    ("raw", "{% raw %}{{ not }}{% if %}{% endraw %}!", {}),
    ("raw_ws", "a\n  {%- raw -%}  x  {%- endraw -%}  \nb", {}),
    ("if_elif_else", "{% for v in [0, 1, 2, 3] %}{% if v == 0 %}zero{% elif v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o', 'e') }}|{% endfor %}", {}),
    ("for_filter_else", "{% for x in xs if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% else %}none{% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}", {"xs": [1, 2, 3]}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"x": 1, "y": [2]}}),
    ("for_break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.depth }}{{ a * b }} {% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("loop_scope", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("loop_changed", "{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", {}),
    ("set_namespace", "{% set ns = namespace(total=0, names=[]) %}{% for x in [1, 2, 3] %}{% set ns.total = ns.total + x %}{% endfor %}{{ ns.total }} {{ ns.names }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{% set (c, d) = [3, 4] %}{{ a }}{{ b }}{{ c }}{{ d }}", {}),
    ("set_block", "{% set x %}  inner {{ 1 + 1 }}\n{% endset %}[{{ x }}]{% set y | upper | trim %} abc {% endset %}[{{ y }}]", {}),
    ("set_shadow_ctx", "{{ m }}{% set m = m[1:] %}{{ m }}", {"m": [1, 2, 3]}),
    ("macro", "{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet('Cy', punct='?') }} {{ greet(name='Di', greeting='Yo') }}", {}),
    ("macro_varargs_kwargs", "{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }} {{ m(1, 3, 4, z=5) }}", {}),
    ("macro_recursive", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}", {}),
    ("macro_late_binding", "{% macro m() %}{{ x }}{{ other() }}{% endmacro %}{% macro other() %}O{% endmacro %}{% set x = 1 %}{{ m() }}", {}),
    ("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}][{{ b }}]{{ b is defined }}{% endmacro %}{{ m(1) }}", {}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 }}{% endcall %}", {}),
    ("call_block_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x, loop.index) }}{% endfor %}{% endmacro %}{% call(item, i) each(['a', 'b']) %}{{ i }}{{ item }};{% endcall %}", {}),
    ("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}{% filter replace('a', 'b') | title %}aaa ccc{% endfilter %}", {}),
    ("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    ("generation", "A{% generation %}gen {{ 1 }}{% endgeneration %}B", {}),
    ("attr_item", "{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ l[0] }} {{ l[-1] }} {{ l.1 }} {{ s[1] }} {{ d.missing }}|{{ d.get('a') }} {{ d.get('zz', 'def') }} {{ d.get('zz') }}", {"d": {"a": 1, "b": {"c": 2}}, "l": [5, 6, 7], "s": "h\u00e9llo"}),
    ("dict_key_vs_method", "{{ d['items'] }} {{ d.keys() | list }} {{ d.values() | list }}", {"d": {"items": 1, "x": 2}}),
    ("slicing", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[1:4:2] }} {{ l[10:] }} {{ s[::-1] }} {{ s[1:3] }} {{ l[-100:2] }} {{ l[5:1:-2] }}", {"l": [0, 1, 2, 3, 4, 5], "s": "h\u00e9llo"}),
    ("arith", "{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ true + 1 }}", {}),
    ("concat_ops", "{{ 'a' ~ 1 ~ none ~ true ~ u }} {{ 'ab' + 'cd' }} {{ [1] + [2] }} {{ 'x' * 3 }} {{ [0] * 2 }} {{ 3 * 'y' }}", {}),
    ("compare", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 2] == [1, 2] }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] < [1, 3] }} {{ none == none }}", {}),
    ("logic", "{{ true and 'x' }} {{ 0 and 'x' }} {{ '' or 'y' }} {{ 'a' or 'b' }} {{ not true }} {{ not 0 }} {{ not (1 and 0) }} {{ [] or {} or 'z' }}", {}),
    ("in_ops", "{{ 'a' in 'abc' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'z' not in 'abc' }} {{ 'x' in u }} {{ '' in 'abc' }}", {}),
    ("condexpr", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}] {{ 1 if none else 2 if true else 3 }}", {}),
    ("literals", "{{ [1, 'a', [2]] }} {{ {'a': 1, 2: 'b'} }} {{ (1, 'x') }} {{ 0x1F }} {{ 1_000 }} {{ 0o17 }} {{ 0b101 }} {{ 1.5e3 }} {{ True }} {{ None }}", {}),
    ("undefined_behaviour", "[{{ u }}] {{ u is defined }} {{ u is undefined }} {{ u | length }} [{{ u | trim }}] {{ u == u }} {{ u is none }} {{ u | default('d') }} {{ u is sequence }} {{ u is iterable }} {{ u is mapping }} [{% for x in u %}x{% endfor %}] {{ n.foo is defined }} {{ d.x is defined }} {{ u | list }} [{{ u | join(',') }}] {{ u | string }}|", {"n": None, "d": {}}),
    ("tests", "{{ 's' is string }} {{ 1 is string }} {{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 's' is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ {} is sequence }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ 1 is float }} {{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ none is none }}", {}),
    ("tests2", "{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} {{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 1 is le 1 }} {{ 1 is ge 2 }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 'Ab' is lower }} {{ 'a' is in 'abc' }} {{ 2 is in [1, 2] }} {{ range is callable }} {{ 1 is callable }} {{ 1 is not none }} {{ x is sameas none }} {{ 'upper' is filter }} {{ 'nope' is test }}", {"x": None}),
    ("filters_text", "{{ '  hi  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'Hello' | upper }} {{ 'Hello' | lower }} {{ 'hello WORLD-foo(bar [baz <q' | title }} {{ 'hELLO wORLD' | capitalize }} {{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | center(7) }}| {{ 'ab' | center(6) }}| {{ '<a href=\"x\">&</a>' | e }} {{ '<b>' | escape }} {{ '<b>' | safe }} {{ 'a b  c\\nd' | wordcount }} {{ '<p>Hi <b>there</b></p>  &amp; x' | striptags }}", {}),
    ("filters_indent", "[{{ 'a\\nb\\n\\nc' | indent }}] [{{ 'a\\nb' | indent(2, true) }}] [{{ 'a\\n\\nb\\n' | indent(2, false, true) }}] [{{ 'x\\ny' | indent('> ') }}] [{{ '' | indent(first=true) }}]", {}),
    ("filters_seq", "{{ [3, 1, 2] | length }} {{ 'h\u00e9' | length }} {{ {'a': 1} | count }} {{ [1, 2] | first }} {{ [1, 2] | last }} {{ 'abc' | first }} {{ 'abc' | last }} {{ [1, 2, 3] | join('-') }} {{ ['a', 'b'] | join }} {{ [{'n': 'x'}, {'n': 'y'}] | join(', ', attribute='n') }} {{ 'abc' | list }} {{ {'a': 1} | list }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} {{ [1, 2, 3] | sum }} {{ [{'v': 1.5}, {'v': 2}] | sum(attribute='v') }} {{ [1, 2] | sum(start=10) }} {{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A', 'c'] | max }} {{ ['b', 'A', 'c'] | min(case_sensitive=true) }}", {}),
    ("filters_sort", "{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'a', 'C'] | sort }} {{ ['b', 'A', 'a', 'C'] | sort(case_sensitive=true) }} {{ users | sort(attribute='age') | map(attribute='name') | join(',') }} {{ ['b', 'A', 'a', 'B'] | unique | list }} {{ ['b', 'A', 'a'] | unique(case_sensitive=true) | list }} {{ {'b': 1, 'A': 2, 'c': 0} | dictsort }} {{ {'b': 1, 'A': 2, 'c': 0} | dictsort(by='value', reverse=true) }} {{ {'b': 1, 'a': 2} | items | list }}", {"users": [{"name": "x", "age": 30}, {"name": "y", "age": 20}, {"name": "z", "age": 30}]}),
    ("filters_map_select", "{{ ['a', 'b'] | map('upper') | list }} {{ us | map(attribute='n') | list }} {{ us | map(attribute='q', default='-') | list }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ [1, 2, 3] | select('gt', 1) | list }} {{ ['x', 'y'] | reject('equalto', 'x') | list }} {{ us | selectattr('ok') | map(attribute='n') | list }} {{ us | rejectattr('ok') | map(attribute='n') | list }} {{ us | selectattr('n', 'equalto', 'b') | list }} {{ [1, 0, '', 'a'] | select | list }} {{ ['a', 'b'] | map('replace', 'a', 'z') | list }} {{ us | map(attribute='sub.k') | list }}", {"us": [{"n": "a", "ok": True, "sub": {"k": 1}}, {"n": "b", "ok": False, "sub": {"k": 2}}]}),
    ("filters_num", "{{ '42' | int }} {{ '3.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '0x1F' | int(0, 16) }} {{ true | int }} {{ '2.5' | float }} {{ 'x' | float }} {{ 3 | float }} {{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 3 | round }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }} {{ '1_000' | int }}", {}),
    ("filters_default", "{{ u | default('x') }} {{ u | d('y') }} {{ '' | default('z') }} {{ '' | default('z', true) }} {{ none | default('n') }} {{ none | default('n', boolean=true) }} {{ 0 | d(5, true) }} [{{ u | default }}]", {}),
    ("filters_misc", "{{ 1 | string }} {{ [1, 'a'] | string }} {{ none | string }} {{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 0) | list }} {{ '%s-%d %.2f %%' | format('a', 3, 1.2345) }} {{ 'v=%r' | format('q') }} {{ {'a': 1} | attr('a') }} {{ 'x' | attr('upper') is callable }}", {}),
    ("tojson", "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ d | tojson(indent=0) }}\n{{ d | tojson(sort_keys=true) }}\n{{ d | tojson(separators=(',', ':')) }}\n{{ d | tojson(indent='\\t') }}\n{{ d | tojson(ensure_ascii=true) }}\n{{ [] | tojson(indent=2) }} {{ {} | tojson(indent=2) }} {{ 'x\"\\\\\\n\\u0001\u00e9' | tojson }} {{ 1.0 | tojson }} {{ none | tojson }} {{ (1, 2) | tojson }} {{ {1: 2, true: 3} | tojson }}", {"d": {"b": [1, 2.5, True, None, "s\u00e9 \U0001F642"], "a": {"x": {}, "y": []}, "c": 1e-7}}),
    ("str_methods", "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a b c'.split(none, 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  x  '.strip() }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'xyhixy'.strip('yx') }} {{ 'aXa'.replace('a', 'b') }} {{ 'hi'.upper() }} {{ 'HI'.lower() }} {{ 'hello wORLD 2nd'.title() }} {{ 'hELLO'.capitalize() }} {{ 'h\u00e9llo'.find('l') }} {{ 'abc'.find('z') }} {{ 'banana'.count('an') }} {{ '-'.join(['a', 'b']) }} {{ '{} and {x}'.format(1, x=2) }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ '  '.isspace() }} {{ 'ab'.islower() }} {{ 'x'.ljust(3) }}| {{ 'x'.rjust(3) }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'banana'.rfind('a') }} {{ 'banana'.index('n') }}", {}),
    ("unicode_case", "{{ '\u00e9t\u00e9 \u00c7A' | upper }} {{ '\u00c9T\u00c9' | lower }} {{ '\u00e9cole' | capitalize }} {{ '\u00e9cole normale' | title }}", {}),
    ("globals", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }} {% set n = namespace(d) %}{{ n.k }}", {"d": {"k": "v"}}),
    ("strftime", "{{ strftime_now('%d %b %Y') is string }}", {}),
    ("raise", "a{{ raise_exception('Custom failure: \"x\" \u00e9') }}b", {}),
    ("raise_in_macro", "{% macro m() %}{{ raise_exception('from macro') }}{% endmacro %}{{ m() }}", {}),
    ("whitespace_mix", "{%- for m in msgs -%}\n  {{- m.role }}: {{ m.content | trim }}\n{% endfor -%}\n{%- if add %}\n  <end>\n{%- endif %}", {"msgs": [{"role": "u", "content": " a "}, {"role": "b", "content": "c\n"}], "add": True}),
    ("lstrip_comment_line", "a\n  {# comment #}\n  {% set x = 1 %}\n  {{ x }}\nb", {}),
    ("var_no_lstrip", "a\n    {{ 'x' }}\n    {%- if true %} y{% endif %}", {}),
    ("immutable_sandbox", "{% set l = [1] %}{{ l.append }}|{{ l }}", {}),
    ("probe_ws_block_end_newline", "{% for x in [1,2] -%}\n  {{ x }}\n{%- endfor %}\n\n{% if true %}  \n  a\n{% endif %}", {}),
    ("probe_lstrip_tabs", "x\n\t \t{% if true %}\n\ty\n\t{% endif %}\n", {}),
    ("probe_lstrip_after_var", "{{ 'a' }}   {% if true %}b{% endif %}", {}),
    ("probe_comment_trim", "a\n{# c #}\nb\n  {#- d #}\nc", {}),
    ("probe_minus_plus_mix", "a  \n {%- if true +%}\n b \n {%+ endif -%} \n c", {}),
    ("probe_nested_ns", "{% set ns = namespace(items=[]) %}{% for m in ms %}{% set ns.items = ns.items + [m.role] %}{% endfor %}{{ ns.items | join('|') }}", {"ms": [{"role": "a"}, {"role": "b"}]}),
    ("probe_dict_items_order", "{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %} {% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", {"d": {"b": 2, "a": 1, "C": 3}}),
    ("probe_getattr_chain_none", "{{ x.y.z is defined }} [{{ x.y }}] {{ (x.q or 'dflt') }}", {"x": {"y": None}}),
    ("probe_str_index_oob", "[{{ 'ab'[5] }}] {{ 'ab'[-1] }}", {}),
    ("probe_list_index_oob", "[{{ l[9] }}] {{ l[9] is defined }}", {"l": [1]}),
    ("probe_float_int_ops", "{{ 10 / 4 }} {{ 10 // 4.0 }} {{ 2 ** 62 }} {{ 0.1 * 3 }} {{ 1e300 * 10 }} {{ 5 % 2.5 }} {{ -1 // 3 }} {{ 1 - 0.9 }}", {}),
    ("probe_round_trip_repr", "{{ 1/3 }} {{ 2/3 }} {{ 1e21 }} {{ 1e15 + 0.5 }} {{ 9007199254740993.0 }} {{ 0.0001 }} {{ 0.00001 }} {{ 123e-20 }}", {}),
    ("probe_bool_arith", "{{ true + true }} {{ false * 3 }} {{ [1, 2][true] }} {{ true is number }} {{ 1 == true }} {{ {true: 'x'}[1] }}", {}),
    ("probe_in_dict_list", "{{ 'role' in m }} {{ 'x' in m }} {{ 'tool_calls' in m }} {{ m is mapping }}", {"m": {"role": "u", "tool_calls": None}}),
    ("probe_tojson_nested_indent", "{{ x | tojson(indent=4) }}", {"x": [{"a": [1, {"b": None}], "c": "\u00e9\u2028"}, [], {}, "s"]}),
    ("probe_string_method_on_none", "{{ (n or '').strip() }}|{{ n is string }}", {"n": None}),
    ("probe_loop_in_macro", "{% macro r(items) %}{% for i in items %}{{ loop.index }}{{ i }}{% if not loop.last %},{% endif %}{% endfor %}{% endmacro %}{{ r(['a', 'b', 'c']) }}", {}),
    ("probe_caller_in_loop", "{% macro list(xs) %}{% for x in xs %}<{{ caller(x) }}>{% endfor %}{% endmacro %}{% call(v) list([1, 2]) %}{{ v * 10 }}{% endcall %}", {}),
    ("probe_set_in_if_top", "{% if true %}{% set z = 5 %}{% endif %}{{ z }}", {}),
    ("probe_macro_sees_loop_var", "{% macro m() %}{{ x }}{% endmacro %}{% for x in [1, 2] %}{{ m() }}{% endfor %}", {"x": 0}),
    ("probe_filter_chain_args", "{{ ' A,b ,C ' | trim | lower | replace(' ', '') | list | reject('equalto', ',') | join }}", {}),
    ("probe_map_int_sum", "{{ ['1', '2', 'x'] | map('int') | sum }} {{ [1.5, 2] | map('round') | list }} {{ ['a'] | map('default', 'z') | list }}", {}),
    ("probe_length_unicode", "{{ '\U0001F642\u00e9a' | length }} {{ '\U0001F642\u00e9a'[0] }} {{ '\U0001F642\u00e9a'[1:] }} {{ '\u00e9' | center(5) }}|", {}),
    ("probe_concat_list_tuple", "{{ (1, 2) + (3,) }} {{ [1] + [] }}", {}),
    ("probe_conditional_filters", "{{ x | tojson if x is mapping else x | string }} {{ y | tojson if y is mapping else y | string }}", {"x": {"a": 1}, "y": 2.0}),
    ("probe_ws_in_expr", "{{\n  a\n  +\n  b\n}}|{%\n if a\n%}y{%\nendif\n%}", {"a": 1, "b": 2}),
    ("probe_attr_number", "{{ d.0 }} {{ l.0 }}", {"d": {"0": "s"}, "l": ["first"]}),
    ("probe_none_output", "{{ none }}{{ x }}{{ [none] }}", {"x": None}),
    ("probe_string_compare_unicode", "{{ '\u00e9' > 'z' }} {{ ['b', '\u00e9', 'a'] | sort }} {{ ['B', 'a'] | sort }}", {}),
    ("probe_escape_nonstr", "{{ 1 | e }} {{ none | e }} {{ [1, '<'] | e }}", {}),
    ("probe_items_on_ns", "{% set ns = namespace(a=1) %}{{ ns.a }} {{ ns.b is defined }}", {}),
    ("probe_recursive_macro_dict", "{% macro show(v) %}{% if v is mapping %}{{ '{' }}{% for k, x in v | dictsort %}{{ k }}={{ show(x) }}{% if not loop.last %},{% endif %}{% endfor %}{{ '}' }}{% elif v is sequence and v is not string %}[{% for x in v %}{{ show(x) }}{% endfor %}]{% else %}{{ v }}{% endif %}{% endmacro %}{{ show(d) }}", {"d": {"b": [1, {"c": True}], "a": "s"}}),
    ("markup_concat", "{{ ('<a>' | safe) + '<b>' }} {{ ('<a>' | safe) ~ '<b>' }}", {}),
]

MALFORMED = [
    ("unclosed_if", "line1\n{% if x %}\nbody\n"),
    ("unclosed_for", "{% for x in y %}\n{{ x }}"),
    ("mismatched_end", "{% if x %}\n{% for a in b %}\n{% endif %}\n{% endfor %}"),
    ("stray_endfor", "a\n\n{% endfor %}"),
    ("stray_else", "{% else %}"),
    ("unknown_tag", "\n\n{% frobnicate %}"),
    ("unknown_filter", "a\n{{ x | nosuchfilter }}"),
    ("unknown_test", "{% if x is nosuchtest %}{% endif %}"),
    ("unterminated_var", "a {{ x"),
    ("unterminated_block", "{% if x"),
    ("unterminated_comment", "a\n{# never closed"),
    ("unterminated_string", "{{ 'abc }}"),
    ("bad_expression", "{{ 1 + }}"),
    ("bad_paren", "{{ (1 + 2 }}"),
    ("extra_paren", "{{ 1 + 2) }}"),
    ("empty_var", "{{ }}"),
    ("bad_char", "{{ a $ b }}"),
    ("do_not_enabled", "{% do x.append(1) %}"),
    ("chained_is", "{{ a is defined is defined }}"),
    ("endmacro_missing", "{% macro m() %}x"),
    ("set_no_value", "{% set %}"),
    ("for_no_in", "{% for x y %}{% endfor %}"),
    ("break_outside_loop", "{% break %}"),
    ("continue_in_macro_in_loop", "{% for x in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}"),
    ("runtime_undefined_attr", "ok\n{{ u.attr }}"),
    ("runtime_undefined_add", "{{ u + 1 }}"),
    ("runtime_type_error", "{{ 'a' + 1 }}"),
    ("runtime_div_zero", "\n{{ 1 / 0 }}"),
    ("runtime_compare", "{{ 'a' < 1 }}"),
    ("runtime_call_noncallable", "{{ 'x'() }}"),
    ("runtime_unsafe_append", "{% set l = [] %}{{ l.append(1) }}"),
    ("runtime_range_too_big", "{{ range(1000000) | length }}"),
    ("runtime_ns_assign", "{% set d = {} %}{% set d.x = 1 %}"),
    ("runtime_unpack", "{% for a, b in [1, 2] %}{% endfor %}"),
    ("runtime_tojson_undefined", "{{ u | tojson }}"),
    ("runtime_iterate_int", "{% for x in 5 %}{% endfor %}"),
    ("runtime_macro_recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
]


def cli_cases():
    """Inputs and expected stdout for tests/cli_template.sh (gerbil template over the
    tokenizer folders in ../shared/data/tokenizers)."""
    tok = os.path.join(ROOT, "..", "shared", "data", "tokenizers")
    if not os.path.isdir(tok):
        print("note: %s absent, CLI expectations not regenerated" % tok, file=sys.stderr)
        return
    msgs = CONVS["tool_calls"]
    with open(os.path.join(TDIR, "cli_messages.json"), "w", encoding="utf-8") as f:
        json.dump(msgs, f, ensure_ascii=False)
    with open(os.path.join(TDIR, "cli_tools.json"), "w", encoding="utf-8") as f:
        json.dump(TOOLS, f, ensure_ascii=False)
    with open(os.path.join(TDIR, "cli_bad_messages.json"), "w", encoding="utf-8") as f:
        json.dump(CONVS["bad_alternation"], f)

    def cfg_of(model):
        cfg = json.load(open(os.path.join(tok, model, "tokenizer_config.json"), encoding="utf-8"))
        sp = {}
        for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
            v = cfg.get(k)
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str):
                sp[k] = v
        return cfg["chat_template"], sp

    runs = [  # (output file, model, template override, tools, add_generation_prompt, extra vars)
        ("cli_qwen3.txt", "qwen3", None, True, True, {"enable_thinking": False}),
        ("cli_gemma3.txt", "gemma3", None, False, False, {}),
        ("cli_llama31.txt", "llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja", True, True, {"date_string": "26 Jul 2024"}),
        # Gemma 4's template over the Gemma 3 tokenizer folder (no Gemma 4 tokenizer.json is stored here)
        ("cli_gemma4.txt", "gemma3", "google-gemma-4-31B-it.jinja", True, True, {}),
    ]
    for out, model, override, tools, agp, extra in runs:
        src, sp = cfg_of(model)
        if override:
            src = open(os.path.join(TDIR, override), encoding="utf-8").read()
        m = CONVS["user"] if out == "cli_gemma3.txt" else msgs
        ctx = {"messages": m, "tools": TOOLS if tools else None, "documents": None, "add_generation_prompt": agp}
        ctx.update(sp)
        ctx.update(extra)
        r = render(src, ctx)
        with open(os.path.join(TDIR, out), "w", encoding="utf-8", newline="") as f:
            f.write(r["output"])


def main():
    cli_cases()
    cases = real_template_cases()
    for name, src, ctx in UNIT:
        case = {"name": "unit/" + name, "template": src, "context": ctx}
        case.update(render(src, ctx))
        cases.append(case)
    for name, src in MALFORMED:
        case = {"name": "malformed/" + name, "template": src, "context": {"x": [1], "y": [1], "b": [1]}}
        case.update(render(src, case["context"]))
        if "error" not in case:
            print("warning: malformed case %s rendered fine" % name, file=sys.stderr)
        cases.append(case)
    out = os.path.join(TDIR, "expected.json")
    for c in cases:  # the context as JSON text, so floats like 1.0 stay floats for the C side
        c["context"] = json.dumps(c["context"], ensure_ascii=False)
    with open(out, "w", encoding="utf-8") as f:  # one case per line
        f.write('{"jinja2_version": %s, "cases": [\n' % json.dumps(jinja2.__version__))
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")
    n_err = sum(1 for c in cases if "error" in c)
    print("wrote %s: %d cases (%d expect an error)" % (out, len(cases), n_err))


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    main()
