// chat/src/jinja.cpp: Template - parse once, render with a context (rotary_chat/jinja.h).
#include "rotary_chat/jinja.h"

#include "jinja_syntax.h"

namespace rotary::chat {

Template::Template(std::string_view source, std::string origin)
    : program_(detail::parse_program(source, std::move(origin))) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  using namespace detail;
  if (!context.is_object()) fail(program_->origin + " context", std::string("a JSON ") + context.type_name(), "a JSON object");
  Interpreter in{*program_, options, {}, {}, 0, 0, Interpreter::Flow::Normal};
  auto globals = std::make_shared<Frame>();
  for (const char* name : {"raise_exception", "strftime_now", "namespace", "range", "dict"})
    (*globals)[name] = global_function(name);
  for (auto it = context.begin(); it != context.end(); ++it) (*globals)[it.key()] = from_json(it.value());
  in.frames = {globals, std::make_shared<Frame>()};
  in.exec_body(program_->body);
  return std::move(in.out);
}

std::string python_json_dumps(const nlohmann::ordered_json& value, int indent, std::string_view item_separator,
                              std::string_view key_separator, bool sort_keys) {
  return detail::dump_json(detail::from_json(value), indent, item_separator, key_separator, sort_keys, nullptr, 0);
}

}  // namespace rotary::chat
