// chat/src/jinja_parser.cpp: tokens to the syntax tree, and how each node evaluates.
//
// Precedence as Jinja's parser: x if c else y < or < and < not < comparisons (in, not in, ==, ...) < + - < ~ <
// * / // % < ** < unary - + < postfix (.attr, [index], [a:b:c], (call)) with filters (|f) and tests (is t) on it.
#include <algorithm>
#include <cmath>
#include <set>

#include "jinja_syntax.h"

namespace rotary::chat::detail {
namespace {

constexpr int kMaxNesting = 200;  // expressions and blocks nested deeper than this are refused (the stack)

// ---- expressions ----

struct Literal : Expr {
  Value value;
  Value eval(Interpreter&) const override { return value; }
};
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  Value eval(Interpreter& in) const override {
    ValueList out;
    for (const auto& e : items) out.push_back(e->eval(in));
    return Value::from_list(std::move(out));
  }
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Interpreter& in) const override {
    Value d = Value::new_dict();
    for (const auto& [k, v] : items) {
      Value key = k->eval(in);
      if (!key.is_string()) in.error(line, "dict key of type " + type_name(key), "string keys");
      d.dict->set(key.text, v->eval(in));
    }
    return d;
  }
};
struct NameExpr : Expr {
  std::string name;
  Value eval(Interpreter& in) const override { return in.lookup(name); }
};
struct AttrExpr : Expr {
  ExprPtr object;
  std::string name;
  Value eval(Interpreter& in) const override { return getattr_value(in, object->eval(in), name, line); }
};
struct IndexExpr : Expr {
  ExprPtr object, index;
  Value eval(Interpreter& in) const override { return getitem_value(in, object->eval(in), index->eval(in), line); }
};
struct SliceExpr : Expr {
  ExprPtr object, start, stop, step;
  Value eval(Interpreter& in) const override {
    Value obj = object->eval(in);
    auto bound = [&](const ExprPtr& e) -> std::optional<int64_t> {
      if (!e) return std::nullopt;
      Value v = e->eval(in);
      if (v.is_none()) return std::nullopt;
      if (v.kind != Value::Kind::Int && v.kind != Value::Kind::Bool)
        in.error(line, "slice bound of type " + type_name(v), "integers or none");
      return v.kind == Value::Kind::Bool ? int64_t(v.boolean) : v.integer;
    };
    const auto b = bound(start), e = bound(stop), s = bound(step);
    const int64_t st = s.value_or(1);
    if (st == 0) in.error(line, "slice step 0", "a non-zero step");
    std::vector<uint32_t> cps;
    int64_t n = 0;
    if (obj.is_list()) {
      n = int64_t(obj.list->size());
    } else if (obj.is_string()) {
      cps = code_points(obj.text);
      n = int64_t(cps.size());
    } else if (obj.is_undefined()) {
      in.error(line, "slice of undefined " + quoted_text(obj.text), "slicing a defined list or string");
    } else {
      in.error(line, "slice of a " + type_name(obj), "slicing a list or a string");
    }
    // Python's slice.indices.
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v;
      if (x < 0) x += n;
      if (st > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t from = clamp(b, st > 0 ? 0 : n - 1), to = clamp(e, st > 0 ? n : -1);
    std::vector<int64_t> picks;
    for (int64_t k = from; st > 0 ? k < to : k > to; k += st) picks.push_back(k);
    if (obj.is_list()) {
      ValueList out;
      for (int64_t k : picks) out.push_back((*obj.list)[size_t(k)]);
      return Value::from_list(std::move(out));
    }
    std::string out;
    for (int64_t k : picks) append_code_point(out, cps[size_t(k)]);
    return Value::from_string(out);
  }
};

CallArgs eval_args(Interpreter& in, const ArgList& args) {
  CallArgs out;
  for (const auto& e : args.positional) out.positional.push_back(e->eval(in));
  for (const auto& n : args.named) out.named.emplace_back(n.name, n.value->eval(in));
  return out;
}

struct CallExpr : Expr {
  ExprPtr callee;
  ArgList args;
  Value eval(Interpreter& in) const override {
    if (auto* attr = dynamic_cast<const AttrExpr*>(callee.get())) {
      Value obj = attr->object->eval(in);
      if (obj.is_undefined())
        in.error(line, "method " + attr->name + " of undefined " + quoted_text(obj.text), "methods of defined values");
      if (obj.is_string() || obj.is_list() || (obj.is_dict() && !obj.dict->is_namespace)) {
        CallArgs a = eval_args(in, args);
        return call_method(in, obj, attr->name, a, line);
      }
      Value f = getattr_value(in, obj, attr->name, line);
      if (f.kind != Value::Kind::Callable)
        in.error(line, "call of " + attr->name + " (a " + type_name(f) + ")", "calling functions and macros");
      CallArgs a = eval_args(in, args);
      return f.callable->call(in, a, line);
    }
    Value f = callee->eval(in);
    if (f.kind != Value::Kind::Callable) {
      const std::string what = f.is_undefined() ? "undefined " + quoted_text(f.text) : "a " + type_name(f);
      in.error(line, "call of " + what, "calling functions and macros");
    }
    CallArgs a = eval_args(in, args);
    return f.callable->call(in, a, line);
  }
};
struct FilterExpr : Expr {
  ExprPtr operand;
  std::string name;
  ArgList args;
  Value eval(Interpreter& in) const override {
    Value v = operand->eval(in);
    CallArgs a = eval_args(in, args);
    return apply_filter(in, name, std::move(v), a, line);
  }
};
struct TestExpr : Expr {
  ExprPtr operand;
  std::string name;
  ArgList args;
  bool negated = false;
  Value eval(Interpreter& in) const override {
    Value v = operand->eval(in);
    CallArgs a = eval_args(in, args);
    return Value::from_bool(apply_test(in, name, v, a, line) != negated);
  }
};
struct NotExpr : Expr {
  ExprPtr operand;
  Value eval(Interpreter& in) const override { return Value::from_bool(!truthy(operand->eval(in))); }
};
struct AndOrExpr : Expr {
  bool is_and = false;
  ExprPtr left, right;
  Value eval(Interpreter& in) const override {
    Value l = left->eval(in);
    if (truthy(l) != is_and) return l;  // Python returns the deciding operand itself
    return right->eval(in);
  }
};
struct CondExpr : Expr {
  ExprPtr then, cond, otherwise;
  Value eval(Interpreter& in) const override {
    if (truthy(cond->eval(in))) return then->eval(in);
    return otherwise ? otherwise->eval(in) : Value::undefined();
  }
};
struct UnaryExpr : Expr {
  char op;
  ExprPtr operand;
  Value eval(Interpreter& in) const override {
    Value v = operand->eval(in);
    if (v.kind == Value::Kind::Bool) v = Value::from_int(v.boolean);
    if (v.kind == Value::Kind::Int) {
      if (op == '-' && v.integer == INT64_MIN) in.error(line, "-(" + to_text(v.integer) + ")", "64-bit integers");
      return op == '-' ? Value::from_int(-v.integer) : v;
    }
    if (v.kind == Value::Kind::Float) return op == '-' ? Value::from_float(-v.real) : v;
    in.error(line, std::string("unary ") + op + " of a " + type_name(v), "numbers");
  }
};

Value binary_op(Interpreter& in, const std::string& op, const Value& l, const Value& r, int line);
bool compare_op(Interpreter& in, const std::string& op, const Value& l, const Value& r, int line);

struct BinaryExpr : Expr {
  std::string op;
  ExprPtr left, right;
  Value eval(Interpreter& in) const override { return binary_op(in, op, left->eval(in), right->eval(in), line); }
};
struct CompareExpr : Expr {
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;  // a < b < c is a < b and b < c, as Python
  Value eval(Interpreter& in) const override {
    Value l = first->eval(in);
    for (const auto& [op, e] : rest) {
      Value r = e->eval(in);
      if (!compare_op(in, op, l, r, line)) return Value::from_bool(false);
      l = std::move(r);
    }
    return Value::from_bool(true);
  }
};

double as_double(const Value& v) {
  return v.kind == Value::Kind::Float ? v.real : double(v.kind == Value::Kind::Bool ? v.boolean : v.integer);
}
int64_t as_int(const Value& v) { return v.kind == Value::Kind::Bool ? int64_t(v.boolean) : v.integer; }

Value binary_op(Interpreter& in, const std::string& op, const Value& l, const Value& r, int line) {
  const size_t cap = in.options.limits.max_output_bytes;
  if (op == "~") {
    std::string s = to_str(l) + to_str(r);
    if (s.size() > cap) in.error(line, "a string of " + to_text(s.size()) + " bytes", "RenderLimits::max_output_bytes");
    return Value::from_string(std::move(s));
  }
  if (l.is_undefined() || r.is_undefined())
    in.error(line, "operator " + op + " on undefined " + quoted_text(l.is_undefined() ? l.text : r.text),
             "defined operands");
  const std::string desc = "operator " + op + " on " + type_name(l) + " and " + type_name(r);
  if (op == "+") {
    if (l.is_string() && r.is_string()) {
      if (l.text.size() + r.text.size() > cap) in.error(line, "a string too long", "RenderLimits::max_output_bytes");
      return Value::from_string(l.text + r.text);
    }
    if (l.is_list() && r.is_list()) {
      ValueList out = *l.list;
      out.insert(out.end(), r.list->begin(), r.list->end());
      return Value::from_list(std::move(out));
    }
  }
  const bool l_seq = l.is_string() || l.is_list(), r_seq = r.is_string() || r.is_list();
  const bool l_int = l.kind == Value::Kind::Int || l.kind == Value::Kind::Bool;
  const bool r_int = r.kind == Value::Kind::Int || r.kind == Value::Kind::Bool;
  if (op == "*" && ((l_seq && r_int) || (r_seq && l_int))) {
    const Value& seq = (l.is_string() || l.is_list()) ? l : r;
    const int64_t n = std::max<int64_t>(0, as_int((l.is_string() || l.is_list()) ? r : l));
    const size_t unit = seq.is_string() ? seq.text.size() : seq.list->size();
    if (unit > 0 && uint64_t(n) > cap / unit) in.error(line, desc + " repeating " + to_text(n) + " times",
                                                        "results within RenderLimits::max_output_bytes");
    if (seq.is_string()) {
      std::string s;
      for (int64_t k = 0; k < n; ++k) s += seq.text;
      return Value::from_string(std::move(s));
    }
    ValueList out;
    for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
    return Value::from_list(std::move(out));
  }
  if (!l.is_number() || !r.is_number()) in.error(line, desc, "numbers (+ also joins two strings or two lists)");
  const bool ints = l.kind != Value::Kind::Float && r.kind != Value::Kind::Float;
  if (op == "/") {
    if (as_double(r) == 0) in.error(line, "division by zero", "a non-zero divisor");
    return Value::from_float(as_double(l) / as_double(r));
  }
  if (ints) {
    const int64_t a = as_int(l), b = as_int(r);
    int64_t v = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(a, b, &v);
    if (op == "-") overflow = __builtin_sub_overflow(a, b, &v);
    if (op == "*") overflow = __builtin_mul_overflow(a, b, &v);
    if (overflow) in.error(line, desc, "results within 64-bit integers");
    if (op == "+" || op == "-" || op == "*") return Value::from_int(v);
    if (op == "//" || op == "%") {
      if (b == 0) in.error(line, "integer division or modulo by zero", "a non-zero divisor");
      if (a == INT64_MIN && b == -1) in.error(line, desc, "results within 64-bit integers");
      int64_t q = a / b, m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) {  // Python floors
        --q;
        m += b;
      }
      return Value::from_int(op == "//" ? q : m);
    }
    if (op == "**") {
      if (b < 0) return Value::from_float(std::pow(double(a), double(b)));
      int64_t acc = 1;
      for (int64_t k = 0; k < b; ++k) {
        if (__builtin_mul_overflow(acc, a, &acc)) in.error(line, desc, "results within 64-bit integers");
        if (acc == 0 || acc == 1) break;
      }
      return Value::from_int(acc);
    }
  }
  const double a = as_double(l), b = as_double(r);
  if (op == "+") return Value::from_float(a + b);
  if (op == "-") return Value::from_float(a - b);
  if (op == "*") return Value::from_float(a * b);
  if (op == "**") return Value::from_float(std::pow(a, b));
  if (b == 0) in.error(line, "float division or modulo by zero", "a non-zero divisor");
  const double q = std::floor(a / b);
  if (op == "//") return Value::from_float(q);
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return Value::from_float(m);
}

int order(Interpreter& in, const Value& l, const Value& r, const std::string& op, int line) {
  if (l.is_number() && r.is_number()) {
    if (l.kind != Value::Kind::Float && r.kind != Value::Kind::Float) {
      const int64_t a = as_int(l), b = as_int(r);
      return a < b ? -1 : a > b;
    }
    const double a = as_double(l), b = as_double(r);
    return a < b ? -1 : a > b;
  }
  if (l.is_string() && r.is_string()) return l.text < r.text ? -1 : l.text > r.text;
  if (l.is_list() && r.is_list()) {
    for (size_t k = 0; k < std::min(l.list->size(), r.list->size()); ++k) {
      if (values_equal((*l.list)[k], (*r.list)[k])) continue;
      return order(in, (*l.list)[k], (*r.list)[k], op, line);
    }
    return l.list->size() < r.list->size() ? -1 : l.list->size() > r.list->size();
  }
  in.error(line, "comparison " + op + " between " + type_name(l) + " and " + type_name(r),
           "numbers with numbers, strings with strings, lists with lists");
}

bool contains(Interpreter& in, const Value& container, const Value& item, int line) {
  if (container.is_string()) {
    if (!item.is_string()) in.error(line, "'in <string>' with a " + type_name(item) + " on the left", "a string");
    return container.text.find(item.text) != std::string::npos;
  }
  if (container.is_list())
    return std::any_of(container.list->begin(), container.list->end(),
                       [&](const Value& v) { return values_equal(v, item); });
  if (container.is_dict()) return item.is_string() && container.dict->find(item.text) != nullptr;
  if (container.is_undefined()) return false;  // Jinja's Undefined iterates as empty
  in.error(line, "'in' on a " + type_name(container), "strings, lists and dicts");
}

bool compare_op(Interpreter& in, const std::string& op, const Value& l, const Value& r, int line) {
  if (op == "==") return values_equal(l, r);
  if (op == "!=") return !values_equal(l, r);
  if (op == "in") return contains(in, r, l, line);
  if (op == "not in") return !contains(in, r, l, line);
  if (l.is_undefined() || r.is_undefined())
    in.error(line, "comparison " + op + " with undefined " + quoted_text(l.is_undefined() ? l.text : r.text),
             "defined operands");
  const int c = order(in, l, r, op, line);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

// ---- statements ----

struct TextStmt : Stmt {
  std::string text;
  void exec(Interpreter& in) const override { in.write(text, line); }
};
struct OutputStmt : Stmt {
  ExprPtr expr;
  void exec(Interpreter& in) const override { in.write(to_str(expr->eval(in)), line); }
};
struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body otherwise;
  void exec(Interpreter& in) const override {
    for (const auto& [cond, body] : branches)
      if (truthy(cond->eval(in))) return in.exec_body(body);
    in.exec_body(otherwise);
  }
};

void bind_targets(Interpreter& in, const std::vector<std::string>& targets, const Value& item, int line) {
  if (targets.size() == 1) return in.assign(targets[0], item);
  ValueList parts;
  if (item.is_list()) parts = *item.list;
  else if (item.is_string()) for (uint32_t cp : code_points(item.text)) { std::string s; append_code_point(s, cp); parts.push_back(Value::from_string(s)); }
  else in.error(line, "unpacking a " + type_name(item) + " into " + to_text(targets.size()) + " names", "a sequence");
  if (parts.size() != targets.size())
    in.error(line, "unpacking " + to_text(parts.size()) + " values into " + to_text(targets.size()) + " names",
             "as many values as names");
  for (size_t k = 0; k < targets.size(); ++k) in.assign(targets[k], parts[k]);
}

ValueList iterate(Interpreter& in, const Value& v, int line) {
  if (v.is_list()) return *v.list;
  if (v.is_undefined()) return {};
  ValueList out;
  if (v.is_dict()) {
    for (const auto& kv : v.dict->items) out.push_back(Value::from_string(kv.first));
    return out;
  }
  if (v.is_string()) {
    for (uint32_t cp : code_points(v.text)) {
      std::string s;
      append_code_point(s, cp);
      out.push_back(Value::from_string(s));
    }
    return out;
  }
  in.error(line, "iterating over a " + type_name(v), "lists, dicts (their keys) and strings");
}

struct ForStmt : Stmt {
  std::vector<std::string> targets;
  ExprPtr iterable, filter;
  Body body, otherwise;
  void exec(Interpreter& in) const override {
    ValueList items = iterate(in, iterable->eval(in), line);
    if (filter) {  // the filter runs before the loop: loop.length and loop.last count only what passes
      ValueList kept;
      for (const auto& item : items) {
        in.frames.push_back(std::make_shared<Frame>());
        bind_targets(in, targets, item, line);
        const bool keep = truthy(filter->eval(in));
        in.frames.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return in.exec_body(otherwise);
    const int64_t n = int64_t(items.size());
    for (int64_t k = 0; k < n; ++k) {
      in.count_iteration(line);
      auto frame = std::make_shared<Frame>();
      in.frames.push_back(frame);
      Value loop = Value::new_dict();
      loop.dict->set("index", Value::from_int(k + 1));
      loop.dict->set("index0", Value::from_int(k));
      loop.dict->set("revindex", Value::from_int(n - k));
      loop.dict->set("revindex0", Value::from_int(n - k - 1));
      loop.dict->set("first", Value::from_bool(k == 0));
      loop.dict->set("last", Value::from_bool(k == n - 1));
      loop.dict->set("length", Value::from_int(n));
      loop.dict->set("depth", Value::from_int(1));
      loop.dict->set("depth0", Value::from_int(0));
      loop.dict->set("previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined("loop.previtem"));
      loop.dict->set("nextitem", k + 1 < n ? items[size_t(k + 1)] : Value::undefined("loop.nextitem"));
      loop.dict->set("cycle", Value::from_callable("loop.cycle", [k](Interpreter& it, CallArgs& a, int l) {
                       if (a.positional.empty()) it.error(l, "loop.cycle()", "at least one value");
                       return a.positional[size_t(k) % a.positional.size()];
                     }));
      loop.dict->is_namespace = true;  // its attributes read as attributes, never as dict methods
      (*frame)["loop"] = loop;
      bind_targets(in, targets, items[size_t(k)], line);
      in.exec_body(body);
      in.frames.pop_back();
      if (in.flow == Interpreter::Flow::Break) {
        in.flow = Interpreter::Flow::Normal;
        break;
      }
      in.flow = Interpreter::Flow::Normal;
    }
  }
};
struct FlowStmt : Stmt {
  Interpreter::Flow flow;
  void exec(Interpreter& in) const override { in.flow = flow; }
};
struct SetStmt : Stmt {
  std::vector<std::string> targets;  // one name, or several to unpack into
  std::string attribute;             // set ns.attribute = ...: targets[0] is the namespace
  ExprPtr value;
  Body block;  // {% set x %}...{% endset %}
  bool is_block = false;
  void exec(Interpreter& in) const override {
    Value v;
    if (is_block) {
      std::string saved;
      std::swap(saved, in.out);
      in.exec_body(block);
      std::swap(saved, in.out);
      v = Value::from_string(std::move(saved));
    } else {
      v = value->eval(in);
    }
    if (!attribute.empty()) {
      Value ns = in.lookup(targets[0]);
      const bool is_loop = ns.is_dict() && ns.dict->find("index0") != nullptr && ns.dict->find("cycle") != nullptr;
      if (!ns.is_dict() || !ns.dict->is_namespace || is_loop)
        in.error(line, "set " + targets[0] + "." + attribute + " on a " + type_name(ns),
                 "attribute assignment on a namespace() only");
      ns.dict->set(attribute, std::move(v));
      return;
    }
    bind_targets(in, targets, v, line);
  }
};
struct MacroStmt : Stmt {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;
  Body body;
  void exec(Interpreter& in) const override {
    const MacroStmt* self = this;
    in.assign(name, Value::from_callable(name, [self](Interpreter& it, CallArgs& a, int call_line) {
                return self->call(it, a, call_line);
              }));
  }
  Value call(Interpreter& in, CallArgs& a, int call_line) const {
    if (in.call_depth >= in.options.limits.max_call_depth)
      in.error(call_line, "macro " + name + " nested " + to_text(in.call_depth + 1) + " calls deep",
               "at most RenderLimits::max_call_depth = " + to_text(in.options.limits.max_call_depth));
    if (a.positional.size() > params.size())
      in.error(call_line, "macro " + name + " called with " + to_text(a.positional.size()) + " arguments",
               "at most " + to_text(params.size()));
    auto frame = std::make_shared<Frame>();
    std::vector<std::shared_ptr<Frame>> frames{in.frames[0], in.frames[1], frame};
    std::swap(frames, in.frames);
    for (size_t k = 0; k < params.size(); ++k) {
      const auto& [pname, dflt] = params[k];
      Value v = k < a.positional.size() ? a.positional[k] : Value::undefined(pname);
      for (const auto& [n, nv] : a.named)
        if (n == pname) v = nv;
      if (v.is_undefined() && k >= a.positional.size() && dflt) v = dflt->eval(in);
      (*frame)[pname] = v;
    }
    for (const auto& [n, nv] : a.named) {
      bool known = false;
      for (const auto& p : params) known = known || p.first == n;
      if (!known) {
        std::swap(frames, in.frames);
        in.error(call_line, "argument " + n + " of macro " + name, "its parameters");
      }
    }
    std::string saved;
    std::swap(saved, in.out);
    ++in.call_depth;
    try {
      in.exec_body(body);
    } catch (...) {
      --in.call_depth;
      std::swap(frames, in.frames);
      throw;
    }
    --in.call_depth;
    std::swap(saved, in.out);
    std::swap(frames, in.frames);
    in.flow = Interpreter::Flow::Normal;
    return Value::from_string(std::move(saved));
  }
};
struct BlockStmt : Stmt {  // {% generation %}: transformers' assistant mask marker; renders its body
  Body body;
  void exec(Interpreter& in) const override { in.exec_body(body); }
};

// ---- the parser ----

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& origin) : t_(std::move(tokens)), origin_(origin) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, end, 0, "");
    for (const auto& [name, line] : called_names_)
      if (!is_known_global(name) && !macros_.count(name))
        error(line, "function " + quoted_text(name), "the globals " + known_globals() + " and the template's macros");
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Op && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Name && peek(ahead).text == name;
  }
  [[noreturn]] void error(int line, const std::string& what, const std::string& allowed) const {
    fail(origin_ + " line " + std::to_string(line), what, allowed);
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case TokenKind::End: return "the end of the template";
      case TokenKind::VarEnd: return "}}";
      case TokenKind::BlockEnd: return "%}";
      case TokenKind::String: return "string " + quoted_text(t.text);
      default: return quoted_text(t.text);
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(peek().line, describe(peek()), std::string("'") + op + "' here");
    ++pos_;
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::Name) error(peek().line, describe(peek()), "a name here");
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::BlockEnd) error(peek().line, describe(peek()), "%} here");
    ++pos_;
  }
  void enter(int line) {
    if (++depth_ > kMaxNesting) error(line, "nesting deeper than " + to_text(kMaxNesting), "shallower templates");
  }

  // Statements until one of `ends` ({% endfor %}, {% else %}, ...); `end` gets the one that stopped it.
  Body parse_body(const std::set<std::string>& ends, std::string& end, int open_line, const std::string& opener) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::End) {
        if (!ends.empty())
          error(open_line, "{% " + opener + " %} without its {% " + *ends.rbegin() + " %}", "every block closed");
        return body;
      }
      if (t.kind == TokenKind::Text) {
        auto s = std::make_unique<TextStmt>();
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        ++pos_;
      } else if (t.kind == TokenKind::VarBegin) {
        ++pos_;
        auto s = std::make_unique<OutputStmt>();
        s->line = t.line;
        s->expr = parse_expression();
        if (peek().kind != TokenKind::VarEnd) error(peek().line, describe(peek()), "}} closing the {{ here");
        ++pos_;
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::BlockBegin) {
        const Token& name = peek(1);
        if (name.kind != TokenKind::Name) error(name.line, describe(name), "a statement name after {%");
        if (ends.count(name.text)) {
          pos_ += 2;
          end = name.text;
          return body;
        }
        pos_ += 2;
        body.push_back(parse_statement(name));
      } else {
        error(t.line, describe(t), "text, {{ }} or {% %}");
      }
    }
  }

  StmtPtr parse_statement(const Token& name) {
    const std::string& s = name.text;
    const int line = name.line;
    enter(line);
    StmtPtr out;
    if (s == "if") out = parse_if(line);
    else if (s == "for") out = parse_for(line);
    else if (s == "set") out = parse_set(line);
    else if (s == "macro") out = parse_macro(line);
    else if (s == "break" || s == "continue") {
      if (loop_depth_ == 0) error(line, "{% " + s + " %} outside a loop", "break and continue inside a for");
      auto f = std::make_unique<FlowStmt>();
      f->flow = s == "break" ? Interpreter::Flow::Break : Interpreter::Flow::Continue;
      expect_block_end();
      out = std::move(f);
    } else if (s == "generation") {
      expect_block_end();
      auto b = std::make_unique<BlockStmt>();
      std::string end;
      b->body = parse_body({"endgeneration"}, end, line, "generation");
      expect_block_end();
      out = std::move(b);
    } else {
      error(line, "statement " + quoted_text(s),
            "the statements if / elif / else, for (with else, break, continue), set (and set ... endset), macro, "
            "generation");
    }
    out->line = line;
    --depth_;
    return out;
  }

  StmtPtr parse_if(int line) {
    auto s = std::make_unique<IfStmt>();
    ExprPtr cond = parse_expression();
    expect_block_end();
    while (true) {
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, end, line, "if");
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_expression();
        expect_block_end();
        continue;
      }
      expect_block_end();
      if (end == "else") {
        s->otherwise = parse_body({"endif"}, end, line, "if");
        expect_block_end();
      }
      return s;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) ++pos_;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++pos_;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(int line) {
    auto s = std::make_unique<ForStmt>();
    s->targets = parse_targets();
    if (!is_name("in")) error(peek().line, describe(peek()), "'in' after the loop's names");
    ++pos_;
    s->iterable = parse_or();  // no x if c else y here: the 'if' is the loop's filter
    if (is_name("if")) {
      ++pos_;
      s->filter = parse_or();
    }
    if (is_name("recursive")) error(peek().line, "recursive for loops", "plain for loops");
    expect_block_end();
    std::string end;
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"}, end, line, "for");
    --loop_depth_;
    expect_block_end();
    if (end == "else") {
      s->otherwise = parse_body({"endfor"}, end, line, "for");
      expect_block_end();
    }
    return s;
  }

  StmtPtr parse_set(int line) {
    auto s = std::make_unique<SetStmt>();
    s->targets.push_back(expect_name());
    if (is_op(".")) {
      ++pos_;
      s->attribute = expect_name();
    } else {
      while (is_op(",")) {
        ++pos_;
        s->targets.push_back(expect_name());
      }
    }
    if (peek().kind == TokenKind::BlockEnd && s->targets.size() == 1 && s->attribute.empty()) {
      ++pos_;
      s->is_block = true;
      std::string end;
      s->block = parse_body({"endset"}, end, line, "set");
      expect_block_end();
      return s;
    }
    expect_op("=");
    s->value = parse_expression();
    if (is_op(",")) {  // set a, b = 1, 2: a tuple on the right
      auto list = std::make_unique<ListExpr>();
      list->line = line;
      list->items.push_back(std::move(s->value));
      while (is_op(",")) {
        ++pos_;
        list->items.push_back(parse_expression());
      }
      s->value = std::move(list);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(int line) {
    auto s = std::make_unique<MacroStmt>();
    s->name = expect_name();
    macros_.insert(s->name);
    expect_op("(");
    while (!is_op(")")) {
      std::string p = expect_name();
      ExprPtr dflt;
      if (is_op("=")) {
        ++pos_;
        dflt = parse_expression();
      }
      s->params.emplace_back(p, std::move(dflt));
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
    expect_block_end();
    std::string end;
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"}, end, line, "macro");
    loop_depth_ = saved_loops;
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  template <class T>
  std::unique_ptr<T> node(int line) {
    auto n = std::make_unique<T>();
    n->line = line;
    return n;
  }

  ExprPtr parse_expression() {
    enter(peek().line);
    ExprPtr e = parse_or();
    if (is_name("if")) {
      auto c = node<CondExpr>(peek().line);
      ++pos_;
      c->then = std::move(e);
      c->cond = parse_or();
      if (is_name("else")) {
        ++pos_;
        c->otherwise = parse_expression();
      }
      e = std::move(c);
    }
    --depth_;
    return e;
  }
  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      auto n = node<AndOrExpr>(next().line);
      n->left = std::move(e);
      n->right = parse_and();
      e = std::move(n);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      auto n = node<AndOrExpr>(next().line);
      n->is_and = true;
      n->left = std::move(e);
      n->right = parse_not();
      e = std::move(n);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      auto n = node<NotExpr>(next().line);
      enter(n->line);
      n->operand = parse_not();
      --depth_;
      return n;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      std::string op;
      const int line = peek().line;
      if (peek().kind == TokenKind::Op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        ++pos_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node<CompareExpr>(line);
        cmp->first = std::move(e);
      }
      cmp->rest.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return e;
  }
  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line) {
    auto n = node<BinaryExpr>(line);
    n->op = std::move(op);
    n->left = std::move(l);
    n->right = std::move(r);
    return n;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.text, std::move(e), parse_concat(), t.line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& t = next();
      e = binary("~", std::move(e), parse_math2(), t.line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t.text, std::move(e), parse_pow(), t.line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      e = binary("**", std::move(e), parse_unary(true), t.line);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      auto n = node<UnaryExpr>(peek().line);
      n->op = next().text[0];
      enter(n->line);
      n->operand = parse_unary(false);
      --depth_;
      e = std::move(n);
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ArgList parse_call_args() {
    ArgList args;
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == TokenKind::Name && is_op("=", 1)) {
        std::string n = next().text;
        ++pos_;
        args.named.push_back({n, parse_expression()});
      } else {
        if (!args.named.empty()) error(peek().line, "a positional argument after a named one", "named ones last");
        args.positional.push_back(parse_expression());
      }
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (is_op(".")) {
        ++pos_;
        if (peek().kind == TokenKind::Int) {  // x.0 is x[0] in Jinja
          auto n = node<IndexExpr>(line);
          n->object = std::move(e);
          auto lit = node<Literal>(line);
          lit->value = Value::from_int(next().integer);
          n->index = std::move(lit);
          e = std::move(n);
          continue;
        }
        auto n = node<AttrExpr>(line);
        n->object = std::move(e);
        n->name = expect_name();
        e = std::move(n);
      } else if (is_op("[")) {
        ++pos_;
        enter(line);
        ExprPtr first;
        if (!is_op(":")) first = parse_expression();
        if (is_op(":")) {
          auto n = node<SliceExpr>(line);
          n->object = std::move(e);
          n->start = std::move(first);
          ++pos_;
          if (!is_op("]") && !is_op(":")) n->stop = parse_expression();
          if (is_op(":")) {
            ++pos_;
            if (!is_op("]")) n->step = parse_expression();
          }
          e = std::move(n);
        } else {
          auto n = node<IndexExpr>(line);
          n->object = std::move(e);
          n->index = std::move(first);
          e = std::move(n);
        }
        expect_op("]");
        --depth_;
      } else if (is_op("(")) {
        enter(line);
        auto n = node<CallExpr>(line);
        if (auto* name = dynamic_cast<NameExpr*>(e.get())) called_names_.emplace_back(name->name, line);
        if (auto* attr = dynamic_cast<AttrExpr*>(e.get()))
          if (!is_known_method(attr->name) && !is_loop_cycle(*attr))
            error(line, "method " + quoted_text(attr->name), "the methods " + known_methods());
        n->callee = std::move(e);
        n->args = parse_call_args();
        e = std::move(n);
        --depth_;
      } else {
        return e;
      }
    }
  }
  static bool is_loop_cycle(const AttrExpr& attr) {
    auto* obj = dynamic_cast<const NameExpr*>(attr.object.get());
    return attr.name == "cycle" && obj && obj->name == "loop";
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (is_op("|")) {
        ++pos_;
        auto n = node<FilterExpr>(line);
        n->name = expect_name();
        if (!is_known_filter(n->name)) error(line, "filter " + quoted_text(n->name), "the filters " + known_filters());
        n->operand = std::move(e);
        if (is_op("(")) n->args = parse_call_args();
        e = std::move(n);
      } else if (is_name("is")) {
        ++pos_;
        auto n = node<TestExpr>(line);
        if (is_name("not")) {
          ++pos_;
          n->negated = true;
        }
        n->name = expect_name();
        if (!is_known_test(n->name)) error(line, "test " + quoted_text(n->name), "the tests " + known_tests());
        n->operand = std::move(e);
        if (is_op("(")) {
          n->args = parse_call_args();
        } else {
          const Token& t = peek();
          const bool arg_start = t.kind == TokenKind::String || t.kind == TokenKind::Int ||
                                 t.kind == TokenKind::Float || is_op("[") || is_op("{") ||
                                 (t.kind == TokenKind::Name && t.text != "else" && t.text != "or" &&
                                  t.text != "and" && t.text != "if" && t.text != "is");
          if (arg_start) n->args.positional.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    const int line = t.line;
    enter(line);
    ExprPtr out;
    if (t.kind == TokenKind::Name) {
      ++pos_;
      static const std::set<std::string> kReserved = {"and", "or", "not", "in", "is", "if", "else"};
      if (kReserved.count(t.text)) error(line, quoted_text(t.text) + " where a value belongs", "an expression");
      auto lit = node<Literal>(line);
      if (t.text == "true" || t.text == "True") lit->value = Value::from_bool(true);
      else if (t.text == "false" || t.text == "False") lit->value = Value::from_bool(false);
      else if (t.text == "none" || t.text == "None") lit->value = Value::none();
      else {
        auto n = node<NameExpr>(line);
        n->name = t.text;
        out = std::move(n);
      }
      if (!out) out = std::move(lit);
    } else if (t.kind == TokenKind::String) {
      std::string s;
      while (peek().kind == TokenKind::String) s += next().text;  // adjacent strings join, as in Python
      auto lit = node<Literal>(line);
      lit->value = Value::from_string(s);
      out = std::move(lit);
    } else if (t.kind == TokenKind::Int || t.kind == TokenKind::Float) {
      ++pos_;
      auto lit = node<Literal>(line);
      lit->value = t.kind == TokenKind::Int ? Value::from_int(t.integer) : Value::from_float(t.real);
      out = std::move(lit);
    } else if (is_op("(")) {
      ++pos_;
      ExprPtr inner = parse_expression();
      if (is_op(",")) {  // a tuple: a list to us
        auto list = node<ListExpr>(line);
        list->items.push_back(std::move(inner));
        while (is_op(",")) {
          ++pos_;
          if (is_op(")")) break;
          list->items.push_back(parse_expression());
        }
        inner = std::move(list);
      }
      expect_op(")");
      out = std::move(inner);
    } else if (is_op("[")) {
      ++pos_;
      auto list = node<ListExpr>(line);
      while (!is_op("]")) {
        list->items.push_back(parse_expression());
        if (!is_op(",")) break;
        ++pos_;
      }
      expect_op("]");
      out = std::move(list);
    } else if (is_op("{")) {
      ++pos_;
      auto dict = node<DictExpr>(line);
      while (!is_op("}")) {
        ExprPtr k = parse_expression();
        expect_op(":");
        dict->items.emplace_back(std::move(k), parse_expression());
        if (!is_op(",")) break;
        ++pos_;
      }
      expect_op("}");
      out = std::move(dict);
    } else {
      error(line, describe(t), "an expression (a name, literal, list, dict or parenthesized expression)");
    }
    --depth_;
    return out;
  }

  std::vector<Token> t_;
  const std::string& origin_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::set<std::string> macros_;
  std::vector<std::pair<std::string, int>> called_names_;
};

}  // namespace

std::unique_ptr<Program> parse_program(std::string_view source, std::string origin) {
  auto program = std::make_unique<Program>();
  program->origin = std::move(origin);
  Parser parser(lex_template(source, program->origin), program->origin);
  program->body = parser.parse_all();
  return program;
}

void Interpreter::write(std::string_view text, int line) {
  if (out.size() + text.size() > options.limits.max_output_bytes)
    error(line, "output past " + to_text(options.limits.max_output_bytes) + " bytes",
          "at most RenderLimits::max_output_bytes");
  out.append(text);
}

void Interpreter::exec_body(const Body& body) {
  for (const auto& s : body) {
    s->exec(*this);
    if (flow != Flow::Normal) return;
  }
}

void Interpreter::count_iteration(int line) {
  if (++iterations > options.limits.max_loop_iterations)
    error(line, "loop iterations past " + to_text(options.limits.max_loop_iterations),
          "at most RenderLimits::max_loop_iterations in one render");
}

}  // namespace rotary::chat::detail
