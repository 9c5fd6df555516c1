// Cluster generators: standard interconnects from a few parameters.
//
// Every generator names things predictably, uses full-duplex links and leaves routing to the
// Router (shortest paths by latency, then hops) except the tori, which use dimension-order routing
// (Cluster::torus_dims). Devices are numbered so that consecutive indices are close in the network
// (same switch, same node, same pod): pipeline stage i runs on device i. The figures given as
// defaults below are from docs/reference/hardware.md; [assumed] marks modelling assumptions.
#pragma once

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/result.h"

namespace pipegrid {

struct LinkSpec {
  double bandwidth = 0;  // bytes/s per direction
  double latency = 0;    // seconds
};

// `count` identical devices named <prefix>0, <prefix>1, ..., each with one link (bandwidth,
// latency, full duplex) to one switch named "switch". A transfer between two devices crosses two
// links: 2 x latency + bytes / bandwidth.
Cluster make_switch_cluster(int count, const std::string& prefix, const DeviceSpec& device, double bandwidth,
                            double latency);

// `count` devices <prefix>0.. in a ring: a link between <prefix>i and <prefix>(i+1 mod count) (one
// link when count is 2, none when 1). Shortest-path routing goes the shorter way round.
Result<Cluster> make_ring_cluster(int count, const std::string& prefix, const DeviceSpec& device,
                                  LinkSpec link);

// A 1-, 2- or 3-D torus of devices <prefix>i, i = x + X (y + Y z) for dims [X, Y, Z]: a link to the
// next device along each dimension, wrapping around (one link when a dimension has size 2).
// Dimension-order routing (x, then y, then z, the shorter way round each ring).
Result<Cluster> make_torus_cluster(const std::vector<int>& dims, const std::string& prefix,
                                   const DeviceSpec& device, LinkSpec link);

// The k-ary fat-tree of Al-Fares et al. (SIGCOMM'08), built from k-port switches (k even): k pods of
// k/2 edge switches "edge<p>-<e>" and k/2 aggregation switches "agg<p>-<a>", (k/2)^2 core switches
// "core<c>"; every edge switch serves k/2 devices, so k^3/4 devices <prefix>i (device i on edge
// switch i / (k/2)); aggregation switch a of every pod links to cores a (k/2) .. a (k/2) + k/2 - 1.
// Full bisection bandwidth: k^3/8 x bandwidth. Every link has the same figures. Destination-mod-k
// routing (Cluster::fat_tree). With `count` below
// k^3/4, only the first `count` device slots are filled (the switches are all there).
Result<Cluster> make_fat_tree_cluster(int k, int count, const std::string& prefix, const DeviceSpec& device,
                                      LinkSpec link);

// Dragonfly (Kim et al., ISCA'08): `groups` groups of `routers` routers "router<g>-<r>", all-to-all
// inside a group (local links), `hosts` devices per router (<prefix>i on router i / hosts), and one
// global link between every two groups. Group g's links to the other groups, in the order
// g+1, g+2, ... (mod groups), are spread over its routers, `global` per router, so
// groups - 1 <= routers x global is required. Minimal routing: local, global, local.
struct DragonflySpec {
  int groups = 0, routers = 0, hosts = 0, global = 0;
  std::string prefix = "gpu";
  DeviceSpec device;
  LinkSpec host_link, local_link, global_link;
};
Result<Cluster> make_dragonfly_cluster(const DragonflySpec& s);

// DGX-style nodes: `nodes` x `gpus_per_node` GPUs gpu<i> (node "dgx<n>" holds gpu<n g> .. gpu<n g + g - 1>),
// each with an NVLink link to its node's NVSwitch "dgx<n>-nvswitch" and one InfiniBand NIC link into the
// fabric: one switch "ib-switch", or the smallest k-ary fat-tree with room for every NIC (switches
// "ib-edge<p>-<e>", "ib-agg<p>-<a>", "ib-core<c>"; NIC i on edge switch i / (k/2); destination-mod-k
// routing between nodes, NVLink inside a node). Defaults: DGX A100
// (NVLink 300 GB/s per direction per GPU, HDR InfiniBand 200 Gb/s = 25 GB/s per GPU); latencies
// [assumed]: 0.5 us per NVLink link (about 1 us GPU to GPU through the NVSwitch), 1 us per InfiniBand link.
struct DgxSpec {
  // Switch: one InfiniBand switch; FatTree: a k-ary fat-tree; Rail: rail-optimised (the NIC of local
  // GPU j of every node on rail switch "ib-rail<j>", the rails joined by a non-blocking spine "ib-spine").
  enum class Fabric { Switch, FatTree, Rail };
  int nodes = 1;
  int gpus_per_node = 8;
  DeviceSpec gpu;
  LinkSpec nvlink{300e9, 0.5e-6};
  LinkSpec infiniband{25e9, 1e-6};
  Fabric fabric = Fabric::Switch;
  // Rail fabric in pods (0: one pod, the names above): pods of `pod_nodes` nodes, each rail-optimised
  // and non-blocking inside ("ib-pod<q>-rail<j>" joined by "ib-pod<q>-spine"), the pods' spines joined
  // by one core switch "ib-core" over one link each whose bandwidth is the pod's NICs' together divided
  // by `oversubscription` (Llama 3's 24k-GPU cluster: pods of 3,072 GPUs, 1:7 between pods, arXiv
  // 2407.21783 section 3.3.1). The pod's uplinks are one link here: ECMP over many taken as perfect.
  int pod_nodes = 0;
  double oversubscription = 1;
};
Result<Cluster> make_dgx_cluster(const DgxSpec& s);

// Summit-style nodes as GraphPipe used them: 4 V100 per node, gpu<4n> .. gpu<4n+3> in node "summit<n>",
// two per POWER9 socket ("summit<n>-cpu0", "summit<n>-cpu1"). Links: NVLink 2.0 between the two GPUs
// of a socket and from each GPU to its socket (50 GB/s per direction), X-Bus between the sockets
// (64 GB/s), and one EDR InfiniBand rail per socket (100 Gb/s = 12.5 GB/s; Summit nodes are dual-rail)
// to one non-blocking switch "ib-switch". Latencies [assumed]: 0.5 us NVLink, 0.5 us X-Bus, 1 us InfiniBand.
struct SummitSpec {
  int nodes = 1;
  DeviceSpec gpu;
  LinkSpec nvlink{50e9, 0.5e-6};
  LinkSpec xbus{64e9, 0.5e-6};
  LinkSpec infiniband{12.5e9, 1e-6};
};
Result<Cluster> make_summit_cluster(const SummitSpec& s);

// DGX-1 servers (NVIDIA DGX-1 with Tesla V100 System Architecture, WP-08437-002): 8 GPUs per server
// gpu<8n> .. gpu<8n+7> (node "dgx1-<n>") in the NVLink hybrid cube-mesh: two fully linked quads
// {0,1,2,3} and {4,5,6,7} plus the links i <-> i+4. A V100 has 6 NVLink2 links of 25 GB/s per direction;
// on DGX-1V the pairs 0-3, 0-4, 1-2, 1-5, 2-3, 4-7, 5-6, 6-7 carry two links and the other 8 pairs
// of the mesh one (kDgx1Links below: 16 pairs, 24 links, 6 per GPU), as
// `nvidia-smi topo -m` shows NV1/NV2; NVIDIA/nccl issue #671 dumps GPU0's and GPU1's links). Each
// pair of GPUs (2k, 2k+1) sits on a PCIe Gen3 x16 switch "dgx1-<n>-plx<k>" (PLX PEX8764), switches
// 0-1 on CPU "dgx1-<n>-cpu0" and 2-3 on "dgx1-<n>-cpu1", the CPUs joined by QPI. Every PCIe switch can
// carry a NIC (`nics` per server: 4 (one per PCIe switch, DGX-1's four EDR ports), 2 or 1) into one
// network switch "net-switch".
//
// Routes: two linked GPUs use their NVLink bundle (one link with the bundle's bandwidth). Two GPUs of a
// server with no NVLink between them (e.g. 0-5, or any pair of a `pcie` server) go over PCIe: through
// their shared PCIe switch, or up to the CPU(s) and across QPI (CUDA peer copies between GPUs without
// NVLink go through PCIe and the host, not through a third GPU), given as explicit routes; with
// `nvlink_forwarding` the shortest path by latency is used instead, two NVLink hops through a third
// GPU (what NCCL's rings can do). Between servers: shortest paths by latency (GPU, its PCIe switch, its
// NIC, the network, ...; with fewer than 4 NICs a route may first cross an NVLink to a GPU beside a NIC,
// like NCCL's PXN).
//
// Server kinds (per server, in order; the list repeats its last entry): `nvlink2` (DGX-1V: 6 links per
// GPU, the two-link pairs doubled), `nvlink1` (DGX-1 P100 generation: NVLink 1.0 at 20 GB/s per
// direction per link, 4 links per GPU: every cube-mesh pair one link), `pcie` (no NVLink: 8 GPUs on the
// same PCIe tree only). Defaults [public]: NVLink2 25 GB/s, NVLink1 20 GB/s, PCIe Gen3 x16 15.75 GB/s
// per direction, QPI 2 links x 9.6 GT/s x 2 B = 38.4 GB/s per direction, network EDR InfiniBand
// 100 Gb/s = 12.5 GB/s per NIC. Latencies [assumed]: 1 us per NVLink (GPU to GPU), 1 us per PCIe link,
// 0.5 us QPI, 1 us per network link (Ethernet: give a larger one, e.g. 5 us).
struct Dgx1Spec {
  enum class Kind { NvLink2, NvLink1, Pcie };
  int servers = 1;
  std::vector<Kind> kinds{Kind::NvLink2};
  DeviceSpec gpu;
  LinkSpec nvlink2{25e9, 1e-6};  // one link; a two-link pair gets twice the bandwidth
  LinkSpec nvlink1{20e9, 1e-6};
  LinkSpec pcie{15.75e9, 1e-6};
  LinkSpec qpi{38.4e9, 0.5e-6};
  LinkSpec network{12.5e9, 1e-6};
  int nics = 4;
  bool nvlink_forwarding = false;
};
// NVLink links between the GPUs of one DGX-1V, as {a, b, links}.
struct Dgx1Pair {
  int a, b, links;
};
inline constexpr Dgx1Pair kDgx1Links[] = {{0, 1, 1}, {0, 2, 1}, {0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 3, 1},
                                          {1, 5, 2}, {2, 3, 2}, {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1},
                                          {4, 7, 2}, {5, 6, 2}, {5, 7, 1}, {6, 7, 2}};
Result<Cluster> make_dgx1_cluster(const Dgx1Spec& s);

// FPGAs fpga<i> linked directly through their QSFP28 ports, in a ring (`dims` = {count}, shortest-path
// routing) or a 2-D/3-D torus (dimension-order routing). The link bandwidth defaults to the device's
// port bandwidth (FpgaSpec::port_bandwidth; 100 Gb/s = 12.5 GB/s when unknown), the latency to 0.5 us
// [assumed]. When the device gives its port count, the shape must not need more (a ring uses 2
// ports, a torus 2 per dimension of size 3 or more and 1 per dimension of size 2). With `pcie`,
// every `per_host` consecutive FPGAs also have a PCIe link to their host "host<j>" (a routing node;
// the FPGAs' `node`), PCIe Gen3 x16 by default (15.75 GB/s, latency [assumed] 1 us); a ring may then
// route between FPGAs of one host over PCIe when that is faster.
struct FpgaClusterSpec {
  std::vector<int> dims;  // {count} for a ring
  bool torus = false;
  DeviceSpec device;
  LinkSpec qsfp{0, 0.5e-6};  // bandwidth 0: the device's port bandwidth
  bool pcie = false;
  LinkSpec pcie_link{15.75e9, 1e-6};
  int per_host = 1;
};
Result<Cluster> make_fpga_cluster(const FpgaClusterSpec& s);

}  // namespace pipegrid
