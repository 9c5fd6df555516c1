#include "sim/platform.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace sg4 = simgrid::s4u;

namespace pipegrid::sim {

Result<Platform> build_platform(const Cluster& c, const std::vector<std::pair<int, int>>& pairs) {
  if (Status s = validate(c); !s) return s.error();
  // Routes first: a missing one is an error here, not an abort inside SimGrid.
  Router router(c);
  std::vector<std::pair<std::pair<int, int>, Route>> routes;
  routes.reserve(pairs.size());
  for (const auto& pr : pairs) {
    Result<Route> r = router.route(pr.first, pr.second);
    if (!r) return r.error();
    routes.emplace_back(pr, std::move(*r));
  }

  Platform p;
  sg4::NetZone* zone = sg4::create_full_zone("cluster");
  for (const Device& d : c.devices) {
    double speed = 0;
    for (double f : d.spec.peak_flops) speed = std::max(speed, f);
    if (!(speed > 0)) speed = kDefaultHostSpeed;
    p.hosts.push_back(zone->create_host(d.name, speed));
    p.speeds.push_back(speed);
  }
  for (const std::string& s : c.switches) zone->create_router(s);
  std::vector<sg4::Link*> links;
  links.reserve(c.links.size());
  for (size_t i = 0; i < c.links.size(); ++i) {
    const Link& l = c.links[i];
    const std::string name = fmt::format("{}--{}", c.node_name(l.a), c.node_name(l.b));
    sg4::Link* link = l.duplex == Duplex::Full ? zone->create_split_duplex_link(name, l.bandwidth)
                                               : zone->create_link(name, l.bandwidth);
    link->set_latency(l.latency);
    link->seal();
    links.push_back(link);
  }
  for (const auto& [pr, r] : routes) {
    std::vector<sg4::LinkInRoute> hops;
    hops.reserve(r.hops.size());
    for (const Hop& h : r.hops) {
      if (c.links[h.link].duplex == Duplex::Full)
        hops.emplace_back(links[h.link], h.reverse ? sg4::LinkInRoute::Direction::DOWN : sg4::LinkInRoute::Direction::UP);
      else
        hops.emplace_back(links[h.link]);
    }
    zone->add_route(p.hosts[pr.first]->get_netpoint(), p.hosts[pr.second]->get_netpoint(), nullptr, nullptr, hops,
                    /*symmetrical=*/false);
  }
  zone->seal();
  return p;
}

}  // namespace pipegrid::sim
