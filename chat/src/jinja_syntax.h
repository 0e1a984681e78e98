// chat/src/jinja_syntax.h: tokens, the syntax tree and the interpreter's state (internal to rotary_chat).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "jinja_value.h"
#include "rotary/error.h"
#include "rotary_chat/jinja.h"

namespace rotary::chat::detail {

enum class TokenKind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
struct Token {
  TokenKind kind;
  std::string text;
  int line = 1;
  int64_t integer = 0;
  double real = 0;
};
std::vector<Token> lex_template(std::string_view source, const std::string& origin);
void append_code_point(std::string& out, uint32_t cp);

struct Expr {
  int line = 0;
  virtual ~Expr() = default;
  virtual Value eval(Interpreter& in) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;
struct NamedExpr {
  std::string name;
  ExprPtr value;
};
struct ArgList {
  std::vector<ExprPtr> positional;
  std::vector<NamedExpr> named;
};

struct Stmt {
  int line = 0;
  virtual ~Stmt() = default;
  virtual void exec(Interpreter& in) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Program {
  std::string origin;
  Body body;
};
std::unique_ptr<Program> parse_program(std::string_view source, std::string origin);

using Frame = std::unordered_map<std::string, Value>;

struct Interpreter {
  const Program& program;
  const RenderOptions& options;
  std::vector<std::shared_ptr<Frame>> frames;  // [0]: globals and the context, [1]: the template's own sets
  std::string out;
  int64_t iterations = 0;
  int call_depth = 0;
  enum class Flow { Normal, Break, Continue } flow = Flow::Normal;

  [[noreturn]] void error(int line, const std::string& what, const std::string& allowed) const {
    fail(program.origin + " line " + std::to_string(line), what, allowed);
  }
  Value lookup(const std::string& name) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
      auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    return Value::undefined(name);
  }
  void assign(const std::string& name, Value v) { (*frames.back())[name] = std::move(v); }
  void write(std::string_view text, int line);
  void exec_body(const Body& body);
  void count_iteration(int line);
};

// Values: conversions and Python's operations on them (jinja_values.cpp).
bool truthy(const Value& v);
std::string to_str(const Value& v);   // str(v): what {{ v }} prints
std::string py_repr(const Value& v);  // repr(v): inside a printed list or dict
std::string py_float(double d);
std::string type_name(const Value& v);
bool values_equal(const Value& a, const Value& b);
Value from_json(const nlohmann::ordered_json& j);
std::string dump_json(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep, bool sort_keys,
                      const Interpreter* in, int line);
std::vector<uint32_t> code_points(std::string_view s);
std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end);
size_t utf8_length(std::string_view s);
bool is_py_space(uint32_t cp);

// Filters, tests, methods and globals (jinja_builtins.cpp): the names parsing accepts and their implementations.
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);
bool is_known_method(const std::string& name);
bool is_known_global(const std::string& name);
std::string known_filters();
std::string known_tests();
std::string known_methods();
std::string known_globals();
Value apply_filter(Interpreter& in, const std::string& name, Value value, CallArgs& args, int line);
bool apply_test(Interpreter& in, const std::string& name, const Value& value, CallArgs& args, int line);
// obj.name(args): a method of a string, dict or list; undefined-callable errors where the object has none.
Value call_method(Interpreter& in, const Value& obj, const std::string& name, CallArgs& args, int line);
// obj.name for a dict's method names (items, get, ...); undefined when `name` is not one.
Value global_function(const std::string& name);
Value getattr_value(Interpreter& in, const Value& obj, const std::string& name, int line);
Value getitem_value(Interpreter& in, const Value& obj, const Value& key, int line);

}  // namespace rotary::chat::detail
