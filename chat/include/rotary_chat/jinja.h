// rotary_chat/jinja.h: a Jinja interpreter of the subset Hugging Face chat templates use (docs/chat-templates.md).
//
// Rendering follows transformers: the environment has trim_blocks and lstrip_blocks on, the loopcontrols extension
// (break, continue), the globals raise_exception and strftime_now, and a tojson that is Python's json.dumps with
// ensure_ascii=False. Anything outside the subset - a statement, filter, test, method, function or operator we do not
// implement - is a rotary::Error naming the construct and its line, at parse time where the construct is visible
// there, so a template is never rendered differently from Jinja without saying so. Loops, macro recursion and the
// output are bounded (RenderLimits); exceeding a bound is an Error naming it.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace rotary::chat {

struct RenderLimits {
  int64_t max_loop_iterations = 1'000'000;  // all loops of one render together (range() lists count too)
  int max_call_depth = 100;                 // nested macro calls
  size_t max_output_bytes = size_t(64) << 20;  // the rendered text, and any one string built while rendering
};

struct RenderOptions {
  RenderLimits limits;
  // The time strftime_now formats (UTC); unset: the current time. Tests fix it.
  std::optional<std::time_t> now;
};

namespace detail {
struct Program;
}

// A parsed template. Parsing refuses every construct outside the subset that is visible without data.
class Template {
 public:
  // `source` is the template text; `origin` names it in error messages (a file, "tokenizer_config.json").
  explicit Template(std::string_view source, std::string origin = "template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context` (an object; a key absent is an undefined variable, JSON null is none;
  // ordered_json, as tojson keeps the data's key order).
  // raise_exception(msg) in the template becomes a rotary::Error carrying msg.
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

 private:
  std::unique_ptr<detail::Program> program_;
};

// Python's json.dumps(value, ensure_ascii=False, indent=indent, separators=(item, key), sort_keys=sort_keys): the
// text tojson gives. indent < 0 is None.
std::string python_json_dumps(const nlohmann::ordered_json& value, int indent = -1, std::string_view item_separator = ", ",
                              std::string_view key_separator = ": ", bool sort_keys = false);

}  // namespace rotary::chat
