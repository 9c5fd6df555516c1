#include "sim/platform.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/kernel/routing/NetZoneImpl.hpp>
#include <unordered_map>

namespace sg4 = simgrid::s4u;
namespace kr = simgrid::kernel::routing;

namespace pipegrid::sim {
namespace {

// A zone that holds explicit routes for the pairs that were given one, and nothing else. SimGrid's
// Full zone keeps an N x N table of route pointers (16k hosts: 2 GB and 7 s to build, measured);
// this keeps only the routes that exist. Routing inside the zone is a look-up in a PairTable.
class PairRoutedZone final : public kr::NetZoneImpl {
 public:
  explicit PairRoutedZone(const std::string& name) : NetZoneImpl(name) {}

  void add_route(kr::NetPoint* src, kr::NetPoint* dst, kr::NetPoint* /*gw_src*/, kr::NetPoint* /*gw_dst*/,
                 const std::vector<sg4::LinkInRoute>& link_list, bool symmetrical) override {
    store(src, dst, link_list, false);
    if (symmetrical) store(dst, src, link_list, true);
  }

  void get_local_route(const kr::NetPoint* src, const kr::NetPoint* dst, kr::Route* into,
                       double* latency) override {
    const Entry* e = routes_.find(static_cast<uint32_t>(src->id()), static_cast<uint32_t>(dst->id()));
    xbt_assert(e != nullptr, "pipegrid: no route from %s to %s", src->get_cname(), dst->get_cname());
    into->link_list_.insert(into->link_list_.end(), e->links.begin(), e->links.end());
    if (latency) *latency += e->latency;
  }

 private:
  struct Entry {
    std::vector<simgrid::kernel::resource::StandardLinkImpl*> links;
    double latency = 0;
  };

  void store(const kr::NetPoint* src, const kr::NetPoint* dst, const std::vector<sg4::LinkInRoute>& link_list,
             bool back) {
    Entry e;
    e.links = get_link_list_impl(link_list, back);
    if (back) std::reverse(e.links.begin(), e.links.end());
    for (const sg4::LinkInRoute& l : link_list) e.latency += l.get_link()->get_latency();
    routes_.add(static_cast<uint32_t>(src->id()), static_cast<uint32_t>(dst->id()), std::move(e));
  }

  PairTable<Entry> routes_;
};

// Per device, its engine ports' links (collectives' [0], sends' [1]); empty without an engine.
using PortLinks = std::vector<std::array<sg4::Link*, 2>>;

// The collective engine's ports (platform.h) of every device of `pairs` on the engine: per kind of
// flow whose rate is finite, a host "<device> (collective engine)" or "(send engine)" and a
// split-duplex link of that name at the rate, no latency. Fills p.engine_ports.
PortLinks add_engine_ports(const Cluster& c, const std::vector<std::pair<int, int>>& pairs,
                           sg4::NetZone* zone, Platform& p) {
  PortLinks links;
  if (!c.engine) return links;
  p.engine_ports.assign(c.devices.size(), {nullptr, nullptr});
  links.assign(c.devices.size(), {nullptr, nullptr});
  std::unordered_map<std::string, int> names;
  for (size_t d = 0; d < c.devices.size(); ++d) names.emplace(c.devices[d].name, static_cast<int>(d));
  static constexpr std::array<const char*, 2> kKinds = {"collective engine", "send engine"};
  for (const auto& pr : pairs) {
    if (!c.on_engine(pr.first) || !c.on_engine(pr.second)) continue;
    for (int d : {pr.first, pr.second})
      for (size_t k = 0; k < 2; ++k) {
        const double rate = c.engine_rate(d, d, k == 0);
        if (!std::isfinite(rate) || p.engine_ports[d][k] != nullptr) continue;
        // A name no device has (SimGrid aborts on a duplicate host): "<device> (collective engine)",
        // or with " #2", " #3" ... after it where a device is already named so.
        std::string name = fmt::format("{} ({})", c.devices[d].name, kKinds[k]);
        for (int n = 2; names.count(name) != 0; ++n)
          name = fmt::format("{} ({}) #{}", c.devices[d].name, kKinds[k], n);
        names.emplace(name, d);
        p.engine_ports[d][k] = zone->create_host(name, kDefaultHostSpeed);
        sg4::Link* link = zone->create_split_duplex_link(name, rate);
        link->set_latency(0.0);
        link->seal();
        links[d][k] = link;
      }
  }
  return links;
}

// The routes between the engine ports of `from` and `to`, kind by kind where both have one: the
// source's port link up, `hops`, the destination's down.
void add_ported_routes(int from, int to, const std::vector<sg4::LinkInRoute>& hops, const PortLinks& links,
                       const Platform& p, sg4::NetZone* zone) {
  for (size_t k = 0; k < 2; ++k) {
    sg4::Link* out = links[from][k];
    sg4::Link* in = links[to][k];
    if (out == nullptr || in == nullptr) continue;
    std::vector<sg4::LinkInRoute> ported;
    ported.reserve(hops.size() + 2);
    ported.emplace_back(out, sg4::LinkInRoute::Direction::UP);
    ported.insert(ported.end(), hops.begin(), hops.end());
    ported.emplace_back(in, sg4::LinkInRoute::Direction::DOWN);
    zone->add_route(p.engine_ports[from][k]->get_netpoint(), p.engine_ports[to][k]->get_netpoint(), nullptr,
                    nullptr, ported, /*symmetrical=*/false);
  }
}

}  // namespace

Result<std::vector<std::pair<std::pair<int, int>, Route>>> plan_routes(
    const Cluster& c, const std::vector<std::pair<int, int>>& pairs) {
  if (Status s = validate(c); !s) return s.error();
  Router router(c);
  std::vector<std::pair<std::pair<int, int>, Route>> routes;
  routes.reserve(pairs.size());
  for (const auto& pr : pairs) {
    Result<Route> r = router.route(pr.first, pr.second);
    if (!r) return r.error();
    routes.emplace_back(pr, std::move(*r));
  }
  return routes;
}

std::string link_name(const Cluster& c, int link) {
  const Link& l = c.links[link];
  return fmt::format("{}--{}", c.node_name(l.a), c.node_name(l.b));
}

double host_speed(const DeviceSpec& d) {
  double speed = 0;
  for (double f : d.peak_flops) speed = std::max(speed, f);
  return speed > 0 ? speed : kDefaultHostSpeed;
}

Status check_link_names(const Cluster& c) {
  std::unordered_map<std::string, int> seen;
  for (size_t i = 0; i < c.links.size(); ++i) {
    auto [it, fresh] = seen.emplace(link_name(c, static_cast<int>(i)), static_cast<int>(i));
    if (!fresh)
      return Error{
          fmt::format("links {} and {} would both be named \"{}\" in SimGrid (a node name contains \"--\")",
                      it->second, i, it->first)};
  }
  return {};
}

Result<Platform> build_platform(const Cluster& c, const std::vector<std::pair<int, int>>& pairs) {
  // Routes first: a missing one is an error here, not an abort inside SimGrid.
  auto routes = plan_routes(c, pairs);
  if (!routes) return routes.error();
  if (Status s = check_link_names(c); !s) return s.error();

  Platform p;
  // Max-min: SimGrid's links carry no latency (see platform.h); the replay delays each flow instead.
  const bool latency_in_simgrid = c.sharing == Sharing::Tcp;
  auto* zone_impl = new PairRoutedZone(c.name.empty() ? "cluster" : c.name);  // owned by the engine
  sg4::NetZone* zone = zone_impl->get_iface();
  p.hosts.reserve(c.devices.size());
  for (const Device& d : c.devices) {
    p.speeds.push_back(host_speed(d.spec));
    p.hosts.push_back(zone->create_host(d.name, p.speeds.back()));
  }
  // Switches need no netpoint: routes are given as link lists between hosts.
  std::vector<sg4::Link*> links(c.links.size(), nullptr);
  auto link_of = [&](int i) {
    if (!links[i]) {
      const Link& l = c.links[i];
      sg4::Link* link = l.duplex == Duplex::Full
                            ? zone->create_split_duplex_link(link_name(c, i), l.bandwidth)
                            : zone->create_link(link_name(c, i), l.bandwidth);
      link->set_latency(latency_in_simgrid ? l.latency : 0.0);
      link->seal();
      links[i] = link;
    }
    return links[i];
  };
  const PortLinks port_links = add_engine_ports(c, pairs, zone, p);
  for (const auto& [pr, r] : *routes) {
    if (!latency_in_simgrid && r.latency > 0)
      p.delays.add(static_cast<uint32_t>(pr.first), static_cast<uint32_t>(pr.second), r.latency);
    std::vector<sg4::LinkInRoute> hops;
    hops.reserve(r.hops.size());
    for (const Hop& h : r.hops) {
      if (c.links[h.link].duplex == Duplex::Full)
        hops.emplace_back(link_of(h.link),
                          h.reverse ? sg4::LinkInRoute::Direction::DOWN : sg4::LinkInRoute::Direction::UP);
      else
        hops.emplace_back(link_of(h.link));
    }
    if (!port_links.empty()) add_ported_routes(pr.first, pr.second, hops, port_links, p, zone);
    zone->add_route(p.hosts[pr.first]->get_netpoint(), p.hosts[pr.second]->get_netpoint(), nullptr, nullptr,
                    hops,
                    /*symmetrical=*/false);
  }
  zone->seal();
  return p;
}

}  // namespace pipegrid::sim
