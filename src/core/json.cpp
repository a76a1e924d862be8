#include "tardelli/core/json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "tardelli/core/error.h"

namespace td::json {

const char* type_name(Type t) {
  switch (t) {
    case Type::Null:
      return "null";
    case Type::Bool:
      return "bool";
    case Type::Int:
      return "integer";
    case Type::Double:
      return "number";
    case Type::String:
      return "string";
    case Type::Array:
      return "array";
    case Type::Object:
      return "object";
  }
  return "invalid";
}

// ---- Value ----

namespace {
[[noreturn]] void wrong_type(const char* expected, Type actual) {
  TD_ERROR("JSON: expected ", expected, ", got ", type_name(actual));
}
}  // namespace

bool Value::as_bool() const {
  if (!is_bool()) wrong_type("bool", type());
  return std::get<bool>(v_);
}
int64_t Value::as_int() const {
  if (!is_int()) wrong_type("integer", type());
  return std::get<int64_t>(v_);
}
double Value::as_double() const {
  if (is_int()) return static_cast<double>(std::get<int64_t>(v_));
  if (!is_double()) wrong_type("number", type());
  return std::get<double>(v_);
}
const std::string& Value::as_string() const {
  if (!is_string()) wrong_type("string", type());
  return std::get<std::string>(v_);
}
const Array& Value::as_array() const {
  if (!is_array()) wrong_type("array", type());
  return std::get<Array>(v_);
}
Array& Value::as_array() {
  if (!is_array()) wrong_type("array", type());
  return std::get<Array>(v_);
}
const Object& Value::as_object() const {
  if (!is_object()) wrong_type("object", type());
  return std::get<Object>(v_);
}
Object& Value::as_object() {
  if (!is_object()) wrong_type("object", type());
  return std::get<Object>(v_);
}

const Value* Value::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& [k, v] : std::get<Object>(v_))
    if (k == key) return &v;
  return nullptr;
}

const Value& Value::at(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) {
    if (!is_object()) wrong_type("object", type());
    TD_ERROR("JSON: missing key \"", key, "\"");
  }
  return *v;
}

Value& Value::set(std::string key, Value v) {
  if (is_null()) v_ = Object{};
  Object& o = as_object();
  for (auto& [k, old] : o) {
    if (k == key) {
      old = std::move(v);
      return old;
    }
  }
  o.emplace_back(std::move(key), std::move(v));
  return o.back().second;
}

Value& Value::push_back(Value v) {
  if (is_null()) v_ = Array{};
  Array& a = as_array();
  a.push_back(std::move(v));
  return a.back();
}

size_t Value::size() const {
  if (is_array()) return std::get<Array>(v_).size();
  if (is_object()) return std::get<Object>(v_).size();
  return 0;
}

// ---- parser ----

namespace {

// Note [Strict parser]: a recursive-descent parser over a string_view. Every read is bounds
// checked through peek()/at_end(), so malformed input can only end in fail(), never in an
// out-of-bounds read; nesting is capped at kMaxDepth so hostile input cannot overflow the stack.
class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (!at_end()) fail("unexpected trailing character ", quoted(s_[pos_]));
    return v;
  }

 private:
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  template <typename... Args>
  [[noreturn]] void fail_at(size_t pos, const Args&... args) const {
    TD_ERROR("JSON: ", args..., " at byte ", pos);
  }
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    fail_at(pos_, args...);
  }
  static std::string quoted(char c) {
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
    static const char* hex = "0123456789abcdef";
    return std::string("byte 0x") + hex[u >> 4] + hex[u & 15];
  }

  void skip_ws() {
    while (!at_end()) {
      char c = s_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail("invalid literal (expected '", lit, "')");
    pos_ += lit.size();
  }

  Value parse_value(int depth) {
    if (at_end()) fail("unexpected end of input (expected a value)");
    switch (peek()) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return Value(parse_string());
      case 't':
        expect_literal("true");
        return Value(true);
      case 'f':
        expect_literal("false");
        return Value(false);
      case 'n':
        expect_literal("null");
        return Value();
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
        fail("unexpected character ", quoted(peek()), " (expected a value)");
    }
  }

  void check_depth(int depth) const {
    if (depth > kMaxDepth) fail("nesting deeper than ", kMaxDepth);
  }

  Value parse_object(int depth) {
    check_depth(depth);
    ++pos_;  // '{'
    Object obj;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return Value(std::move(obj));
    }
    while (true) {
      skip_ws();
      if (peek() != '"') {
        if (at_end()) fail("unexpected end of input in object (expected a key)");
        fail("expected a string key in object, got ", quoted(peek()));
      }
      size_t key_pos = pos_;
      std::string key = parse_string();
      for (const auto& kv : obj)
        if (kv.first == key) fail_at(key_pos, "duplicate key \"", key, "\"");
      skip_ws();
      if (peek() != ':') {
        if (at_end()) fail("unexpected end of input in object (expected ':')");
        fail("expected ':' after key \"", key, "\", got ", quoted(peek()));
      }
      ++pos_;
      skip_ws();
      Value v = parse_value(depth);
      obj.emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return Value(std::move(obj));
      }
      if (at_end()) fail("unexpected end of input in object (expected ',' or '}')");
      fail("expected ',' or '}' in object, got ", quoted(peek()));
    }
  }

  Value parse_array(int depth) {
    check_depth(depth);
    ++pos_;  // '['
    Array arr;
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return Value(std::move(arr));
    }
    while (true) {
      skip_ws();
      arr.push_back(parse_value(depth));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return Value(std::move(arr));
      }
      if (at_end()) fail("unexpected end of input in array (expected ',' or ']')");
      fail("expected ',' or ']' in array, got ", quoted(peek()));
    }
  }

  Value parse_number() {
    const size_t start = pos_;
    auto digit = [&] { return !at_end() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    if (peek() == '-') ++pos_;
    if (!digit()) fail("expected a digit in number");
    if (peek() == '0') {
      ++pos_;
      if (digit()) fail_at(start, "leading zero in number");
    } else {
      while (digit()) ++pos_;
    }
    bool is_integer = true;
    if (peek() == '.') {
      is_integer = false;
      ++pos_;
      if (!digit()) fail("expected a digit after '.' in number");
      while (digit()) ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      is_integer = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digit()) fail("expected a digit in exponent");
      while (digit()) ++pos_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (is_integer) {
      int64_t i = 0;
      auto [p, ec] = std::from_chars(first, last, i);
      if (ec == std::errc() && p == last) return Value(i);
      // Out of int64 range: kept as a double (as Python's json would give a big int, we give the
      // nearest double rather than failing; callers needing an exact integer see a Double).
    }
    double d = 0.0;
    auto [p, ec] = std::from_chars(first, last, d);
    if (ec == std::errc::result_out_of_range) {
      // from_chars leaves d unset here; strtod (same grammar for this validated text) gives the
      // correctly rounded subnormal or signed zero on underflow and +-HUGE_VAL on overflow.
      std::string copy(first, last);
      d = std::strtod(copy.c_str(), nullptr);
      if (std::isinf(d)) fail_at(start, "number out of range");
      return Value(d);
    }
    if (ec != std::errc() || p != last) fail_at(start, "invalid number");
    return Value(d);
  }

  unsigned parse_hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_];
      unsigned d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        fail("invalid hex digit ", quoted(c), " in \\u escape");
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // Validates one UTF-8 sequence starting at pos_ (RFC 3629: no overlongs, no surrogates,
  // <= U+10FFFF) and appends it.
  void copy_utf8(std::string& out) {
    const size_t start = pos_;
    auto b0 = static_cast<unsigned char>(s_[pos_]);
    int len;
    uint32_t cp;
    if (b0 < 0x80) {
      out += static_cast<char>(b0);
      ++pos_;
      return;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2;
      cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3;
      cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4;
      cp = b0 & 0x07;
    } else {
      fail("invalid UTF-8 lead byte in string");
    }
    if (s_.size() - pos_ < static_cast<size_t>(len)) fail("truncated UTF-8 sequence in string");
    for (int i = 1; i < len; ++i) {
      auto b = static_cast<unsigned char>(s_[pos_ + i]);
      if ((b & 0xC0) != 0x80) fail_at(pos_ + i, "invalid UTF-8 continuation byte in string");
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len]) fail("overlong UTF-8 sequence in string");
    if (cp >= 0xD800 && cp <= 0xDFFF) fail("UTF-8 encoded surrogate in string");
    if (cp > 0x10FFFF) fail("UTF-8 code point beyond U+10FFFF in string");
    out.append(s_.substr(start, len));
    pos_ += len;
  }

  std::string parse_string() {
    const size_t start = pos_;
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail_at(start, "unterminated string");
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("unescaped control character in string");
      if (c != '\\') {
        copy_utf8(out);
        continue;
      }
      const size_t esc = pos_;
      ++pos_;
      if (at_end()) fail_at(start, "unterminated string");
      char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(esc, "lone low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") fail_at(esc, "lone high surrogate in \\u escape");
            pos_ += 2;
            uint32_t lo = parse_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF)
              fail_at(esc, "high surrogate not followed by a low surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail_at(esc, "invalid escape '\\", e, "' in string");
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// ---- writer ----

void dump_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out += hex[u >> 4];
          out += hex[u & 15];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void dump_double(std::string& out, double d) {
  TD_CHECK(std::isfinite(d), "JSON: cannot write non-finite number ", d,
           " (NaN and Infinity are not JSON)");
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  TD_CHECK(ec == std::errc(), "JSON: failed to format number ", d);
  std::string_view txt(buf, p - buf);
  out += txt;
  // Keep the Double type on the way back: "1" -> "1.0" (exponent forms already read as Double).
  if (txt.find_first_of(".eE") == std::string_view::npos) out += ".0";
}

void dump_value(std::string& out, const Value& v, int indent, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent) * lvl, ' ');
  };
  switch (v.type()) {
    case Type::Null:
      out += "null";
      return;
    case Type::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Type::Int:
      out += std::to_string(v.as_int());
      return;
    case Type::Double:
      dump_double(out, v.as_double());
      return;
    case Type::String:
      dump_string(out, v.as_string());
      return;
    case Type::Array: {
      const Array& a = v.as_array();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) out += ',';
        if (indent >= 0) newline(level + 1);
        dump_value(out, a[i], indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += ']';
      return;
    }
    case Type::Object: {
      const Object& o = v.as_object();
      if (o.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < o.size(); ++i) {
        if (i > 0) out += ',';
        if (indent >= 0) newline(level + 1);
        dump_string(out, o[i].first);
        out += indent >= 0 ? ": " : ":";
        dump_value(out, o[i].second, indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += '}';
      return;
    }
  }
}

}  // namespace

Value parse(std::string_view text) {
  return Parser(text).parse_document();
}

std::string dump(const Value& v, int indent) {
  std::string out;
  dump_value(out, v, indent, 0);
  return out;
}

}  // namespace td::json
