// SimGrid platform files (XML, DTD version 4.1) read as pipegrid clusters. The XML is parsed with
// pugixml, and everything is checked before SimGrid could see it: errors name file:line:column.
//
// It reads what tools/output/simgrid_xml.h writes, and the common hand-written constructs:
//  - nested <zone> with routing Full, Floyd, Dijkstra or DijkstraCache;
//  - <host> (a device), <router> (a switch), <link> (bandwidth, latency, sharing_policy SHARED or
//    SPLITDUPLEX), <prop>;
//  - <route> with <link_ctn> (direction UP/DOWN for split-duplex links) and symmetrical, and
//    <zoneRoute> (its links join gw_src to gw_dst);
//  - <cluster> with topology FLAT and no backbone: a switch (router_id, or prefix id _router
//    suffix) with one link `<id>_link_<i>` per host;
//  - <config> and platform-level <prop> are ignored (pipegrid chooses SimGrid's models).
// Links have no endpoints in SimGrid: pipegrid takes them from the pipegrid:a/pipegrid:b
// properties, or else infers them from the routes (a route's first link touches its source, its
// last link its destination, consecutive links share a node; the junctions no host or router
// claims become switches named junction0, junction1, ...). Routes between two hosts of a Full zone
// become explicit routes; Floyd and Dijkstra zones only contribute links, and pipegrid routes over
// them by its own rule (latency, then hops), where SimGrid counts hops. Links no route uses are
// left out. A host without pipegrid properties takes `default_device`.
#pragma once

#include <optional>
#include <string>

#include "core/cluster.h"
#include "core/result.h"

namespace pipegrid::input {

Result<Cluster> read_simgrid_xml_file(const std::string& path,
                                      const std::optional<DeviceSpec>& default_device);
// `name` is used in messages (as a file name).
Result<Cluster> read_simgrid_xml(const std::string& text, const std::string& name,
                                 const std::optional<DeviceSpec>& default_device);

}  // namespace pipegrid::input
