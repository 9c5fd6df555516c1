// A line of progress on a terminal for work that may take a while (issue 30: a 32-board `plan`
// printed nothing for 20 s). Silent for the first two seconds and whenever standard error is not a
// terminal (pipes, files, sweep points), so captured outputs stay as they were.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace pipegrid::cli {

class Progress {
 public:
  // `what` is shown as "pipegrid: <what>... 3 s"; stage() changes it.
  explicit Progress(std::string what) : what_(std::move(what)) {
    if (!isatty(STDERR_FILENO)) return;
    thread_ = std::thread([this] { loop(); });
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { done(); }

  void stage(std::string what) {
    std::lock_guard<std::mutex> lock(m_);
    what_ = std::move(what);
  }

  // Stops and clears the line (if one was shown).
  void done() {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(m_);
    // PIPEGRID_PROGRESS_AFTER (seconds, default 2): when the line first shows (tests set 0).
    double after = 2;
    if (const char* env = std::getenv("PIPEGRID_PROGRESS_AFTER")) after = std::clamp(std::atof(env), 0.0, 3600.0);
    if (cv_.wait_for(lock, std::chrono::duration<double>(after), [this] { return stop_; })) return;
    bool shown = false;
    while (!stop_) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "\rpipegrid: %s... %.0f s\033[K", what_.c_str(), s);
      std::fflush(stderr);
      shown = true;
      cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; });
    }
    if (shown) {
      std::fprintf(stderr, "\r\033[K");
      std::fflush(stderr);
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::string what_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pipegrid::cli
