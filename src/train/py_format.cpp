#include "py_format.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <system_error>

namespace td::train::py {

std::string str(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  // The shortest round-trip digits, then Python's layout (float_repr_style 'short').
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(r.ptr - buf));  // "-1.25e-05", "0e+00"
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e)) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string_view exp_text = s.substr(e + 1);
  const bool exp_negative = exp_text.front() == '-';
  exp_text.remove_prefix(1);  // the sign
  int exp = 0;
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exp);
  if (exp_negative) exp = -exp;
  const auto n = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min(n, exp + 1));
      int_part.append(static_cast<size_t>(std::max(0, exp + 1 - n)), '0');
      out += int_part;
      out += '.';
      out += n > exp + 1 ? digits.substr(static_cast<size_t>(exp + 1)) : "0";
    } else {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    }
  } else {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out += digits.substr(1);
    }
    char e_buf[16];
    std::snprintf(e_buf, sizeof e_buf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e_buf;
  }
  return out;
}

std::string repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      out += c;  // printable ASCII and UTF-8 bytes (Python prints printable non-ASCII as is)
    }
  }
  out += quote;
  return out;
}

const char* str(bool b) {
  return b ? "True" : "False";
}

std::string repr(const json::Value& v) {
  switch (v.type()) {
    case json::Type::Null:
      return "None";
    case json::Type::Bool:
      return str(v.as_bool());
    case json::Type::Int:
      return std::to_string(v.as_int());
    case json::Type::Double:
      return str(v.as_double());
    case json::Type::String:
      return repr(std::string_view(v.as_string()));
    case json::Type::Array: {
      std::string out = "[";  // (not "[" + join(...): GCC 12's -Wrestrict false positive)
      out += join(", ", v.as_array(), [](const json::Value& x) { return repr(x); });
      return out + "]";
    }
    case json::Type::Object: {
      std::string out = "{";
      out += join(", ", v.as_object(), [](const auto& kv) {
        std::string item = repr(std::string_view(kv.first));
        item += ": ";
        return item + repr(kv.second);
      });
      return out + "}";
    }
  }
  return "?";
}

std::string_view strip(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\v\f\r";
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Appends the digits of a run "d(_?d)*" starting at s[i] to out (without the '_') and returns
// the index after it; i itself when s[i] is not a digit or a '_' is misplaced (then *ok = false).
size_t digit_part(std::string_view s, size_t i, std::string& out, bool* ok) {
  const size_t start = i;
  while (i < s.size() && is_digit(s[i])) {
    out += s[i++];
    if (i + 1 < s.size() && s[i] == '_' && is_digit(s[i + 1])) ++i;
  }
  if (i < s.size() && s[i] == '_') *ok = false;  // "1_", "1__0"
  return i == start ? start : i;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
  }
  return true;
}

}  // namespace

std::optional<int64_t> parse_int(std::string_view s) {
  s = strip(s);
  std::string text;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    if (s[i] == '-') text += '-';
    ++i;
  }
  bool ok = true;
  const size_t end = digit_part(s, i, text, &ok);
  if (!ok || end == i || end != s.size()) return std::nullopt;
  int64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_float(std::string_view s) {
  s = strip(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (iequals(s, "inf") || iequals(s, "infinity")) {
    return negative ? -HUGE_VAL : HUGE_VAL;
  }
  if (iequals(s, "nan")) return std::nan("");
  // digitpart ["." [digitpart]] | "." digitpart, then [eE] [sign] digitpart.
  std::string text = negative ? "-" : "";
  bool ok = true;
  size_t i = digit_part(s, 0, text, &ok);
  const bool int_digits = i > 0;
  bool frac_digits = false;
  if (i < s.size() && s[i] == '.') {
    text += '.';
    const size_t j = digit_part(s, i + 1, text, &ok);
    frac_digits = j > i + 1;
    i = j;
  }
  if (!ok || (!int_digits && !frac_digits)) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    text += 'e';
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) text += s[i++];
    const size_t j = digit_part(s, i, text, &ok);
    if (!ok || j == i) return std::nullopt;
    i = j;
  }
  if (i != s.size()) return std::nullopt;
  double v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec == std::errc::result_out_of_range) {
    return std::strtod(text.c_str(), nullptr);  // +-inf or +-0 as Python gives (HUGE_VAL / 0)
  }
  if (r.ec != std::errc() || r.ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace td::train::py
