// Hostile input and outputs (issue 16): writes never destroy what was there, inputs that are not
// regular files (or never end) are refused, outputs never overwrite inputs or each other.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

using pipegrid::testing::read_file;
using pipegrid::testing::run_command;
using pipegrid::testing::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kExample =
    read_file(std::string(PIPEGRID_SOURCE_DIR) + "/experiments/example/experiment.yaml");

// Runs pipegrid with its file size limited to one block and SIGXFSZ ignored, so writes fail with EFBIG.
pipegrid::testing::CommandResult run_with_tiny_file_limit(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "trap '' XFSZ; ulimit -f 1; exec \"$0\" \"$@\"",
                                   PIPEGRID_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv);
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("a failed write (file size limit) leaves the existing file byte-identical, exit 2") {
  TempDir tmp;
  const std::string old = "previous content, must survive\n";
  const std::string trace = tmp.write("trace.json", old);
  auto r = run_with_tiny_file_limit({"run", "--trace", trace});
  CHECK(r.exit_code == 2);
  CHECK(r.err == "pipegrid: cannot write \"" + trace + "\": File too large (nothing was changed)\n");
  CHECK(read_file(trace) == old);
  CHECK(names_in(tmp.path) == std::vector<std::string>{"trace.json"});  // no temporary file left

  const std::string tasks = tmp.write("tasks.csv", old);
  CHECK(run_with_tiny_file_limit({"run", "--tasks", tasks}).exit_code == 2);
  CHECK(read_file(tasks) == old);

  // `cluster export -o` used to remove the file it could not write, even a pre-existing one.
  const std::string xml = tmp.write("platform.xml", old);
  auto e = run_with_tiny_file_limit({"cluster", "export", "dgx-a100-16", "--simgrid", "-o", xml});
  CHECK(e.exit_code == 2);
  CHECK(e.err == "pipegrid: cannot write \"" + xml + "\": File too large (nothing was changed)\n");
  CHECK(read_file(xml) == old);
  CHECK(names_in(tmp.path) == std::vector<std::string>{"platform.xml", "tasks.csv", "trace.json"});
}

TEST_CASE("a successful write replaces the file and keeps its permissions") {
  TempDir tmp;
  const std::string trace = tmp.write("trace.json", "old");
  fs::permissions(trace, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  CHECK(run_command({PIPEGRID_BINARY, "run", "--trace", trace}).exit_code == 0);
  CHECK(read_file(trace).find("traceEvents") != std::string::npos);
  CHECK(fs::status(trace).permissions() ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
  CHECK(names_in(tmp.path) == std::vector<std::string>{"trace.json"});
}

TEST_CASE("an output that is an input or another output is refused before anything runs") {
  TempDir tmp;
  const std::string exp = tmp.write("exp.yaml", kExample);
  auto same_as_input = run_command({PIPEGRID_BINARY, "run", exp, "--trace", exp});
  CHECK(same_as_input.exit_code == 2);
  CHECK(same_as_input.err ==
        "pipegrid: --trace \"" + exp + "\" is the experiment file: an output must not overwrite an input\n");
  CHECK(read_file(exp) == kExample);
  // The same file by another name.
  auto via_dots =
      run_command({PIPEGRID_BINARY, "run", exp, "--memory", (tmp.path / "." / "exp.yaml").string()});
  CHECK(via_dots.exit_code == 2);
  CHECK(read_file(exp) == kExample);

  const std::string x = (tmp.path / "x").string();
  auto twice = run_command({PIPEGRID_BINARY, "run", exp, "--trace", x, "--tasks", x});
  CHECK(twice.exit_code == 2);
  CHECK(twice.err == "pipegrid: --trace \"" + x + "\" and --tasks \"" + x +
                         "\" are the same file: each output needs its own\n");
  CHECK(twice.out.empty());
  CHECK(!fs::exists(x));
  // --plot-data keeps the plot's tasks.csv in DIR: the same file as --tasks. (Without it the plot's
  // data goes to a private folder, and the two do not meet.)
  auto plot = run_command({PIPEGRID_BINARY, "run", exp, "--tasks", (tmp.path / "tasks.csv").string(),
                           "--plot", tmp.path.string(), "--plot-data"});
  CHECK(plot.exit_code == 2);

  const std::string cluster = tmp.write("c.yaml", "generator: {kind: ring, count: 2}\n");
  auto e = run_command({PIPEGRID_BINARY, "cluster", "export", cluster, "--simgrid", "-o", cluster});
  CHECK(e.exit_code == 2);
  CHECK(read_file(cluster) == "generator: {kind: ring, count: 2}\n");
}

TEST_CASE("an output in a missing folder, or onto a directory, FIFO or symbolic link, is an error") {
  TempDir tmp;
  const std::string missing = (tmp.path / "no-such-folder" / "t.json").string();
  auto r = run_command({PIPEGRID_BINARY, "run", "--trace", missing});
  CHECK(r.exit_code == 2);
  CHECK(r.err == "pipegrid: cannot write \"" + missing + "\": folder \"" +
                     (tmp.path / "no-such-folder").string() +
                     "\": No such file or directory (nothing was changed)\n");
  CHECK(!fs::exists(tmp.path / "no-such-folder"));

  fs::create_directory(tmp.path / "d");
  auto dir = run_command({PIPEGRID_BINARY, "run", "--trace", (tmp.path / "d").string()});
  CHECK(dir.exit_code == 2);
  CHECK(dir.err.find("it is a directory; outputs are written to regular files only") != std::string::npos);

  const std::string fifo = (tmp.path / "fifo").string();
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  auto f = run_command({PIPEGRID_BINARY, "run", "--tasks", fifo});
  CHECK(f.exit_code == 2);
  CHECK(f.err.find("it is a FIFO") != std::string::npos);

  const std::string target = tmp.write("target", "kept");
  fs::create_symlink(target, tmp.path / "link");
  auto l = run_command({PIPEGRID_BINARY, "run", "--memory", (tmp.path / "link").string()});
  CHECK(l.exit_code == 2);
  CHECK(l.err.find("it is a symbolic link") != std::string::npos);
  CHECK(read_file(target) == "kept");
  CHECK(fs::is_symlink(tmp.path / "link"));
}

TEST_CASE("inputs that are not regular files or exceed 64 MiB are refused, not read forever") {
  TempDir tmp;
  auto zero = run_command({PIPEGRID_BINARY, "run", "/dev/zero"});
  CHECK(zero.exit_code == 2);
  CHECK(zero.err == "pipegrid: cannot read \"/dev/zero\": a character device, not a regular file\n");
  auto dir = run_command({PIPEGRID_BINARY, "run", tmp.path.string()});
  CHECK(dir.exit_code == 2);
  CHECK(dir.err == "pipegrid: cannot read \"" + tmp.path.string() + "\": a directory, not a regular file\n");
  const std::string fifo = (tmp.path / "fifo").string();
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  auto f = run_command({PIPEGRID_BINARY, "run", fifo});  // no writer: must not wait for one
  CHECK(f.exit_code == 2);
  CHECK(f.err == "pipegrid: cannot read \"" + fifo + "\": a FIFO, not a regular file\n");

  const std::string big = (tmp.path / "big.yaml").string();
  fs::resize_file(tmp.write("big.yaml", ""), (64u << 20) + 1);  // sparse
  auto b = run_command({PIPEGRID_BINARY, "run", big});
  CHECK(b.exit_code == 2);
  CHECK(b.err == "pipegrid: cannot read \"" + big + "\": larger than the 64 MiB limit for input files\n");

  auto stdin_zero = run_command({"/bin/sh", "-c", "exec \"$0\" run - < /dev/zero", PIPEGRID_BINARY});
  CHECK(stdin_zero.exit_code == 2);
  CHECK(stdin_zero.err ==
        "pipegrid: cannot read \"<stdin>\": larger than the 64 MiB limit for input files\n");

  // Files named inside an experiment, and by other commands.
  const std::string exp =
      tmp.write("exp.yaml",
                "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB, "
                "parameters: 1MiB}\ncluster: {file: /dev/zero}\n"
                "strategy: {partitioner: uniform, schedule: 1f1b, micro_batches: 2}\n");
  auto referenced = run_command({PIPEGRID_BINARY, "run", exp});
  CHECK(referenced.exit_code == 2);
  CHECK(referenced.err.find("cannot read \"/dev/zero\": a character device, not a regular file") !=
        std::string::npos);
  auto schedule =
      run_command({PIPEGRID_BINARY, "schedule", "file", "-p", "2", "-m", "2", "--file", "/dev/zero"});
  CHECK(schedule.exit_code == 2);
  CHECK(schedule.err == "pipegrid: cannot read \"/dev/zero\": a character device, not a regular file\n");
  const std::string profile_fifo = (tmp.path / "profile.txt").string();
  REQUIRE(mkfifo(profile_fifo.c_str(), 0600) == 0);
  auto profile = run_command({PIPEGRID_BINARY, "workload", "show", profile_fifo});
  CHECK(profile.exit_code == 2);
  CHECK(profile.err == "pipegrid: cannot read \"" + profile_fifo + "\": a FIFO, not a regular file\n");
}

TEST_CASE("input-controlled depth: 100000 nested zones and a 100000-layer model listed last-first") {
  TempDir tmp;
  // Before: both overflowed the stack (recursive zone reader, recursive topological sort).
  constexpr int kDepth = 100000;
  std::string xml = "<?xml version=\"1.0\"?>\n<platform version=\"4.1\">\n";
  for (int i = 0; i < kDepth; ++i) xml += "<zone id=\"z" + std::to_string(i) + "\" routing=\"Full\">";
  for (int i = 0; i < kDepth; ++i) xml += "</zone>";
  xml += "\n</platform>\n";
  tmp.write("deep.xml", xml);
  const std::string exp = tmp.write(
      "exp.yaml", "workload: {model: resnet50}\ncluster: {file: deep.xml}\nstrategy: {micro_batches: 2}\n");
  auto r = run_command({PIPEGRID_BINARY, "run", exp});
  CHECK(r.exit_code == 2);
  // The 65th <zone> (z64) is the first too deep. Its column, by hand: `<zone id="zN" routing="Full">` is
  // 28 characters + the digits of N, so z0..z9 take 29 each, z10..z63 30 each, and z64 starts after them.
  CHECK(r.err == "pipegrid: " + (tmp.path / "deep.xml").string() +
                     ":3:" + std::to_string(1 + 10 * 29 + 54 * 30) +
                     ": <zone id=\"z64\">: zones nest more than 64 deep (pipegrid's limit)\n");

  // Layer i takes l(i-1) as input and the file lists them from the last to the first: a depth-first
  // sort from the first entry goes 100000 deep. The model is a chain of 8-wide linear layers.
  std::string model = "name: deep\nlayers:\n";
  for (int i = kDepth - 1; i > 0; --i)
    model += "  - {name: l" + std::to_string(i) +
             ", kind: linear, in_features: 8, out_features: 8, inputs: [l" + std::to_string(i - 1) + "]}\n";
  model += "  - {name: l0, kind: input, shape: [8]}\n";
  const std::string file = tmp.write("deep.yaml", model);
  r = run_command({PIPEGRID_BINARY, "workload", "show", "--json", file});
  CHECK(r.exit_code == 0);
  // 99999 layers of 8 x 8 multiply-adds = 128 FLOP each, per sample.
  CHECK(r.out.find("\"forward_flops_per_sample\": " + std::to_string(128LL * (kDepth - 1))) !=
        std::string::npos);
}

TEST_CASE("command-line numbers and paths: nan, inf and empty strings are usage errors") {
  auto r = run_command({PIPEGRID_BINARY, "workload", "show", "--profile-batch", "nan", "vgg16"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--profile-batch: expected a finite positive number, got nan") != std::string::npos);
  r = run_command({PIPEGRID_BINARY, "workload", "show", "-b", "inf", "vgg16"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("expected a whole number, got \"inf\" (samples per micro-batch)") != std::string::npos);
  // Samples per micro-batch are whole and at most an experiment's 1,000,000 (0.5 and 1e30 were shown).
  for (const char* b : {"0.5", "1e30"}) {
    r = run_command({PIPEGRID_BINARY, "workload", "show", "-b", b, "vgg16"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("(samples per micro-batch)") != std::string::npos);
  }
  r = run_command({PIPEGRID_BINARY, "place", "resnet50", "--backends",
                   std::string(PIPEGRID_SOURCE_DIR) + "/topologies/backends/a100.yaml", "--micro-batch-size",
                   "2000000"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("expected at most 1000000 samples per micro-batch, got 2000000") != std::string::npos);
  r = run_command({PIPEGRID_BINARY, "run", ""});  // before: ran the built-in example
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("experiment: expected a file name, got an empty string") != std::string::npos);
  CHECK(r.out.empty());
  r = run_command({PIPEGRID_BINARY, "plan", ""});
  CHECK(r.exit_code == 2);
}

TEST_CASE(
    "an output never replaces a file the command read: a cluster file the experiment names, the experiment") {
  // Until 2026-12-05 only the experiment file itself was compared: `run --trace` onto the cluster file
  // the experiment names, and `export --graph` onto the experiment, replaced them.
  TempDir tmp;
  const std::string cluster_text =
      "kind: switch\ncount: 2\ndevice: {name: gpu, memory: 16GiB}\nbandwidth: 10GBps\nlatency: 1us\n";
  const std::string cluster = tmp.write("c.yaml", cluster_text);
  const std::string exp_text =
      "workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
      "cluster: {file: c.yaml}\nstrategy: {micro_batches: 2}\n";
  const std::string exp = tmp.write("e.yaml", exp_text);
  auto trace = run_command({PIPEGRID_BINARY, "run", exp, "--trace", cluster});
  CHECK(trace.exit_code == 2);
  CHECK(trace.err.find("it is a file this command read as an input; an output must not overwrite an input") !=
        std::string::npos);
  CHECK(read_file(cluster) == cluster_text);
  auto graph = run_command({PIPEGRID_BINARY, "export", exp, "--graph", exp});
  CHECK(graph.exit_code == 2);
  CHECK(read_file(exp) == exp_text);
  // Another file is written as before.
  CHECK(run_command({PIPEGRID_BINARY, "export", exp, "--graph", (tmp.path / "g.json").string()}).exit_code ==
        0);
}

TEST_CASE(
    "export --chakra refuses a folder that holds an earlier export's traces, and a --prefix with a path") {
  TempDir tmp;
  const std::string dir = (tmp.path / "traces").string();
  fs::create_directory(dir);
  const std::string old = (fs::path(dir) / "pipegrid.3.et").string();
  {
    std::ofstream f(old);
    f << "an earlier export's rank 3";
  }
  auto r = run_command({PIPEGRID_BINARY, "export", "--chakra", dir});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("already holds 1 trace of an earlier export (pipegrid.3.et)") != std::string::npos);
  CHECK(read_file(old) == "an earlier export's rank 3");
  auto escape = run_command({PIPEGRID_BINARY, "export", "--chakra", dir, "--prefix", "../out"});
  CHECK(escape.exit_code == 2);
  CHECK(!fs::exists(tmp.path / "out.0.et"));
}
