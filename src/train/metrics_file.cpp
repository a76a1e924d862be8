#include "tardelli/train/metrics_file.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "tardelli/core/error.h"

namespace td::train {

namespace fs = std::filesystem;

namespace {

void make_parent(const std::string& path) {
  const fs::path parent = fs::absolute(fs::path(path)).parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  TD_CHECK(!ec, "train: cannot create the directory ", parent.string(), " for ", path, ": ",
           ec.message());
}

}  // namespace

std::string python_json(const json::Value& v) {
  if (v.is_double() && !std::isfinite(v.as_double())) {
    const double d = v.as_double();
    return std::isnan(d) ? "NaN" : (d > 0 ? "Infinity" : "-Infinity");
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.as_array().size(); ++i) {
      out += (i ? ", " : "") + python_json(v.as_array()[i]);
    }
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, x] : v.as_object()) {
      out += (first ? "" : ", ") + json::dump(json::Value(k)) + ": " + python_json(x);
      first = false;
    }
    return out + "}";
  }
  return json::dump(v);
}

std::optional<int64_t> metrics_row_step(const std::string& line) {
  // NaN / Infinity / -Infinity outside strings become null.
  std::string text;
  text.reserve(line.size());
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (in_string) {
      text += ch;
      if (ch == '\\' && i + 1 < line.size()) {
        text += line[++i];
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    bool replaced = false;
    for (const std::string_view word : {"-Infinity", "Infinity", "NaN"}) {
      if (line.compare(i, word.size(), word) == 0) {
        text += "null";
        i += word.size() - 1;
        replaced = true;
        break;
      }
    }
    if (replaced) continue;
    if (ch == '"') in_string = true;
    text += ch;
  }
  const json::Value row = json::parse(text);
  const json::Value* step = row.find("step");
  if (step == nullptr || !step->is_int()) return std::nullopt;
  return step->as_int();
}

MetricsFile::MetricsFile(const std::string& path, std::optional<int64_t> resume_step, bool append)
    : path_(path) {
  if (path_.empty()) return;
  make_parent(path_);
  if (append) {
    f_ = std::fopen(path_.c_str(), "a");
  } else if (resume_step && fs::exists(path_)) {
    // Python rewrites the kept rows with json.dumps(json.loads(line)), which gives back the
    // line's own text for rows either trainer wrote: the lines are kept as they are.
    std::ifstream in(path_);
    TD_CHECK(in.good(), "train: cannot read the metrics file ", path_, ": ", std::strerror(errno));
    std::string kept, line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::optional<int64_t> step;
      try {
        step = metrics_row_step(line);
      } catch (const Error& e) {
        TD_ERROR("train: the metrics file ", path_, " has a malformed line ", n, ": ", e.what());
      }
      if (!step || *step <= *resume_step) kept += line + "\n";
    }
    write_text_file(path_, kept);
    f_ = std::fopen(path_.c_str(), "a");
  } else {
    f_ = std::fopen(path_.c_str(), "w");
  }
  TD_CHECK(f_ != nullptr, "train: cannot open the metrics file ", path_, ": ",
           std::strerror(errno));
}

MetricsFile::~MetricsFile() {
  if (f_ != nullptr) std::fclose(f_);
}

void MetricsFile::write(const json::Value& row) {
  if (f_ == nullptr) return;
  const std::string line = python_json(row) + "\n";
  TD_CHECK(std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fflush(f_) == 0,
           "train: writing the metrics file ", path_, " failed: ", std::strerror(errno));
}

void write_text_file(const std::string& path, const std::string& text) {
  make_parent(path);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  TD_CHECK(f != nullptr, "train: cannot write ", tmp, ": ", std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  TD_CHECK(ok && closed, "train: writing ", tmp, " failed: ", std::strerror(errno));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  TD_CHECK(!ec, "train: cannot move ", tmp, " to ", path, ": ", ec.message());
}

}  // namespace td::train
