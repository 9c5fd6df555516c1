#include "core/units.h"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <optional>

namespace pipegrid {
namespace {

struct Unit {
  std::string_view symbol;
  Dimension dim;
  double factor;
};

constexpr double kKi = 1024.0;
// Longest symbols first is not needed: the whole suffix must match exactly.
constexpr std::array kUnits = {
    Unit{"s", Dimension::Time, 1.0},
    Unit{"ms", Dimension::Time, 1e-3},
    Unit{"us", Dimension::Time, 1e-6},
    Unit{"\xC2\xB5s", Dimension::Time, 1e-6},  // µs
    Unit{"ns", Dimension::Time, 1e-9},
    Unit{"min", Dimension::Time, 60.0},
    Unit{"h", Dimension::Time, 3600.0},

    Unit{"B", Dimension::Bytes, 1.0},
    Unit{"kB", Dimension::Bytes, 1e3},
    Unit{"KB", Dimension::Bytes, 1e3},
    Unit{"MB", Dimension::Bytes, 1e6},
    Unit{"GB", Dimension::Bytes, 1e9},
    Unit{"TB", Dimension::Bytes, 1e12},
    Unit{"PB", Dimension::Bytes, 1e15},
    Unit{"KiB", Dimension::Bytes, kKi},
    Unit{"MiB", Dimension::Bytes, kKi* kKi},
    Unit{"GiB", Dimension::Bytes, kKi* kKi* kKi},
    Unit{"TiB", Dimension::Bytes, kKi* kKi* kKi* kKi},
    Unit{"PiB", Dimension::Bytes, kKi* kKi* kKi* kKi* kKi},

    Unit{"Bps", Dimension::Bandwidth, 1.0},
    Unit{"B/s", Dimension::Bandwidth, 1.0},
    Unit{"kBps", Dimension::Bandwidth, 1e3},
    Unit{"KBps", Dimension::Bandwidth, 1e3},
    Unit{"kB/s", Dimension::Bandwidth, 1e3},
    Unit{"KB/s", Dimension::Bandwidth, 1e3},
    Unit{"MBps", Dimension::Bandwidth, 1e6},
    Unit{"MB/s", Dimension::Bandwidth, 1e6},
    Unit{"GBps", Dimension::Bandwidth, 1e9},
    Unit{"GB/s", Dimension::Bandwidth, 1e9},
    Unit{"TBps", Dimension::Bandwidth, 1e12},
    Unit{"TB/s", Dimension::Bandwidth, 1e12},
    Unit{"KiBps", Dimension::Bandwidth, kKi},
    Unit{"MiBps", Dimension::Bandwidth, kKi* kKi},
    Unit{"GiBps", Dimension::Bandwidth, kKi* kKi* kKi},
    Unit{"KiB/s", Dimension::Bandwidth, kKi},
    Unit{"MiB/s", Dimension::Bandwidth, kKi* kKi},
    Unit{"GiB/s", Dimension::Bandwidth, kKi* kKi* kKi},
    Unit{"bps", Dimension::Bandwidth, 1.0 / 8},
    Unit{"b/s", Dimension::Bandwidth, 1.0 / 8},
    Unit{"kbps", Dimension::Bandwidth, 1e3 / 8},
    Unit{"Kbps", Dimension::Bandwidth, 1e3 / 8},
    Unit{"Mbps", Dimension::Bandwidth, 1e6 / 8},
    Unit{"Mb/s", Dimension::Bandwidth, 1e6 / 8},
    Unit{"Gbps", Dimension::Bandwidth, 1e9 / 8},
    Unit{"Gb/s", Dimension::Bandwidth, 1e9 / 8},
    Unit{"Tbps", Dimension::Bandwidth, 1e12 / 8},
    Unit{"Tb/s", Dimension::Bandwidth, 1e12 / 8},

    Unit{"FLOPS", Dimension::FlopRate, 1.0},
    Unit{"FLOP/s", Dimension::FlopRate, 1.0},
    Unit{"kFLOPS", Dimension::FlopRate, 1e3},
    Unit{"MFLOPS", Dimension::FlopRate, 1e6},
    Unit{"GFLOPS", Dimension::FlopRate, 1e9},
    Unit{"TFLOPS", Dimension::FlopRate, 1e12},
    Unit{"PFLOPS", Dimension::FlopRate, 1e15},
    Unit{"GFLOP/s", Dimension::FlopRate, 1e9},
    Unit{"TFLOP/s", Dimension::FlopRate, 1e12},
    Unit{"PFLOP/s", Dimension::FlopRate, 1e15},
    Unit{"OPS", Dimension::FlopRate, 1.0},  // integer operations (int8 peaks are quoted in TOPS)
    Unit{"GOPS", Dimension::FlopRate, 1e9},
    Unit{"TOPS", Dimension::FlopRate, 1e12},

    Unit{"Hz", Dimension::Frequency, 1.0},
    Unit{"kHz", Dimension::Frequency, 1e3},
    Unit{"MHz", Dimension::Frequency, 1e6},
    Unit{"GHz", Dimension::Frequency, 1e9},

    Unit{"FLOP", Dimension::Flops, 1.0},
    Unit{"kFLOP", Dimension::Flops, 1e3},
    Unit{"MFLOP", Dimension::Flops, 1e6},
    Unit{"GFLOP", Dimension::Flops, 1e9},
    Unit{"TFLOP", Dimension::Flops, 1e12},
    Unit{"PFLOP", Dimension::Flops, 1e15},
};

std::string_view dimension_noun(Dimension d) {
  switch (d) {
    case Dimension::Time:
      return "a time";
    case Dimension::Bytes:
      return "a byte size";
    case Dimension::Bandwidth:
      return "a bandwidth";
    case Dimension::FlopRate:
      return "a compute rate";
    case Dimension::Flops:
      return "an operation count";
    case Dimension::Frequency:
      return "a frequency";
  }
  return "a quantity";
}

// The largest magnitude accepted per dimension, after the unit is applied (see units.h).
struct Limit {
  double max;
  std::string_view text;
  // The smallest non-zero magnitude: a link of 1e-6 B/s made times of 1e14 s, beside which each
  // millisecond of compute was lost to rounding (its busy time printed as 0 s).
  double min = 0;
  std::string_view min_text = "";
};
Limit limit(Dimension d) {
  switch (d) {
    case Dimension::Time:
      return {1e9, "1e9 s"};
    case Dimension::Bytes:
      return {1e18, "1e18 B"};
    case Dimension::Bandwidth:
      return {1e21, "1e21 B/s", 1, "1 B/s"};
    case Dimension::FlopRate:
      return {1e21, "1e21 FLOP/s"};
    case Dimension::Flops:
      return {1e24, "1e24 FLOP"};
    case Dimension::Frequency:
      return {1e12, "1e12 Hz"};
  }
  return {0, "0"};
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<Unit> find_unit(std::string_view symbol) {
  for (const Unit& u : kUnits)
    if (u.symbol == symbol) return u;
  return std::nullopt;
}

std::string scaled(double v, std::initializer_list<std::pair<double, std::string_view>> steps,
                   std::string_view base) {
  double a = std::fabs(v);
  for (const auto& [f, sym] : steps)
    if (a >= f) return fmt::format("{:.4g} {}", v / f, sym);
  return fmt::format("{:.4g} {}", v, base);
}

}  // namespace

std::string describe(Dimension d) {
  switch (d) {
    case Dimension::Time:
      return "a time like \"1ms\"";
    case Dimension::Bytes:
      return "a byte size like \"16GiB\"";
    case Dimension::Bandwidth:
      return "a bandwidth like \"25GBps\"";
    case Dimension::FlopRate:
      return "a compute rate like \"125TFLOPS\"";
    case Dimension::Flops:
      return "an operation count like \"30.9GFLOP\"";
    case Dimension::Frequency:
      return "a frequency like \"300MHz\"";
  }
  return "a quantity";
}

std::string describe(Dimension d, std::string_view qualifier) {
  std::string s = describe(d);
  size_t space = s.find(' ');
  return fmt::format("a {} {}", qualifier, s.substr(space + 1));
}

Result<double> parse_quantity(std::string_view text, Dimension d, bool allow_negative) {
  std::string_view s = trim(text);
  auto fail = [&](std::string_view why = {}) {
    std::string msg = fmt::format("expected {}, got \"{}\"", describe(d), text);
    if (!why.empty()) msg += fmt::format(" ({})", why);
    return Error{msg};
  };
  if (s.empty()) return fail();
  double value = 0;
  // from_chars rejects a leading '+': accept it explicitly.
  std::string_view num = s;
  if (num.front() == '+') num.remove_prefix(1);
  auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), value);
  if (ec != std::errc() || ptr == num.data()) return fail();
  std::string_view unit = trim(std::string_view(ptr, num.data() + num.size() - ptr));
  if (!std::isfinite(value)) return fail("not a finite number");
  if (unit.empty()) return fail("the unit is missing");
  std::optional<Unit> u = find_unit(unit);
  if (!u) return fail(fmt::format("unknown unit \"{}\"", unit));
  if (u->dim != d) return fail(fmt::format("\"{}\" is the unit of {}", unit, dimension_noun(u->dim)));
  if (value < 0 && !allow_negative)
    return Error{fmt::format("expected {}, got \"{}\"", describe(d, "non-negative"), text)};
  const double v = value * u->factor;
  const Limit l = limit(d);
  if (!(std::fabs(v) <= l.max)) return fail(fmt::format("out of range: at most {}", l.text));
  if (v != 0 && std::fabs(v) < l.min) return fail(fmt::format("out of range: at least {}", l.min_text));
  return v;
}

std::string format_time(double s) {
  double a = std::fabs(s);
  if (a == 0) return "0 s";
  if (a >= 1) return fmt::format("{:.4g} s", s);
  if (a >= 1e-3) return fmt::format("{:.4g} ms", s * 1e3);
  if (a >= 1e-6) return fmt::format("{:.4g} us", s * 1e6);
  return fmt::format("{:.4g} ns", s * 1e9);
}

std::string format_bytes(double b) {
  return scaled(b,
                {{kKi * kKi * kKi * kKi * kKi, "PiB"},
                 {kKi * kKi * kKi * kKi, "TiB"},
                 {kKi * kKi * kKi, "GiB"},
                 {kKi * kKi, "MiB"},
                 {kKi, "KiB"}},
                "B");
}

std::string format_bandwidth(double b) {
  return scaled(b, {{1e15, "PB/s"}, {1e12, "TB/s"}, {1e9, "GB/s"}, {1e6, "MB/s"}, {1e3, "kB/s"}}, "B/s");
}

std::string format_flop_rate(double f) {
  return scaled(f,
                {{1e15, "PFLOP/s"}, {1e12, "TFLOP/s"}, {1e9, "GFLOP/s"}, {1e6, "MFLOP/s"}, {1e3, "kFLOP/s"}},
                "FLOP/s");
}

std::string format_frequency(double f) {
  return scaled(f, {{1e9, "GHz"}, {1e6, "MHz"}, {1e3, "kHz"}}, "Hz");
}

std::string format_flops(double f) {
  return scaled(f, {{1e15, "PFLOP"}, {1e12, "TFLOP"}, {1e9, "GFLOP"}, {1e6, "MFLOP"}, {1e3, "kFLOP"}},
                "FLOP");
}

double max_magnitude(Dimension d) {
  return limit(d).max;
}

}  // namespace pipegrid
