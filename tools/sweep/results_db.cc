#include "tools/sweep/results_db.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <vector>

namespace pipegrid::sweep {
namespace {

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &st_, nullptr); }
  ~Statement() { sqlite3_finalize(st_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return st_; }
  void text(int i, const std::string& s) { sqlite3_bind_text(st_, i, s.c_str(), -1, SQLITE_TRANSIENT); }
  void real(int i, std::optional<double> v) {
    if (v)
      sqlite3_bind_double(st_, i, *v);
    else
      sqlite3_bind_null(st_, i);
  }
  void integer(int i, std::optional<long long> v) {
    if (v)
      sqlite3_bind_int64(st_, i, *v);
    else
      sqlite3_bind_null(st_, i);
  }
  std::string column_text(int i) {
    const unsigned char* t = sqlite3_column_text(st_, i);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  std::optional<double> column_real(int i) {
    if (sqlite3_column_type(st_, i) == SQLITE_NULL) return std::nullopt;
    return sqlite3_column_double(st_, i);
  }
  std::optional<long long> column_integer(int i) {
    if (sqlite3_column_type(st_, i) == SQLITE_NULL) return std::nullopt;
    return sqlite3_column_int64(st_, i);
  }

 private:
  sqlite3_stmt* st_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points(
  point INTEGER PRIMARY KEY,
  axes TEXT NOT NULL,
  status TEXT NOT NULL CHECK(status IN ('ok', 'infeasible', 'error')),
  message TEXT NOT NULL DEFAULT '',
  iteration_time_s REAL,
  throughput_samples_per_s REAL,
  bubble_ratio REAL,
  peak_memory_bytes INTEGER,
  result TEXT,
  pipegrid_version TEXT NOT NULL,
  wall_s REAL NOT NULL,
  finished_at TEXT NOT NULL,
  host TEXT NOT NULL DEFAULT ''
);
)sql";

// The columns the schema above gives each table (checked in a database that existed before).
const std::pair<const char*, std::vector<const char*>> kColumns[] = {
    {"meta", {"key", "value"}},
    {"points",
     {"point", "axes", "status", "message", "iteration_time_s", "throughput_samples_per_s", "bubble_ratio",
      "peak_memory_bytes", "result", "pipegrid_version", "wall_s", "finished_at", "host"}},
};

}  // namespace

Result<ResultsDb> ResultsDb::open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    std::string why = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Error{fmt::format("cannot open the results database \"{}\": {}", path, why)};
  }
  ResultsDb r(db, path);
  sqlite3_busy_timeout(db, 60'000);  // shards merged while another process writes: wait
  // A database of something else (a `points` or `meta` table of its own) would fail later with an
  // SQL message, or export nothing, and one with other tables only would gain the sweep's beside
  // them: refuse both before anything is written to it.
  std::vector<std::string> tables;
  {
    Statement st(db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
    if (!st.ok()) return Error{fmt::format("the results database \"{}\": {}", path, sqlite3_errmsg(db))};
    int rc = SQLITE_ROW;
    while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) tables.push_back(st.column_text(0));
    if (rc != SQLITE_DONE)
      return Error{fmt::format("the results database \"{}\": {}", path, sqlite3_errmsg(db))};
  }
  const bool ours = std::any_of(tables.begin(), tables.end(), [](const std::string& t) {
    return std::any_of(std::begin(kColumns), std::end(kColumns), [&](const auto& c) { return t == c.first; });
  });
  if (!tables.empty() && !ours)
    return Error{
        fmt::format("the results database \"{}\" is not a pipegrid sweep's: it holds the table{} "
                    "{} and no meta or points table (give another --db; nothing was written)",
                    path, tables.size() == 1 ? "" : "s", fmt::join(tables, ", "))};
  for (const auto& [table, columns] : kColumns) {
    const std::string sql = fmt::format("PRAGMA table_info({})", table);
    Statement st(db, sql.c_str());
    if (!st.ok()) return Error{fmt::format("the results database \"{}\": {}", path, sqlite3_errmsg(db))};
    std::set<std::string> have;
    int rc = SQLITE_ROW;
    while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) have.insert(st.column_text(1));
    if (rc != SQLITE_DONE)
      return Error{fmt::format("the results database \"{}\": {}", path, sqlite3_errmsg(db))};
    if (have.empty()) continue;  // a new database: the schema below creates the table
    for (const char* c : columns)
      if (!have.count(c))
        return Error{
            fmt::format("the results database \"{}\" is not a pipegrid sweep's: its table {} has no "
                        "column {} (give another --db)",
                        path, table, c)};
  }
  // WAL: a commit is one append to the log, and a process killed at any moment leaves every
  // committed transaction readable (the next open recovers the log).
  if (Status s = r.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"); !s) return s.error();
  if (Status s = r.exec(kSchema); !s) return s.error();
  return r;
}

ResultsDb::~ResultsDb() {
  if (db_) sqlite3_close(db_);
}

Status ResultsDb::exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string why = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    return Error{fmt::format("the results database \"{}\": {}", path_, why)};
  }
  return {};
}

std::map<std::string, std::string> ResultsDb::meta() const {
  std::map<std::string, std::string> out;
  Statement st(db_, "SELECT key, value FROM meta");
  while (st.ok() && sqlite3_step(st.get()) == SQLITE_ROW) out[st.column_text(0)] = st.column_text(1);
  return out;
}

Status ResultsDb::bind(const std::map<std::string, std::string>& meta) {
  const std::map<std::string, std::string> have = this->meta();
  if (!have.empty()) {
    auto it = have.find("fingerprint");
    const std::string theirs = it == have.end() ? "" : it->second;
    if (theirs != meta.at("fingerprint"))
      return Error{
          fmt::format("the results database \"{}\" holds another sweep (fingerprint {}, this one is {}: the "
                      "sweep file or its "
                      "base experiment changed); give another --db or remove it",
                      path_, theirs, meta.at("fingerprint"))};
    return {};
  }
  if (Status s = exec("BEGIN IMMEDIATE"); !s) return s;
  for (const auto& [k, v] : meta) {
    Statement st(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)");
    st.text(1, k);
    st.text(2, v);
    if (!st.ok() || sqlite3_step(st.get()) != SQLITE_DONE) {
      (void)exec("ROLLBACK");
      return Error{fmt::format("the results database \"{}\": {}", path_, sqlite3_errmsg(db_))};
    }
  }
  return exec("COMMIT");
}

std::set<long long> ResultsDb::done() const {
  std::set<long long> out;
  Statement st(db_, "SELECT point FROM points");
  while (st.ok() && sqlite3_step(st.get()) == SQLITE_ROW) out.insert(sqlite3_column_int64(st.get(), 0));
  return out;
}

Status ResultsDb::insert(const Row& r) {
  Statement st(db_,
               "INSERT INTO points(point, axes, status, message, iteration_time_s, throughput_samples_per_s, "
               "bubble_ratio, peak_memory_bytes, result, pipegrid_version, wall_s, finished_at, host) "
               "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
  if (!st.ok()) return Error{fmt::format("the results database \"{}\": {}", path_, sqlite3_errmsg(db_))};
  st.integer(1, r.point);
  st.text(2, r.axes.dump());
  st.text(3, r.status);
  st.text(4, r.message);
  st.real(5, r.iteration_time_s);
  st.real(6, r.throughput_samples_per_s);
  st.real(7, r.bubble_ratio);
  st.integer(8, r.peak_memory_bytes);
  if (r.result.is_null())
    sqlite3_bind_null(st.get(), 9);
  else
    st.text(9, r.result.dump());
  st.text(10, r.pipegrid_version);
  st.real(11, r.wall_s);
  st.text(12, r.finished_at);
  st.text(13, r.host);
  if (sqlite3_step(st.get()) != SQLITE_DONE)
    return Error{
        fmt::format("the results database \"{}\": point {}: {}", path_, r.point, sqlite3_errmsg(db_))};
  return {};
}

std::vector<Row> ResultsDb::rows() const {
  std::vector<Row> out;
  Statement st(
      db_,
      "SELECT point, axes, status, message, iteration_time_s, throughput_samples_per_s, bubble_ratio, "
      "peak_memory_bytes, result, pipegrid_version, wall_s, finished_at, host FROM points ORDER BY point");
  while (st.ok() && sqlite3_step(st.get()) == SQLITE_ROW) {
    Row r;
    r.point = sqlite3_column_int64(st.get(), 0);
    r.axes = nlohmann::json::parse(st.column_text(1), nullptr, false);
    r.status = st.column_text(2);
    r.message = st.column_text(3);
    r.iteration_time_s = st.column_real(4);
    r.throughput_samples_per_s = st.column_real(5);
    r.bubble_ratio = st.column_real(6);
    r.peak_memory_bytes = st.column_integer(7);
    if (sqlite3_column_type(st.get(), 8) != SQLITE_NULL)
      r.result = nlohmann::json::parse(st.column_text(8), nullptr, false);
    r.pipegrid_version = st.column_text(9);
    r.wall_s = sqlite3_column_double(st.get(), 10);
    r.finished_at = st.column_text(11);
    r.host = st.column_text(12);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace pipegrid::sweep
