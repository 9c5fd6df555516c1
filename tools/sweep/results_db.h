// A sweep's results in SQLite (Debian's libsqlite3, C API): one row per point, each committed
// when its point ends (WAL journal), so a sweep killed at any moment resumes where it stopped. The
// schema (docs/sweeps.md):
//
//   meta(key TEXT PRIMARY KEY, value TEXT)   schema_version, fingerprint, sweep, axes (JSON list),
//                                            points (selected count), grid_size, pipegrid_version
//   points(point INTEGER PRIMARY KEY,        the point's index in the sweep's grid
//          axes TEXT,                        {"cluster.count": 4, ...} (JSON)
//          status TEXT,                      ok | infeasible | error
//          message TEXT,                     the error, or the infeasibility ("gpu0 needs ...")
//          iteration_time_s REAL, throughput_samples_per_s REAL, bubble_ratio REAL,
//          peak_memory_bytes INTEGER,
//          result TEXT,                      the whole `pipegrid run --json` object (JSON)
//          pipegrid_version TEXT, wall_s REAL, finished_at TEXT, host TEXT)
#pragma once

#include <sqlite3.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/result.h"

namespace pipegrid::sweep {

inline constexpr int kDatabaseSchemaVersion = 1;

struct Row {
  long long point = 0;
  nlohmann::json axes;
  std::string status;  // ok | infeasible | error
  std::string message;
  std::optional<double> iteration_time_s, throughput_samples_per_s, bubble_ratio;
  std::optional<long long> peak_memory_bytes;
  nlohmann::json result;  // null for errors
  std::string pipegrid_version;
  double wall_s = 0;
  std::string finished_at;
  std::string host;
};

class ResultsDb {
 public:
  // Opens (creating it if absent) the database at `path`.
  static Result<ResultsDb> open(const std::string& path);
  ResultsDb(ResultsDb&& o) noexcept : db_(o.db_), path_(std::move(o.path_)) { o.db_ = nullptr; }
  ResultsDb& operator=(ResultsDb&&) = delete;
  ~ResultsDb();

  // A fresh database takes `meta`; an existing one must hold the same fingerprint (one sweep per
  // database), else the error says so.
  Status bind(const std::map<std::string, std::string>& meta);
  std::map<std::string, std::string> meta() const;
  std::set<long long> done() const;
  // Inserts one point's row in its own transaction; a point already present is an error.
  Status insert(const Row& row);
  std::vector<Row> rows() const;
  const std::string& path() const { return path_; }

 private:
  explicit ResultsDb(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  Status exec(const std::string& sql);
  sqlite3* db_ = nullptr;
  std::string path_;
};

}  // namespace pipegrid::sweep
