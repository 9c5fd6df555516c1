// tools/process/process.h: children's answers of any size, exit codes and signals, captured output,
// the pool's bounds and order (checked by the children themselves through a shared counter page), and
// spawned commands. Oracles: the bytes each child was asked to send, the statuses the jobs chose.
#include "tools/process/process.h"

#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace pipegrid;
using namespace pipegrid::process;

namespace {

// Bytes no two positions of which a shifted copy would match: i-th byte from a 32-bit mix of i.
std::string pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u + seed;
    x ^= x >> 15;
    s[i] = static_cast<char>(x & 0xff);
  }
  return s;
}

// Counters shared by this process and its forked children (an anonymous shared mapping).
struct Shared {
  std::atomic<int> running{0}, most{0}, arrived{0}, finished{0};
  std::atomic<int> finished_at_start[64];
};

Shared* shared_page() {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return new (p) Shared();
}

}  // namespace

TEST_CASE("write_all and read_all move every byte through a pipe") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const std::string text = pattern(4000, 1);
  REQUIRE(write_all(fds[1], text.data(), text.size()));
  close(fds[1]);
  std::string back = "x";
  REQUIRE(read_all(fds[0], back));
  close(fds[0]);
  CHECK(back == "x" + text);
}

TEST_CASE("a child's answer larger than a pipe's buffer comes back whole") {
  const std::string big = pattern(8 << 20, 7);  // 8 MiB: 128 times a pipe's 64 KiB
  const ChildResult r = run_child([&](int fd) { return write_all(fd, big.data(), big.size()) ? 0 : 1; });
  REQUIRE(r.started());
  CHECK(r.exited());
  CHECK(r.exit_code() == 0);
  CHECK(r.signal() == 0);
  CHECK(r.answer.size() == big.size());
  CHECK(r.answer == big);
  CHECK(r.wall_s >= 0);
}

TEST_CASE("a child's exit status and the signal that killed it") {
  const ChildResult seven = run_child([](int) { return 7; });
  CHECK(seven.exited());
  CHECK(seven.exit_code() == 7);
  CHECK(seven.signal() == 0);
  CHECK(answer_of(seven, "the child").error().message == "the child failed without an answer");

  const ChildResult killed = run_child([](int fd) {
    write_all(fd, "\1partial", 8);
    raise(SIGKILL);
    return 0;
  });
  CHECK_FALSE(killed.exited());
  CHECK(killed.exit_code() == -1);
  CHECK(killed.signal() == SIGKILL);
  CHECK(killed.answer == "\1partial");  // what it sent before it died
  CHECK(answer_of(killed, "the child").error().message == "the child died (Killed)");
}

TEST_CASE("send_answer and answer_of: bytes or a message") {
  const std::string bytes = std::string("a\0b\1", 4) + pattern(100000, 3);
  Result<std::string> ok = answer_of(run_child([&](int fd) { return send_answer(fd, bytes); }), "x");
  REQUIRE(ok.ok());
  CHECK(*ok == bytes);
  Result<std::string> empty = answer_of(run_child([&](int fd) { return send_answer(fd, std::string()); }), "x");
  REQUIRE(empty.ok());
  CHECK(empty->empty());
  Result<std::string> failed =
      answer_of(run_child([&](int fd) { return send_answer(fd, Error{"no such plan"}); }), "x");
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().message == "no such plan");
}

TEST_CASE("captured output, pending output not written twice, and an escaping exception") {
  ChildOptions o;
  o.capture_output = true;
  // Pending in this process's stdout buffer at the fork: flushed here before it, so the child, whose
  // stdout is a memory file, does not write it a second time.
  std::printf("[process_test: pending output] ");
  const ChildResult r = run_child(
      [](int) {
        std::cout << "to stdout\n";
        std::fprintf(stderr, "to stderr\n");
        return 3;
      },
      o);
  CHECK(r.exit_code() == 3);
  CHECK(r.out == "to stdout\n");
  CHECK(r.err == "to stderr\n");

  const ChildResult thrown = run_child([](int) -> int { throw std::runtime_error("boom"); }, o);
  CHECK(thrown.exit_code() == 1);
  CHECK(thrown.err == "pipegrid: internal error: boom\n");
}

TEST_CASE("the pool runs every job once, at most `parallel` at a time, started in index order") {
  constexpr int kJobs = 12, kParallel = 3;
  Shared* s = shared_page();
  std::vector<int> done;
  std::set<size_t> seen;
  const bool all = run_pool(
      kJobs, kParallel,
      [&](size_t i, int fd) {
        s->finished_at_start[i] = s->finished.load();
        ++s->arrived;
        const int now = ++s->running;
        for (int m = s->most.load(); now > m && !s->most.compare_exchange_weak(m, now);) {
        }
        // The first kParallel wait until all of them run (they all start before any can end), so the
        // bound is reached, not just respected. Bounded wait: a broken pool fails the checks, not hangs.
        if (i < static_cast<size_t>(kParallel))
          for (int k = 0; k < 20000 && s->arrived.load() < kParallel; ++k)
            std::this_thread::sleep_for(std::chrono::microseconds(500));
        --s->running;
        ++s->finished;
        const std::string answer = std::to_string(i);
        return write_all(fd, answer.data(), answer.size()) ? 0 : 1;
      },
      [&](size_t i, ChildResult&& r) {
        CHECK(r.answer == std::to_string(i));
        CHECK(r.exit_code() == 0);
        seen.insert(i);
        done.push_back(static_cast<int>(i));
        return true;
      });
  CHECK(all);
  CHECK(done.size() == kJobs);
  CHECK(seen.size() == kJobs);
  CHECK(s->most.load() == kParallel);
  // Job i (i >= kParallel) starts only after i - kParallel + 1 jobs have ended.
  for (int i = kParallel; i < kJobs; ++i) CHECK(s->finished_at_start[i].load() >= i - kParallel + 1);
  munmap(s, sizeof(Shared));
}

TEST_CASE("children answering large answers at once all come back") {
  std::vector<std::string> answers(4);
  run_pool(
      4, 4, [](size_t i, int fd) {
        const std::string a = pattern(1 << 20, static_cast<uint32_t>(i));
        return write_all(fd, a.data(), a.size()) ? 0 : 1;
      },
      [&](size_t i, ChildResult&& r) {
        answers[i] = std::move(r.answer);
        return true;
      });
  for (uint32_t i = 0; i < 4; ++i) CHECK(answers[i] == pattern(1 << 20, i));
}

TEST_CASE("the pool stops when on_done says so: the children still running are killed") {
  int calls = 0;
  const bool all = run_pool(
      6, 3,
      [](size_t i, int) {
        if (i > 0) pause();  // until killed
        return 0;
      },
      [&](size_t i, ChildResult&&) {
        ++calls;
        CHECK(i == 0);
        return false;
      });
  CHECK_FALSE(all);
  CHECK(calls == 1);
}

TEST_CASE("spawn: exit status, no such program, a signal, output to /dev/null") {
  CHECK(spawn({"sh", "-c", "exit 3"}, Output::Quiet) == 3);
  CHECK(spawn({"sh", "-c", "echo hidden; echo hidden >&2"}, Output::Quiet) == 0);
  CHECK(spawn({"pipegrid-no-such-program-anywhere"}, Output::Quiet) == -1);
  CHECK(spawn({"sh", "-c", "kill -9 $$"}, Output::Quiet) == -1);
  CHECK(python_with("no_module_named_like_this_anywhere") == std::nullopt);
}
