#include "tools/input/simgrid_xml.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <pugixml.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "core/file_io.h"
#include "core/units.h"
#include "tools/output/simgrid_xml.h"

namespace pipegrid::input {
namespace {

constexpr const char* kPrefix = output::kSimGridPropertyPrefix;

struct XmlFail : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class RouteRole { Explicit, Edge };  // a Full zone's route, or a link chain in a graph

struct RawLink {
  std::string name;
  double bandwidth = 0, latency = 0;
  Duplex duplex = Duplex::Shared;
  std::string prop_a, prop_b;  // endpoints from pipegrid:a / pipegrid:b
  pugi::xml_node where;
};

// Names are resolved as they are read (SimGrid wants links, hosts and routers declared before the
// routes that use them), which keeps large files' routes small.
struct RawHop {
  int link = -1;
  int dir = -1;  // -1 unknown, 0 UP (a to b), 1 DOWN
  pugi::xml_node where;
};

struct RawRoute {
  int src = 0, dst = 0;  // Reader::node_code (hosts may still come after the route)
  std::vector<RawHop> hops;
  bool symmetrical = true;
  RouteRole role = RouteRole::Edge;
  pugi::xml_node where;
};

class Reader {
 public:
  Reader(std::string text, std::string name, const std::optional<DeviceSpec>& device)
      : text_(std::move(text)), name_(std::move(name)), default_device_(device) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < text_.size(); ++i)
      if (text_[i] == '\n') line_starts_.push_back(i + 1);
  }

  Cluster read() {
    pugi::xml_document doc;
    // In place: a platform with every pair's route is large (a 1024-device export is 350 MB).
    pugi::xml_parse_result res =
        doc.load_buffer_inplace(text_.data(), text_.size(), pugi::parse_default | pugi::parse_doctype);
    if (!res) throw XmlFail(fmt::format("{}: invalid XML: {}", location(res.offset), res.description()));
    // pugixml expands no entity a DTD declares: "&e;" would stay in a name as text. SimGrid's own
    // platforms carry only the DOCTYPE line naming simgrid.dtd, which declares nothing inline.
    for (pugi::xml_node child : doc.children())
      if (child.type() == pugi::node_doctype &&
          std::string_view(child.value()).find('[') != std::string_view::npos)
        fail(child,
             "<!DOCTYPE ...>: inline DTD declarations (entities) are not supported in a platform file");
    pugi::xml_node root = doc.document_element();
    if (std::string_view(root.name()) != "platform")
      fail(root, fmt::format("expected a SimGrid <platform>, got <{}>", root.name()));
    if (pugi::xml_attribute v = root.attribute("version");
        !v || (std::string_view(v.value()) != "4.1" && std::string_view(v.value()) != "4"))
      fail(root, fmt::format("expected <platform version=\"4.1\">, got version \"{}\"",
                             root.attribute("version").value()));
    check_attributes(root, {"version"});
    for (pugi::xml_node child : root.children()) {
      if (child.type() != pugi::node_element) continue;
      const std::string_view tag = child.name();
      if (tag == "zone")
        zone(child, 1);
      else if (tag == "cluster")
        cluster(child);
      else if (tag == "config" || tag == "prop")
        continue;
      else
        unsupported(child);
    }
    // A default device that no host takes would be ignored: every host describes its own.
    if (default_device_ && !default_used_)
      throw XmlFail(fmt::format(
          "{}: every host describes its own device (pipegrid:* properties), so the default device (`device:` "
          "beside `file:`, or --device) would be ignored; expected none, or a platform without descriptions",
          name_));
    return build();
  }

 private:
  // --- locations and errors -------------------------------------------------------------------
  std::string location(ptrdiff_t offset) const {
    if (offset < 0) return name_;
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), static_cast<size_t>(offset));
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return fmt::format("{}:{}:{}", name_, line, static_cast<size_t>(offset) - line_starts_[line - 1] + 1);
  }
  // pugixml gives the offset of the element's name: point at its '<'.
  std::string location(const pugi::xml_node& n) const {
    const ptrdiff_t o = n.offset_debug();
    return location(o > 0 ? o - 1 : o);
  }
  [[noreturn]] void fail(const pugi::xml_node& n, std::string_view what) const {
    throw XmlFail(fmt::format("{}: {}", location(n), what));
  }
  [[noreturn]] void unsupported(const pugi::xml_node& n) const {
    fail(n, fmt::format(
                "<{}> is not supported (pipegrid reads zone, cluster, host, router, link, route, zoneRoute, "
                "link_ctn, prop and config)",
                n.name()));
  }
  std::string describe(const pugi::xml_node& n) const {
    if (const char* id = n.attribute("id").value(); *id) return fmt::format("<{} id=\"{}\">", n.name(), id);
    return fmt::format("<{}>", n.name());
  }

  void check_attributes(const pugi::xml_node& n, std::initializer_list<std::string_view> allowed) const {
    for (pugi::xml_attribute a : n.attributes())
      if (std::find(allowed.begin(), allowed.end(), std::string_view(a.name())) == allowed.end())
        fail(n, fmt::format("{}: attribute \"{}\" is not supported", describe(n), a.name()));
  }
  std::string required(const pugi::xml_node& n, const char* attribute) const {
    pugi::xml_attribute a = n.attribute(attribute);
    if (!a || !*a.value()) fail(n, fmt::format("<{}>: the attribute \"{}\" is missing", n.name(), attribute));
    return a.value();
  }

  // SimGrid quantities: pipegrid's units, or a bare number in SimGrid's default unit.
  double quantity(const pugi::xml_node& n, const char* attribute, Dimension d, bool positive) const {
    const std::string text = n.attribute(attribute).value();
    double v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    const bool bare = ec == std::errc() && p == text.data() + text.size();
    Result<double> parsed = bare ? Result<double>(v) : parse_quantity(text, d, true);
    if (!parsed || !std::isfinite(*parsed) || (positive ? !(*parsed > 0) : *parsed < 0))
      fail(n, fmt::format("{}: {}: expected {}, got \"{}\"", describe(n), attribute,
                          pipegrid::describe(d, positive ? "positive" : "non-negative"), text));
    return *parsed;
  }
  // Host speeds: "1Gf", "2.5e9f", "100TFLOPS" or a bare number of flop/s.
  void check_speed(const pugi::xml_node& n) const {
    const std::string text = required(n, "speed");
    // SimGrid's own units, then pipegrid's; either way within core/units.h's bound for speeds.
    double v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    const std::string_view unit(p, text.data() + text.size() - p);
    static const std::map<std::string_view, double> kSimGrid = {
        {"", 1},     {"f", 1},     {"flops", 1}, {"kf", 1e3},  {"Mf", 1e6},
        {"Gf", 1e9}, {"Tf", 1e12}, {"Pf", 1e15}, {"Ef", 1e18}, {"Zf", 1e21}};
    if (ec == std::errc() && v > 0 && std::isfinite(v)) {
      if (auto it = kSimGrid.find(unit);
          it != kSimGrid.end() && v * it->second <= max_magnitude(Dimension::FlopRate))
        return;
      if (!kSimGrid.count(unit) && parse_quantity(text, Dimension::FlopRate).ok()) return;
    }
    fail(n, fmt::format("{}: speed: expected a positive speed like \"1Gf\", got \"{}\"", describe(n), text));
  }

  // --- elements ---------------------------------------------------------------------------------
  // Zones nest recursively; the input controls the depth, so it is bounded.
  static constexpr int kMaxZoneDepth = 64;
  void zone(const pugi::xml_node& z, int depth) {
    if (depth > kMaxZoneDepth)
      fail(z, fmt::format("{}: zones nest more than {} deep (pipegrid's limit)", describe(z), kMaxZoneDepth));
    check_attributes(z, {"id", "routing"});
    required(z, "id");
    const std::string routing = required(z, "routing");
    RouteRole role;
    if (routing == "Full")
      role = RouteRole::Explicit;
    else if (routing == "Floyd" || routing == "Dijkstra" || routing == "DijkstraCache")
      role = RouteRole::Edge;
    else if (routing == "None")
      role = RouteRole::Edge;
    else
      fail(z, fmt::format(
                  "{}: routing \"{}\" is not supported (pipegrid reads Full, Floyd, Dijkstra, DijkstraCache)",
                  describe(z), routing));
    if (zone_name_.empty()) zone_name_ = z.attribute("id").value();
    for (pugi::xml_node child : z.children()) {
      if (child.type() != pugi::node_element) continue;
      const std::string_view tag = child.name();
      if (tag == "host")
        host(child);
      else if (tag == "router")
        router(child);
      else if (tag == "link")
        link(child);
      else if (tag == "route")
        route(child, role);
      else if (tag == "zoneRoute")
        zone_route(child);
      else if (tag == "zone")
        zone(child, depth + 1);
      else if (tag == "cluster")
        cluster(child);
      else if (tag == "prop")
        continue;
      else
        unsupported(child);
    }
  }

  void add_node(const pugi::xml_node& n, const std::string& id, bool host) {
    if (static_cast<double>(host ? hosts_.size() : hosts_.size() + routers_.size()) >=
        (host ? kMaxClusterDevices : kMaxClusterNodes))
      fail(n, fmt::format("{}: one more {} would make the platform larger than pipegrid's limit of {:.0f} {} "
                          "(see docs/limits.md)",
                          describe(n), host ? "host" : "router", host ? kMaxClusterDevices : kMaxClusterNodes,
                          host ? "hosts" : "hosts and routers"));
    if (auto it = nodes_.find(id); it != nodes_.end())
      fail(n, fmt::format("{}: the name \"{}\" is already used (at {})", describe(n), id,
                          location(it->second.where).substr(name_.size() + 1)));
    nodes_.emplace(
        id, NodeInfo{host, host ? static_cast<int>(hosts_.size()) : static_cast<int>(routers_.size()), n});
    if (host)
      hosts_.push_back(id);
    else
      routers_.push_back(id);
  }

  void host(const pugi::xml_node& h) {
    check_attributes(h, {"id", "speed", "core", "coordinates"});
    const std::string id = required(h, "id");
    check_speed(h);
    Device d;
    d.name = id;
    bool described = false;
    for (pugi::xml_node p : h.children()) {
      if (p.type() != pugi::node_element) continue;
      if (std::string_view(p.name()) != "prop") unsupported(p);
      const std::string key = required(p, "id");
      if (key.rfind(kPrefix, 0) != 0) continue;
      described = true;
      device_property(p, key.substr(std::strlen(kPrefix)), p.attribute("value").value(), d);
    }
    if (!described) {
      if (!default_device_)
        fail(h,
             fmt::format("{}: no pipegrid device description (pipegrid:* properties) and no default device "
                         "(give one: `device:` beside `file:`, or --device)",
                         describe(h)));
      d.spec = *default_device_;
      default_used_ = true;
    } else if (!(d.spec.memory_bytes > 0)) {
      fail(h, fmt::format("{}: the property pipegrid:memory is missing", describe(h)));
    }
    // Rates, given or derived from an FPGA's figures, within the range a YAML device may state.
    for (int i = 0; i < kPrecisionCount; ++i) {
      const double derived = d.spec.fpga ? d.spec.fpga->peak(static_cast<Precision>(i)) : 0.0;
      if (!(d.spec.peak_flops[i] <= 1e21) || !(derived <= 1e21))
        fail(h,
             fmt::format("{}: its {} peak ({}) is {:g} FLOP/s, out of range: at most 1e21 FLOP/s",
                         describe(h), to_string(static_cast<Precision>(i)),
                         d.spec.peak_flops[i] <= 1e21 ? "DSPs x clock x MACs per DSP x 2" : "pipegrid:peak",
                         d.spec.peak_flops[i] <= 1e21 ? derived : d.spec.peak_flops[i]));
    }
    add_node(h, id, true);
    devices_.push_back(std::move(d));
  }

  void device_property(const pugi::xml_node& p, const std::string& key, const std::string& value,
                       Device& d) const {
    DeviceSpec& s = d.spec;
    auto number = [&]() {
      double v = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || ptr != value.data() + value.size() || !std::isfinite(v) || v < 0)
        fail(p, fmt::format("<prop id=\"{}{}\">: expected a non-negative number, got \"{}\"", kPrefix, key,
                            value));
      return v;
    };
    auto fpga = [&]() -> FpgaSpec& {
      if (!s.fpga) s.fpga = FpgaSpec{};
      return *s.fpga;
    };
    if (key == "model")
      s.kind = value;
    else if (key == "family")
      s.family = value;
    else if (key == "node")
      d.node = value;
    else if (key == "memory")
      s.memory_bytes = number();
    else if (key == "memory_bandwidth")
      s.memory_bandwidth = number();
    else if (key == "efficiency")
      s.efficiency = number();
    else if (key == "layer_overhead")
      s.layer_overhead_s = number();
    else if (key == "kernel_startup")
      s.kernel_startup_s = number();
    else if (key == "kernel_dispatch")
      s.kernel_dispatch_s = number();
    else if (key == "microscaling") {
      if (value != "0" && value != "1")
        fail(p, fmt::format("<prop id=\"{}{}\">: expected 0 or 1, got \"{}\"", kPrefix, key, value));
      s.microscaling = value == "1";
    } else if (key == "memory_efficiency")
      s.memory_efficiency_default = number();
    else if (key == "fpga_dsps")
      fpga().dsps = number();
    else if (key == "fpga_clock")
      fpga().clock_hz = number();
    else if (key == "fpga_onchip")
      fpga().onchip_bytes = number();
    else if (key == "fpga_ports") {
      const double v = number();  // as a YAML device's `ports`: a whole number up to 1024
      if (v != std::floor(v) || v > 1024)
        fail(p, fmt::format(
                    "<prop id=\"{}{}\">: expected a whole number of network ports from 0 to 1024, got \"{}\"",
                    kPrefix, key, value));
      fpga().ports = static_cast<int>(v);
    } else if (key == "fpga_port_bandwidth")
      fpga().port_bandwidth = number();
    else {
      for (int i = 0; i < kPrecisionCount; ++i) {
        const std::string_view prec = to_string(static_cast<Precision>(i));
        if (key == fmt::format("peak_{}", prec)) return void(s.peak_flops[i] = number());
        if (key == fmt::format("fpga_macs_{}", prec)) return void(fpga().macs_per_dsp[i] = number());
        if (key == fmt::format("recurrent_step_{}", prec)) return void(s.recurrent_step_s[i] = number());
        if (key == fmt::format("winograd_{}", prec)) {
          if (value != "0" && value != "1")
            fail(p, fmt::format("<prop id=\"{}{}\">: expected 0 or 1, got \"{}\"", kPrefix, key, value));
          return void(s.winograd[i] = value == "1");
        }
        for (KernelClass k : kKernelClasses) {
          if (key == fmt::format("efficiency_{}_{}", prec, to_string(k)))
            return void(s.compute_efficiency[i][static_cast<int>(k)] = number());
          if (i == 0 && key == fmt::format("memory_efficiency_{}", to_string(k)))
            return void(s.memory_efficiency[static_cast<int>(k)] = number());
          if (i == 0 && key == fmt::format("kernel_startup_{}", to_string(k)))
            return void(s.kernel_startup_class[static_cast<int>(k)] = number());
          if (i == 0 && key == fmt::format("kernel_dispatch_{}", to_string(k)))
            return void(s.kernel_dispatch_class[static_cast<int>(k)] = number());
        }
      }
      fail(p, fmt::format("<prop id=\"{}{}\">: unknown pipegrid property", kPrefix, key));
    }
  }

  void router(const pugi::xml_node& r) {
    check_attributes(r, {"id", "coordinates"});
    add_node(r, required(r, "id"), false);
  }

  void add_link(RawLink l) {
    if (auto it = link_index_.find(l.name); it != link_index_.end())
      fail(l.where, fmt::format("<link id=\"{}\">: a link with this id is already declared (at {})", l.name,
                                location(links_[it->second].where).substr(name_.size() + 1)));
    link_index_.emplace(l.name, links_.size());
    links_.push_back(std::move(l));
  }

  Duplex sharing(const pugi::xml_node& n, const char* attribute, Duplex fallback) const {
    const std::string_view p = n.attribute(attribute).value();
    if (p.empty()) return fallback;
    if (p == "SHARED") return Duplex::Shared;
    if (p == "SPLITDUPLEX" || p == "FULLDUPLEX") return Duplex::Full;
    fail(n, fmt::format("{}: {} \"{}\" is not supported (pipegrid reads SHARED and SPLITDUPLEX)", describe(n),
                        attribute, p));
  }

  void link(const pugi::xml_node& n) {
    check_attributes(n, {"id", "bandwidth", "latency", "sharing_policy"});
    RawLink l;
    l.name = required(n, "id");
    l.where = n;
    required(n, "bandwidth");
    l.bandwidth = quantity(n, "bandwidth", Dimension::Bandwidth, true);
    l.latency = n.attribute("latency") ? quantity(n, "latency", Dimension::Time, false) : 0.0;
    l.duplex = sharing(n, "sharing_policy", Duplex::Shared);
    for (pugi::xml_node p : n.children()) {
      if (p.type() != pugi::node_element) continue;
      if (std::string_view(p.name()) != "prop") unsupported(p);
      const std::string key = required(p, "id");
      if (key == std::string(kPrefix) + "a")
        l.prop_a = p.attribute("value").value();
      else if (key == std::string(kPrefix) + "b")
        l.prop_b = p.attribute("value").value();
      else if (key.rfind(kPrefix, 0) == 0)
        fail(p, fmt::format("<prop id=\"{}\">: unknown pipegrid property", key));
    }
    if (l.prop_a.empty() != l.prop_b.empty())
      fail(n, fmt::format("<link id=\"{}\">: pipegrid:a and pipegrid:b go together", l.name));
    add_link(std::move(l));
  }

  std::vector<RawHop> link_list(const pugi::xml_node& r) const {
    std::vector<RawHop> hops;
    for (pugi::xml_node c : r.children()) {
      if (c.type() != pugi::node_element) continue;
      if (std::string_view(c.name()) != "link_ctn") unsupported(c);
      check_attributes(c, {"id", "direction"});
      const std::string id = required(c, "id");
      auto it = link_index_.find(id);
      if (it == link_index_.end()) fail(c, fmt::format("<link_ctn>: unknown link \"{}\"", id));
      RawHop h{static_cast<int>(it->second), -1, c};
      const std::string_view dir = c.attribute("direction").value();
      if (dir == "UP")
        h.dir = 0;
      else if (dir == "DOWN")
        h.dir = 1;
      else if (!dir.empty() && dir != "NONE")
        fail(c,
             fmt::format("<link_ctn id=\"{}\">: direction: expected UP, DOWN or NONE, got \"{}\"", id, dir));
      hops.push_back(std::move(h));
    }
    return hops;
  }

  bool symmetrical(const pugi::xml_node& r) const {
    const std::string_view s = r.attribute("symmetrical").value();
    if (s.empty() || s == "YES" || s == "yes") return true;
    if (s == "NO" || s == "no") return false;
    fail(r, fmt::format("<{}>: symmetrical: expected YES or NO, got \"{}\"", r.name(), s));
  }

  void route(const pugi::xml_node& r, RouteRole role) {
    check_attributes(r, {"src", "dst", "symmetrical"});
    routes_.push_back({node_code(r, required(r, "src")), node_code(r, required(r, "dst")), link_list(r),
                       symmetrical(r), role, r});
    if (routes_.back().hops.empty()) fail(r, "<route>: a route needs at least one <link_ctn>");
  }

  void zone_route(const pugi::xml_node& r) {
    check_attributes(r, {"src", "dst", "gw_src", "gw_dst", "symmetrical"});
    required(r, "src");
    required(r, "dst");
    routes_.push_back({node_code(r, required(r, "gw_src")), node_code(r, required(r, "gw_dst")), link_list(r),
                       true, RouteRole::Edge, r});
    if (routes_.back().hops.empty()) fail(r, "<zoneRoute>: a route needs at least one <link_ctn>");
  }

  // radical "0-3,7": the host numbers.
  std::vector<long> radical(const pugi::xml_node& n) const {
    const std::string text = required(n, "radical");
    std::vector<long> out;
    std::stringstream ss(text);
    std::string part;
    while (std::getline(ss, part, ',')) {
      long lo = 0, hi = 0;
      const size_t dash = part.find('-');
      auto parse = [&](std::string_view s, long& v) {
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        return ec == std::errc() && p == s.data() + s.size() && v >= 0;
      };
      bool ok = dash == std::string::npos ? parse(part, lo) && parse(part, hi)
                                          : parse(std::string_view(part).substr(0, dash), lo) &&
                                                parse(std::string_view(part).substr(dash + 1), hi);
      if (!ok || hi < lo || hi - lo > 1'000'000)
        fail(n, fmt::format("{}: radical: expected ranges like \"0-15\" or \"0-3,8\", got \"{}\"",
                            describe(n), text));
      if (static_cast<double>(hosts_.size() + out.size()) + static_cast<double>(hi - lo) + 1 >
          kMaxClusterDevices)
        fail(n,
             fmt::format("{}: radical: \"{}\" would make the platform larger than pipegrid's limit of {:.0f} "
                         "hosts (see docs/limits.md)",
                         describe(n), text, kMaxClusterDevices));
      // Counted loop: `i <= hi; ++i` would overflow when hi is the largest long.
      for (long k = 0; k <= hi - lo; ++k) out.push_back(lo + k);
    }
    return out;
  }

  void cluster(const pugi::xml_node& n) {
    check_attributes(n, {"id", "prefix", "suffix", "radical", "speed", "bw", "lat", "sharing_policy",
                         "router_id", "topology", "core", "loopback_bw", "loopback_lat", "bb_bw", "bb_lat",
                         "bb_sharing_policy", "limiter_link", "topo_parameters"});
    const std::string id = required(n, "id");
    if (zone_name_.empty()) zone_name_ = id;
    if (n.attribute("bb_bw") || n.attribute("bb_lat"))
      fail(n, fmt::format("{}: a backbone is not supported (pipegrid's links join two nodes, and every route "
                          "between the cluster's hosts crosses the backbone)",
                          describe(n)));
    if (n.attribute("limiter_link")) fail(n, fmt::format("{}: limiter_link is not supported", describe(n)));
    if (const std::string_view t = n.attribute("topology").value(); !t.empty() && t != "FLAT")
      fail(n,
           fmt::format("{}: topology \"{}\" is not supported (pipegrid reads FLAT clusters; use its torus, "
                       "fat-tree and dragonfly generators)",
                       describe(n), t));
    check_speed(n);
    required(n, "bw");
    const double bw = quantity(n, "bw", Dimension::Bandwidth, true);
    const double lat = n.attribute("lat") ? quantity(n, "lat", Dimension::Time, false) : 0.0;
    const Duplex duplex = sharing(n, "sharing_policy", Duplex::Full);
    const std::string prefix = n.attribute("prefix").value(), suffix = n.attribute("suffix").value();
    std::string router_id = n.attribute("router_id").value();
    if (router_id.empty()) router_id = prefix + id + "_router" + suffix;
    if (!default_device_)
      fail(n, fmt::format(
                  "{}: cluster hosts have no pipegrid device description: give a default device (`device:` "
                  "beside `file:`, or --device)",
                  describe(n)));
    add_node(n, router_id, false);
    for (long i : radical(n)) {
      const std::string host = prefix + std::to_string(i) + suffix;
      add_node(n, host, true);
      devices_.push_back({host, *default_device_, ""});
      default_used_ = true;
      RawLink l;
      l.name = id + "_link_" + std::to_string(i);
      l.bandwidth = bw;
      l.latency = lat;
      l.duplex = duplex;
      l.prop_a = host;
      l.prop_b = router_id;
      l.where = n;
      add_link(std::move(l));
    }
  }

  // --- from the raw description to a cluster ------------------------------------------------------
  struct NodeInfo {
    bool host;
    int index;
    pugi::xml_node where;
  };

  // Union-find over the network nodes (hosts, then routers) and the two ends of every link.
  struct Classes {
    std::vector<int> parent;
    std::vector<int> named;  // per root: the host/router in the class, -1 if none
    int find(int x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    }
  };

  // Host i is i, router j is -1 - j, until every host is known.
  int node_code(const pugi::xml_node& where, const std::string& name) const {
    auto it = nodes_.find(name);
    if (it == nodes_.end())
      fail(where, fmt::format("<{}>: unknown host or router \"{}\"", where.name(), name));
    return it->second.host ? it->second.index : -1 - it->second.index;
  }
  // The network node: hosts, then routers.
  int node_of_code(int code) const { return code >= 0 ? code : static_cast<int>(hosts_.size()) - 1 - code; }
  int node_id(const pugi::xml_node& where, const std::string& name) const {
    return node_of_code(node_code(where, name));
  }
  std::string node_label(int id) const {
    return id < static_cast<int>(hosts_.size()) ? hosts_[id] : routers_[id - hosts_.size()];
  }

  void unite(Classes& k, int x, int y, const pugi::xml_node& where) const {
    x = k.find(x);
    y = k.find(y);
    if (x == y) return;
    if (k.named[x] >= 0 && k.named[y] >= 0)
      fail(where,
           fmt::format(
               "{}: its links would make \"{}\" and \"{}\" one network node (pipegrid needs every link "
               "to join two nodes, and routes that agree with that)",
               describe(where), node_label(k.named[x]), node_label(k.named[y])));
    k.parent[y] = x;
    if (k.named[x] < 0) k.named[x] = k.named[y];
  }

  // What build() assembles, step by step.
  struct Assembly {
    Classes k;                                   // the network elements found to be one node
    std::vector<char> used;                      // per link read: some route or pipegrid:a/b uses it
    std::vector<int> cluster_link;               // per link read: its index in c.links, -1 if left out
    std::vector<pugi::xml_node> explicit_where;  // per route of c: its <route>
    Cluster c;
  };

  // The element of end e (0 or 1) of link l in the union-find: after the hosts and routers.
  int link_end(int l, int e) const { return static_cast<int>(hosts_.size() + routers_.size()) + 2 * l + e; }

  Cluster build() {
    Assembly a = join_declared_ends();
    join_route_ends(a);
    a.c.name = zone_name_;
    a.c.devices = std::move(devices_);
    a.c.switches = routers_;
    add_links(a);
    add_explicit_routes(a);
    if (a.c.devices.empty()) throw XmlFail(fmt::format("{}: the platform has no host", name_));
    check_cluster(a);
    return std::move(a.c);
  }

  // One class per host, router and link end, the ends joined to the nodes their pipegrid:a and
  // pipegrid:b properties name.
  Assembly join_declared_ends() const {
    const int N = static_cast<int>(hosts_.size() + routers_.size());
    const int L = static_cast<int>(links_.size());
    Assembly a;
    a.k.parent.resize(N + 2 * L);
    std::iota(a.k.parent.begin(), a.k.parent.end(), 0);
    a.k.named.assign(N + 2 * L, -1);
    for (int i = 0; i < N; ++i) a.k.named[i] = i;
    a.used.assign(L, 0);
    for (int l = 0; l < L; ++l) {
      if (links_[l].prop_a.empty()) continue;
      a.used[l] = 1;
      unite(a.k, link_end(l, 0), node_id(links_[l].where, links_[l].prop_a), links_[l].where);
      unite(a.k, link_end(l, 1), node_id(links_[l].where, links_[l].prop_b), links_[l].where);
    }
    return a;
  }

  // Routes as constraints, resolved from both ends inwards; a hop whose orientation is not yet
  // known waits for another pass, and when no pass makes progress one is oriented a to b.
  void join_route_ends(Assembly& a) const {
    struct Pending {
      const RawRoute* r;
      size_t lo = 0, hi = 0;
      int cur_lo = 0, cur_hi = 0;
    };
    std::vector<Pending> pending;
    for (const RawRoute& r : routes_) {
      if (r.src == r.dst) continue;  // loopback
      for (const RawHop& h : r.hops) a.used[h.link] = 1;
      pending.push_back({&r, 0, r.hops.size(), node_of_code(r.src), node_of_code(r.dst)});
    }
    Classes& k = a.k;
    bool force = false;
    while (!pending.empty()) {
      bool progress = false;
      for (Pending& p : pending) {
        while (p.lo < p.hi) {
          const int l = p.r->hops[p.lo].link;
          int e = p.r->hops[p.lo].dir;
          if (e < 0) {
            if (k.find(link_end(l, 0)) == k.find(p.cur_lo))
              e = 0;
            else if (k.find(link_end(l, 1)) == k.find(p.cur_lo))
              e = 1;
            else if (force)
              e = 0, force = false;
            else
              break;
          }
          unite(k, p.cur_lo, link_end(l, e), p.r->where);
          p.cur_lo = link_end(l, 1 - e);
          ++p.lo;
          progress = true;
        }
        while (p.hi > p.lo) {
          const int l = p.r->hops[p.hi - 1].link;
          int x = p.r->hops[p.hi - 1].dir;  // UP leaves at end 1
          if (x >= 0)
            x = 1 - x;
          else if (k.find(link_end(l, 1)) == k.find(p.cur_hi))
            x = 1;
          else if (k.find(link_end(l, 0)) == k.find(p.cur_hi))
            x = 0;
          else
            break;
          unite(k, p.cur_hi, link_end(l, x), p.r->where);
          p.cur_hi = link_end(l, 1 - x);
          --p.hi;
          progress = true;
        }
      }
      for (Pending& p : pending)
        if (p.lo == p.hi) unite(k, p.cur_lo, p.cur_hi, p.r->where);
      std::erase_if(pending, [](const Pending& p) { return p.lo == p.hi; });
      if (!progress) force = true;
    }
  }

  // The used links as cluster links between the classes' nodes: a class without a host or router
  // becomes a switch named junction0, junction1, ...
  void add_links(Assembly& a) const {
    Cluster& c = a.c;
    std::unordered_map<int, int> node_of_class;  // class root -> cluster node
    std::set<std::string> names(hosts_.begin(), hosts_.end());
    names.insert(routers_.begin(), routers_.end());
    int junctions = 0;
    auto node_of = [&](int element) {
      const int root = a.k.find(element);
      if (a.k.named[root] >= 0) return a.k.named[root];  // hosts, then routers: the cluster's numbering
      auto [it, fresh] = node_of_class.emplace(root, -1);
      if (fresh) {
        std::string name;
        do name = fmt::format("junction{}", junctions++);
        while (names.count(name));
        names.insert(name);
        c.switches.push_back(name);
        it->second = static_cast<int>(c.devices.size() + c.switches.size() - 1);
      }
      return it->second;
    };
    const int L = static_cast<int>(links_.size());
    a.cluster_link.assign(L, -1);
    std::map<std::pair<int, int>, int> by_ends;
    for (int l = 0; l < L; ++l) {
      if (!a.used[l]) continue;
      const int x = node_of(link_end(l, 0)), y = node_of(link_end(l, 1));
      const RawLink& raw = links_[l];
      if (x == y)
        fail(raw.where, fmt::format("<link id=\"{}\">: the routes through it make it join \"{}\" to itself",
                                    raw.name, c.node_name(x)));
      if (auto [it, fresh] = by_ends.emplace(std::minmax(x, y), l); !fresh)
        fail(raw.where,
             fmt::format("<link id=\"{}\">: \"{}\" also joins \"{}\" and \"{}\" (pipegrid allows one link "
                         "between two nodes)",
                         raw.name, links_[it->second].name, c.node_name(x), c.node_name(y)));
      a.cluster_link[l] = static_cast<int>(c.links.size());
      c.links.push_back({x, y, raw.bandwidth, raw.latency, raw.duplex});
    }
  }

  // Explicit routes: a Full zone's routes between two hosts, each hop checked against the links.
  void add_explicit_routes(Assembly& a) const {
    Cluster& c = a.c;
    std::map<std::pair<int, int>, const RawRoute*> seen;
    auto add = [&](const RawRoute& r, int from, int to, std::vector<Hop> hops) {
      if (auto [it, fresh] = seen.emplace(std::pair{from, to}, &r); !fresh)
        fail(r.where,
             fmt::format("<route>: a route from \"{}\" to \"{}\" is already given (at {})", c.node_name(from),
                         c.node_name(to), location(it->second->where).substr(name_.size() + 1)));
      c.routes.push_back({from, to, std::move(hops)});
      a.explicit_where.push_back(r.where);
    };
    for (const RawRoute& r : routes_) {
      if (r.role != RouteRole::Explicit) continue;
      const int from = node_of_code(r.src), to = node_of_code(r.dst);
      if (from == to || !c.is_device(from) || !c.is_device(to)) continue;
      std::vector<Hop> hops = route_hops(a, r, from, to);
      std::vector<Hop> back;
      for (auto it = hops.rbegin(); it != hops.rend(); ++it) back.push_back({it->link, !it->reverse});
      add(r, from, to, std::move(hops));
      if (r.symmetrical) add(r, to, from, std::move(back));
    }
  }

  // The hops of route r from `from` to `to` over the cluster's links.
  std::vector<Hop> route_hops(const Assembly& a, const RawRoute& r, int from, int to) const {
    const Cluster& c = a.c;
    std::vector<Hop> hops;
    int at = from;
    for (const RawHop& h : r.hops) {
      const int li = a.cluster_link[h.link];
      const Link& l = c.links[li];
      const bool reverse = l.b == at;
      if (l.a != at && l.b != at)
        fail(h.where, fmt::format("<link_ctn id=\"{}\">: the link does not touch \"{}\", where the route is",
                                  h.link, c.node_name(at)));
      if (h.dir >= 0 && reverse != (h.dir == 1))
        fail(h.where,
             fmt::format("<link_ctn id=\"{}\">: direction {} goes against the way the route crosses it",
                         h.link, h.dir == 0 ? "UP" : "DOWN"));
      hops.push_back({li, reverse});
      at = reverse ? l.a : l.b;
    }
    if (at != to)
      fail(r.where,
           fmt::format("<route>: the links end at \"{}\", not \"{}\"", c.node_name(at), c.node_name(to)));
    return hops;
  }

  // Validates the cluster; what validation finds is located at the element it is about: the <host>
  // or <router>, the <link> (a junction: the first link that touches it), the <route>.
  void check_cluster(const Assembly& a) const {
    const Cluster& c = a.c;
    ClusterSubject subject;
    Status s = validate(c, &subject);
    if (s) s = check_connected(c, &subject);
    if (s) return;
    const pugi::xml_node where = subject_element(a, subject);
    if (where) fail(where, s.error().message);
    throw XmlFail(fmt::format("{}: {}", name_, s.error().message));
  }

  pugi::xml_node subject_element(const Assembly& a, const ClusterSubject& subject) const {
    const Cluster& c = a.c;
    const std::vector<int>& cluster_link = a.cluster_link;
    switch (subject.kind) {
      case ClusterSubject::Kind::Node:
        if (auto it = nodes_.find(c.node_name(subject.index)); it != nodes_.end()) return it->second.where;
        for (size_t l = 0; l < cluster_link.size(); ++l)
          if (cluster_link[l] >= 0 &&
              (c.links[cluster_link[l]].a == subject.index || c.links[cluster_link[l]].b == subject.index))
            return links_[l].where;
        return {};
      case ClusterSubject::Kind::Link:
        for (size_t l = 0; l < cluster_link.size(); ++l)
          if (cluster_link[l] == subject.index) return links_[l].where;
        return {};
      case ClusterSubject::Kind::Route:
        if (subject.index < static_cast<int>(a.explicit_where.size())) return a.explicit_where[subject.index];
        return {};
      case ClusterSubject::Kind::None:
        break;
    }
    return {};
  }

  std::string text_;  // parsed in place by pugixml
  std::string name_;
  std::optional<DeviceSpec> default_device_;
  bool default_used_ = false;  // some host took the default device
  std::vector<size_t> line_starts_;
  std::string zone_name_;
  std::map<std::string, NodeInfo> nodes_;
  std::vector<std::string> hosts_, routers_;
  std::vector<Device> devices_;
  std::vector<RawLink> links_;
  std::unordered_map<std::string, size_t> link_index_;
  std::vector<RawRoute> routes_;
};

}  // namespace

Result<Cluster> read_simgrid_xml(const std::string& text, const std::string& name,
                                 const std::optional<DeviceSpec>& default_device) {
  try {
    return Reader(std::string(text), name, default_device).read();
  } catch (const XmlFail& e) {
    return Error{e.what()};
  }
}

Result<Cluster> read_simgrid_xml_file(const std::string& path,
                                      const std::optional<DeviceSpec>& default_device) {
  Result<std::string> text = read_input_file(path);
  if (!text) return text.error();
  try {
    return Reader(std::move(*text), path, default_device).read();
  } catch (const XmlFail& e) {
    return Error{e.what()};
  }
}

}  // namespace pipegrid::input
