// td::json: the strict parser and the writer used by the safetensors and HF config formats.
#include "tardelli/core/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "tardelli/core/error.h"

namespace {

using td::json::Array;
using td::json::dump;
using td::json::Object;
using td::json::parse;
using td::json::Type;
using td::json::Value;

// The error text of parse(s) ("" when it parses).
std::string parse_error(std::string_view s) {
  try {
    parse(s);
  } catch (const td::Error& e) {
    return e.what();
  }
  return "";
}

// Property: scalars parse to the right type; integers and doubles stay apart.
TEST(Json, Scalars) {
  EXPECT_TRUE(parse("null").is_null());
  EXPECT_EQ(parse("true").as_bool(), true);
  EXPECT_EQ(parse(" false ").as_bool(), false);
  EXPECT_EQ(parse("0").type(), Type::Int);
  EXPECT_EQ(parse("-0").as_int(), 0);
  EXPECT_EQ(parse("42").as_int(), 42);
  EXPECT_EQ(parse("-9223372036854775808").as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(parse("9223372036854775807").as_int(), std::numeric_limits<int64_t>::max());
  // Beyond int64: the nearest double.
  EXPECT_EQ(parse("9223372036854775808").type(), Type::Double);
  EXPECT_EQ(parse("9223372036854775808").as_double(), 9223372036854775808.0);
  EXPECT_EQ(parse("1.0").type(), Type::Double);
  EXPECT_EQ(parse("1e2").type(), Type::Double);
  EXPECT_EQ(parse("1e2").as_double(), 100.0);
  EXPECT_EQ(parse("-2.5E-3").as_double(), -2.5e-3);
  EXPECT_EQ(parse("1e-05").as_double(), 1e-05);
  // Subnormals and underflow round like strtod (no error); signed zero survives.
  EXPECT_EQ(parse("4.9406564584124654e-324").as_double(),
            std::numeric_limits<double>::denorm_min());
  EXPECT_EQ(parse("1e-400").as_double(), 0.0);
  EXPECT_TRUE(std::signbit(parse("-1e-400").as_double()));
  // An Int converts to double, a Double is not an int.
  EXPECT_EQ(parse("3").as_double(), 3.0);
  EXPECT_THROW(parse("3.0").as_int(), td::Error);
  EXPECT_THROW(parse("\"x\"").as_int(), td::Error);
}

// Property: every escape decodes, \u escapes (with surrogate pairs) become UTF-8, raw UTF-8 is
// kept; the writer escapes what JSON requires and round-trips.
TEST(Json, Strings) {
  EXPECT_EQ(parse(R"("a\"b\\c\/d\b\f\n\r\t")").as_string(), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(parse(R"("\u0041\u00e9\u20ac")").as_string(), "A\xc3\xa9\xe2\x82\xac");
  EXPECT_EQ(parse(R"("\ud83d\ude00")").as_string(), "\xf0\x9f\x98\x80");  // U+1F600
  EXPECT_EQ(parse("\"\xf0\x9f\x98\x80 \xc3\xa9\"").as_string(), "\xf0\x9f\x98\x80 \xc3\xa9");
  EXPECT_EQ(parse(R"("\u0000")").as_string(), std::string(1, '\0'));
  std::string all;
  for (int c = 1; c < 128; ++c) all += static_cast<char>(c);
  all += "\xc3\xa9\xf0\x9f\x98\x80";
  all += '\0';
  std::string text = dump(Value(all));
  EXPECT_EQ(parse(text).as_string(), all);
  EXPECT_EQ(dump(Value("a\"\n\x01")), R"("a\"\n\u0001")");
}

// Property: objects keep file order, find/at/set behave, arrays nest; compact output is
// serde_json's and pretty output is Python's json.dumps(indent=2) layout.
TEST(Json, ContainersAndWriter) {
  Value v = parse(R"( {"z": 1, "a": [1, 2.5, "s", null, true, {}, []], "m": {"k": -3}} )");
  ASSERT_TRUE(v.is_object());
  const Object& o = v.as_object();
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(o[0].first, "z");
  EXPECT_EQ(o[1].first, "a");
  EXPECT_EQ(o[2].first, "m");
  EXPECT_EQ(v.at("m").at("k").as_int(), -3);
  EXPECT_EQ(v.find("nope"), nullptr);
  EXPECT_THROW(v.at("nope"), td::Error);
  EXPECT_EQ(v.at("a").size(), 7u);
  EXPECT_EQ(dump(v), R"({"z":1,"a":[1,2.5,"s",null,true,{},[]],"m":{"k":-3}})");
  EXPECT_EQ(dump(v, 2),
            "{\n  \"z\": 1,\n  \"a\": [\n    1,\n    2.5,\n    \"s\",\n    null,\n    true,\n"
            "    {},\n    []\n  ],\n  \"m\": {\n    \"k\": -3\n  }\n}");
  EXPECT_EQ(parse(dump(v, 2)), v);
  EXPECT_EQ(parse(dump(v)), v);

  Value b;
  b.set("x", 1);
  b.set("y", Array{});
  b.set("x", 2.0);  // replaces in place, keeps order
  b.set("y", Value()).push_back("q");
  EXPECT_EQ(dump(b), R"({"x":2.0,"y":["q"]})");
}

// Property: doubles print as the shortest text that reads back to the same bits, always as a
// Double; non-finite numbers are refused.
TEST(Json, DoubleRoundTrip) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    if (!std::isfinite(d)) continue;
    Value back = parse(dump(Value(d)));
    ASSERT_TRUE(back.is_double());
    uint64_t bits2;
    double d2 = back.as_double();
    std::memcpy(&bits2, &d2, sizeof d2);
    EXPECT_EQ(bits, bits2) << dump(Value(d));
  }
  EXPECT_EQ(dump(Value(1e-5)), "1e-05");
  EXPECT_EQ(dump(Value(0.02)), "0.02");
  EXPECT_EQ(dump(Value(1.0)), "1.0");
  EXPECT_THROW(dump(Value(std::nan(""))), td::Error);
  EXPECT_THROW(dump(Value(INFINITY)), td::Error);
}

// Property: each malformed document is a td::Error that says what is wrong (nlohmann/json's
// wording: Note [JSON through nlohmann]) and at which byte (0-based offset of the byte where the
// parser stopped); the text is valid UTF-8 even when the input is not.
TEST(Json, ErrorsNameTheByteOffset) {
  struct Case {
    std::string_view text;
    const char* what;
    int byte;  // -1: not reported (td::json's own checks)
  };
  const Case cases[] = {
      {"", "unexpected end of input", 0},
      {"   ", "unexpected end of input", 3},
      {"{\"a\":1,}", "while parsing object key - unexpected '}'; expected string literal", 7},
      {"[1,]", "unexpected ']'", 3},
      {"[1 2]", "while parsing array - unexpected number literal; expected ']'", 3},
      {"{\"a\" 1}", "expected ':'", 5},
      {"{\"a\":1,\"a\":2}", "duplicate key \"a\"", -1},
      {"{\"b\":{\"a\":1,\"a\":2}}", "duplicate key \"a\"", -1},
      {"01", "expected end of input", 1},
      {"-", "expected digit after '-'", 1},
      {"1.", "expected digit after '.'", 2},
      {"1e", "expected '+', '-', or digit after exponent", 2},
      {"+1", "invalid literal; last read: '+'", 0},
      {"NaN", "invalid literal; last read: 'N'", 0},
      {"Infinity", "invalid literal; last read: 'I'", 0},
      {"1e400", "number overflow parsing '1e400'", 4},
      {"tru", "invalid literal; last read: 'tru'", 3},
      {"nul", "invalid literal; last read: 'nul'", 3},
      {"1 2", "expected end of input", 2},
      {"\"abc", "missing closing quote", 4},
      {"\"a\\x\"", "forbidden character after backslash", 3},
      {"\"\\u12zz\"", "must be followed by 4 hex digits", 5},
      {"\"\\u12", "must be followed by 4 hex digits", 5},
      {"\"\\ud800\"", "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF", 7},
      {"\"\\udc00\"", "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF", 6},
      {"\"\\ud800\\u0041\"", "must be followed by U+DC00..U+DFFF", 12},
      {"\"a\tb\"", "control character U+0009 (HT) must be escaped", 2},
      {"\"\xff\"", "ill-formed UTF-8 byte; last read: '\"\\xff'", 1},
      {"\"\xc3", "ill-formed UTF-8 byte", 2},
      {"\"\xc3(\"", "ill-formed UTF-8 byte", 2},
      {"\"\xc0\xaf\"", "ill-formed UTF-8 byte", 1},          // overlong
      {"\"\xed\xa0\x80\"", "ill-formed UTF-8 byte", 2},      // an encoded surrogate
      {"\"\xf4\x90\x80\x80\"", "ill-formed UTF-8 byte", 2},  // beyond U+10FFFF
      {"{1:2}", "while parsing object key - unexpected number literal", 1},
      {"[", "unexpected end of input", 1},
      {"{", "while parsing object key - unexpected end of input", 1},
      {"{\"a\":1", "while parsing object - unexpected end of input; expected '}'", 6},
      {std::string_view("1\0", 2), "NUL byte (0x00)", 1},
      {std::string_view("[1]\0garbage", 11), "NUL byte (0x00)", 3},
      {std::string_view("\"a\0\"", 4), "NUL byte (0x00)", 2},
  };
  for (const auto& c : cases) {
    const std::string err = parse_error(c.text);
    EXPECT_EQ(err.rfind("JSON: ", 0), 0u) << err;
    EXPECT_NE(err.find(c.what), std::string::npos)
        << "input: " << c.text << "\nerror: " << err << "\nexpected to contain: " << c.what;
    if (c.byte >= 0) {
      EXPECT_NE(err.find(" at byte " + std::to_string(c.byte)), std::string::npos)
          << "input: " << c.text << "\nerror: " << err;
    }
    for (const char ch : err) EXPECT_LT(static_cast<unsigned char>(ch), 0x80) << err;
  }
}

// Property: nesting is capped (a deep document is an error, not a stack overflow).
TEST(Json, DepthLimit) {
  std::string ok(td::json::kMaxDepth, '[');
  ok += std::string(td::json::kMaxDepth, ']');
  EXPECT_NO_THROW(parse(ok));
  std::string deep(100000, '[');
  EXPECT_NE(parse_error(deep).find("nesting deeper than"), std::string::npos);
  std::string deep_obj;
  for (int i = 0; i < 1000; ++i) deep_obj += "{\"a\":";
  EXPECT_NE(parse_error(deep_obj).find("nesting deeper than"), std::string::npos);
}

// Property (fuzz): random byte strings, and random mutations and truncations of a valid
// document, either parse or raise td::Error; nothing else escapes (no crash, no other
// exception). When a mutant parses, dump/parse round-trips it.
TEST(Json, FuzzNeverCrashes) {
  const std::string seed_doc =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],)"
      R"("data_offsets":[0,24]},"s":"\u00e9\ud83d\ude00\n","x":[1.5e-3,-0,true,null]})";
  ASSERT_NO_THROW(parse(seed_doc));
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\",:\\/0123456789-+.eEtrufalsn \t\nu\x80\xc3\xff";
  int parsed = 0, errors = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s;
    if (iter % 3 == 0) {
      s.resize(rng() % 40);
      for (char& c : s) c = alphabet[rng() % alphabet.size()];
    } else if (iter % 3 == 1) {
      s = seed_doc;
      int n = 1 + rng() % 4;
      for (int k = 0; k < n; ++k) s[rng() % s.size()] = static_cast<char>(rng() % 256);
    } else {
      s = seed_doc.substr(0, rng() % seed_doc.size());
    }
    try {
      Value v = parse(s);
      ++parsed;
      EXPECT_EQ(parse(dump(v)), v) << s;
    } catch (const td::Error&) {
      ++errors;
    }
  }
  // Both outcomes occur, so the fuzz exercises the error paths and the success path.
  EXPECT_GT(parsed, 0);
  EXPECT_GT(errors, 10000);
}

}  // namespace
