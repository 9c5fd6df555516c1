// pipegrid sweep SWEEP.yaml [-j N] [--db FILE] [--shard I/N] [--slurm N]: every point of a sweep
// (tools/sweep/sweep.h) in a forked child process of its own (SimGrid allows one simulation per
// process), N at a time, results committed to SQLite point by point (tools/sweep/results_db.h).
// pipegrid sweep export DB [--csv | --jsonl]; pipegrid sweep merge OUT DB...; pipegrid sweep plot.
#include "tools/sweep/sweep.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "core/units.h"
#include "tools/builtin_sweep_plot_script.h"
#include "tools/cli/cli.h"
#include "tools/input/experiment_yaml.h"
#include "tools/output/report.h"
#include "tools/output/safe_write.h"
#include "tools/process/process.h"
#include "tools/sweep/results_db.h"

namespace pipegrid::cli {
namespace {

namespace fs = std::filesystem;
using sweep::ResultsDb;
using sweep::Row;
using sweep::Sweep;

struct SweepOptions {
  std::string file;
  int jobs = 0;
  std::string db;
  std::string shard;  // "I/N"
  int slurm = 0;      // shards of a Slurm job array
  std::vector<std::string> slurm_options;
  bool quiet = false;
  bool list = false;
  // export
  std::string export_db;
  bool csv = false, jsonl = false;
  // merge
  std::string merge_out;
  std::vector<std::string> merge_in;
  // point (internal)
  std::string point_file;
  long long point_index = -1;
  std::string point_fingerprint;
  // plot
  std::string plot_db, plot_out, plot_metric = "throughput_samples_per_s", plot_x, plot_lines, plot_y,
                                 plot_kind = "line";
  std::string plot_title, plot_xlabel, plot_ylabel, plot_legend_title, plot_size, plot_baseline;
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// "pipegrid: x\npipegrid: warning: y\n" -> the lines without the prefix, warnings last.
std::string messages_of(const std::string& err) {
  std::string errors, warnings;
  size_t start = 0;
  while (start < err.size()) {
    size_t end = err.find('\n', start);
    if (end == std::string::npos) end = err.size();
    std::string line = err.substr(start, end - start);
    start = end + 1;
    if (line.rfind("pipegrid: ", 0) == 0) line = line.substr(10);
    if (line.empty()) continue;
    std::string& to = line.rfind("warning: ", 0) == 0 ? warnings : errors;
    to += (to.empty() ? "" : "\n") + line;
  }
  if (warnings.empty()) return errors;
  return errors.empty() ? warnings : errors + "\n" + warnings;
}

// "fpga0 needs 9.1 GiB but has 8 GiB" from an `infeasible` entry of the run's JSON.
std::string infeasibility(const nlohmann::json& m) {
  if (!m.is_object()) return m.dump();
  return fmt::format("{} needs {} but has {}", m.value("device", "?"),
                     format_bytes(m.value("peak_memory_bytes", 0.0)),
                     format_bytes(m.value("capacity_bytes", 0.0)));
}

// The row of a finished point from its process's exit status and outputs.
Row row_of(const Sweep& s, size_t point, int status, const std::string& out, const std::string& err,
           double wall) {
  Row r;
  r.point = static_cast<long long>(point);
  r.axes = s.axis_values(point);
  r.pipegrid_version = PIPEGRID_VERSION;
  r.wall_s = wall;
  r.finished_at = utc_now();
  r.host = hostname();
  if (WIFEXITED(status) && WEXITSTATUS(status) == kOk) {
    nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
    if (j.is_object()) {
      r.result = j;
      const auto num = [&](const char* k) -> std::optional<double> {
        if (j.contains(k) && j[k].is_number()) return j[k].get<double>();
        return std::nullopt;
      };
      r.iteration_time_s = num("iteration_time_s");
      r.throughput_samples_per_s = num("throughput_samples_per_s");
      r.bubble_ratio = num("bubble_ratio");
      long long peak = 0;
      for (const auto& d : j.value("devices", nlohmann::json::array()))
        if (d.contains("peak_memory_bytes") && d["peak_memory_bytes"].is_number())
          peak = std::max(peak, static_cast<long long>(d["peak_memory_bytes"].get<double>()));
      r.peak_memory_bytes = peak;
      const bool feasible = j.value("feasible", true);
      r.status = feasible ? "ok" : "infeasible";
      r.message = messages_of(err);  // warnings (a micro-batch split into fractional samples)
      if (!feasible)
        for (const auto& m : j.value("infeasible", nlohmann::json::array()))
          r.message += (r.message.empty() ? "" : "; ") + infeasibility(m);
      return r;
    }
    r.status = "error";
    r.message = "pipegrid run printed no JSON object";
    return r;
  }
  r.status = "error";
  const std::string msg = messages_of(err);
  if (WIFEXITED(status) && WEXITSTATUS(status) == kBadInput)
    r.message = msg;
  else if (WIFEXITED(status))
    r.message = fmt::format("pipegrid run failed (exit status {}){}{}", WEXITSTATUS(status),
                            msg.empty() ? "" : ": ", msg);
  else
    r.message = fmt::format("pipegrid run was killed by signal {}{}{}", WTERMSIG(status),
                            msg.empty() ? "" : ": ", msg);
  return r;
}

// --- progress -----------------------------------------------------------------------------------

class Progress {
 public:
  Progress(size_t total, size_t already, bool quiet)
      : total_(total), done_(already), quiet_(quiet), tty_(isatty(STDERR_FILENO) == 1) {}

  void finished(size_t point, const Row& r, const std::string& axes) {
    ++done_;
    ++run_;
    if (r.status == "error") ++failed_;
    if (r.status == "infeasible") ++infeasible_;
    if (quiet_) return;
    if (tty_) {
      draw();
    } else {
      const std::string what = r.status == "error" ? "error: " + first_line(r.message) : r.status;
      fmt::print(std::cerr, "pipegrid: sweep: [{}/{}] point {} {} ({:.2f} s) {}\n", done_, total_, point,
                 what, r.wall_s, axes);
    }
  }
  void end() {
    if (tty_ && !quiet_ && run_ > 0) fmt::print(std::cerr, "\n");
  }
  size_t failed() const { return failed_; }
  size_t infeasible() const { return infeasible_; }
  size_t run() const { return run_; }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
  void draw() {
    const double t = elapsed();
    const double eta = run_ ? t / run_ * (total_ - done_) : 0;
    constexpr int kWidth = 30;
    const int filled = total_ ? static_cast<int>(kWidth * done_ / total_) : kWidth;
    fmt::print(std::cerr, "\r[{}{}] {}/{} points, {} failed, {} infeasible, {:.0f} s, ETA {:.0f} s   ",
               std::string(filled, '#'), std::string(kWidth - filled, '.'), done_, total_, failed_,
               infeasible_, t, eta);
  }
  size_t total_, done_, run_ = 0, failed_ = 0, infeasible_ = 0;
  bool quiet_, tty_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// --- the local runner ---------------------------------------------------------------------------

int run_point(const SweepOptions& o);

// The options of `pipegrid sweep point SWEEP INDEX --fingerprint F`, which a forked child runs for
// each point (re-reading the sweep file and checking its fingerprint).
SweepOptions point_options(const Sweep& s, size_t point) {
  SweepOptions po;
  po.point_file = s.path();
  po.point_index = static_cast<long long>(point);
  po.point_fingerprint = s.fingerprint();
  return po;
}

Result<std::pair<size_t, size_t>> parse_shard(const std::string& text) {
  size_t i = 0, n = 0;
  char slash = 0, extra = 0;
  if (std::sscanf(text.c_str(), "%zu%c%zu%c", &i, &slash, &n, &extra) != 3 || slash != '/' || n == 0 ||
      i >= n)
    return Error{fmt::format("--shard: expected I/N with 0 <= I < N, like 0/4, got \"{}\"", text)};
  return std::pair{i, n};
}

std::string default_db(const std::string& sweep_file, std::optional<std::pair<size_t, size_t>> shard) {
  fs::path p(sweep_file);
  std::string stem = p.stem().string();
  if (shard) stem += fmt::format(".shard-{}-of-{}", shard->first, shard->second);
  return (p.parent_path() / (stem + ".sqlite")).string();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

int write_slurm(const SweepOptions& o, const Sweep& s) {
  const std::string exe = fs::canonical("/proc/self/exe").string();
  const fs::path sweep_file = fs::absolute(o.file).lexically_normal();
  const fs::path dir = sweep_file.parent_path();
  const std::string stem = sweep_file.stem().string();
  const std::string out_db = o.db.empty() ? (dir / (stem + ".sqlite")).string() : fs::absolute(o.db).string();
  const int n = o.slurm;
  const std::string shard_db = (dir / (stem + ".shard-")).string();
  std::string extra;
  for (const std::string& opt : o.slurm_options) extra += fmt::format("#SBATCH {}\n", opt);
  const std::string array = fmt::format(
      "#!/bin/bash\n"
      "# pipegrid sweep {sweep} as a Slurm job array: task I runs shard I of {n} into its own database.\n"
      "# Submit: jid=$(sbatch --parsable {array_path}) && sbatch --dependency=afterok:$jid {merge_path}\n"
      "#SBATCH --job-name=pipegrid-{name}\n"
      "#SBATCH --array=0-{last}\n"
      "#SBATCH --output={dir}/{stem}.shard-%a.log\n"
      "#SBATCH --cpus-per-task={cpus}\n"
      "{extra}"
      "set -euo pipefail\n"
      "i=${{SLURM_ARRAY_TASK_ID:?submit this script with sbatch}}\n"
      "exec {exe} sweep {sweep_q} --shard \"$i/{n}\" --db {shard_db_q}\"$i-of-{n}.sqlite\" -j "
      "\"${{SLURM_CPUS_PER_TASK:-1}}\"\n",
      fmt::arg("sweep", sweep_file.string()), fmt::arg("n", n), fmt::arg("last", n - 1),
      fmt::arg("name", s.name().empty() ? stem : s.name()), fmt::arg("dir", dir.string()),
      fmt::arg("stem", stem), fmt::arg("cpus", o.jobs > 0 ? o.jobs : 1), fmt::arg("extra", extra),
      fmt::arg("exe", shell_quote(exe)), fmt::arg("sweep_q", shell_quote(sweep_file.string())),
      fmt::arg("shard_db_q", shell_quote(shard_db)),
      fmt::arg("array_path", (dir / (stem + ".slurm.sh")).string()),
      fmt::arg("merge_path", (dir / (stem + ".slurm-merge.sh")).string()));
  std::string inputs;
  for (int i = 0; i < n; ++i) inputs += " " + shell_quote(fmt::format("{}{}-of-{}.sqlite", shard_db, i, n));
  const std::string merge = fmt::format(
      "#!/bin/bash\n"
      "# Joins the {n} shard databases of {sweep} into {out} (run after the array: afterok).\n"
      "#SBATCH --job-name=pipegrid-{name}-merge\n"
      "#SBATCH --output={dir}/{stem}.merge.log\n"
      "{extra}"
      "set -euo pipefail\n"
      "exec {exe} sweep merge {out_q}{inputs}\n",
      fmt::arg("n", n), fmt::arg("sweep", sweep_file.string()), fmt::arg("out", out_db),
      fmt::arg("name", s.name().empty() ? stem : s.name()), fmt::arg("dir", dir.string()),
      fmt::arg("stem", stem), fmt::arg("extra", extra), fmt::arg("exe", shell_quote(exe)),
      fmt::arg("out_q", shell_quote(out_db)), fmt::arg("inputs", inputs));
  const std::string array_path = (dir / (stem + ".slurm.sh")).string();
  const std::string merge_path = (dir / (stem + ".slurm-merge.sh")).string();
  // A script of an earlier --slurm is written again; any other file of that name is the user's.
  for (const std::string& path : {array_path, merge_path}) {
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    // Not read_input_file: a file read as an input is never replaced (write_file_safely).
    std::ifstream in(path);
    std::string head(4096, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
    if (!fs::is_regular_file(path, ec) || head.find("#SBATCH --job-name=pipegrid-") == std::string::npos)
      return bad_input(
          fmt::format("--slurm: \"{}\" exists and is not a script of an earlier `pipegrid sweep "
                      "--slurm`; move it away (nothing was written)",
                      path));
  }
  if (Status st = output::write_file_safely(array_path, array); !st) return bad_input(st.error().message);
  if (Status st = output::write_file_safely(merge_path, merge); !st) return bad_input(st.error().message);
  fs::permissions(array_path, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
  fs::permissions(merge_path, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
  fmt::print("{}\n{}\nsubmit with:\n  jid=$(sbatch --parsable {}) && sbatch --dependency=afterok:$jid {}\n",
             array_path, merge_path, array_path, merge_path);
  return kOk;
}

std::map<std::string, std::string> meta_of(const Sweep& s, size_t points, const std::string& shard) {
  nlohmann::json axes = nlohmann::json::array();
  for (const sweep::Axis& a : s.axes()) axes.push_back(a.path);
  return {{"schema_version", std::to_string(sweep::kDatabaseSchemaVersion)},
          {"fingerprint", s.fingerprint()},
          {"sweep", fs::absolute(s.path()).lexically_normal().string()},
          {"name", s.name()},
          {"axes", axes.dump()},
          {"grid_size", std::to_string(s.grid_size())},
          {"points", std::to_string(points)},
          {"shard", shard},
          {"pipegrid_version", PIPEGRID_VERSION}};
}

// The points this run selects: the sweep's `where`/`skip` selection, and of it the shard's.
struct Selection {
  std::optional<Sweep> sweep;
  std::vector<size_t> points;
  std::optional<std::pair<size_t, size_t>> shard;
};

Result<Selection> select_points(const SweepOptions& o) {
  Selection sel;
  try {
    sel.sweep.emplace(Sweep::load(o.file));
    sel.points = sel.sweep->points();
  } catch (const input::InputError& e) {
    return Error{e.what()};
  }
  if (o.shard.empty()) return sel;
  Result<std::pair<size_t, size_t>> sh = parse_shard(o.shard);
  if (!sh) return sh.error();
  sel.shard = *sh;
  std::vector<size_t> mine;
  for (size_t k = 0; k < sel.points.size(); ++k)
    if (k % sh->second == sh->first) mine.push_back(sel.points[k]);
  sel.points = std::move(mine);
  return sel;
}

// The lock of a results database: one sweep process per database, since two would run the same
// pending points. Held by the process (also released when it is killed); the lock file goes when
// this sweep ends, however it returns. A killed sweep leaves it: the next sweep takes the lock and,
// seeing the words a sweep writes in it (kLockText), removes it at its end; a file of the user's
// (other contents) is left as it was.
constexpr std::string_view kLockText = "pipegrid sweep lock\n";
struct LockFile {
  std::string path;
  int fd;
  bool created;  // made by this sweep: removed at its end (a file that was there before is left as it was)
  LockFile(std::string p, int f, bool c) : path(std::move(p)), fd(f), created(c) {}
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;
  ~LockFile() {
    if (created) unlink(path.c_str());
    close(fd);
  }
};

Result<std::unique_ptr<LockFile>> lock_database(const std::string& db_path) {
  const std::string lock_path = db_path + ".lock";
  bool created = true;
  int lock = open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (lock < 0 && errno == EEXIST) {  // another sweep's, a crashed one's, or a file of the user's: kept
    created = false;
    lock = open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  }
  if (lock < 0) return Error{fmt::format("cannot create \"{}\": {}", lock_path, std::strerror(errno))};
  if (flock(lock, LOCK_EX | LOCK_NB) != 0) {
    close(lock);
    return Error{
        fmt::format("another pipegrid sweep is running on \"{}\" (it holds \"{}\")", db_path, lock_path)};
  }
  if (created) {
    (void)!write(lock, kLockText.data(), kLockText.size());  // best effort: only the removal depends on it
  } else {
    char text[64] = {};
    const ssize_t n = pread(lock, text, sizeof text, 0);
    created = n == static_cast<ssize_t>(kLockText.size()) && std::string_view(text, n) == kLockText;
  }
  return std::make_unique<LockFile>(lock_path, lock, created);
}

// Runs the pending points, each in a forked child (tools/process/process.h; SimGrid allows one
// simulation per process), `jobs` at a time, each point's row committed as it ends. The child runs
// the point as `pipegrid sweep point` would, its outputs in memory files, and dies with this process.
int run_pending(const Sweep& s, const std::vector<size_t>& pending, int jobs, ResultsDb& db,
                Progress& progress) {
  process::ChildOptions co;
  co.capture_output = true;
  co.die_with_parent = true;  // a killed sweep leaves no point running
  int failure = kOk;
  process::run_pool(
      pending.size(), jobs, [&](size_t k, int) { return run_point(point_options(s, pending[k])); },
      [&](size_t k, process::ChildResult&& c) {
        if (!c.started()) {
          fmt::print(std::cerr, "pipegrid: sweep: cannot start a process: {}\n",
                     std::strerror(c.start_errno));
          failure = kInternal;
          return false;
        }
        const size_t point = pending[k];
        const Row r = row_of(s, point, c.status, c.out, c.err, c.wall_s);
        if (Status st = db.insert(r); !st) {
          fmt::print(std::cerr, "pipegrid: sweep: {}\n", st.error().message);
          failure = kInternal;
          return false;
        }
        progress.finished(point, r, s.describe(point));
        return true;
      },
      co);
  return failure;
}

// The closing summary, counted over the database's rows of the selected points, not this run's
// alone: a re-run that runs nothing reports the errors recorded before. Failed points are recorded
// results, but not a success: said even under -q, and exit status 2.
int report(const SweepOptions& o, const std::vector<size_t>& points, const std::string& db_path,
           const ResultsDb& db, const Progress& progress) {
  size_t errors = 0, infeasible = 0;
  std::string first_error;
  const std::set<size_t> selected(points.begin(), points.end());
  for (const Row& r : db.rows()) {
    if (!selected.count(static_cast<size_t>(r.point))) continue;
    if (r.status == "error") {
      if (errors++ == 0) first_error = fmt::format("point {}: {}", r.point, r.message);
    } else if (r.status == "infeasible") {
      ++infeasible;
    }
  }
  if (!o.quiet)
    fmt::print(std::cerr,
               "pipegrid: sweep: {} points in {}: {} run now in {:.1f} s; {} {}, {} infeasible in all\n",
               points.size(), db_path, progress.run(), progress.elapsed(), errors,
               errors == 1 ? "error" : "errors", infeasible);
  if (errors > 0) {
    fmt::print(
        std::cerr,
        "pipegrid: sweep: {} of {} points failed (the first: {}); `pipegrid sweep export {}` lists them\n",
        errors, points.size(), first_error.substr(0, first_error.find('\n')), db_path);
    return kBadInput;
  }
  return kOk;
}

int run_sweep(const SweepOptions& o) {
  if (o.file.empty()) return bad_input("sweep: a sweep file is needed; see `pipegrid sweep --help`");
  Result<Selection> sel = select_points(o);
  if (!sel) return bad_input(sel.error().message);
  const Sweep& s = *sel->sweep;
  const std::vector<size_t>& points = sel->points;
  if (o.slurm > 0 && static_cast<size_t>(o.slurm) > points.size())
    return bad_input(
        fmt::format("--slurm {}: the sweep selects {} point{}, so {} of the array's tasks would run "
                    "nothing; expected at most {} (nothing was written)",
                    o.slurm, points.size(), points.size() == 1 ? "" : "s",
                    static_cast<size_t>(o.slurm) - points.size(), points.size()));
  if (o.slurm > 0) return write_slurm(o, s);
  if (o.list) {
    for (size_t p : points) fmt::print("{} {}\n", p, s.describe(p));
    return kOk;
  }
  const std::string db_path = o.db.empty() ? default_db(o.file, sel->shard) : o.db;
  Result<std::unique_ptr<LockFile>> lock = lock_database(db_path);
  if (!lock) return bad_input(lock.error().message);
  Result<ResultsDb> db = ResultsDb::open(db_path);
  if (!db) return bad_input(db.error().message);
  if (Status st = db->bind(meta_of(s, points.size(), o.shard)); !st) return bad_input(st.error().message);
  const std::set<long long> done = db->done();
  std::vector<size_t> pending;
  for (size_t p : points)
    if (!done.count(static_cast<long long>(p))) pending.push_back(p);
  const size_t already = points.size() - pending.size();
  const int jobs = o.jobs > 0 ? o.jobs : std::max(1u, std::thread::hardware_concurrency());
  if (!o.quiet)
    fmt::print(std::cerr, "pipegrid: sweep: {} ({} in the grid{}), {} already in {}, {} to run on {}\n",
               output::plural(static_cast<double>(points.size()), "point", "points"), s.grid_size(),
               sel->shard ? fmt::format(", shard {}", o.shard) : "", already, db_path, pending.size(),
               output::plural(jobs, "process", "processes"));
  Progress progress(points.size(), already, o.quiet);
  if (int rc = run_pending(s, pending, jobs, *db, progress); rc != kOk) return rc;
  progress.end();
  return report(o, points, db_path, *db, progress);
}

// --- point, export, merge -----------------------------------------------------------------------

int run_point(const SweepOptions& o) {
  try {
    const Sweep s = Sweep::load(o.point_file);
    if (!o.point_fingerprint.empty() && o.point_fingerprint != s.fingerprint())
      return bad_input(
          fmt::format("{}: the sweep file or its base experiment changed while the sweep ran", o.point_file));
    if (o.point_index < 0 || static_cast<size_t>(o.point_index) >= s.grid_size())
      return bad_input(
          fmt::format("{}: no point {} (the grid has {})", o.point_file, o.point_index, s.grid_size()));
    const input::Document doc = s.experiment_document(static_cast<size_t>(o.point_index));
    const Experiment e = input::parse_experiment(doc);
    return run_loaded(e, fmt::format("{} point {}", o.point_file, o.point_index));
  } catch (const input::InputError& e) {
    return bad_input(e.what());
  }
}

std::string csv_value(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return output::csv_field(v.get<std::string>());
  return output::csv_field(v.dump());
}

template <class T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// The chosen plan's columns of `sweep export --csv`, read from a row's result (its `plan` object;
// rows written before it existed fall back to the top-level fields). Lists are space-separated
// ("2 2 2 2"). One table: a column added here (tensor parallel t, pipeline p, data-parallel d)
// appears in the header and in every row.
struct PlanColumn {
  const char* name;
  nlohmann::json (*value)(const nlohmann::json& result);
};

nlohmann::json plan_field(const nlohmann::json& result, const char* key) {
  if (!result.is_object()) return nullptr;
  if (auto p = result.find("plan"); p != result.end() && p->is_object())
    if (auto v = p->find(key); v != p->end()) return *v;
  if (auto v = result.find(key); v != result.end()) return *v;
  return nullptr;
}

nlohmann::json joined(const nlohmann::json& list) {
  if (!list.is_array()) return list;
  std::string out;
  for (const auto& x : list)
    out += (out.empty() ? "" : " ") + (x.is_string() ? x.get<std::string>() : x.dump());
  return out;
}

const PlanColumn kPlanColumns[] = {
    {"planner", [](const nlohmann::json& r) { return plan_field(r, "planner"); }},
    {"partitioner", [](const nlohmann::json& r) { return plan_field(r, "partitioner"); }},
    {"schedule", [](const nlohmann::json& r) { return plan_field(r, "schedule"); }},
    {"chunks", [](const nlohmann::json& r) { return plan_field(r, "chunks"); }},
    {"shape", [](const nlohmann::json& r) { return plan_field(r, "shape"); }},
    {"stages",
     [](const nlohmann::json& r) {
       nlohmann::json v = plan_field(r, "stages");
       return v.is_array() ? nlohmann::json(v.size()) : v;
     }},
    {"devices_per_stage", [](const nlohmann::json& r) { return joined(plan_field(r, "devices_per_stage")); }},
    {"replicas_per_stage",
     [](const nlohmann::json& r) { return joined(plan_field(r, "replicas_per_stage")); }},
    {"devices_used", [](const nlohmann::json& r) { return plan_field(r, "devices_used"); }},
    {"micro_batch_size", [](const nlohmann::json& r) { return plan_field(r, "micro_batch_size"); }},
    {"micro_batches", [](const nlohmann::json& r) { return plan_field(r, "micro_batches"); }},
};

int run_export(const SweepOptions& o) {
  if (!fs::is_regular_file(o.export_db))
    return bad_input(fmt::format("no results database \"{}\"", o.export_db));
  Result<ResultsDb> db = ResultsDb::open(o.export_db);
  if (!db) return bad_input(db.error().message);
  const auto meta = db->meta();
  std::vector<std::string> axes;
  if (auto it = meta.find("axes"); it != meta.end())
    for (const auto& a : nlohmann::json::parse(it->second, nullptr, false))
      axes.push_back(a.get<std::string>());
  const std::vector<Row> rows = db->rows();
  if (o.jsonl) {
    for (const Row& r : rows) {
      nlohmann::json j = {
          {"point", r.point},
          {"axes", r.axes},
          {"status", r.status},
          {"message", r.message},
          {"iteration_time_s", opt(r.iteration_time_s)},
          {"throughput_samples_per_s", opt(r.throughput_samples_per_s)},
          {"bubble_ratio", opt(r.bubble_ratio)},
          {"peak_memory_bytes", opt(r.peak_memory_bytes)},
          {"plan", r.result.is_object() && r.result.contains("plan") ? r.result["plan"] : nlohmann::json()},
          {"pipegrid_version", r.pipegrid_version},
          {"wall_s", r.wall_s},
          {"finished_at", r.finished_at},
          {"host", r.host},
          {"result", r.result}};
      std::cout << j.dump() << "\n";
    }
    return kOk;
  }
  std::string header = "point";
  for (const std::string& a : axes) header += "," + output::csv_field(a);
  header += ",status,message,iteration_time_s,throughput_samples_per_s,bubble_ratio,peak_memory_bytes";
  for (const PlanColumn& c : kPlanColumns) header += fmt::format(",{}", c.name);
  header += ",wall_s,pipegrid_version,finished_at,host";
  std::cout << header << "\n";
  for (const Row& r : rows) {
    std::string line = std::to_string(r.point);
    for (const std::string& a : axes)
      line += "," + csv_value(r.axes.contains(a) ? r.axes[a] : nlohmann::json());
    line += fmt::format(",{},{},{},{},{},{}", r.status, output::csv_field(r.message),
                        csv_value(opt(r.iteration_time_s)), csv_value(opt(r.throughput_samples_per_s)),
                        csv_value(opt(r.bubble_ratio)), csv_value(opt(r.peak_memory_bytes)));
    for (const PlanColumn& c : kPlanColumns) line += "," + csv_value(c.value(r.result));
    line += fmt::format(",{},{},{},{}", csv_value(r.wall_s), output::csv_field(r.pipegrid_version),
                        output::csv_field(r.finished_at), output::csv_field(r.host));
    std::cout << line << "\n";
  }
  return kOk;
}

// The database's advice names --db, which merge does not take: its output is the first argument.
std::string merge_message(std::string m) {
  for (size_t at; (at = m.find("another --db")) != std::string::npos;)
    m.replace(at, 12, "another output database (merge's first argument)");
  return "sweep merge: " + m;
}

int run_merge(const SweepOptions& o) {
  std::optional<std::map<std::string, std::string>> meta;
  std::vector<ResultsDb> inputs;
  for (const std::string& in : o.merge_in) {
    if (!fs::is_regular_file(in)) return bad_input(fmt::format("no results database \"{}\"", in));
    Result<ResultsDb> db = ResultsDb::open(in);
    if (!db) return bad_input(db.error().message);
    auto m = db->meta();
    if (m.empty()) return bad_input(fmt::format("\"{}\" holds no sweep (no meta table rows)", in));
    if (meta && m["fingerprint"] != (*meta)["fingerprint"])
      return bad_input(fmt::format("\"{}\" holds another sweep than \"{}\" (fingerprints {} and {})", in,
                                   o.merge_in.front(), m["fingerprint"], (*meta)["fingerprint"]));
    if (!meta) meta = m;
    inputs.push_back(std::move(*db));
  }
  Result<ResultsDb> out = ResultsDb::open(o.merge_out);
  if (!out) return bad_input(merge_message(out.error().message));
  // Disjoint shards (distinct `shard` values) add up to the whole sweep's point count.
  std::set<std::string> shards;
  long long total = 0;
  for (const ResultsDb& in : inputs) {
    const auto m = in.meta();
    shards.insert(m.count("shard") ? m.at("shard") : "");
    total += m.count("points") ? std::stoll(m.at("points")) : 0;
  }
  if (shards.size() == inputs.size() && !shards.count("")) (*meta)["points"] = std::to_string(total);
  (*meta)["shard"] = "";
  if (Status st = out->bind(*meta); !st) return bad_input(merge_message(st.error().message));
  std::set<long long> have = out->done();
  size_t added = 0, duplicates = 0;
  for (const ResultsDb& in : inputs)
    for (const Row& r : in.rows()) {
      if (have.count(r.point)) {
        ++duplicates;
        continue;
      }
      if (Status st = out->insert(r); !st) return bad_input(st.error().message);
      have.insert(r.point);
      ++added;
    }
  fmt::print(std::cerr,
             "pipegrid: sweep merge: {} rows from {} databases into {} ({} points already there); it holds "
             "{} points\n",
             added, inputs.size(), o.merge_out, duplicates, have.size());
  return kOk;
}

int run_plot(const SweepOptions& o);

}  // namespace

Command add_sweep_command(CLI::App& parent) {
  auto o = std::make_shared<SweepOptions>();
  CLI::App* app = parent.add_subcommand(
      "sweep", "Run every point of a sweep file (a base experiment and axes of values), results in SQLite");
  app->add_option("sweep", o->file, "Sweep file (YAML): base or experiment, grid, zip, where, skip");
  app->add_option("-j,--jobs", o->jobs, "Points run at once, each in its own process (default: every core)")
      ->default_str("")
      ->check(CLI::Range(1, 4096));
  app->add_option("--db", o->db, "Results database (SQLite; default SWEEP.sqlite beside the sweep file)");
  app->add_option("--shard", o->shard,
                  "Run only shard I of N (I/N, I from 0): every N-th selected point from the I-th");
  app->add_option("--slurm", o->slurm,
                  "Write a Slurm job array of this many shards and its merge step, run nothing")
      ->default_str("")
      ->check(CLI::Range(1, 100000));
  app->add_option("--slurm-option", o->slurm_options,
                  "An #SBATCH line for the scripts (repeatable): --partition=x");
  app->add_flag("-q,--quiet", o->quiet, "No progress");
  app->add_flag("--list", o->list, "Print the selected points (number and values), run nothing");
  app->fallthrough(false);

  CLI::App* exp = app->add_subcommand("export", "Print a results database as CSV (default) or JSON lines");
  exp->add_option("database", o->export_db, "Results database")->required();
  auto* csv = exp->add_flag("--csv", o->csv, "CSV: one row per point, a column per axis (default)");
  exp->add_flag("--jsonl", o->jsonl, "JSON lines: one object per point, with the whole run result")
      ->excludes(csv);

  CLI::App* merge = app->add_subcommand("merge", "Join the databases of a sweep's shards into one");
  merge->add_option("output", o->merge_out, "The database to write (created if absent)")->required();
  merge->add_option("inputs", o->merge_in, "Shard databases")->required();

  CLI::App* point =
      app->add_subcommand("point", "Run one point of a sweep and print its JSON (used by sweep)");
  point->group("");  // internal: not in --help
  point->add_option("sweep", o->point_file)->required();
  point->add_option("index", o->point_index)->required();
  point->add_option("--fingerprint", o->point_fingerprint);

  CLI::App* plot = app->add_subcommand("plot", "Plot a results database (python3 with matplotlib)");
  plot->add_option("database", o->plot_db, "Results database")->required();
  plot->add_option("-o,--out", o->plot_out, "Output image (.png, .svg, .pdf)")->required();
  plot->add_option("--kind", o->plot_kind,
                   "line (metric against --x, a line per --lines), heatmap (--x by --y), pareto")
      ->check(CLI::IsMember({"line", "heatmap", "pareto"}));
  plot->add_option("--metric", o->plot_metric,
                   "A column: throughput_samples_per_s, iteration_time_s, bubble_ratio, ...");
  plot->add_option("--x", o->plot_x, "Axis on the horizontal");
  plot->add_option("--lines", o->plot_lines,
                   "Axes whose values are separate lines, comma-separated: a line per combination (line)");
  plot->add_option("--y", o->plot_y, "Axis on the vertical (heatmap)");
  plot->add_option("--baseline", o->plot_baseline,
                   "AXIS=VALUE[,AXIS=VALUE...]: plot the speed-up against that point instead of the metric");
  plot->add_option("--title", o->plot_title, "Title (default: the sweep's name)");
  plot->add_option("--xlabel", o->plot_xlabel, "Horizontal axis label (default: the axis in words)");
  plot->add_option("--ylabel", o->plot_ylabel, "Vertical axis (or colour bar) label (default: the metric)");
  plot->add_option("--legend-title", o->plot_legend_title, "Legend title (default: the --lines axes)");
  plot->add_option("--size", o->plot_size, "Figure size in inches, WxH (default 7x4.5)");

  return {app, [o, exp, merge, point, plot] {
            if (exp->parsed()) return run_export(*o);
            if (merge->parsed()) return run_merge(*o);
            if (point->parsed()) return run_point(*o);
            if (plot->parsed()) return run_plot(*o);
            return run_sweep(*o);
          }};
}

namespace {

int run_plot(const SweepOptions& o) {
  if (!fs::is_regular_file(o.plot_db)) return bad_input(fmt::format("no results database \"{}\"", o.plot_db));
  std::optional<std::string> py = process::python_with("matplotlib");
  if (!py)
    return bad_input(fmt::format(
        "sweep plot needs python3 with matplotlib (Debian: sudo apt-get install python3-matplotlib; {})",
        process::python_advice()));
  std::vector<std::string> argv = {*py,        "-c",     kSweepPlotScript, "--db",     o.plot_db,    "--out",
                                   o.plot_out, "--kind", o.plot_kind,      "--metric", o.plot_metric};
  for (auto [flag, v] :
       {std::pair{"--x", &o.plot_x}, std::pair{"--lines", &o.plot_lines}, std::pair{"--y", &o.plot_y},
        std::pair{"--title", &o.plot_title}, std::pair{"--xlabel", &o.plot_xlabel},
        std::pair{"--ylabel", &o.plot_ylabel}, std::pair{"--legend-title", &o.plot_legend_title},
        std::pair{"--size", &o.plot_size}, std::pair{"--baseline", &o.plot_baseline}})
    if (!v->empty()) argv.insert(argv.end(), {flag, *v});
  const int rc = process::spawn(argv, process::Output::ToStderr);
  return rc == 0 ? kOk : rc == 1 ? kBadInput : kInternal;
}

}  // namespace

}  // namespace pipegrid::cli
