#include "sim/platform.h"

#include <fmt/format.h>

#include <algorithm>
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
  p.cluster = &c;
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
    zone->add_route(p.hosts[pr.first]->get_netpoint(), p.hosts[pr.second]->get_netpoint(), nullptr, nullptr,
                    hops,
                    /*symmetrical=*/false);
  }
  zone->seal();
  return p;
}

}  // namespace pipegrid::sim
