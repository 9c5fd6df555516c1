#include "tools/sweep/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <set>

#include "core/file_io.h"
#include "core/units.h"
#include "tools/input/cluster_yaml.h"
#include "tools/input/device_yaml.h"

namespace pipegrid::sweep {

using input::Document;
using input::InputError;
using input::Node;

std::string fnv1a_hex(std::string_view text, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

// --- filter expressions --------------------------------------------------------------------------
//   expr := or;  or := and ("or" and)*;  and := not ("and" not)*;  not := "not" not | cmp
//   cmp := sum (("==" | "!=" | "<" | "<=" | ">" | ">=") sum)?
//   sum := prod (("+" | "-") prod)*;  prod := unary (("*" | "/") unary)*;  unary := "-" unary | atom
//   atom := NUMBER[UNIT] | 'text' | "text" | true | false | AXIS.PATH | "(" expr ")"

class Expression {
 public:
  using Lookup = std::function<Value(size_t axis)>;
  virtual ~Expression() = default;
  virtual Value eval(const Lookup& lookup) const = 0;
};

namespace {

struct Constant : Expression {
  Value v;
  explicit Constant(Value x) : v(std::move(x)) {}
  Value eval(const Lookup&) const override { return v; }
};

struct AxisRef : Expression {
  size_t axis;
  explicit AxisRef(size_t a) : axis(a) {}
  Value eval(const Lookup& lookup) const override { return lookup(axis); }
};

// "a bandwidth", "a time", "a number", "a quantity in B s^-1 FLOP^2" for messages.
std::string dimension_name(const std::array<int, 3>& d) {
  static const std::pair<std::array<int, 3>, const char*> known[] = {
      {{0, 0, 0}, "a number"},     {{1, 0, 0}, "a time"},       {{0, 1, 0}, "a size in bytes"},
      {{-1, 1, 0}, "a bandwidth"}, {{-1, 0, 1}, "a FLOP rate"}, {{0, 0, 1}, "a FLOP count"},
      {{-1, 0, 0}, "a frequency"}};
  for (const auto& [dim, name] : known)
    if (dim == d) return name;
  std::string units;
  const char* base[] = {"s", "B", "FLOP"};
  for (size_t i = 0; i < 3; ++i)
    if (d[i] != 0)
      units +=
          fmt::format("{}{}{}", units.empty() ? "" : " ", base[i], d[i] == 1 ? "" : fmt::format("^{}", d[i]));
  return "a quantity in " + units;
}

std::string type_name(const Value& v) {
  return std::holds_alternative<Quantity>(v) ? dimension_name(std::get<Quantity>(v).dimension)
         : std::holds_alternative<bool>(v)   ? "true/false"
                                             : "text";
}

struct Operation : Expression {
  std::string op;
  std::unique_ptr<Expression> a, b;  // b is null for unary operators
  const Node* where;
  Value eval(const Lookup& lookup) const override {
    const Value x = a->eval(lookup);
    if (op == "not") return !truth(x);
    if (op == "neg") return Quantity{-number(x).value, number(x).dimension};
    if (op == "and") return truth(x) && truth(b->eval(lookup));
    if (op == "or") return truth(x) || truth(b->eval(lookup));
    const Value y = b->eval(lookup);
    const bool quantities = std::holds_alternative<Quantity>(x) && std::holds_alternative<Quantity>(y);
    // Quantities of different kinds (a bandwidth and a time, or a bandwidth and a bare number) are
    // refused: their SI values would compare or add without meaning.
    auto same_kind = [&] {
      if (quantities && std::get<Quantity>(x).dimension != std::get<Quantity>(y).dimension)
        where->fail(fmt::format("cannot use {} with {} and {}{}", op, type_name(x), type_name(y),
                                std::get<Quantity>(x).dimension == std::array<int, 3>{} ||
                                        std::get<Quantity>(y).dimension == std::array<int, 3>{}
                                    ? " (give the number its unit, e.g. 40GBps, or the axis values theirs)"
                                    : ""));
    };
    if (op == "==" || op == "!=") {
      same_kind();
      return (x == y) == (op == "==");
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      if (x.index() != y.index() || std::holds_alternative<bool>(x))
        where->fail(fmt::format("cannot compare {} with {} using {}", type_name(x), type_name(y), op));
      same_kind();
      const int c = quantities ? (std::get<Quantity>(x).value < std::get<Quantity>(y).value   ? -1
                                  : std::get<Quantity>(y).value < std::get<Quantity>(x).value ? 1
                                                                                              : 0)
                               : std::get<std::string>(x).compare(std::get<std::string>(y));
      return op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    const Quantity p = number(x), q = number(y);
    if (op == "+" || op == "-") {
      same_kind();
      const double sum = op == "+" ? p.value + q.value : p.value - q.value;
      if (!std::isfinite(sum)) where->fail(fmt::format("{} gives a number too large at this point", op));
      return Quantity{sum, p.dimension};
    }
    // A division by zero gave inf or NaN, whose comparisons kept or dropped points without a word.
    if (op == "/" && q.value == 0)
      where->fail(
          "a division by zero at this point (guard it: `DIVISOR != 0 and ...` is evaluated left to right)");
    Quantity r{op == "*" ? p.value * q.value : p.value / q.value, p.dimension};
    for (size_t i = 0; i < 3; ++i) r.dimension[i] += op == "*" ? q.dimension[i] : -q.dimension[i];
    if (!std::isfinite(r.value)) where->fail(fmt::format("{} gives a number too large at this point", op));
    return r;
  }
  bool truth(const Value& v) const {
    if (!std::holds_alternative<bool>(v))
      where->fail(fmt::format("expected true/false around {}, got {}", op, type_name(v)));
    return std::get<bool>(v);
  }
  Quantity number(const Value& v) const {
    if (!std::holds_alternative<Quantity>(v))
      where->fail(fmt::format("expected a number around {}, got {}", op == "neg" ? "-" : op, type_name(v)));
    return std::get<Quantity>(v);
  }
};

// A scalar as filters see it: a number, a quantity in SI units with its dimension, true/false, else
// text.
Value value_of(const std::string& s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc() && p == s.data() + s.size()) return Quantity{v, {}};
  if (s == "true") return true;
  if (s == "false") return false;
  static const std::pair<Dimension, std::array<int, 3>> kinds[] = {
      {Dimension::Time, {1, 0, 0}},      {Dimension::Bytes, {0, 1, 0}}, {Dimension::Bandwidth, {-1, 1, 0}},
      {Dimension::FlopRate, {-1, 0, 1}}, {Dimension::Flops, {0, 0, 1}}, {Dimension::Frequency, {-1, 0, 0}}};
  for (const auto& [d, dimension] : kinds)
    if (Result<double> q = parse_quantity(s, d, true)) return Quantity{*q, dimension};
  return s;
}

class Parser {
 public:
  Parser(std::string text, const Node& where, const std::vector<Axis>& axes)
      : s_(std::move(text)), where_(where), axes_(axes) {}

  std::unique_ptr<Expression> parse() {
    auto e = parse_or();
    skip_space();
    if (i_ < s_.size()) fail(fmt::format("unexpected \"{}\"", s_.substr(i_)));
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    const std::string shown = s_.size() <= 200 ? s_ : s_.substr(0, 100) + "...";
    where_.fail(fmt::format("in the filter \"{}\" at character {}: {}", shown, i_ + 1, why));
  }
  // Bounds on what a filter builds, so that a hostile one gets an error instead of exhausting the
  // stack: the parser recurses per nesting level ("(", "not", "-") and evaluation and destruction
  // per level of the tree, whose depth is at most its operation count.
  static constexpr int kMaxNesting = 100;
  static constexpr size_t kMaxOperations = 1000;
  struct Deeper {
    Parser& p;
    explicit Deeper(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting)
        p.fail(fmt::format("nested deeper than {} levels (parentheses, not, unary minus)", kMaxNesting));
    }
    ~Deeper() { --p.depth_; }
  };
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool word(std::string_view w) {
    skip_space();
    if (s_.compare(i_, w.size(), w) != 0) return false;
    const size_t end = i_ + w.size();
    if (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_'))
      return false;
    i_ = end;
    return true;
  }
  bool symbol(std::string_view w) {
    skip_space();
    if (s_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }
  std::unique_ptr<Expression> binary(std::string op, std::unique_ptr<Expression> a,
                                     std::unique_ptr<Expression> b) {
    if (++operations_ > kMaxOperations)
      fail(fmt::format("more than {} operations: split it into a list of conditions", kMaxOperations));
    auto o = std::make_unique<Operation>();
    o->op = std::move(op);
    o->a = std::move(a);
    o->b = std::move(b);
    o->where = &where_;
    return o;
  }
  std::unique_ptr<Expression> parse_or() {
    auto e = parse_and();
    while (word("or")) e = binary("or", std::move(e), parse_and());
    return e;
  }
  std::unique_ptr<Expression> parse_and() {
    auto e = parse_not();
    while (word("and")) e = binary("and", std::move(e), parse_not());
    return e;
  }
  std::unique_ptr<Expression> parse_not() {
    if (word("not")) {
      Deeper d(*this);
      return binary("not", parse_not(), nullptr);
    }
    return parse_cmp();
  }
  std::unique_ptr<Expression> parse_cmp() {
    auto e = parse_sum();
    for (std::string_view op : {"==", "!=", "<=", ">=", "<", ">"})
      if (symbol(op)) return binary(std::string(op), std::move(e), parse_sum());
    return e;
  }
  std::unique_ptr<Expression> parse_sum() {
    auto e = parse_prod();
    for (;;) {
      if (symbol("+"))
        e = binary("+", std::move(e), parse_prod());
      else if (symbol("-"))
        e = binary("-", std::move(e), parse_prod());
      else
        return e;
    }
  }
  std::unique_ptr<Expression> parse_prod() {
    auto e = parse_unary();
    for (;;) {
      if (symbol("*"))
        e = binary("*", std::move(e), parse_unary());
      else if (symbol("/"))
        e = binary("/", std::move(e), parse_unary());
      else
        return e;
    }
  }
  std::unique_ptr<Expression> parse_unary() {
    if (symbol("-")) {
      Deeper d(*this);
      return binary("neg", parse_unary(), nullptr);
    }
    return parse_atom();
  }
  std::unique_ptr<Expression> parse_atom() {
    skip_space();
    if (i_ >= s_.size()) fail("expected a value, an axis or \"(\", got the end");
    const char c = s_[i_];
    if (c == '(') {
      ++i_;
      Deeper d(*this);
      auto e = parse_or();
      if (!symbol(")")) fail("expected \")\"");
      return e;
    }
    if (c == '\'' || c == '"') {
      const size_t end = s_.find(c, i_ + 1);
      if (end == std::string::npos) fail("an unclosed quote");
      std::string text = s_.substr(i_ + 1, end - i_ - 1);
      i_ = end + 1;
      return std::make_unique<Constant>(std::move(text));
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      size_t end = i_;
      while (end < s_.size() &&
             (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '.' || s_[end] == '/' ||
              ((s_[end] == '+' || s_[end] == '-') && (s_[end - 1] == 'e' || s_[end - 1] == 'E'))))
        ++end;
      const std::string text = s_.substr(i_, end - i_);
      Value v = value_of(text);
      if (!std::holds_alternative<Quantity>(v))
        fail(fmt::format("\"{}\" is not a number or a quantity", text));
      i_ = end;
      return std::make_unique<Constant>(v);
    }
    if (word("true")) return std::make_unique<Constant>(true);
    if (word("false")) return std::make_unique<Constant>(false);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = i_;
      while (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_' ||
                                 s_[end] == '.' || s_[end] == '[' || s_[end] == ']'))
        ++end;
      const std::string name = s_.substr(i_, end - i_);
      for (size_t a = 0; a < axes_.size(); ++a)
        if (axes_[a].path == name) {
          i_ = end;
          return std::make_unique<AxisRef>(a);
        }
      std::vector<std::string_view> names;
      for (const Axis& a : axes_) names.push_back(a.path);
      std::vector<std::string> close = input::close_matches(name, names);
      std::string all;
      for (std::string_view n : names) all += fmt::format("{}{}", all.empty() ? "" : ", ", n);
      fail(fmt::format("\"{}\" is not an axis ({}axes: {}); quote text values: 'u280'", name,
                       close.empty() ? "" : fmt::format("did you mean \"{}\"? ", close.front()), all));
    }
    fail(fmt::format("unexpected \"{}\"", s_.substr(i_)));
  }

  std::string s_;
  size_t i_ = 0;
  int depth_ = 0;
  size_t operations_ = 0;
  const Node& where_;
  const std::vector<Axis>& axes_;
};

// --- axis values ----------------------------------------------------------------------------------

std::string label_of(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter out;
  out.SetMapFormat(YAML::Flow);
  out.SetSeqFormat(YAML::Flow);
  out << n;
  return out.c_str();
}

nlohmann::json json_of(const YAML::Node& n) {
  if (!n.IsScalar()) return label_of(n);
  const std::string& s = n.Scalar();
  long long i = 0;
  if (auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
      ec == std::errc() && p == s.data() + s.size())
    return i;
  double d = 0;
  if (auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
      ec == std::errc() && p == s.data() + s.size() && std::isfinite(d))
    return d;
  if (s == "true") return true;
  if (s == "false") return false;
  return s;
}

// "100Gbps" -> {100, "Gbps"}; false when the text does not start with a number.
bool split_quantity(const std::string& s, double& number, std::string& unit) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), number);
  if (ec != std::errc() || !std::isfinite(number)) return false;
  unit = std::string(p, s.data() + s.size());
  return true;
}

std::string format_number(double x) {
  if (std::abs(x) < 1e15 && x == std::round(x))
    return fmt::format("{}", static_cast<long long>(std::round(x)));
  return fmt::format("{:.12g}", x);
}

// A scalar node holding `text`, positioned at `at` (for messages about it).
YAML::Node positioned(const std::string& text, const YAML::Mark& at) {
  std::string padded(std::max(at.line, 0), '\n');
  padded.append(std::max(at.column, 0), ' ');
  padded += text;
  return YAML::Load(padded);
}

std::vector<std::string> split_keys(std::string_view path) {
  std::vector<std::string> keys;
  size_t start = 0;
  for (size_t i = 0; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '.') {
      keys.emplace_back(path.substr(start, i - start));
      start = i + 1;
    }
  return keys;
}

// The value a key path has in an experiment tree, looking through cluster presets and the device
// catalog (`cluster.device.dsps` of `cluster: {preset: fpga-ring-u280-8}` is the U280's 9024).
YAML::Node effective_value(const YAML::Node& cur, const std::vector<std::string>& keys, size_t i) {
  const YAML::Node none(YAML::NodeType::Undefined);
  if (i == keys.size()) return cur;
  if (cur.IsMap()) {
    const YAML::Node next = cur[keys[i]];
    if (next.IsDefined()) return effective_value(next, keys, i + 1);
    if (const YAML::Node preset = cur["preset"]; preset.IsDefined() && preset.IsScalar())
      for (const input::ClusterPreset& p : input::cluster_presets())
        if (p.name == preset.Scalar()) return effective_value(YAML::Load(std::string(p.text)), keys, i);
    if (const YAML::Node model = cur["model"]; model.IsDefined() && model.IsScalar() && i + 1 == keys.size())
      return input::catalog_value(model.Scalar(), keys[i]);
    return none;
  }
  if (cur.IsScalar() && i > 0 && i + 1 == keys.size() && input::is_device_key(keys[i - 1]))
    return input::catalog_value(cur.Scalar(), keys[i]);
  return none;
}

void add_value(Axis& axis, const YAML::Node& v) {
  axis.values.push_back(v);
  axis.labels.push_back(label_of(v));
  axis.json_values.push_back(json_of(v));
  axis.filter_values.push_back(v.IsScalar() ? value_of(v.Scalar()) : Value(label_of(v)));
}

constexpr size_t kMaxValues = 100'000;

Axis parse_axis(const Node& key, const Node& spec, const YAML::Node& base_root) {
  Axis axis;
  axis.path = key.yaml().Scalar();
  const std::string what =
      "a list of values, or a mapping with values, scale (and of), or from, to and step or times";
  if (spec.is_list()) {
    for (const Node& v : spec.items(what)) add_value(axis, v.yaml());
  } else if (spec.is_map()) {
    spec.check_keys({"values", "scale", "of", "from", "to", "step", "times"});
    if (auto v = spec.get("values")) {
      spec.check_keys({"values"});
      for (const Node& x : v->items("a list of values")) add_value(axis, x.yaml());
    } else if (auto sc = spec.get("scale")) {
      spec.check_keys({"scale", "of"});
      const YAML::Node base =
          spec.get("of") ? spec.get("of")->yaml() : effective_value(base_root, split_keys(axis.path), 0);
      if (!base.IsDefined() || !base.IsScalar())
        sc->fail(
            fmt::format("the base experiment gives {} no value to scale (write `of: VALUE`)", axis.path));
      double b = 0;
      std::string unit;
      if (!split_quantity(base.Scalar(), b, unit))
        sc->fail(fmt::format("cannot scale \"{}\" ({}'s base value): not a number or a quantity",
                             base.Scalar(), axis.path));
      for (const Node& f : sc->items("a list of factors like [0.5, 1, 2, 4]")) {
        const double factor = f.number("a factor (a number) like 0.5 or 2");
        add_value(axis, positioned(format_number(b * factor) + unit, f.mark()));
      }
    } else {
      const Node from = spec.need("from", what), to = spec.need("to", "the last value of the range");
      double a = 0, z = 0;
      std::string ua, uz;
      if (!from.is_scalar() || !split_quantity(from.yaml().Scalar(), a, ua))
        from.expected("a number or a quantity like 100Gbps");
      if (!to.is_scalar() || !split_quantity(to.yaml().Scalar(), z, uz))
        to.expected("a number or a quantity like 400Gbps");
      if (ua != uz) to.fail(fmt::format("expected the unit of from (\"{}\"), got \"{}\"", ua, uz));
      if (z < a)
        to.fail(
            fmt::format("expected a value at least from's {}, got {}", format_number(a), format_number(z)));
      std::vector<double> xs;
      if (auto st = spec.get("step")) {
        if (spec.has("times")) st->fail("give step (arithmetic) or times (geometric), not both");
        double step = 0;
        std::string us;
        if (!st->is_scalar() || !split_quantity(st->yaml().Scalar(), step, us) || !(step > 0) ||
            (us != ua && !us.empty()))
          st->expected(fmt::format("a positive step in from's unit (\"{}\")", ua));
        for (size_t k = 0; a + k * step <= z * (1 + 1e-12) + 1e-12; ++k) {
          if (xs.size() >= kMaxValues) st->fail(fmt::format("more than {} values", kMaxValues));
          xs.push_back(a + k * step);
        }
      } else if (auto t = spec.get("times")) {
        const double r = t->number("a factor above 1 like 2");
        if (!(r > 1)) t->expected("a factor above 1 like 2");
        if (!(a > 0)) from.expected("a positive value (a geometric range multiplies it)");
        for (double x = a; x <= z * (1 + 1e-12); x *= r) {
          if (xs.size() >= kMaxValues) t->fail(fmt::format("more than {} values", kMaxValues));
          xs.push_back(x);
        }
      } else {
        spec.need("step", "a step (arithmetic range) or `times` (geometric range)");
      }
      for (double x : xs) add_value(axis, positioned(format_number(x) + ua, from.mark()));
    }
  } else {
    spec.expected(what);
  }
  if (axis.values.empty()) spec.expected("at least one value");
  return axis;
}

bool path_prefix(const std::string& a, const std::string& b) {
  return b.size() > a.size() && b.compare(0, a.size(), a) == 0 && (b[a.size()] == '.' || b[a.size()] == '[');
}

}  // namespace

Sweep::~Sweep() = default;
Sweep::Sweep(Sweep&&) noexcept = default;
Sweep& Sweep::operator=(Sweep&&) noexcept = default;

Sweep Sweep::load(const std::string& path) {
  Result<std::string> text = read_input_file(path);
  if (!text) throw InputError(text.error().message);
  return load_text(std::move(*text), path);
}

Sweep Sweep::load_text(std::string text, const std::string& path) {
  Sweep s;
  s.path_ = path;
  s.text_ = std::move(text);
  s.doc_ = std::make_unique<Document>(input::load_document_text(s.text_, path));
  const Node root = Node::root(*s.doc_);
  if (root.is_null())
    root.fail("expected a sweep (base or experiment, and grid or zip), got an empty document");
  root.require_map("a mapping with base (or experiment), grid, zip, where, skip");
  root.check_keys({"name", "base", "experiment", "grid", "zip", "where", "skip"});
  if (auto n = root.get("name")) s.name_ = n->string("a name");
  YAML::Node base_root(YAML::NodeType::Undefined);
  if (auto b = root.get("base")) {
    if (root.has("experiment"))
      root.get("experiment")->fail("give base (a file) or experiment (inline), not both");
    s.base_path_ = input::resolve_path(b->document(), b->string("a path to an experiment file"));
    s.base_text_ = input::read_referenced_file(*b, s.base_path_);
    base_root.reset(input::load_document_text(s.base_text_, s.base_path_).root);
  } else {
    const Node e = root.need("experiment", "an experiment (inline), or base: FILE");
    e.require_map("an experiment: a mapping with workload, cluster, strategy");
    base_root.reset(e.yaml());
  }
  const auto add_axis = [&](const Node& key, const Node& spec) {
    Axis a = parse_axis(key, spec, base_root);
    for (const Axis& other : s.axes_) {
      if (other.path == a.path) key.fail(fmt::format("the axis {} is given twice", a.path));
      const bool nested = path_prefix(other.path, a.path) || path_prefix(a.path, other.path);
      const Axis& outer = path_prefix(other.path, a.path) ? other : a;
      if (nested && std::any_of(outer.values.begin(), outer.values.end(),
                                [](const YAML::Node& v) { return !v.IsScalar(); }))
        key.fail(
            fmt::format("the axes {} and {} overlap and {} has mappings or lists as values; set one of them",
                        other.path, a.path, outer.path));
    }
    s.axes_.push_back(std::move(a));
    s.axis_keys_.push_back(key);
    return s.axes_.size() - 1;
  };
  const auto keys_of = [](const Node& map) {
    std::vector<std::pair<Node, Node>> out;
    for (const auto& kv : map.yaml()) {
      // A key that is no text (`: [8, 8]` has a null key, `[a]: 1` a list) names no axis.
      std::optional<Node> value;
      if (kv.first.IsScalar() && !kv.first.Scalar().empty()) value = map.get(kv.first.Scalar());
      if (!value)
        Node(&map.document(), kv.first, map.path(), kv.first.Mark())
            .expected("a key path like strategy.micro_batches");
      out.emplace_back(Node(&map.document(), kv.first, value->path(), kv.first.Mark()), *value);
    }
    return out;
  };
  if (auto g = root.get("grid")) {
    g->require_map("a mapping from key paths to values, like {strategy.micro_batches: [4, 8]}");
    for (const auto& [key, spec] : keys_of(*g)) {
      const size_t a = add_axis(key, spec);
      s.factors_.push_back({{a}, s.axes_[a].values.size()});
    }
  }
  if (auto z = root.get("zip")) {
    std::vector<Node> groups;
    if (z->is_list())
      groups = z->items("a mapping of lists of equal length, or a list of them");
    else
      groups.push_back(*z);
    for (const Node& group : groups) {
      group.require_map("a mapping from key paths to lists of equal length");
      Factor f;
      for (const auto& [key, spec] : keys_of(group)) {
        const size_t a = add_axis(key, spec);
        if (!f.axes.empty() && s.axes_[a].values.size() != f.size)
          spec.fail(fmt::format("expected {} values (as {}), got {}: zipped lists have equal lengths", f.size,
                                s.axes_[f.axes.front()].path, s.axes_[a].values.size()));
        f.axes.push_back(a);
        f.size = s.axes_[a].values.size();
      }
      if (!f.axes.empty()) s.factors_.push_back(std::move(f));
    }
  }
  for (const Factor& f : s.factors_) {
    if (s.grid_size_ > 100'000'000 / f.size) root.fail("more than 100,000,000 points: split the sweep");
    s.grid_size_ *= f.size;
  }
  for (auto [key, list] : {std::pair{"where", &s.where_}, std::pair{"skip", &s.skip_}})
    if (auto w = root.get(key)) {
      std::vector<Node> conditions;
      if (w->is_scalar())
        conditions.push_back(*w);
      else
        conditions = w->items("a condition like \"cluster.count <= 16\", or a list of them");
      for (const Node& c : conditions) {
        // The expression refers to its Node (messages at evaluation): it is kept beside it.
        auto kept = std::make_shared<Node>(c);
        auto e = Parser(c.string("a condition like \"cluster.count <= 16\""), *kept, s.axes_).parse();
        struct Holder : Expression {
          std::shared_ptr<Node> where;
          std::unique_ptr<Expression> e;
          const char* what;
          Value eval(const Lookup& l) const override {
            Value v = e->eval(l);
            if (!std::holds_alternative<bool>(v))
              where->fail(fmt::format("a {} condition gives {}, not true/false", what, type_name(v)));
            return v;
          }
        };
        auto h = std::make_unique<Holder>();
        h->where = kept;
        h->what = key;
        h->e = std::move(e);
        list->push_back(std::move(h));
      }
    }
  // What the points' numbers and results depend on: the base experiment and the factors (axes,
  // values, grid and zip grouping). Filters and the name may change without invalidating results.
  std::string canon = s.base_text_;
  if (s.base_path_.empty()) {
    YAML::Emitter e;
    e << base_root;
    canon = e.c_str();
  }
  for (const Factor& f : s.factors_) {
    canon += "\x1e";
    for (size_t a : f.axes) {
      canon += "\x1d" + s.axes_[a].path;
      for (const std::string& l : s.axes_[a].labels) canon += "\x1f" + l;
    }
  }
  s.fingerprint_ = fnv1a_hex(canon);
  return s;
}

std::vector<size_t> Sweep::value_indices(size_t point) const {
  std::vector<size_t> idx(axes_.size(), 0);
  for (size_t f = factors_.size(); f-- > 0;) {
    const size_t k = point % factors_[f].size;
    point /= factors_[f].size;
    for (size_t a : factors_[f].axes) idx[a] = k;
  }
  return idx;
}

bool Sweep::selected(size_t point) const {
  const std::vector<size_t> idx = value_indices(point);
  const Expression::Lookup lookup = [&](size_t a) { return axes_[a].filter_values[idx[a]]; };
  // Each condition's holder refuses a value other than true/false, at the condition's position.
  const auto truth = [&](const Expression& e) { return std::get<bool>(e.eval(lookup)); };
  for (const auto& w : where_)
    if (!truth(*w)) return false;
  for (const auto& s : skip_)
    if (truth(*s)) return false;
  return true;
}

std::vector<size_t> Sweep::points() const {
  std::vector<size_t> out;
  for (size_t p = 0; p < grid_size_; ++p)
    if (selected(p)) out.push_back(p);
  return out;
}

nlohmann::json Sweep::axis_values(size_t point) const {
  const std::vector<size_t> idx = value_indices(point);
  nlohmann::json j = nlohmann::json::object();
  for (size_t a = 0; a < axes_.size(); ++a) j[axes_[a].path] = axes_[a].json_values[idx[a]];
  return j;
}

std::string Sweep::describe(size_t point) const {
  const std::vector<size_t> idx = value_indices(point);
  std::string out;
  for (size_t a = 0; a < axes_.size(); ++a)
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", axes_[a].path, axes_[a].labels[idx[a]]);
  return out;
}

Document Sweep::experiment_document(size_t point) const {
  Document d = base_path_.empty() ? input::load_document_text(text_, path_)
                                  : input::load_document_text(base_text_, base_path_);
  if (base_path_.empty()) {
    const YAML::Node experiment = static_cast<const YAML::Node&>(d.root)["experiment"];
    d.root.reset(experiment);
  }
  const std::vector<size_t> idx = value_indices(point);
  for (size_t a = 0; a < axes_.size(); ++a)
    input::set_path(d, axes_[a].path, axes_[a].values[idx[a]], doc_.get(), axis_keys_[a]);
  // The point's name says which values it has (titles and the result's `experiment`).
  if (d.root.IsMap() && d.root["name"] && d.root["name"].IsScalar() && !axes_.empty())
    d.root["name"] = fmt::format("{} [{}]", d.root["name"].Scalar(), describe(point));
  return d;
}

}  // namespace pipegrid::sweep
