#pragma once
// td::json: a small, strict JSON value, parser and writer (RFC 8259) for the file formats the
// library reads and writes itself (safetensors headers, Hugging Face config.json).
//
// What it promises:
//   - Integers and floating-point numbers stay apart: a number written without a fraction or an
//     exponent that fits int64 is an Int; every other number is a Double.
//   - Objects keep their keys in insertion (file) order; a duplicate key is a parse error.
//   - The parser never crashes on malformed input: every error is a td::Error "JSON: <what> at
//     byte <offset>" (the offset of the offending byte in the input). Invalid UTF-8, control
//     characters in strings, lone surrogates, trailing commas, leading zeros, NaN/Infinity,
//     trailing garbage and nesting deeper than kMaxDepth are all errors.
//   - dump() writes compact JSON (indent < 0) or pretty JSON in Python's json.dumps(indent=n)
//     layout; doubles use the shortest text that reads back to the same bits (always with a '.'
//     or an exponent, so they read back as Double). Non-ASCII text is written as UTF-8.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace td::json {

inline constexpr int kMaxDepth = 256;

class Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order

enum class Type { Null, Bool, Int, Double, String, Array, Object };
const char* type_name(Type t);

class Value {
 public:
  Value() = default;  // null
  Value(std::nullptr_t) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(long i) : v_(static_cast<int64_t>(i)) {}
  Value(long long i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::move(a)) {}
  Value(Object o) : v_(std::move(o)) {}

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_null() const { return type() == Type::Null; }
  bool is_bool() const { return type() == Type::Bool; }
  bool is_int() const { return type() == Type::Int; }
  bool is_double() const { return type() == Type::Double; }
  bool is_number() const { return is_int() || is_double(); }
  bool is_string() const { return type() == Type::String; }
  bool is_array() const { return type() == Type::Array; }
  bool is_object() const { return type() == Type::Object; }

  // Checked accessors: the wrong type is a td::Error naming the expected and actual types.
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;  // an Int converts
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Object access. find: nullptr when absent (or not an object). at: td::Error when absent.
  const Value* find(std::string_view key) const;
  const Value& at(std::string_view key) const;
  // Sets key (replacing an existing value in place, else appending); makes a null an object.
  Value& set(std::string key, Value v);
  // Array append; makes a null an array.
  Value& push_back(Value v);
  size_t size() const;  // elements of an array / members of an object; 0 otherwise

  // Structural equality (Int 1 != Double 1.0; object member order matters).
  bool operator==(const Value& o) const { return v_ == o.v_; }

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object> v_;
};

// Parses exactly one JSON value (surrounding whitespace allowed).
Value parse(std::string_view text);

// Serializes v. indent < 0: compact ("," and ":" without spaces, like serde_json); indent >= 0:
// Python's json.dumps(v, indent=indent) layout (", " -> ",\n", ": " after keys).
std::string dump(const Value& v, int indent = -1);

}  // namespace td::json
