// chat/src/jinja_value.h: the interpreter's values - Python's types as Jinja templates see them (internal).
//
// undefined and none differ (a missing key vs JSON null), ints and floats differ ({{ 1.0 }} prints 1.0), dicts keep
// their insertion order (tojson keeps the key order of the data), lists and dicts are shared by reference as in
// Python (a namespace's attribute set in a loop is seen after it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rotary::chat::detail {

struct Value;
struct Interpreter;
using ValueList = std::vector<Value>;
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): the one object `set ns.attr = ...` may change
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};
struct Argument;
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};
struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&, int line)> call;
};

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };
  Kind kind = Kind::Undefined;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;  // a string's bytes (UTF-8); for undefined, the name it was looked up by (messages)
  std::shared_ptr<ValueList> list;
  std::shared_ptr<ValueDict> dict;
  std::shared_ptr<Callable> callable;

  static Value undefined(std::string name = {}) { Value v; v.text = std::move(name); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value from_bool(bool b) { Value v; v.kind = Kind::Bool; v.boolean = b; return v; }
  static Value from_int(int64_t i) { Value v; v.kind = Kind::Int; v.integer = i; return v; }
  static Value from_float(double d) { Value v; v.kind = Kind::Float; v.real = d; return v; }
  static Value from_string(std::string s) { Value v; v.kind = Kind::String; v.text = std::move(s); return v; }
  static Value from_list(ValueList items) {
    Value v; v.kind = Kind::List; v.list = std::make_shared<ValueList>(std::move(items)); return v;
  }
  static Value new_dict() { Value v; v.kind = Kind::Dict; v.dict = std::make_shared<ValueDict>(); return v; }
  static Value from_callable(std::string name, std::function<Value(Interpreter&, CallArgs&, int)> fn) {
    Value v; v.kind = Kind::Callable; v.callable = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
    return v;
  }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
};

}  // namespace rotary::chat::detail
