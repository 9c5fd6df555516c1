// YAML access with error messages that name file:line:column, the key path, what was expected and
// what was found, e.g.
//   exp.yaml:12:14: cluster.bandwidth: expected a bandwidth like "25GBps", got "fast"
// Parsing code throws InputError (internally, for readability); the public load functions catch it
// and return an Error value.
#pragma once

#include <yaml-cpp/yaml.h>

#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/units.h"

namespace pipegrid::input {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Document;

// A subtree of a document's tree that came from another document (a `--set` argument, a sweep
// file's axis value, an experiment's keys merged into a preset): messages about it name its origin.
struct Graft {
  YAML::Node node;
  const Document* origin;
  // Where in `origin` a node made for it stands (a key that `set_path` created, which has no
  // position of its own: the axis or argument that named it); null when the node has its own.
  YAML::Mark mark = YAML::Mark::null_mark();
};

// A document: where it came from (for messages) and its root node.
struct Document {
  std::string name;  // file path as given, or "<built-in example>"
  YAML::Node root;
  std::vector<Graft> grafts;
  // Documents the grafts point to that this one keeps alive (`--set` arguments).
  std::vector<std::shared_ptr<const Document>> owned;
  // For a `--set KEY=VALUE` argument: the column where VALUE starts in it (messages give the
  // column within the argument instead of file:line:column); -1 for files.
  int argument_offset = -1;

  // The document a node of this tree comes from: a graft's origin, else this one.
  const Document* origin_of(const YAML::Node& n) const;
  // Records that `n` (and what lies below it) comes from `origin`, at `mark` when n has no position.
  void graft(const YAML::Node& n, const Document* origin, YAML::Mark mark = YAML::Mark::null_mark());
  // n's position: its own, else the one its graft was given.
  YAML::Mark mark_of(const YAML::Node& n) const;
};

// A path written in a document, relative to the document's directory (absolute paths unchanged).
std::string resolve_path(const Document& doc, const std::string& path);

// Loads and parses a YAML file or text; syntax errors become InputError with the position.
Document load_document_file(const std::string& path);
Document load_document_text(const std::string& text, const std::string& name);

enum class Sign { NonNegative, Positive };

// Upper bound for counts read from files (layers, devices, micro-batches).
inline constexpr long long kMaxCount = 1'000'000;

class Node {
 public:
  Node(const Document* doc, YAML::Node node, std::string path, YAML::Mark mark);
  static Node root(const Document& doc);

  const std::string& path() const { return path_; }
  const YAML::Node& yaml() const { return node_; }
  YAML::Mark mark() const { return mark_; }
  const Document& document() const { return *doc_; }

  // "file:line:column: path" (without the path at the root): what fail() puts before its message.
  std::string where() const;
  // "file:line:column: path: what"
  [[noreturn]] void fail(std::string_view what) const;
  // "...: expected <expectation>, got <found()>"
  [[noreturn]] void expected(std::string_view expectation) const;
  // "\"text\"", "a mapping", "a list", "nothing".
  std::string found() const;

  bool is_null() const { return !node_.IsDefined() || node_.IsNull(); }
  bool is_map() const { return node_.IsMap(); }
  bool is_list() const { return node_.IsSequence(); }
  bool is_scalar() const { return node_.IsScalar(); }

  // Mapping access. require_map() fails unless this is a mapping; check_keys() fails on the first
  // key (in document order) not in `allowed`, suggesting close names.
  void require_map(std::string_view expectation) const;
  void check_keys(const std::vector<std::string_view>& allowed) const;
  bool has(std::string_view key) const;
  std::optional<Node> get(std::string_view key) const;
  // Fails with "<path.key>: expected <expectation>, got nothing (the key is missing)".
  Node need(std::string_view key, std::string_view expectation) const;

  // List access.
  std::vector<Node> items(std::string_view expectation) const;

  // Scalars.
  std::string string(std::string_view expectation = "a string") const;
  long long integer(long long min, long long max, std::string_view expectation) const;
  double number(std::string_view expectation) const;
  double quantity(Dimension d, Sign sign) const;
  bool boolean() const;
  // One of `choices`; the error lists them and suggests a close one.
  std::string choice(const std::vector<std::string_view>& choices, std::string_view what) const;

 private:
  const Document* doc_;
  YAML::Node node_;
  std::string path_;
  YAML::Mark mark_;
};

// Keys written in `device:` or `gpu:` may be a catalog name or a mapping: refining a device given by
// name turns `u280` into `{model: u280}` first.
bool is_device_key(std::string_view key);

// Sets the value at `path` (keys separated by '.', list items as `[i]`: "cluster.device.dsps",
// "workload.layers[2].forward") in `doc`'s tree to `value`, which comes from `origin`. Missing
// mappings on the way are created; a device given by name becomes {model: NAME}. A path that
// cannot be followed fails at `where` (the `--set` argument or the sweep file's key). A null value
// (`~`, `null`) of a mapping's key removes the key: the file's or the default's setting applies.
void set_path(Document& doc, std::string_view path, const YAML::Node& value, const Document* origin,
              const Node& where);

// Applies `--set KEY=VALUE` arguments to `doc` (VALUE is YAML: 18048, 25GBps, [4, 4], {dsps: 1}).
// Errors name the argument.
void apply_overrides(Document& doc, const std::vector<std::string>& arguments);

// Merges the mapping `overlay` into the mapping `base` (a tree of `doc`) in place: keys of both
// that hold mappings (or a device name and a mapping) are merged recursively, other keys of
// `overlay` replace or join `base`'s; `skip` keys of the top level are left out. Messages about the
// merged keys name the overlay's positions.
void merge_into(Document& doc, YAML::Node base, const Node& overlay,
                const std::vector<std::string_view>& skip);

// Reads a whole file named by node `where` (relative to its document); a failure is `where`'s error.
std::string read_referenced_file(const Node& where, const std::string& path);

// Close matches of `word` among `candidates` (edit distance), best first.
std::vector<std::string> close_matches(std::string_view word,
                                       const std::vector<std::string_view>& candidates);

// The names separated by ", " (for messages listing the valid choices).
std::string join(const std::vector<std::string_view>& names);

}  // namespace pipegrid::input
