// SimGrid platform XML: export then import gives the same cluster (devices, links, routes, figures);
// SimGrid itself loads the export and routes like pipegrid; hand-written SimGrid platforms are read
// into the graphs a reader of the file would draw.
#include "tools/input/simgrid_xml.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <simgrid/s4u.hpp>
#include <sstream>

#include "core/topologies/generators.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"
#include "tests/support/temp_dir.h"
#include "tools/output/simgrid_xml.h"
#include "tools/process/process.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

DeviceSpec gpu() {
  DeviceSpec d = test_device(80e9);
  d.kind = "a100";
  d.family = "gpu";
  d.memory_bandwidth = 2.039e12;
  d.peak_flops = {19.5e12, 156e12, 312e12, 312e12, 624e12};  // fp32, tf32, fp16, bf16, int8
  // and an fp8 rate: the format shares its name with the fp8 training precision, whose own (unused)
  // entry once followed it in the export and replaced it on import with 0
  d.peak_flops[static_cast<int>(Precision::FP8)] = 1979e12;
  d.efficiency = 0.5;
  d.layer_overhead_s = 1e-5;
  d.kernel_startup_s = 4.5e-6;
  d.kernel_dispatch_s = 8e-6;
  d.kernel_startup_class[static_cast<int>(KernelClass::Gemm)] = 9e-6;
  d.kernel_dispatch_class[static_cast<int>(KernelClass::GroupedGemm)] = 41e-6;
  d.compute_efficiency[static_cast<int>(Precision::FP16)][static_cast<int>(KernelClass::Gemm)] = 0.7;
  d.memory_efficiency[static_cast<int>(KernelClass::Gather)] = 0.5;
  d.winograd[static_cast<int>(Precision::FP32)] = true;
  d.recurrent_step_s[static_cast<int>(Precision::FP16)] = 31e-6;
  d.microscaling = true;
  return d;
}

std::string export_text(const Cluster& c) {
  std::ostringstream out;
  REQUIRE(output::write_simgrid_xml(c, out).ok());
  return out.str();
}

void check_same_spec(const DeviceSpec& a, const DeviceSpec& b) {
  CHECK(a.kind == b.kind);
  CHECK(a.family == b.family);
  CHECK(a.memory_bytes == b.memory_bytes);
  CHECK(a.memory_bandwidth == b.memory_bandwidth);
  CHECK(a.peak_flops == b.peak_flops);
  CHECK(a.efficiency == b.efficiency);
  CHECK(a.layer_overhead_s == b.layer_overhead_s);
  CHECK(a.kernel_startup_s == b.kernel_startup_s);
  CHECK(a.kernel_startup_class == b.kernel_startup_class);
  CHECK(a.kernel_dispatch_class == b.kernel_dispatch_class);
  CHECK(a.kernel_dispatch_s == b.kernel_dispatch_s);
  CHECK(a.compute_efficiency == b.compute_efficiency);
  CHECK(a.memory_efficiency == b.memory_efficiency);
  CHECK(a.winograd == b.winograd);
  CHECK(a.recurrent_step_s == b.recurrent_step_s);
  CHECK(a.microscaling == b.microscaling);
  REQUIRE(a.fpga.has_value() == b.fpga.has_value());
  if (a.fpga) {
    CHECK(a.fpga->dsps == b.fpga->dsps);
    CHECK(a.fpga->clock_hz == b.fpga->clock_hz);
    CHECK(a.fpga->macs_per_dsp == b.fpga->macs_per_dsp);
    CHECK(a.fpga->onchip_bytes == b.fpga->onchip_bytes);
    CHECK(a.fpga->ports == b.fpga->ports);
    CHECK(a.fpga->port_bandwidth == b.fpga->port_bandwidth);
  }
}

void check_round_trip(const Cluster& c) {
  Result<Cluster> back = input::read_simgrid_xml(export_text(c), "exported.xml", std::nullopt);
  REQUIRE(back.ok());
  CHECK(back->name == c.name);
  REQUIRE(back->devices.size() == c.devices.size());
  for (size_t i = 0; i < c.devices.size(); ++i) {
    CHECK(back->devices[i].name == c.devices[i].name);
    CHECK(back->devices[i].node == c.devices[i].node);
    check_same_spec(back->devices[i].spec, c.devices[i].spec);
  }
  CHECK(back->switches == c.switches);
  REQUIRE(back->links.size() == c.links.size());
  for (size_t i = 0; i < c.links.size(); ++i) {
    CHECK(back->links[i].a == c.links[i].a);
    CHECK(back->links[i].b == c.links[i].b);
    CHECK(back->links[i].bandwidth == c.links[i].bandwidth);
    CHECK(back->links[i].latency == c.links[i].latency);
    CHECK(back->links[i].duplex == c.links[i].duplex);
  }
  Router r0(c), r1(*back);
  for (size_t a = 0; a < c.devices.size(); ++a)
    for (size_t b = 0; b < c.devices.size(); ++b) {
      Route x = *r0.route(static_cast<int>(a), static_cast<int>(b));
      Route y = *r1.route(static_cast<int>(a), static_cast<int>(b));
      CHECK(x.hops == y.hops);
      CHECK(x.latency == y.latency);
      CHECK(x.bandwidth == y.bandwidth);
    }
  ClusterFigures f0 = *cluster_figures(c), f1 = *cluster_figures(*back);
  CHECK(f0.diameter_hops == f1.diameter_hops);
  CHECK(f0.bisection_bandwidth == f1.bisection_bandwidth);
}

// Routes as SimGrid computes them from a platform file: "src dst latency link link ..." per pair,
// from a child process (one SimGrid engine per process).
std::vector<std::string> simgrid_routes(const std::string& xml, const std::vector<std::string>& hosts) {
  TempDir dir;
  const std::string platform = dir.write("platform.xml", xml);
  const process::ChildResult child = process::run_child([&](int fd) {
    int argc = 2;
    char arg0[] = "test", arg1[] = "--log=root.thres:critical";
    char* argv[] = {arg0, arg1, nullptr};
    simgrid::s4u::Engine e(&argc, argv);
    e.load_platform(platform);
    std::ostringstream out;
    for (const std::string& a : hosts)
      for (const std::string& b : hosts) {
        if (a == b) continue;
        std::vector<simgrid::s4u::Link*> links;
        double latency = 0;
        e.host_by_name(a)->route_to(e.host_by_name(b), links, &latency);
        out << a << " " << b << " " << latency;
        for (auto* l : links) out << " " << l->get_name();
        out << "\n";
      }
    const std::string text = out.str();
    return process::write_all(fd, text.data(), text.size()) ? 0 : 1;
  });
  REQUIRE(child.exit_code() == 0);
  std::vector<std::string> lines;
  std::istringstream in(child.answer);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> pipegrid_routes(const Cluster& c) {
  Router r(c);
  std::vector<std::string> lines;
  for (size_t a = 0; a < c.devices.size(); ++a)
    for (size_t b = 0; b < c.devices.size(); ++b) {
      if (a == b) continue;
      Route route = *r.route(static_cast<int>(a), static_cast<int>(b));
      std::ostringstream line;
      line << c.devices[a].name << " " << c.devices[b].name << " " << route.latency;
      for (const Hop& h : route.hops) {
        const Link& l = c.links[h.link];
        line << " " << c.node_name(l.a) << "--" << c.node_name(l.b);
        if (l.duplex == Duplex::Full) line << (h.reverse ? "_DOWN" : "_UP");
      }
      lines.push_back(line.str());
    }
  return lines;
}

Cluster mixed_cluster() {
  // Two FPGAs on a host over PCIe plus a QSFP ring of four, a shared link, an explicit route.
  FpgaClusterSpec s;
  s.dims = {4};
  s.device = gpu();
  s.device.kind = "u280";
  s.device.family = "fpga";
  s.device.fpga = FpgaSpec{};
  s.device.fpga->dsps = 9024;
  s.device.fpga->clock_hz = 300e6;
  s.device.fpga->macs_per_dsp = {0.2, 0, 1, 1, 2};  // fp32, tf32 (none), fp16, bf16, int8
  s.device.fpga->ports = 2;
  s.device.fpga->port_bandwidth = 12.5e9;
  s.pcie = true;
  s.per_host = 2;
  Cluster c = *make_fpga_cluster(s);
  c.links[1].duplex = Duplex::Shared;
  c.routes.push_back({0, 1, {{3, true}, {2, true}, {1, true}}});  // fpga0 -> fpga3 -> fpga2 -> fpga1
  return c;
}

// Two DGX-style nodes on an InfiniBand fat-tree.
Cluster two_dgx_nodes(int gpus_per_node) {
  DgxSpec dgx;
  dgx.nodes = 2;
  dgx.gpus_per_node = gpus_per_node;
  dgx.gpu = gpu();
  dgx.fabric = DgxSpec::Fabric::FatTree;
  return *make_dgx_cluster(dgx);
}

}  // namespace

TEST_CASE("SimGrid XML: export then import gives the same devices, links, routes and figures") {
  check_round_trip(two_dgx_nodes(4));
  check_round_trip(*make_torus_cluster({3, 3}, "gpu", gpu(), {25e9, 1e-6}));  // dimension-order routes
  check_round_trip(*make_summit_cluster({2, gpu()}));
  check_round_trip(mixed_cluster());
  Cluster shared = *make_ring_cluster(5, "gpu", gpu(), {25e9, 1e-6});
  for (Link& l : shared.links) l.duplex = Duplex::Shared;
  check_round_trip(shared);
}

TEST_CASE("SimGrid XML: SimGrid loads the export and its routes are pipegrid's, link by link") {
  for (const Cluster& c :
       {two_dgx_nodes(2), mixed_cluster(), *make_torus_cluster({3, 2}, "gpu", gpu(), {1e9, 2e-6})}) {
    std::vector<std::string> hosts;
    for (const Device& d : c.devices) hosts.push_back(d.name);
    CHECK(simgrid_routes(export_text(c), hosts) == pipegrid_routes(c));
  }
}

TEST_CASE(
    "SimGrid XML: a hand-written Full zone without pipegrid properties - link ends inferred from routes") {
  // A -- l1 -- (r) -- l2 -- B, and C -- l3 -- (r): routes name links only. The junction is the
  // declared router when a route ends there; here it is not, so pipegrid names it junction0.
  const std::string xml = R"(<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <zone id="lab" routing="Full">
    <host id="A" speed="1Gf"/>
    <host id="B" speed="1Gf"/>
    <host id="C" speed="1Gf"/>
    <link id="l1" bandwidth="10GBps" latency="1us"/>
    <link id="l2" bandwidth="5GBps" latency="2us"/>
    <link id="l3" bandwidth="10GBps" latency="1us" sharing_policy="SPLITDUPLEX"/>
    <link id="unused" bandwidth="1GBps" latency="1us"/>
    <route src="A" dst="B"><link_ctn id="l1"/><link_ctn id="l2"/></route>
    <route src="C" dst="A"><link_ctn id="l3" direction="UP"/><link_ctn id="l1"/></route>
    <route src="C" dst="B"><link_ctn id="l3" direction="UP"/><link_ctn id="l2"/></route>
  </zone>
</platform>
)";
  Result<Cluster> c = input::read_simgrid_xml(xml, "lab.xml", test_device());
  REQUIRE(c.ok());
  CHECK(c->name == "lab");
  CHECK(c->switches == std::vector<std::string>{"junction0"});
  REQUIRE(c->links.size() == 3);  // "unused" carries no route: left out
  auto ends = [&](int i) { return c->node_name(c->links[i].a) + "-" + c->node_name(c->links[i].b); };
  CHECK(ends(0) == "A-junction0");
  CHECK(ends(1) == "junction0-B");
  CHECK(ends(2) == "C-junction0");
  CHECK(c->links[2].duplex == Duplex::Full);
  CHECK(c->links[1].bandwidth == 5e9);
  CHECK(c->links[1].latency == pipegrid::testing::approx(2e-6));
  CHECK(c->routes.size() == 6);  // three symmetrical routes
  Route ba = *Router(*c).route(1, 0);
  CHECK(ba.latency == pipegrid::testing::approx(3e-6));
  CHECK(ba.bandwidth == 5e9);
}

TEST_CASE("SimGrid XML: Floyd zones give links, a FLAT cluster a switch, zoneRoute joins gateways") {
  const std::string xml = R"(<?xml version='1.0'?>
<platform version="4.1">
  <zone id="world" routing="Floyd">
    <cluster id="c1" prefix="n" suffix=".lab" radical="0-3" speed="1Gf" bw="125MBps" lat="50us" router_id="gw1"/>
    <zone id="z2" routing="Floyd">
      <host id="x" speed="1Gf"/>
      <router id="gw2"/>
      <link id="x-gw2" bandwidth="1GBps" latency="10us"/>
      <route src="x" dst="gw2"><link_ctn id="x-gw2"/></route>
    </zone>
    <link id="wan" bandwidth="10MBps" latency="5ms"/>
    <zoneRoute src="c1" dst="z2" gw_src="gw1" gw_dst="gw2"><link_ctn id="wan"/></zoneRoute>
  </zone>
</platform>
)";
  Result<Cluster> c = input::read_simgrid_xml(xml, "world.xml", test_device());
  REQUIRE(c.ok());
  REQUIRE(c->devices.size() == 5);
  CHECK(c->devices[0].name == "n0.lab");
  CHECK(c->switches == std::vector<std::string>{"gw1", "gw2"});
  CHECK(c->links.size() == 4 + 2);
  CHECK(c->routes.empty());
  CHECK(c->links[0].duplex == Duplex::Full);  // a cluster's links are split-duplex by default
  Route r = *Router(*c).route(0, 4);          // n0.lab -> gw1 -> gw2 -> x
  CHECK(r.hops.size() == 3);
  CHECK(r.latency == pipegrid::testing::approx(50e-6 + 5e-3 + 10e-6));
  CHECK(r.bandwidth == 10e6);
  CHECK(Router(*c).route(0, 1)->hops.size() == 2);
}

TEST_CASE("SimGrid XML: routes in an early zone keep pointing at their routers when more hosts follow") {
  const std::string xml = R"(<platform version="4.1">
  <zone id="top" routing="Floyd">
    <zone id="z1" routing="Floyd">
      <host id="a" speed="1Gf"/><router id="r1"/><link id="a-r1" bandwidth="1GBps" latency="1us"/>
      <route src="a" dst="r1"><link_ctn id="a-r1"/></route>
    </zone>
    <zone id="z2" routing="Floyd">
      <host id="b" speed="1Gf"/><router id="r2"/><link id="b-r2" bandwidth="2GBps" latency="2us"/>
      <route src="b" dst="r2"><link_ctn id="b-r2"/></route>
    </zone>
    <link id="wan" bandwidth="3GBps" latency="3us"/>
    <zoneRoute src="z1" dst="z2" gw_src="r1" gw_dst="r2"><link_ctn id="wan"/></zoneRoute>
  </zone>
</platform>)";
  Result<Cluster> c = input::read_simgrid_xml(xml, "late.xml", test_device());
  REQUIRE(c.ok());
  auto ends = [&](int i) { return c->node_name(c->links[i].a) + "-" + c->node_name(c->links[i].b); };
  CHECK(ends(0) == "a-r1");
  CHECK(ends(1) == "b-r2");
  CHECK(ends(2) == "r1-r2");
  CHECK(Router(*c).route(0, 1)->latency == pipegrid::testing::approx(6e-6));
}

TEST_CASE("SimGrid XML: a radical may end at the largest long (found by fuzzing: the loop overflowed)") {
  const std::string xml = R"(<platform version="4.1"><zone id="w" routing="Floyd">
    <cluster id="c" prefix="n" radical="9223372036854775806-9223372036854775807" speed="1Gf" bw="1GBps"/>
  </zone></platform>)";
  Result<Cluster> c = input::read_simgrid_xml(xml, "big.xml", test_device());
  REQUIRE(c.ok());
  REQUIRE(c->devices.size() == 2);
  CHECK(c->devices[0].name == "n9223372036854775806");
  CHECK(c->devices[1].name == "n9223372036854775807");
}

TEST_CASE("SimGrid XML: errors name file:line:column") {
  auto error = [](const std::string& xml) {
    Result<Cluster> c = input::read_simgrid_xml(xml, "p.xml", test_device());
    REQUIRE(!c.ok());
    return c.error().message;
  };
  CHECK(error("<platform version=\"4.1\">\n  <zone id=\"z\" routing=\"Full\">\n    <host id=\"a\" "
              "speed=\"1f\">\n  "
              "</zone>\n</platform>\n") == "p.xml:4:5: invalid XML: Start-end tags mismatch");
  CHECK(error("<platform version=\"4.1\">\n  <zone id=\"z\" routing=\"Vivaldi\"/>\n</platform>") ==
        "p.xml:2:3: <zone id=\"z\">: routing \"Vivaldi\" is not supported (pipegrid reads Full, Floyd, "
        "Dijkstra, "
        "DijkstraCache)");
  CHECK(
      error("<platform version=\"4.1\"><zone id=\"z\" routing=\"Full\">\n<host id=\"a\" speed=\"1f\"/><host "
            "id=\"b\" speed=\"1f\"/>\n<link id=\"l\" bandwidth=\"fast\"/></zone></platform>") ==
      "p.xml:3:1: <link id=\"l\">: bandwidth: expected a positive bandwidth like \"25GBps\", got \"fast\"");
  CHECK(
      error("<platform version=\"4.1\"><zone id=\"z\" routing=\"Full\">\n<host id=\"a\" speed=\"1f\"/><host "
            "id=\"b\" speed=\"1f\"/>\n<route src=\"a\" dst=\"b\"><link_ctn "
            "id=\"nope\"/></route></zone></platform>") == "p.xml:3:24: <link_ctn>: unknown link \"nope\"");
  // a -- l -- b and then a route a -> c over l alone: b and c would be one node.
  CHECK(
      error("<platform version=\"4.1\"><zone id=\"z\" routing=\"Full\">\n<host id=\"a\" speed=\"1f\"/><host "
            "id=\"b\" speed=\"1f\"/><host id=\"c\" speed=\"1f\"/>\n<link id=\"l\" bandwidth=\"1Bps\"/>\n"
            "<route src=\"a\" dst=\"b\"><link_ctn id=\"l\"/></route>\n<route src=\"a\" dst=\"c\"><link_ctn "
            "id=\"l\"/></route>\n</zone></platform>") ==
      "p.xml:5:1: <route>: its links would make \"b\" and \"c\" one network node (pipegrid needs every link "
      "to join "
      "two nodes, and routes that agree with that)");
}

TEST_CASE("SimGrid XML: a default device that no host takes is refused, not ignored") {
  // Every host of pipegrid's export describes its own device: a `device:` beside `file:` (or --device)
  // changed nothing until 2026-12-05.
  const std::string xml = export_text(two_dgx_nodes(2));
  DeviceSpec other = gpu();
  other.kind = "v100";
  Result<Cluster> r = input::read_simgrid_xml(xml, "p.xml", other);
  REQUIRE(!r.ok());
  CHECK(r.error().message.find("p.xml: every host describes its own device") != std::string::npos);
  CHECK(input::read_simgrid_xml(xml, "p.xml", std::nullopt).ok());
}
