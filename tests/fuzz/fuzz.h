// Shared by the libFuzzer harnesses (one per input parser; see docs/testing.md, "Fuzzing").
// A harness hands the bytes to a parser as a file's text. A located error (a Result holding an
// Error, or input::InputError) is a normal outcome; anything else is a finding: a crash, a
// sanitizer report, a timeout, running out of memory, or an exception other than an input error
// (the command line reports those as internal errors, exit 1), which escapes the harness and aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pipegrid::fuzz {

inline std::string text_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// An error message must not be empty (every message names the file first).
template <class R>
void check(const R& r) {
  if (!r.ok() && r.error().message.empty()) __builtin_trap();
}

}  // namespace pipegrid::fuzz
