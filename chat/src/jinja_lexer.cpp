// chat/src/jinja_lexer.cpp: template text to tokens, with Jinja's whitespace rules as transformers configures them.
//
// Jinja normalizes line breaks to \n and drops one trailing newline of the source (keep_trailing_newline=False).
// trim_blocks removes the first \n after a block or comment tag; lstrip_blocks removes the spaces and tabs between
// the start of a line and a block or comment tag (never before {{ }}); '-' at a tag's edge strips all whitespace on
// that side, '+' turns the two settings off for that edge.
#include "jinja_syntax.h"

#include <cctype>
#include <cstring>

namespace rotary::chat::detail {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

class Lexer {
 public:
  Lexer(std::string source, const std::string& origin) : src_(std::move(source)), origin_(origin) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool trim_newline = false, strip_all = false;  // how the previous tag's end treats the text after it
    while (pos < src_.size()) {
      size_t start = find_tag(pos);
      std::string text = src_.substr(pos, start - pos);
      const int text_line = line_;
      // Jinja's line_starting: the text follows the source's start or a tag whose end took a \n with it.
      bool line_start = pos == 0;
      if (strip_all) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        line_start = k > 0 && text[k - 1] == '\n';
        text.erase(0, k);
      } else if (trim_newline && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
        line_start = true;
      }
      count_lines(src_.substr(pos, start - pos));
      if (start < src_.size()) {
        const char kind = src_[start + 1];
        const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
        if (sign == '-') {
          while (!text.empty() && is_space(text.back())) text.pop_back();
        } else if (sign != '+' && kind != '{') {
          // lstrip_blocks: only spaces and tabs between the line's start and the tag.
          const size_t nl = text.rfind('\n');
          const size_t from = nl == std::string::npos ? 0 : nl + 1;
          if (nl != std::string::npos || line_start) {
            bool blank = from < text.size();
            for (size_t k = from; k < text.size(); ++k) blank = blank && (text[k] == ' ' || text[k] == '\t');
            if (blank) text.erase(from);
          }
        }
      }
      if (!text.empty()) tokens_.push_back({TokenKind::Text, text, text_line});
      if (start >= src_.size()) break;
      const char kind = src_[start + 1];
      size_t p = start + 2;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
      char end_sign = '\0';
      if (kind == '#') {
        const size_t close = src_.find("#}", p);
        if (close == std::string::npos) error(line_, "a comment {# without its #}", "every {# closed by #}");
        if (close > p && (src_[close - 1] == '-' || src_[close - 1] == '+')) end_sign = src_[close - 1];
        count_lines(src_.substr(start, close + 2 - start));
        pos = close + 2;
      } else {
        tokens_.push_back({kind == '{' ? TokenKind::VarBegin : TokenKind::BlockBegin, "", line_});
        pos = lex_expression(p, kind == '{' ? '}' : '%', end_sign);
      }
      strip_all = end_sign == '-';
      trim_newline = end_sign != '+' && kind != '{';
    }
    tokens_.push_back({TokenKind::End, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t pos) const {
    while (true) {
      const size_t at = src_.find('{', pos);
      if (at == std::string::npos || at + 1 >= src_.size()) return src_.size();
      const char next = src_[at + 1];
      if (next == '{' || next == '%' || next == '#') return at;
      pos = at + 1;
    }
  }

  void count_lines(const std::string& s) {
    for (char c : s) line_ += c == '\n';
  }

  [[noreturn]] void error(int line, const std::string& what, const std::string& allowed) const {
    fail(origin_ + " line " + std::to_string(line), what, allowed);
  }

  // Tokens of one {{ }} or {% %} from `p` to its end ('}' for }}, '%' for %}); returns the position after the end.
  size_t lex_expression(size_t p, char closer, char& end_sign) {
    int depth = 0;  // brackets open inside the tag: }} of a nested dict literal does not end it
    const int tag_line = line_;
    while (true) {
      while (p < src_.size() && is_space(src_[p])) line_ += src_[p++] == '\n';
      if (p >= src_.size())
        error(tag_line, closer == '}' ? "a {{ without its }}" : "a {% without its %}", "every tag closed");
      const char c = src_[p];
      if (depth == 0) {
        for (char sign : {'-', '+', '\0'}) {
          size_t q = p + (sign ? 1 : 0);
          if (sign && (p >= src_.size() || src_[p] != sign)) continue;
          if (q + 1 < src_.size() && src_[q] == closer && src_[q + 1] == '}') {
            if (sign == '+' && closer == '}') continue;
            end_sign = sign;
            tokens_.push_back({closer == '}' ? TokenKind::VarEnd : TokenKind::BlockEnd, "", line_});
            return q + 2;
          }
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        tokens_.push_back({TokenKind::Name, src_.substr(p, q - p), line_});
        p = q;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        p = lex_number(p);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                           ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ":", ".", "|"};
        const char* op = nullptr;
        for (const char* candidate : kOps)
          if (src_.compare(p, std::strlen(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        if (!op)
          error(line_, "operator or character " + quoted_text(std::string(1, c)),
                "the operators + - * / // % ** ~ == != < > <= >= and brackets, names, numbers and strings");
        if (*op == '(' || *op == '[' || *op == '{') ++depth;
        if ((*op == ')' || *op == ']' || *op == '}') && depth > 0) --depth;
        tokens_.push_back({TokenKind::Op, op, line_});
        p += std::strlen(op);
      }
    }
  }

  size_t lex_number(size_t p) {
    size_t q = p;
    std::string digits;
    auto take_digits = [&] {
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) {
        if (src_[q] != '_') digits.push_back(src_[q]);
        ++q;
      }
    };
    take_digits();
    bool real = false;
    if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      real = true;
      digits.push_back(src_[q++]);
      take_digits();
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        real = true;
        digits.push_back('e');
        digits.append(src_, q + 1, r - q - 1);
        q = r;
        take_digits();
      }
    }
    Token t{real ? TokenKind::Float : TokenKind::Int, digits, line_};
    if (real) {
      t.real = std::strtod(digits.c_str(), nullptr);
    } else {
      errno = 0;
      char* end = nullptr;
      t.integer = std::strtoll(digits.c_str(), &end, 10);
      if (errno == ERANGE) error(line_, "integer literal " + quoted_text(digits), "integers within 64 bits");
    }
    tokens_.push_back(t);
    return q;
  }

  size_t lex_string(size_t p) {
    const char quote = src_[p];
    const int start_line = line_;
    std::string out;
    size_t q = p + 1;
    while (true) {
      if (q >= src_.size()) error(start_line, "a string literal without its closing quote", "closed strings");
      const char c = src_[q];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\' || q + 1 >= src_.size()) {
        out.push_back(c);
        ++q;
        continue;
      }
      const char e = src_[q + 1];
      q += 2;
      auto hex = [&](int n) {
        uint32_t v = 0;
        for (int k = 0; k < n; ++k, ++q) {
          if (q >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[q])))
            error(line_, "escape \\" + std::string(1, e) + " in a string", std::to_string(n) + " hex digits");
          const char h = src_[q];
          v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case '0': out.push_back('\0'); break;
        case '\n': ++line_; break;  // a backslash at a line's end continues the string
        case 'x': append_utf8(out, hex(2)); break;
        case 'u': append_utf8(out, hex(4)); break;
        case 'U': {
          const uint32_t cp = hex(8);
          if (cp > 0x10FFFF) error(line_, "escape \\U" + to_text(cp), "code points up to 10FFFF");
          append_utf8(out, cp);
          break;
        }
        default:  // Python keeps an unknown escape as written
          out.push_back('\\');
          out.push_back(e);
      }
    }
    tokens_.push_back({TokenKind::String, out, start_line});
    return q + 1;
  }

  std::string src_;
  const std::string& origin_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

void append_code_point(std::string& out, uint32_t cp) { append_utf8(out, cp); }

std::vector<Token> lex_template(std::string_view source, const std::string& origin) {
  std::string text;
  text.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {  // \r\n and \r are \n to Jinja
    if (source[k] == '\r') {
      text.push_back('\n');
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      text.push_back(source[k]);
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return Lexer(std::move(text), origin).run();
}

}  // namespace rotary::chat::detail
