#include "tardelli/core/json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>

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

// ---- parser and writer: nlohmann/json (Debian's nlohmann-json3-dev) ----
//
// Note [JSON through nlohmann]: the lexing, UTF-8 validation, number conversion and the output
// formatting are nlohmann/json's (a maintained, fuzzed library); this file keeps td::json::Value
// (the project's small value type, with the promises of json.h) and adds what nlohmann does not
// enforce: duplicate keys are errors, nesting is capped at kMaxDepth, integers beyond int64 are
// Doubles, non-finite numbers are not written. Parsing goes through nlohmann's SAX interface
// (an iterative parser: no recursion, so no stack to overflow) straight into Values; writing
// converts to nlohmann::ordered_json (insertion order) and dumps with strict UTF-8 checking.

namespace {

using NJson = nlohmann::ordered_json;

// Builds a Value from nlohmann's SAX events; records the first error (td::json's own checks
// return false, which stops nlohmann's parser).
class Builder {
 public:
  using number_integer_t = NJson::number_integer_t;
  using number_unsigned_t = NJson::number_unsigned_t;
  using number_float_t = NJson::number_float_t;
  using string_t = NJson::string_t;
  using binary_t = NJson::binary_t;

  bool null() { return put(Value()); }
  bool boolean(bool b) { return put(Value(b)); }
  bool number_integer(number_integer_t i) { return put(Value(static_cast<int64_t>(i))); }
  bool number_unsigned(number_unsigned_t u) {
    // Beyond int64: the nearest double (one rounding, from the exact integer).
    if (u > static_cast<number_unsigned_t>(std::numeric_limits<int64_t>::max()))
      return put(Value(static_cast<double>(u)));
    return put(Value(static_cast<int64_t>(u)));
  }
  bool number_float(number_float_t d, const string_t& /*text*/) { return put(Value(d)); }
  bool string(string_t& s) { return put(Value(std::move(s))); }
  bool binary(binary_t& /*b*/) { return fail("binary values are not JSON"); }
  bool start_object(std::size_t /*n*/) { return open(Value(Object{})); }
  bool key(string_t& k) {
    if (!keys_.back().insert(k).second) return fail("duplicate key \"" + k + "\" in an object");
    key_ = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t /*n*/) { return open(Value(Array{})); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) {
    // "[json.exception.parse_error.101] parse error at line 1, column 4: ..." -> the part after
    // the tag, and the byte offset (nlohmann counts the bytes read, the offending one last).
    std::string what = ex.what();
    if (const auto e = what.find("] "); what.rfind("[json.exception.", 0) == 0 && e != what.npos)
      what = what.substr(e + 2);
    // The message quotes the bytes last read: bytes that are not printable ASCII are written as
    // \xNN, so the text stays valid UTF-8 whatever the input held.
    std::string text;
    for (const char c : what) {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && u < 0x7f) {
        text += c;
      } else {
        static const char* hex = "0123456789abcdef";
        text += "\\x";
        text += hex[u >> 4];
        text += hex[u & 15];
      }
    }
    return fail(text + " at byte " + std::to_string(position > 0 ? position - 1 : 0));
  }

  Value take() { return std::move(root_); }
  const std::string& error() const { return error_; }

 private:
  bool fail(std::string what) {
    if (error_.empty()) error_ = std::move(what);
    return false;
  }
  // Places v in the open container (or as the root); returns where it went.
  Value* place(Value v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Value& top = *stack_.back();
    if (top.is_array()) return &top.push_back(std::move(v));
    Object& o = top.as_object();
    o.emplace_back(std::move(key_), std::move(v));
    return &o.back().second;
  }
  bool put(Value v) {
    place(std::move(v));
    return true;
  }
  bool open(Value container) {
    if (stack_.size() >= static_cast<size_t>(kMaxDepth))
      return fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    stack_.push_back(place(std::move(container)));
    keys_.emplace_back();
    return true;
  }
  bool close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  Value root_;
  std::vector<Value*> stack_;  // the open containers (pointers stay valid: only the innermost
                               // container grows, and the outer ones hold it by its slot)
  std::vector<std::unordered_set<std::string>> keys_;  // keys seen per open container
  std::string key_;
  std::string error_;
};

NJson to_nlohmann(const Value& v) {
  switch (v.type()) {
    case Type::Null:
      return nullptr;
    case Type::Bool:
      return v.as_bool();
    case Type::Int:
      return v.as_int();
    case Type::Double: {
      const double d = v.as_double();
      TD_CHECK(std::isfinite(d), "JSON: cannot write non-finite number ", d,
               " (NaN and Infinity are not JSON)");
      return d;
    }
    case Type::String:
      return v.as_string();
    case Type::Array: {
      NJson a = NJson::array();
      for (const Value& x : v.as_array()) a.push_back(to_nlohmann(x));
      return a;
    }
    case Type::Object: {
      // Appended in order (ordered_json's operator[] would search the keys: quadratic).
      NJson o = NJson::object();
      auto& members = o.get_ref<NJson::object_t&>();
      for (const auto& [k, x] : v.as_object()) members.emplace_back(k, to_nlohmann(x));
      return o;
    }
  }
  return nullptr;
}

}  // namespace

Value parse(std::string_view text) {
  // nlohmann's lexer reads a NUL byte as the end of the input (for C strings), which would
  // accept "1\0garbage"; JSON allows no raw NUL anywhere (outside strings it is not whitespace,
  // inside it is an unescaped control character).
  if (const size_t nul = text.find('\0'); nul != text.npos)
    TD_ERROR("JSON: NUL byte (0x00) at byte ", nul, ": not allowed in JSON text");
  Builder b;
  const bool ok = NJson::sax_parse(text, &b, nlohmann::detail::input_format_t::json,
                                   /*strict=*/true, /*ignore_comments=*/false);
  if (!ok || !b.error().empty())
    TD_ERROR("JSON: ", b.error().empty() ? std::string("invalid document") : b.error());
  return b.take();
}

std::string dump(const Value& v, int indent) {
  const NJson j = to_nlohmann(v);
  try {
    // indent < 0: compact; else Python's json.dumps(indent=n) layout. Strict: invalid UTF-8 in a
    // string is an error, not replaced.
    return j.dump(indent < 0 ? -1 : indent, ' ', /*ensure_ascii=*/false,
                  NJson::error_handler_t::strict);
  } catch (const NJson::exception& e) {
    TD_ERROR("JSON: cannot write: ", e.what());
  }
}

}  // namespace td::json
