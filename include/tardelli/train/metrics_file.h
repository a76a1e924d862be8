#pragma once
// The training metrics file: one JSON object per line, one line per optimizer step (the rows
// python -m tardelli.train writes; python/tardelli/train/report.py reads, plots and checks them).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "tardelli/core/json.h"

namespace td::train {

class MetricsFile {
 public:
  // An empty path writes nothing (ranks other than 0). Creates the parent directory; truncates
  // an existing file, except in a resumed run (resume_step: the step of the checkpoint it
  // resumed from), which keeps the rows of steps <= resume_step and appends after them, so the
  // file describes one history . td::Error naming the path when it
  // cannot be opened or rewritten.
  // append: keep every row and add after them (a restarted attempt of a supervised run, Note
  // [Supervised metrics] in src/train/trainer.cpp: a step may then have several rows).
  explicit MetricsFile(const std::string& path, std::optional<int64_t> resume_step = std::nullopt,
                       bool append = false);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  // Appends the row and flushes it (a crash loses at most the line being written). Written as
  // Python's json.dumps does (", " and ": " separators, NaN/Infinity for non-finite numbers).
  void write(const json::Value& row);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

// `v` as Python's json.dumps writes it: ", " and ": " separators and NaN, Infinity, -Infinity for
// the non-finite numbers strict JSON lacks (a skipped fp16 step's gradient norm is NaN), so
// report.py and any json.loads reader read the rows.
std::string python_json(const json::Value& v);

// The "step" of a metrics row as written by either trainer (Python's json.dumps may write NaN,
// Infinity and -Infinity, which strict JSON lacks: read as null here); nullopt for a row
// without an integer step. td::Error for a line that is not JSON.
std::optional<int64_t> metrics_row_step(const std::string& line);

// Writes `text` to `path` atomically (a temporary file in the same directory, then a rename):
// readers see the old file or the whole new one. td::Error naming the path on failure.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace td::train
