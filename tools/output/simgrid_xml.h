// SimGrid platform files (XML, DTD version 4.1) from pipegrid clusters (`pipegrid cluster export`;
// tools/input/simgrid_xml.h reads them back).
//
// One zone with routing="Full": a host per device (speed = the device's highest peak, its figures
// as pipegrid:* properties), a router per switch, a link per cluster link (SPLITDUPLEX for
// full-duplex links, SHARED otherwise; endpoints as pipegrid:a and pipegrid:b properties) and, for
// every ordered pair of devices, the route pipegrid uses (one symmetrical route when the way back is
// the same path reversed). SimGrid loads it as it is; the file grows as the square of the device
// count (a 1024-device cluster: about half a million routes).
#pragma once

#include <ostream>

#include "core/cluster.h"
#include "core/result.h"

namespace pipegrid::output {

// The prefix of the properties that describe a device or a link's endpoints to pipegrid.
inline constexpr const char* kSimGridPropertyPrefix = "pipegrid:";

// Fails on an invalid cluster or a disconnected pair of devices.
Status write_simgrid_xml(const Cluster& c, std::ostream& out);

}  // namespace pipegrid::output
