// Reading a TrainConfig: the TOML file (toml++) and the command line (argparse's rules).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

// Note [TOML through toml++]: Debian's libtomlplusplus-dev, used header-only (TOML_HEADER_ONLY,
// the library's default) and privately, in this file alone: libtardelli.so needs no toml++ at
// run time and its headers expose none of it. (The package's CMake target would link
// libtomlplusplus.so.3, one more shared library for every machine that runs us.) Its inline
// functions get hidden visibility: cmake/tardelli.map exports every symbol whose name holds
// "td::", "std::" included, and a toml++ symbol exported from libtardelli could bind to (or be
// bound by) another toml++ loaded in the same process.
#define TOML_HEADER_ONLY 1
#pragma GCC visibility push(hidden)
#include <toml++/toml.h>
#pragma GCC visibility pop

#include "py_format.h"
#include "tardelli/train/train_config.h"

namespace td::train {

namespace {

constexpr std::string_view kDescription = "Train a GPT (see docs/training.md).";

// ---- TOML ----

std::string tz_repr(int minutes) {
  // Python's repr of the tzinfo tomllib attaches: timezone.utc or timezone(timedelta(...)).
  if (minutes == 0) return "datetime.timezone.utc";
  const long seconds = minutes * 60L;
  const long days = seconds < 0 ? -1 : 0;  // timedelta normalizes to days >= -1, 0 <= seconds
  const long rest = seconds - days * 86400;
  std::string td =
      days ? "days=-1, seconds=" + std::to_string(rest) : "seconds=" + std::to_string(rest);
  return "datetime.timezone(datetime.timedelta(" + td + "))";
}

std::string time_repr_args(const toml::time& t) {
  std::string out = std::to_string(t.hour) + ", " + std::to_string(t.minute);
  const uint32_t micro = t.nanosecond / 1000;
  if (micro) {
    out += ", " + std::to_string(t.second) + ", " + std::to_string(micro);
  } else if (t.second) {
    out += ", " + std::to_string(t.second);
  }
  return out;
}

std::string date_repr_args(const toml::date& d) {
  return std::to_string(d.year) + ", " + std::to_string(d.month) + ", " + std::to_string(d.day);
}

// Python's repr of the value tomllib gives for node (for "must be int, got ...").
std::string toml_repr(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return py::repr(std::string_view(node.as_string()->get()));
    case toml::node_type::integer:
      return std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point:
      return py::str(node.as_floating_point()->get());
    case toml::node_type::boolean:
      return py::str(node.as_boolean()->get());
    case toml::node_type::date:
      return "datetime.date(" + date_repr_args(node.as_date()->get()) + ")";
    case toml::node_type::time:
      return "datetime.time(" + time_repr_args(node.as_time()->get()) + ")";
    case toml::node_type::date_time: {
      const toml::date_time& dt = node.as_date_time()->get();
      std::string out =
          "datetime.datetime(" + date_repr_args(dt.date) + ", " + time_repr_args(dt.time);
      if (dt.offset) out += ", tzinfo=" + tz_repr(dt.offset->minutes);
      return out + ")";
    }
    case toml::node_type::array: {
      std::string out = "[";
      for (const toml::node& x : *node.as_array())
        out += (out.size() > 1 ? ", " : "") + toml_repr(x);
      return out + "]";
    }
    case toml::node_type::table: {
      std::string out = "{";
      for (auto&& [k, x] : *node.as_table()) {
        out += (out.size() > 1 ? ", " : "") + py::repr(k.str()) + ": " + toml_repr(x);
      }
      return out + "}";
    }
    case toml::node_type::none:
      break;
  }
  return "None";
}

// A scalar the fields can hold (string, integer, float, boolean); nullopt for the rest.
std::optional<json::Value> toml_scalar(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return json::Value(node.as_string()->get());
    case toml::node_type::integer:
      return json::Value(node.as_integer()->get());
    case toml::node_type::floating_point:
      return json::Value(node.as_floating_point()->get());
    case toml::node_type::boolean:
      return json::Value(node.as_boolean()->get());
    default:
      return std::nullopt;
  }
}

std::string known_keys() {
  std::vector<std::string_view> names;
  for (const Field& f : fields()) names.push_back(f.name);
  std::sort(names.begin(), names.end());
  return py::join(", ", names);
}

// A table's entries in file order: toml++ keeps them sorted by key, tomllib (whose order
// decides which of two bad keys config.py reports) in the order they appear.
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(
    const toml::table& table) {
  std::vector<std::pair<const toml::key*, const toml::node*>> items;
  for (auto&& [k, v] : table) items.emplace_back(&k, &v);
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    const auto& pa = a.first->source().begin;
    const auto& pb = b.first->source().begin;
    return std::pair(pa.line, pa.column) < std::pair(pb.line, pb.column);
  });
  return items;
}

std::string parse_error_text(const toml::parse_error& e) {
  return detail::str_cat(e.description(), " (at line ", e.source().begin.line, ", column ",
                         e.source().begin.column, ")");
}

// config.py's load_toml walk: tables flattened.
void walk(const toml::table& table, const std::string& where, const std::string& path,
          json::Object& flat) {
  const std::string source = "--config " + path;
  for (const auto& [k, v] : in_file_order(table)) {
    if (const toml::table* sub = v->as_table()) {
      walk(*sub, where + "[" + std::string(k->str()) + "]", path, flat);
      continue;
    }
    const Field* field = find_field(k->str());
    if (field == nullptr) {
      throw ConfigError(detail::str_cat(source, ": unknown key '", k->str(), "' in ",
                                        where.empty() ? "top level" : where,
                                        " (known: ", known_keys(), ")"));
    }
    const std::string name(field->name);
    const bool twice =
        std::any_of(flat.begin(), flat.end(), [&](const auto& kv) { return kv.first == name; });
    if (twice) throw ConfigError(detail::str_cat(source, ": key '", k->str(), "' is given twice"));
    const auto scalar = toml_scalar(*v);
    if (!scalar) {
      throw ConfigError(detail::str_cat(source, ": '", name, "' must be ",
                                        field_type_name(field->type()), ", got ", toml_repr(*v)));
    }
    TrainConfig scratch;
    field->set(scratch, *scalar, source);  // the type check and coercion
    flat.emplace_back(name, field->get(scratch));
  }
}

// ---- the command line ----

// One option string of the parser, in argparse's registration order (-h, --help, --config, the
// fields; a bool field also registers --no-<name>).
struct Option {
  std::string text;
  enum Kind { kHelp, kConfig, kField } kind;
  const Field* field = nullptr;
  bool negated = false;  // --no-<name>
};

const std::vector<Option>& options() {
  static const std::vector<Option> out = [] {
    std::vector<Option> o{
        {"-h", Option::kHelp}, {"--help", Option::kHelp}, {"--config", Option::kConfig}};
    for (const Field& f : fields()) {
      o.push_back({f.flag(), Option::kField, &f, false});
      if (f.type() == FieldType::Bool) {
        o.push_back({"--no-" + f.flag().substr(2), Option::kField, &f, true});
      }
    }
    return o;
  }();
  return out;
}

// argparse's name of an action in its errors: "-h/--help", "--synthetic-data/--no-synthetic-data".
std::string action_name(const Option& o) {
  if (o.kind == Option::kHelp) return "-h/--help";
  if (o.kind == Option::kConfig) return "--config";
  if (o.field->type() == FieldType::Bool) {
    return o.field->flag() + "/--no-" + o.field->flag().substr(2);
  }
  return o.field->flag();
}

[[noreturn]] void usage_error(const std::string& msg) {
  throw ConfigError(msg, true);
}

// An option-like argument: its option (nullptr: unknown) and the text after '=' if any.
struct OptionMatch {
  const Option* option = nullptr;
  std::optional<std::string> explicit_arg;
};

bool looks_negative_number(std::string_view s) {  // argparse: '^-\d+$|^-\d*\.\d+$'
  if (s.size() < 2 || s[0] != '-') return false;
  const std::string_view body = s.substr(1);
  const size_t dot = body.find('.');
  auto digits = [](std::string_view d) {
    return std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (dot == std::string_view::npos) return digits(body);
  return digits(body.substr(0, dot)) && dot + 1 < body.size() && digits(body.substr(dot + 1));
}

// argparse's _parse_optional: nullopt for a positional argument (or a value).
std::optional<OptionMatch> parse_optional(std::string_view arg) {
  if (arg.empty() || arg[0] != '-') return std::nullopt;
  for (const Option& o : options()) {
    if (o.text == arg) return OptionMatch{&o, std::nullopt};
  }
  if (arg.size() == 1) return std::nullopt;
  const size_t eq = arg.find('=');
  if (eq != std::string_view::npos) {
    for (const Option& o : options()) {
      if (o.text == arg.substr(0, eq)) return OptionMatch{&o, std::string(arg.substr(eq + 1))};
    }
  }
  // Unique prefixes (allow_abbrev); "-hx" is -h with the explicit argument "x".
  std::vector<OptionMatch> matches;
  if (arg.starts_with("--")) {
    const std::string_view prefix = arg.substr(0, eq);
    std::optional<std::string> explicit_arg;
    if (eq != std::string_view::npos) explicit_arg = std::string(arg.substr(eq + 1));
    for (const Option& o : options()) {
      if (o.text.starts_with(prefix)) matches.push_back({&o, explicit_arg});
    }
  } else {
    for (const Option& o : options()) {
      if (o.text == arg.substr(0, 2)) {
        matches.push_back({&o, std::string(arg.substr(2))});
      } else if (o.text.starts_with(arg)) {
        matches.push_back({&o, std::nullopt});
      }
    }
  }
  if (matches.size() > 1) {
    const std::string names = py::join(
        ", ", matches, [](const OptionMatch& m) -> std::string_view { return m.option->text; });
    usage_error(detail::str_cat("ambiguous option: ", arg, " could match ", names));
  }
  if (matches.size() == 1) return matches[0];
  if (looks_negative_number(arg)) return std::nullopt;
  if (arg.find(' ') != std::string_view::npos) return std::nullopt;
  return OptionMatch{};
}

// A flag's value as its field's type, checked against the choices (argparse's messages).
json::Value convert(const Option& o, const std::string& text) {
  const Field& f = *o.field;
  json::Value v;
  switch (f.type()) {
    case FieldType::Int: {
      const auto x = py::parse_int(text);
      if (!x)
        usage_error(
            detail::str_cat("argument ", action_name(o), ": invalid int value: ", py::repr(text)));
      v = *x;
      break;
    }
    case FieldType::Float: {
      const auto x = py::parse_float(text);
      if (!x)
        usage_error(detail::str_cat("argument ", action_name(o),
                                    ": invalid float value: ", py::repr(text)));
      v = *x;
      break;
    }
    default:
      v = text;
  }
  if (!f.choices.empty() &&
      std::find(f.choices.begin(), f.choices.end(), text) == f.choices.end()) {
    const std::string names =
        py::join(", ", f.choices, [](std::string_view c) { return py::repr(c); });
    usage_error(detail::str_cat("argument ", action_name(o), ": invalid choice: ", py::repr(text),
                                " (choose from ", names, ")"));
  }
  return v;
}

struct Args {
  std::optional<std::string> config;
  std::vector<std::pair<const Field*, json::Value>> values;  // in command-line order
};

Args parse_args(const std::vector<std::string>& argv, std::string_view prog) {
  // argparse classifies every argument first (an ambiguous prefix is an error before any value
  // is read), then consumes them left to right; "--" makes the rest positional.
  std::vector<std::optional<OptionMatch>> kinds;
  size_t dashes = argv.size();
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--") {
      dashes = i;
      break;
    }
    kinds.push_back(parse_optional(argv[i]));
  }
  Args out;
  std::vector<std::string> extras;
  for (size_t i = 0; i < dashes; ++i) {
    if (!kinds[i]) {
      extras.push_back(argv[i]);  // no positional arguments
      continue;
    }
    const OptionMatch& m = *kinds[i];
    if (m.option == nullptr) {
      extras.push_back(argv[i]);
      continue;
    }
    const Option& o = *m.option;
    if (o.kind == Option::kHelp ||
        (o.kind == Option::kField && o.field->type() == FieldType::Bool)) {
      if (m.explicit_arg) {
        // "-hh" is -h twice; anything else after -h or a bool flag is refused.
        if (o.kind != Option::kHelp || argv[i].starts_with("--") || *m.explicit_arg != "h") {
          usage_error(detail::str_cat("argument ", action_name(o), ": ignored explicit argument ",
                                      py::repr(*m.explicit_arg)));
        }
      }
      if (o.kind == Option::kHelp) throw HelpRequested(help_text(prog));
      out.values.emplace_back(o.field, json::Value(!o.negated));
      continue;
    }
    std::string value;
    if (m.explicit_arg) {
      value = *m.explicit_arg;
    } else if (i + 1 < dashes && !kinds[i + 1]) {
      value = argv[++i];
    } else {
      usage_error(detail::str_cat("argument ", action_name(o), ": expected one argument"));
    }
    if (o.kind == Option::kConfig) {
      out.config = value;
    } else {
      out.values.emplace_back(o.field, convert(o, value));
    }
  }
  for (size_t i = dashes; i < argv.size(); ++i) extras.push_back(argv[i]);
  if (!extras.empty()) {
    usage_error("unrecognized arguments: " + py::join(" ", extras));
  }
  return out;
}

// ---- help: argparse's layout at 80 columns ----

constexpr size_t kWidth = 78;       // argparse: $COLUMNS (80) - 2
constexpr size_t kHelpColumn = 24;  // argparse's max_help_position

// Greedy word wrap of text into lines of at most `width` characters.
std::vector<std::string> wrap(std::string_view text, size_t width) {
  std::vector<std::string> lines;
  std::string line;
  std::istringstream words{std::string(text)};
  std::string w;
  while (words >> w) {
    if (!line.empty() && line.size() + 1 + w.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + w;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

std::string usage_part(const Field& f) {
  if (f.type() == FieldType::Bool) return "[" + f.flag() + " | --no-" + f.flag().substr(2) + "]";
  return "[" + f.flag() + " " + f.metavar() + "]";
}

std::string help_entry(const std::string& invocation, std::string_view help) {
  std::string out = "  " + invocation;
  const auto lines = wrap(help, kWidth - kHelpColumn);
  if (invocation.size() + 2 <= kHelpColumn - 2) {
    out.append(kHelpColumn - out.size(), ' ');
  } else {
    out += "\n" + std::string(kHelpColumn, ' ');
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n" + std::string(kHelpColumn, ' ');
    out += lines[i];
  }
  return out + "\n";
}

// ---- --precision-map ----

// Python's type(x).__name__ of a JSON value.
const char* py_type_name(const json::Value& v) {
  switch (v.type()) {
    case json::Type::Null:
      return "NoneType";
    case json::Type::Bool:
      return "bool";
    case json::Type::Int:
      return "int";
    case json::Type::Double:
      return "float";
    case json::Type::String:
      return "str";
    case json::Type::Array:
      return "list";
    case json::Type::Object:
      return "dict";
  }
  return "object";
}

using Entries = std::vector<std::pair<std::string, std::string>>;

[[noreturn]] void not_a_precision(const std::string& source, const std::string& name,
                                  const std::string& repr) {
  throw ConfigError(source + ": entry '" + name +
                    "': expected a precision string (fp8, bf16 or fp32), got " + repr);
}

// Nested tables are dotted names: {"h": {"3": {"mlp": {"c_fc": "bf16"}}}} -> h.3.mlp.c_fc = bf16.
void flatten(const toml::table& table, const std::string& prefix, const std::string& source,
             Entries& out) {
  for (const auto& [k, v] : in_file_order(table)) {
    const std::string name = prefix + std::string(k->str());
    if (const toml::table* sub = v->as_table()) {
      flatten(*sub, name + ".", source, out);
    } else if (const auto* s = v->as_string()) {
      out.emplace_back(name, s->get());
    } else {
      not_a_precision(source, name, toml_repr(*v));
    }
  }
}

void flatten(const json::Value& object, const std::string& prefix, const std::string& source,
             Entries& out) {
  for (const auto& [k, v] : object.as_object()) {
    const std::string name = prefix + k;
    if (v.is_object()) {
      flatten(v, name + ".", source, out);
    } else if (v.is_string()) {
      out.emplace_back(name, v.as_string());
    } else {
      not_a_precision(source, name, py::repr(v));
    }
  }
}

}  // namespace

std::map<std::string, models::LinearPrecision> read_precision_map(const std::string& path,
                                                                  int64_t n_layer) {
  const std::string source = "--precision-map " + path;
  // Python's OSError text: "[Errno 2] No such file or directory: 'path'".
  auto os_error = [&](int err) {
    return ConfigError(
        detail::str_cat(source, ": [Errno ", err, "] ", std::strerror(err), ": ", py::repr(path)));
  };
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw os_error(EISDIR);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw os_error(errno ? errno : ENOENT);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Entries entries;
  if (path.ends_with(".toml")) {
    toml::table doc;
    try {
      doc = toml::parse(raw, path);
    } catch (const toml::parse_error& e) {
      throw ConfigError(source + ": " + parse_error_text(e));
    }
    flatten(doc, "", source, entries);
  } else {
    json::Value doc;
    try {
      doc = json::parse(raw);
    } catch (const Error& e) {
      throw ConfigError(source + ": " + e.what());
    }
    if (!doc.is_object()) {
      throw ConfigError(source + ": expected a table of linear names to precisions, got " +
                        py_type_name(doc));
    }
    flatten(doc, "", source, entries);
  }
  std::map<std::string, std::string> named;
  for (auto& [k, v] : entries) named[k] = v;  // a later duplicate wins, as in a Python dict
  try {
    return models::parse_precision_map(named, n_layer);
  } catch (const Error& e) {
    throw ConfigError(source + ": " + e.what());
  }
}

json::Object load_toml(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("--config: file not found: " + path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError("--config " + path + ": cannot be read");
  toml::table doc;
  try {
    doc = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ConfigError("--config " + path + ": not valid TOML: " + parse_error_text(e));
  }
  json::Object flat;
  walk(doc, "", path, flat);
  return flat;
}

TrainConfig read_config(const std::vector<std::string>& argv, std::string_view prog) {
  const Args args = parse_args(argv, prog);
  TrainConfig cfg;
  if (args.config) {
    for (const auto& [name, v] : load_toml(*args.config)) {
      find_field(name)->set(cfg, v, "--config " + *args.config);
    }
  }
  for (const auto& [field, v] : args.values) field->set(cfg, v, field->flag());
  return cfg;
}

int64_t data_parallel_size(const TrainConfig& cfg, int64_t world_size) {
  const int64_t mp = cfg.tp * cfg.pp * cfg.cp;
  if (mp < 1) return 1;
  if (world_size % mp != 0) {
    throw ConfigError(detail::str_cat("--tp ", cfg.tp, " x --cp ", cfg.cp, " x --pp ", cfg.pp,
                                      " does not divide the ", world_size, " ranks of this job"));
  }
  return world_size / mp;
}

TrainConfig parse_config(const std::vector<std::string>& argv, int world_size,
                         std::string_view prog) {
  return checked_config(read_config(argv, prog), world_size);
}

TrainConfig checked_config(TrainConfig cfg, int world_size) {
  if (!cfg.plan.empty()) {
    if (cfg.plan != "auto") {
      throw ConfigError("--plan: unknown value " + py::repr(cfg.plan) +
                        " (choose auto, or leave it out)");
    }
    // Note [No planner in C++]: the planner (python/tardelli/plan) searches layouts with the
    // Python cost model. The front ends resolve --plan auto with it (python -m tardelli.train
    // in process, tardelli-train through a Python child on rank 0); this parser, for custom
    // trainers, asks for the layout as flags (python -m tardelli.plan prints them).
    throw ConfigError(
        "--plan auto needs the Python planner (docs/planner.md): use tardelli-train or python "
        "-m tardelli.train, or run python -m tardelli.plan for the layout and pass its flags");
  }
  validate(cfg, data_parallel_size(cfg, world_size));
  return cfg;
}

std::string usage_text(std::string_view prog) {
  std::vector<std::string> parts{"[-h]", "[--config CONFIG]"};
  for (const Field& f : fields()) parts.push_back(usage_part(f));
  const std::string lead = "usage: " + std::string(prog) + " ";
  std::string out = lead;
  size_t column = lead.size();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i && column + 1 + parts[i].size() > kWidth) {
      out += "\n" + std::string(lead.size(), ' ');
      column = lead.size();
    } else if (i) {
      out += ' ';
      ++column;
    }
    out += parts[i];
    column += parts[i].size();
  }
  return out + "\n";
}

std::string help_text(std::string_view prog) {
  std::string out = usage_text(prog) + "\n" + std::string(kDescription) + "\n\noptions:\n";
  out += help_entry("-h, --help", "show this help message and exit");
  out += help_entry("--config CONFIG", "TOML file of defaults; flags override it");
  for (const Field& f : fields()) {
    const std::string invocation = f.type() == FieldType::Bool
                                       ? f.flag() + ", --no-" + f.flag().substr(2)
                                       : f.flag() + " " + f.metavar();
    out += help_entry(invocation, f.help);
  }
  return out;
}

}  // namespace td::train
