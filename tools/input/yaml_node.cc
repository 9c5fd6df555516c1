#include "tools/input/yaml_node.h"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "core/file_io.h"

namespace pipegrid::input {
namespace {

std::string location(const Document& d, const YAML::Mark& m) {
  if (d.argument_offset >= 0) {  // a --set argument: the column within it, past the value's start
    if (m.line != 0 || m.column <= 0) return d.name;
    return fmt::format("{} (column {})", d.name, d.argument_offset + m.column + 1);
  }
  if (m.line < 0) return d.name;
  return fmt::format("{}:{}:{}", d.name, m.line + 1, m.column + 1);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string suggestion(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::vector<std::string> m = close_matches(word, candidates);
  if (m.empty()) return "";
  return fmt::format("did you mean \"{}\"? ", m.front());
}

// What yaml-cpp lets pass silently, checked on the parser's events (aliases are not expanded, so
// the walk is linear in the text): a key given twice in one mapping (yaml-cpp keeps the first) and
// a second document in one file (YAML::Load reads the first only).
class StrictnessCheck : public YAML::EventHandler {
 public:
  explicit StrictnessCheck(const Document& d) : doc_(d) {}

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents_ > 1)
      throw InputError(
          fmt::format("{}: a second YAML document (after \"---\" or \"...\"): a file holds one document",
                      location(doc_, mark)));
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { leaf(mark, nullptr); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { leaf(mark, nullptr); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string& value) override {
    leaf(mark, &value);
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    open(false);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(true);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    bool map = false;
    std::string path;
    bool at_key = true;  // a mapping: the next node is a key
    size_t index = 0;    // a list: the next item's index
    std::string key;     // a mapping: the key of the value to come
    std::map<std::string, YAML::Mark> keys;
  };

  // The key path of the node that starts now.
  std::string child_path() const {
    if (stack_.empty()) return "";
    const Frame& f = stack_.back();
    if (!f.map) return fmt::format("{}[{}]", f.path, f.index);
    return f.path.empty() ? f.key : f.path + "." + f.key;
  }
  // A node is complete: the parent moves on to its next key, value or item.
  void done() {
    if (stack_.empty()) return;
    Frame& f = stack_.back();
    if (f.map)
      f.at_key = !f.at_key;
    else
      ++f.index;
  }
  void leaf(const YAML::Mark& mark, const std::string* value) {
    if (!stack_.empty() && stack_.back().map && stack_.back().at_key) {
      Frame& f = stack_.back();
      f.key = value ? *value : "?";
      if (value) {
        auto [it, inserted] = f.keys.emplace(*value, mark);
        if (!inserted) {
          const std::string path = f.path.empty() ? *value : f.path + "." + *value;
          throw InputError(fmt::format("{}: {}: duplicate key, first given at {}:{} (a key may appear once)",
                                       location(doc_, mark), path, it->second.line + 1,
                                       it->second.column + 1));
        }
      }
    }
    done();
  }
  void open(bool map) {
    std::string path = child_path();
    if (!stack_.empty() && stack_.back().map && stack_.back().at_key) stack_.back().key = "?";
    stack_.push_back(Frame{map, std::move(path)});
  }
  void close() {
    stack_.pop_back();
    done();
  }

  const Document& doc_;
  int documents_ = 0;
  std::vector<Frame> stack_;
};

}  // namespace

std::string join(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view s : names) out += fmt::format("{}{}", out.empty() ? "" : ", ", s);
  return out;
}

std::vector<std::string> close_matches(std::string_view word,
                                       const std::vector<std::string_view>& candidates) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (std::string_view c : candidates) {
    size_t d = edit_distance(word, c);
    size_t limit = std::max<size_t>(2, std::max(word.size(), c.size()) / 3);
    bool prefix = !word.empty() && (c.substr(0, word.size()) == word || word.substr(0, c.size()) == c);
    if (d <= limit || prefix) scored.emplace_back(d, std::string(c));
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (auto& s : scored) out.push_back(std::move(s.second));
  return out;
}

std::string resolve_path(const Document& doc, const std::string& path) {
  std::filesystem::path p(path);
  if (p.is_absolute() || doc.name.empty() || doc.name.front() == '<') return p.string();
  return (std::filesystem::path(doc.name).parent_path() / p).lexically_normal().string();
}

std::string read_referenced_file(const Node& where, const std::string& path) {
  Result<std::string> text = read_input_file(path);
  if (!text) where.fail(text.error().message);
  return std::move(*text);
}

namespace {

// The offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlong forms,
// no surrogates, at most U+10FFFF), or npos.
size_t invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + n >= s.size()) return i;  // truncated at the end
    for (size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return i;
    }
    i += n + 1;
  }
  return std::string_view::npos;
}

}  // namespace

Document load_document_text(const std::string& text, const std::string& name) {
  Document d{name, {}};
  if (const size_t bad = invalid_utf8(text); bad != std::string_view::npos) {
    const size_t newline = bad == 0 ? std::string::npos : text.rfind('\n', bad - 1);
    const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + bad, '\n'));
    const size_t column = bad - (newline == std::string::npos ? 0 : newline + 1) + 1;  // in bytes
    throw InputError(fmt::format("{}:{}:{}: invalid UTF-8 (byte 0x{:02X}): YAML files are UTF-8 text", name,
                                 line, column, static_cast<unsigned char>(text[bad])));
  }
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    StrictnessCheck check(d);
    while (parser.HandleNextDocument(check)) {
    }
    d.root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: invalid YAML: {}", location(d, e.mark), e.msg));
  }
  return d;
}

Document load_document_file(const std::string& path) {
  Result<std::string> text = read_input_file(path);
  if (!text) throw InputError(text.error().message);
  return load_document_text(*text, path);
}

Node::Node(const Document* doc, YAML::Node node, std::string path, YAML::Mark mark)
    : doc_(doc), node_(std::move(node)), path_(std::move(path)), mark_(mark) {}

Node Node::root(const Document& doc) {
  YAML::Mark m;  // line 0, column 0
  if (doc.root.IsDefined() && !doc.root.IsNull()) m = doc.root.Mark();
  return Node(&doc, doc.root, "", m);
}

std::string Node::where() const {
  if (path_.empty()) return location(*doc_, mark_);
  return fmt::format("{}: {}", location(*doc_, mark_), path_);
}

void Node::fail(std::string_view what) const {
  throw InputError(fmt::format("{}: {}", where(), what));
}

void Node::expected(std::string_view expectation) const {
  fail(fmt::format("expected {}, got {}", expectation, found()));
}

std::string Node::found() const {
  if (is_null()) return "nothing";
  if (node_.IsMap() || node_.IsSequence()) {
    // What was written, in YAML's flow style, cut at about 40 bytes (on a character's first byte):
    // "got a list [16]" says more than "got a list".
    YAML::Emitter e;
    e << YAML::Flow << node_;
    std::string text = e.good() ? e.c_str() : "";
    if (text.size() > 40) {
      text.resize(37);
      while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
      if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
      text += "...";
    }
    return fmt::format("{}{}", node_.IsMap() ? "a mapping" : "a list", text.empty() ? "" : " " + text);
  }
  return fmt::format("\"{}\"", node_.Scalar());
}

void Node::require_map(std::string_view expectation) const {
  if (!node_.IsMap()) expected(expectation);
}

void Node::check_keys(const std::vector<std::string_view>& allowed) const {
  for (const auto& kv : node_) {
    const YAML::Node key = kv.first;
    std::string k = key.IsScalar() ? key.Scalar() : "?";
    if (std::find(allowed.begin(), allowed.end(), k) != allowed.end()) continue;
    Node kn(doc_->origin_of(key), key, path_.empty() ? k : path_ + "." + k, doc_->mark_of(key));
    kn.fail(fmt::format("unknown key ({}valid keys: {})", suggestion(k, allowed), join(allowed)));
  }
}

bool Node::has(std::string_view key) const {
  return node_.IsMap() && node_[std::string(key)].IsDefined();
}

std::optional<Node> Node::get(std::string_view key) const {
  if (!node_.IsMap()) return std::nullopt;
  for (const auto& kv : node_) {
    const YAML::Node k = kv.first;
    if (k.IsScalar() && k.Scalar() == key) {
      const YAML::Node v = kv.second;
      // A null value (`key:` with nothing) has no useful mark of its own: point at the key.
      YAML::Mark m = (v.IsDefined() && !v.IsNull()) ? v.Mark() : k.Mark();
      std::string p = path_.empty() ? std::string(key) : path_ + "." + std::string(key);
      return Node(doc_->origin_of(v.IsDefined() && !v.IsNull() ? v : k), v, p, m);
    }
  }
  return std::nullopt;
}

Node Node::need(std::string_view key, std::string_view expectation) const {
  std::optional<Node> n = get(key);
  if (n) return *n;
  std::string p = path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  Node missing(doc_, YAML::Node(), p, mark_);
  missing.fail(fmt::format("expected {}, got nothing (the key is missing)", expectation));
}

std::vector<Node> Node::items(std::string_view expectation) const {
  if (!node_.IsSequence()) expected(expectation);
  std::vector<Node> out;
  size_t i = 0;
  for (const auto& item : node_) {
    const YAML::Node n = item;
    out.emplace_back(doc_->origin_of(n), n, fmt::format("{}[{}]", path_, i++), n.Mark());
  }
  return out;
}

std::string Node::string(std::string_view expectation) const {
  if (!node_.IsScalar() || node_.Scalar().empty()) expected(expectation);
  return node_.Scalar();
}

long long Node::integer(long long min, long long max, std::string_view expectation) const {
  if (!node_.IsScalar()) expected(expectation);
  const std::string& s = node_.Scalar();
  long long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) expected(expectation);
  // A number above the range says it where the expectation names no bound ("a positive integer"
  // alone reads wrong for 20000000; "0 or 1" says it already).
  if (v > max && expectation.find_first_of("0123456789") == std::string_view::npos)
    expected(fmt::format("{} of at most {}", expectation, max));
  if (v > max) expected(expectation);
  if (v < min) expected(expectation);
  return v;
}

double Node::number(std::string_view expectation) const {
  if (!node_.IsScalar()) expected(expectation);
  const std::string& s = node_.Scalar();
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) expected(expectation);
  return v;
}

double Node::quantity(Dimension d, Sign sign) const {
  const std::string what = describe(d, sign == Sign::Positive ? "positive" : "non-negative");
  if (!node_.IsScalar()) expected(what);
  Result<double> v = parse_quantity(node_.Scalar(), d, /*allow_negative=*/true);
  if (!v) fail(v.error().message);
  if (sign == Sign::Positive ? !(*v > 0) : *v < 0) expected(what);
  return *v;
}

bool Node::boolean() const {
  if (node_.IsScalar()) {
    const std::string& s = node_.Scalar();
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
  }
  expected("true or false");
}

std::string Node::choice(const std::vector<std::string_view>& choices, std::string_view what) const {
  if (!node_.IsScalar()) expected(fmt::format("{} ({})", what, join(choices)));
  const std::string& s = node_.Scalar();
  if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
  fail(fmt::format("expected {} ({}), got \"{}\"{}", what, join(choices), s,
                   close_matches(s, choices).empty()
                       ? ""
                       : fmt::format(" (did you mean \"{}\"?)", close_matches(s, choices).front())));
}

const Document* Document::origin_of(const YAML::Node& n) const {
  if (!n.IsDefined()) return this;
  for (const Graft& g : grafts)
    if (g.node.IsDefined() && g.node.is(n)) return g.origin;
  return this;
}

void Document::graft(const YAML::Node& n, const Document* origin, YAML::Mark mark) {
  if (origin != this) grafts.push_back({n, origin, mark});
}

YAML::Mark Document::mark_of(const YAML::Node& n) const {
  if (!n.IsDefined() || !n.Mark().is_null()) return n.Mark();
  for (const Graft& g : grafts)
    if (!g.mark.is_null() && g.node.IsDefined() && g.node.is(n)) return g.mark;
  return n.Mark();
}

bool is_device_key(std::string_view key) {
  return key == "device" || key == "gpu";
}

namespace {

// One step of a key path: a mapping key, or a list index ("[2]").
struct Step {
  std::string key;
  long long index = -1;
};

std::vector<Step> parse_key_path(std::string_view path, const Node& where) {
  std::vector<Step> steps;
  size_t i = 0;
  const auto bad = [&](std::string_view why) {
    where.fail(
        fmt::format("bad key path \"{}\": {} (expected keys separated by '.', list items as [i], "
                    "like cluster.device.dsps or workload.layers[0].forward)",
                    path, why));
  };
  while (i < path.size()) {
    if (path[i] == '[') {
      const size_t close = path.find(']', i);
      if (close == std::string_view::npos) bad("an unclosed '['");
      long long v = -1;
      const std::string_view digits = path.substr(i + 1, close - i - 1);
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (digits.empty() || ec != std::errc() || p != digits.data() + digits.size() || v < 0)
        bad(fmt::format("\"[{}]\" is not a list index", digits));
      steps.push_back({"", v});
      i = close + 1;
      if (i < path.size() && path[i] == '.') {
        ++i;
        if (i == path.size()) bad("it ends with '.'");
      }
      continue;
    }
    size_t end = i;
    while (end < path.size() && path[end] != '.' && path[end] != '[') ++end;
    if (end == i) bad("an empty key");
    steps.push_back({std::string(path.substr(i, end - i)), -1});
    i = end;
    if (i < path.size() && path[i] == '.') {
      ++i;
      if (i == path.size()) bad("it ends with '.'");
    }
  }
  if (steps.empty()) bad("it is empty");
  return steps;
}

std::string describe_yaml(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "nothing";
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return fmt::format("a list of {}", n.size());
  return fmt::format("\"{}\"", n.Scalar());
}

// The key node of `map` whose text is `key`, or an undefined node.
YAML::Node key_node(const YAML::Node& map, std::string_view key) {
  for (const auto& kv : map)
    if (kv.first.IsScalar() && kv.first.Scalar() == key) return kv.first;
  return YAML::Node(YAML::NodeType::Undefined);
}

// Puts (key, value) into `map`, replacing the key's value if it has one; both nodes keep their
// identity (and so their positions).
void put(YAML::Node map, const YAML::Node& key, const YAML::Node& value) {
  map.remove(key.Scalar());
  map.force_insert(key, value);
}

// `device: u280` -> `device: {model: u280}`, the map returned; `key` is the mapping's key node.
YAML::Node device_as_map(Document& doc, YAML::Node parent, const YAML::Node& key, const YAML::Node& name,
                         const Document* origin) {
  YAML::Node map(YAML::NodeType::Map);
  YAML::Node model_key("model");
  map.force_insert(model_key, name);
  doc.graft(model_key, origin);
  doc.graft(map, origin);
  put(parent, key, map);
  return map;
}

}  // namespace

void set_path(Document& doc, std::string_view path, const YAML::Node& value, const Document* origin,
              const Node& where) {
  const std::vector<Step> steps = parse_key_path(path, where);
  if (!doc.root.IsDefined() || doc.root.IsNull()) doc.root.reset(YAML::Node(YAML::NodeType::Map));
  YAML::Node cur = doc.root;
  std::string walked;
  for (size_t s = 0; s < steps.size(); ++s) {
    const Step& step = steps[s];
    const bool last = s + 1 == steps.size();
    if (step.index >= 0) {
      if (!cur.IsSequence())
        where.fail(fmt::format("cannot follow \"{}\": {} is {}, not a list", path,
                               walked.empty() ? "the root" : walked, describe_yaml(cur)));
      if (static_cast<size_t>(step.index) >= cur.size())
        where.fail(fmt::format("cannot follow \"{}\": {} has {} items, no item [{}]", path, walked,
                               cur.size(), step.index));
      walked += fmt::format("[{}]", step.index);
      if (last) {
        YAML::Node item = cur[static_cast<size_t>(step.index)];
        item = value;  // the item now shares the value's data (and position)
        doc.graft(value, origin);
        return;
      }
      cur.reset(cur[static_cast<size_t>(step.index)]);
      continue;
    }
    if (!cur.IsMap())
      where.fail(fmt::format("cannot follow \"{}\": {} is {}, not a mapping", path,
                             walked.empty() ? "the document" : walked, describe_yaml(cur)));
    const std::string here = walked.empty() ? step.key : walked + "." + step.key;
    YAML::Node key = key_node(cur, step.key);
    if (last && value.IsNull()) {  // `~` or `null`: the key left out, as if never written
      if (key.IsDefined()) cur.remove(step.key);
      return;
    }
    if (last) {
      if (!key.IsDefined()) {
        key.reset(YAML::Node(step.key));
        doc.graft(key, origin, where.mark());  // an unknown key is reported where the path was written
      }
      put(cur, key, value);
      doc.graft(value, origin);
      return;
    }
    if (!key.IsDefined()) {  // a new mapping on the way
      key.reset(YAML::Node(step.key));
      YAML::Node map(YAML::NodeType::Map);
      cur.force_insert(key, map);
      doc.graft(key, origin, where.mark());
      doc.graft(map, origin);
      cur.reset(map);
    } else {
      YAML::Node next = cur[step.key];
      if (next.IsScalar() && is_device_key(step.key)) next.reset(device_as_map(doc, cur, key, next, origin));
      cur.reset(next);
    }
    walked = here;
  }
}

void apply_overrides(Document& doc, const std::vector<std::string>& arguments) {
  for (const std::string& arg : arguments) {
    const size_t eq = arg.find('=');
    auto set_doc = std::make_shared<Document>();
    set_doc->name = fmt::format("--set {}", arg);
    set_doc->argument_offset = eq == std::string::npos ? 0 : static_cast<int>(eq + 1) + 6;  // "--set " + KEY=
    const Node where = Node::root(*set_doc);
    if (eq == std::string::npos || eq == 0)
      where.fail("expected KEY=VALUE, like cluster.device.dsps=18048 or strategy.micro_batches=16");
    const std::string value = arg.substr(eq + 1);
    if (value.empty()) where.fail(fmt::format("expected a value after \"{}=\"", arg.substr(0, eq)));
    {
      Document parsed = load_document_text(value, set_doc->name);
      set_doc->root = parsed.root;
    }
    doc.owned.push_back(set_doc);
    set_path(doc, std::string_view(arg).substr(0, eq), set_doc->root, set_doc.get(), where);
  }
}

void merge_into(Document& doc, YAML::Node base, const Node& overlay,
                const std::vector<std::string_view>& skip) {
  for (const auto& kv : overlay.yaml()) {
    const YAML::Node key = kv.first;
    const YAML::Node value = kv.second;
    if (!key.IsScalar()) continue;
    const std::string k = key.Scalar();
    if (std::find(skip.begin(), skip.end(), k) != skip.end()) continue;
    const Node child = *overlay.get(k);
    YAML::Node base_value = static_cast<const YAML::Node&>(base)[k];
    const YAML::Node base_key = key_node(base, k);
    if (base_key.IsDefined() && value.IsMap()) {
      if (base_value.IsScalar() && is_device_key(k))
        base_value.reset(device_as_map(doc, base, base_key, base_value, &doc));
      if (base_value.IsMap()) {
        merge_into(doc, base_value, child, {});
        continue;
      }
    }
    put(base, key, value);
    doc.graft(key, overlay.document().origin_of(key));
    doc.graft(value, &child.document());
  }
}

}  // namespace pipegrid::input
