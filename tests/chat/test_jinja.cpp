// tests/chat/test_jinja.cpp: the Jinja interpreter's semantics (as Jinja2 under transformers' settings renders them)
// and its refusals, each naming the construct and the template line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "rotary/error.h"
#include "rotary_chat/chat_template.h"
#include "rotary_chat/jinja.h"

namespace rotary::chat {
namespace {

using J = nlohmann::ordered_json;

std::string render(const std::string& src, const J& ctx = J::object(), RenderOptions opt = {}) {
  return Template(src).render(ctx, opt);
}

void expect_error(const std::string& src, const std::string& text, const J& ctx = J::object(),
                  RenderOptions opt = {}) {
  try {
    render(src, ctx, opt);
    ADD_FAILURE() << "no error for " << src;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(Jinja, PrintsPythonValues) {
  EXPECT_EQ(render("{{ 1.0 }} {{ 2 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ none }} {{ true }} {{ x }}"),
            "1.0 2 1e+20 0.30000000000000004 None True ");
  EXPECT_EQ(render("{{ [1, 'a', none] }} {{ {'k': 'v'} }}"), "[1, 'a', None] {'k': 'v'}");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 'a' ~ 1 }}"),
            "3 -4 2 3.5 1024 a1");
  EXPECT_EQ(render(R"({{ "a\nb\t\"" }})"), "a\nb\t\"");
}

TEST(Jinja, UndefinedNoneAndTruth) {
  EXPECT_EQ(render("{{ x is defined }}{{ n is none }}{{ n is defined }}{{ x|length }}", {{"n", nullptr}}),
            "FalseTrueTrue0");
  EXPECT_EQ(render("{% if '' or [] or 0 %}y{% else %}n{% endif %}{{ m.missing is defined }}", {{"m", J::object()}}),
            "nFalse");
  expect_error("{{ x.y }}", "line 1");
}

TEST(Jinja, WhitespaceAsTransformers) {
  // trim_blocks and lstrip_blocks, '-' and '+'.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("x\n{# note #}\ny\n"), "x\ny");
  EXPECT_EQ(render("  {%+ if true %}z{% endif %}"), "  z");
}

TEST(Jinja, LoopsAndScopes) {
  const J ctx = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }}{{ loop.revindex }};{% endfor %}", ctx),
            "10TrueFalse33;21FalseFalse32;32FalseTrue31;");
  EXPECT_EQ(render("{% for x in xs if x != 'b' %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}", ctx), "a2c2");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"), "a=1,b=2,");
  EXPECT_EQ(render("{% set y = 1 %}{% for x in xs %}{% set y = 2 %}{% endfor %}{{ y }}", ctx), "1");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
                   ctx), "3");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}", ctx), "a");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{{ x }}{% endfor %}", ctx), "ac");
  EXPECT_EQ(render("{% set b %}in {{ 1 }}{% endset %}[{{ b }}]"), "[in 1]");
}

TEST(Jinja, ExpressionsAndSlices) {
  EXPECT_EQ(render("{{ 'hello'[::-1] }} {{ [1,2,3][1:] }} {{ 'héllo'[1] }} {{ 'x' if 1 > 2 else 'y' }}"),
            "olleh [2, 3] é y");
  EXPECT_EQ(render("{{ 'a' in 'cat' }}{{ 2 not in [1] }}{{ 1 == 1.0 }}{{ 1 < 2 < 3 }}{{ not 0 }}"),
            "TrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 0 or 'd' }} {{ 1 and 'e' }}"), "d e");
}

TEST(Jinja, FiltersTestsMethods) {
  EXPECT_EQ(render("{{ '  x  '|trim }}|{{ 'ab'|upper }}|{{ 'hello world'|title }}|{{ 'aB'|capitalize }}"),
            "x|AB|Hello World|Ab");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1.0, 'ü', none]}|tojson }}"), R"({"b": 1, "a": [1.0, "ü", null]})");
  EXPECT_EQ(render("{{ {'a': [1]}|tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ x|default('d') }}{{ ''|d('e', true) }}{{ [1,2]|join('-') }}{{ [3,4]|first }}{{ [3,4]|last }}"),
            "de1-234");
  const J ms = {{"ms", {{{"role", "user"}}, {{"role", "bot"}}, {{"role", "user"}}}}};
  EXPECT_EQ(render("{{ ms|selectattr('role', 'equalto', 'user')|list|length }}"
                   "{{ ms|map(attribute='role')|unique|join(',') }}{{ ms|rejectattr('role', 'eq', 'user')|list|length }}",
                   ms), "2user,bot1");
  EXPECT_EQ(render("{{ 'a\nb'|indent(2) }}|{{ '3'|int + 1 }}|{{ 2.5|round }}|{{ -3|abs }}|{{ '<'|e }}"),
            "a\n  b|4|2.0|3|&lt;");
  EXPECT_EQ(render("{{ 'a,b'.split(',') }}{{ 'xhix'.strip('x') }}{{ 'ab'.startswith('a') }}{{ {'k': 1}.get('z', 2) }}"),
            "['a', 'b']hiTrue2");
  EXPECT_EQ(render("{{ 3 is odd }}{{ 'a' is string }}{{ 1 is number }}{{ {} is mapping }}{{ 1 is integer }}"
                   "{{ [] is iterable }}{{ 'a' is in 'abc' }}"),
            "TrueTrueTrueTrueTrueTrueTrue");
}

TEST(Jinja, MacrosAndGlobals) {
  EXPECT_EQ(render("{% macro f(a, b='x') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(2, b='y') }}"), "[1x][2y]");
  RenderOptions opt;
  opt.now = 1721995200;
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}", J::object(), opt), "26 Jul 2024");
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% endfor %}"), "012");
  expect_error("\n{{ raise_exception('bad turn') }}", "line 2: the template raised an exception: bad turn");
}

TEST(Jinja, RefusalsNameConstructAndLine) {
  expect_error("a\n{% include 'x' %}", "line 2 = statement \"include\"");
  expect_error("{{ x|wordwrap }}", "line 1 = filter \"wordwrap\"");
  expect_error("\n\n{{ x is prime }}", "line 3 = test \"prime\"");
  expect_error("{{ x.frobnicate() }}", "method \"frobnicate\"");
  expect_error("{{ [].append(1) }}", "method \"append\"");
  expect_error("{{ lipsum() }}", "function \"lipsum\"");
  expect_error("{{ 1 @ 2 }}", "operator or character \"@\"");
  expect_error("{% for x in y %}", "without its {% endfor %}");
  expect_error("{{ 1 + 'a' }}", "line 1 = operator + on integer and string");
  expect_error("{{ 5() }}", "call of a integer");
  expect_error("\n{{ (5)[0] }}{{ x.y }}", "line 2");
  expect_error("{{ 1 // 0 }}", "by zero");
  expect_error("{{ " + std::string(250, '(') + "1" + std::string(250, ')') + " }}", "nesting deeper than 200");
}

TEST(Jinja, LimitsNameTheLimit) {
  RenderOptions opt;
  opt.limits.max_loop_iterations = 100;
  expect_error("{% for i in range(10) %}{% for j in range(20) %}{% endfor %}{% endfor %}", "max_loop_iterations",
               J::object(), opt);
  expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "max_call_depth");
  opt.limits.max_output_bytes = 1000;
  expect_error("{% for i in range(50) %}{{ 'x' * 30 }}{% endfor %}", "max_output_bytes", J::object(), opt);
  expect_error("{{ 'x' * 100000 }}", "max_output_bytes", J::object(), opt);
}

class ChatDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("rotary_chat_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::filesystem::path dir_;
};

TEST_F(ChatDir, TemplateFromConfigAndTokens) {
  write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ eos_token }}"},
                                   {"name": "tool_use", "template": "T{{ tools|length }}"}],
                                   "bos_token": {"content": "<s>"}, "eos_token": "</s>"})");
  ChatRequest req;
  req.messages = J::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(render_chat(load_chat_template(dir_.string()), req), "<s>user:hi;</s>");
  req.tools = J::parse(R"([{"type": "function"}])");
  EXPECT_EQ(render_chat(load_chat_template(dir_.string(), "", "", true), req), "T1");
  try {
    load_chat_template(dir_.string(), "", "nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("default, tool_use"), std::string::npos) << e.what();
  }
  write("chat_template.jinja", "J{{ messages|length }}");
  EXPECT_EQ(render_chat(load_chat_template(dir_.string()), req), "J1");
}

TEST_F(ChatDir, MissingTemplateAndBadMessages) {
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  try {
    load_chat_template(dir_.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--template FILE"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_messages(J::object()), Error);
  auto bad = [](const char* json, const char* field) {
    try {
      check_messages(J::parse(json));
      ADD_FAILURE() << json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  bad(R"([{"role": "user", "content": "a"}, 3])", "messages[1]");
  bad(R"([{"role": "user"}, {"content": "a"}])", "messages[1].role");
  bad(R"([{"role": 5}])", "messages[0].role");
  bad(R"([{"role": "user", "content": 5}])", "messages[0].content");
  check_messages(J::parse(R"([{"role": "user", "content": null}, {"role": "user", "content": [{"type": "text"}]}])"));
}

}  // namespace
}  // namespace rotary::chat
