#include "tools/output/simgrid_xml.h"

#include <fmt/format.h>

#include <span>

#include "sim/platform.h"

namespace pipegrid::output {
namespace {

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

// Shortest text that reads back as the same double.
std::string num(double v) {
  return fmt::format("{}", v);
}

constexpr const char* kPrefix = kSimGridPropertyPrefix;

std::vector<std::pair<std::string, std::string>> device_properties(const Device& d) {
  const DeviceSpec& s = d.spec;
  std::vector<std::pair<std::string, std::string>> p = {
      {"model", s.kind},
      {"memory", num(s.memory_bytes)},
      {"memory_bandwidth", num(s.memory_bandwidth)},
      {"efficiency", num(s.efficiency)},
      {"layer_overhead", num(s.layer_overhead_s)},
      {"kernel_startup", num(s.kernel_startup_s)},
      {"kernel_dispatch", num(s.kernel_dispatch_s)},
      {"memory_efficiency", num(s.memory_efficiency_default)},
  };
  for (Precision prec : kMathPrecisions)
    for (KernelClass k : kComputeClasses)
      if (double e = s.compute_efficiency[static_cast<int>(prec)][static_cast<int>(k)]; e > 0)
        p.emplace_back(fmt::format("efficiency_{}_{}", to_string(prec), to_string(k)), num(e));
  for (KernelClass k : kKernelClasses)
    if (double e = s.memory_efficiency[static_cast<int>(k)]; e > 0)
      p.emplace_back(fmt::format("memory_efficiency_{}", to_string(k)), num(e));
  for (KernelClass k : kKernelClasses)
    if (double t = s.kernel_startup_class[static_cast<int>(k)]; t >= 0)
      p.emplace_back(fmt::format("kernel_startup_{}", to_string(k)), num(t));
  for (KernelClass k : kKernelClasses)
    if (double t = s.kernel_dispatch_class[static_cast<int>(k)]; t >= 0)
      p.emplace_back(fmt::format("kernel_dispatch_{}", to_string(k)), num(t));
  for (Precision prec : kMathPrecisions)
    if (s.winograd[static_cast<int>(prec)]) p.emplace_back(fmt::format("winograd_{}", to_string(prec)), "1");
  for (Precision prec : kMathPrecisions)
    if (double r = s.recurrent_step_s[static_cast<int>(prec)]; r > 0)
      p.emplace_back(fmt::format("recurrent_step_{}", to_string(prec)), num(r));
  if (s.microscaling) p.emplace_back("microscaling", "1");
  if (!s.family.empty()) p.emplace_back("family", s.family);
  if (!d.node.empty()) p.emplace_back("node", d.node);
  // Per arithmetic format (kMathPrecisions): a training precision such as fp8 (Transformer Engine's
  // recipe) shares its name with its format, and its own entry is unused (runs_as).
  for (Precision prec : kMathPrecisions)
    p.emplace_back(fmt::format("peak_{}", to_string(prec)), num(s.peak_flops[static_cast<int>(prec)]));
  if (s.fpga) {
    const FpgaSpec& f = *s.fpga;
    p.emplace_back("fpga_dsps", num(f.dsps));
    p.emplace_back("fpga_clock", num(f.clock_hz));
    for (Precision prec : kMathPrecisions)
      p.emplace_back(fmt::format("fpga_macs_{}", to_string(prec)),
                     num(f.macs_per_dsp[static_cast<int>(prec)]));
    p.emplace_back("fpga_onchip", num(f.onchip_bytes));
    p.emplace_back("fpga_ports", std::to_string(f.ports));
    p.emplace_back("fpga_port_bandwidth", num(f.port_bandwidth));
  }
  return p;
}

// Hops packed as link * 2 + reverse.
uint32_t pack(const Hop& h) {
  return static_cast<uint32_t>(h.link) * 2 + (h.reverse ? 1 : 0);
}
Hop unpack(uint32_t v) {
  return {static_cast<int>(v / 2), (v & 1) != 0};
}

}  // namespace

Status write_simgrid_xml(const Cluster& c, std::ostream& out) {
  if (Status s = validate(c); !s) return s;
  if (Status s = sim::check_link_names(c); !s) return s;
  const int D = static_cast<int>(c.devices.size());
  // Every ordered pair's route, packed (queries grouped by source: one search per source).
  Router router(c);
  std::vector<uint32_t> hops;
  std::vector<size_t> start(static_cast<size_t>(D) * D + 1, 0);
  for (int a = 0; a < D; ++a)
    for (int b = 0; b < D; ++b) {
      if (a != b) {
        Result<Route> r = router.route(a, b);
        if (!r) return r.error();
        for (const Hop& h : r->hops) hops.push_back(pack(h));
      }
      start[static_cast<size_t>(a) * D + b + 1] = hops.size();
    }
  auto route_of = [&](int a, int b) {
    const size_t i = static_cast<size_t>(a) * D + b;
    return std::span<const uint32_t>(hops.data() + start[i], start[i + 1] - start[i]);
  };

  const std::string zone = c.name.empty() ? "cluster" : c.name;
  out << "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n";
  out << "<!-- Written by pipegrid: the routes are the ones pipegrid uses; the pipegrid:* properties let "
         "pipegrid read the cluster back exactly. -->\n";
  out << "<platform version=\"4.1\">\n";
  out << "  <zone id=\"" << escape(zone) << "\" routing=\"Full\">\n";
  for (const Device& d : c.devices) {
    out << "    <host id=\"" << escape(d.name) << "\" speed=\"" << num(sim::host_speed(d.spec)) << "f\">\n";
    for (const auto& [k, v] : device_properties(d))
      out << "      <prop id=\"" << kPrefix << k << "\" value=\"" << escape(v) << "\"/>\n";
    out << "    </host>\n";
  }
  for (const std::string& s : c.switches) out << "    <router id=\"" << escape(s) << "\"/>\n";
  for (size_t i = 0; i < c.links.size(); ++i) {
    const Link& l = c.links[i];
    out << "    <link id=\"" << escape(sim::link_name(c, static_cast<int>(i))) << "\" bandwidth=\""
        << num(l.bandwidth) << "Bps\" latency=\"" << num(l.latency) << "s\" sharing_policy=\""
        << (l.duplex == Duplex::Full ? "SPLITDUPLEX" : "SHARED") << "\">\n";
    out << "      <prop id=\"" << kPrefix << "a\" value=\"" << escape(c.node_name(l.a)) << "\"/>\n";
    out << "      <prop id=\"" << kPrefix << "b\" value=\"" << escape(c.node_name(l.b)) << "\"/>\n";
    out << "    </link>\n";
  }
  auto write_route = [&](int a, int b, bool symmetrical) {
    out << "    <route src=\"" << escape(c.devices[a].name) << "\" dst=\"" << escape(c.devices[b].name)
        << "\" symmetrical=\"" << (symmetrical ? "YES" : "NO") << "\">";
    for (uint32_t v : route_of(a, b)) {
      const Hop h = unpack(v);
      out << "<link_ctn id=\"" << escape(sim::link_name(c, h.link)) << "\"";
      if (c.links[h.link].duplex == Duplex::Full)
        out << " direction=\"" << (h.reverse ? "DOWN" : "UP") << "\"";
      out << "/>";
    }
    out << "</route>\n";
  };
  for (int a = 0; a < D; ++a)
    for (int b = a + 1; b < D; ++b) {
      auto there = route_of(a, b), back = route_of(b, a);
      bool mirror = there.size() == back.size();
      for (size_t k = 0; mirror && k < there.size(); ++k)
        mirror = back[there.size() - 1 - k] == (there[k] ^ 1u);
      write_route(a, b, mirror);
      if (!mirror) write_route(b, a, false);
    }
  out << "  </zone>\n</platform>\n";
  if (!out) return Error{"cannot write the SimGrid platform"};
  return {};
}

}  // namespace pipegrid::output
