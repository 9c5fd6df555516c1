// What a transfer costs SimGrid 3.32 depending on who starts it (issue 14, item 1: "no scan over
// activities in flight"). SimGrid alone, no pipegrid code in the loop.
//
// N hosts on a star (a split-duplex link each), host i sending to host i + 1 (mod N), one transfer
// in flight per host at a time, each the next as soon as the previous one ends; N x K transfers in
// all (K per host), sizes staggered per host (8 MiB x (1 + i / N), 25 GB/s links) so that the
// completions do not fall at the same date. Two ways to start them:
//   Maestro/N/K  what sim/replay.cc does: Comm::sendto_init + start from maestro, the next one started
//                from Activity::on_completion. In SimGrid 3.32 sendto_init detaches the Comm, which
//                appends it to maestro's activity list, and CommImpl::finish removes it with
//                std::list::remove, a walk over every transfer in flight: about N per completion.
//   Actors/N/K   one sender and one receiver actor per host, Mailbox::put and Mailbox::get (the
//                actor-per-device design the issue suggests): the Comm is not detached, so it sits in
//                its two actors' lists only (one element each), but every transfer costs its actors
//                simcalls and context switches.
// One simulation per forked child (SimGrid keeps one engine per process); the counters are the
// child's CPU time for engine.run() (cpu_s) and per transfer (us_per_transfer), and the simulated
// end date (checks that both ways simulate the same thing: they must agree).
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <array>
#include <cstring>
#include <simgrid/s4u.hpp>
#include <string>
#include <vector>

#include "tools/process/process.h"

namespace sg4 = simgrid::s4u;

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

constexpr double kBandwidth = 25e9;

uint64_t size_of(int host, int hosts) {
  return static_cast<uint64_t>(8.0 * (1 << 20) * (1.0 + static_cast<double>(host) / hosts));
}

// Runs one simulation in this process; returns {CPU seconds of engine.run(), simulated end date}.
std::array<double, 2> simulate(int hosts, int per_host, bool actors) {
  std::vector<std::string> args = {"bench",
                                   "--log=root.thres:critical",
                                   "--cfg=network/model:CM02",
                                   "--cfg=network/TCP-gamma:0",
                                   "--cfg=network/crosstraffic:0",
                                   "--cfg=network/optim:Lazy"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  sg4::Engine engine(&argc, argv.data());
  sg4::NetZone* zone = sg4::create_star_zone("star");
  std::vector<sg4::Host*> h;
  std::vector<sg4::Link*> l;
  for (int i = 0; i < hosts; ++i) {
    h.push_back(zone->create_host(fmt::format("h{}", i), 1e9));
    l.push_back(zone->create_split_duplex_link(fmt::format("l{}", i), kBandwidth)->set_latency(0)->seal());
  }
  for (int i = 0; i < hosts; ++i)
    zone->add_route(h[i]->get_netpoint(), nullptr, nullptr, nullptr,
                    {{l[i], sg4::LinkInRoute::Direction::UP}}, /*symmetrical=*/true);
  zone->seal();

  std::vector<int> left(hosts, per_host);
  std::vector<sg4::CommPtr> running(hosts);
  auto start = [&](int i) {
    sg4::CommPtr c = sg4::Comm::sendto_init(h[i], h[(i + 1) % hosts]);
    c->set_payload_size(size_of(i, hosts));
    c->set_data(reinterpret_cast<void*>(static_cast<uintptr_t>(i)));
    c->start();
    running[i] = std::move(c);
  };
  std::vector<sg4::ActivityPtr> graveyard;
  if (actors) {
    for (int i = 0; i < hosts; ++i) {
      sg4::Mailbox* to = sg4::Mailbox::by_name(fmt::format("m{}", (i + 1) % hosts));
      sg4::Mailbox* mine = sg4::Mailbox::by_name(fmt::format("m{}", i));
      const uint64_t bytes = size_of(i, hosts);
      sg4::Actor::create(fmt::format("s{}", i), h[i], [to, bytes, per_host] {
        static int token;
        for (int k = 0; k < per_host; ++k) to->put(&token, bytes);
      });
      sg4::Actor::create(fmt::format("r{}", i), h[i], [mine, per_host] {
        for (int k = 0; k < per_host; ++k) mine->get<int>();
      });
    }
  } else {
    sg4::Activity::on_completion_cb([&](sg4::Activity const& a) {
      const auto i = static_cast<int>(reinterpret_cast<uintptr_t>(a.get_data<void>()));
      graveyard.clear();  // SimGrid still uses the activity during this callback
      graveyard.push_back(std::move(running[i]));
      if (--left[i] > 0) start(i);
    });
    for (int i = 0; i < hosts; ++i) start(i);
  }
  const double c0 = cpu_seconds();
  engine.run();
  const double cpu = cpu_seconds() - c0;
  graveyard.clear();
  return {cpu, sg4::Engine::get_clock()};
}

void run(benchmark::State& state, bool actors) {
  const int hosts = static_cast<int>(state.range(0)), per_host = static_cast<int>(state.range(1));
  std::array<double, 2> out{};
  for (auto _ : state) {
    const pipegrid::process::ChildResult child = pipegrid::process::run_child([&](int fd) {
      const std::array<double, 2> r = simulate(hosts, per_host, actors);
      return pipegrid::process::write_all(fd, r.data(), sizeof r) ? 0 : 1;
    });
    if (child.exit_code() != 0 || child.answer.size() != sizeof out) {
      state.SkipWithError("the simulation failed");
      return;
    }
    std::memcpy(out.data(), child.answer.data(), sizeof out);
    state.SetIterationTime(out[0]);
  }
  const double transfers = static_cast<double>(hosts) * per_host;
  state.counters["transfers"] = transfers;
  state.counters["cpu_s"] = out[0];
  state.counters["us_per_transfer"] = 1e6 * out[0] / transfers;
  state.counters["end_date_s"] = out[1];
}

void Maestro(benchmark::State& state) {
  run(state, false);
}
void Actors(benchmark::State& state) {
  run(state, true);
}

// The same number of transfers (262,144) at every width.
void widths(benchmark::internal::Benchmark* b) {
  for (int n : {64, 128, 256, 512, 1024, 2048}) b->Args({n, 262144 / n});
  b->UseManualTime()->Unit(benchmark::kSecond)->Iterations(1);
}

}  // namespace

BENCHMARK(Maestro)->Apply(widths);
BENCHMARK(Actors)->Apply(widths);

BENCHMARK_MAIN();
