// Reading input files defensively: only a regular file (or standard input), never more than
// kMaxInputBytes, so that a directory, /dev/zero or a FIFO named as an input is an error instead of
// a hang or an unbounded read. Messages name the file and the OS's reason.
#pragma once

#include <cstddef>
#include <istream>
#include <string>

#include "core/result.h"

namespace pipegrid {

// The largest input file read (64 MiB): experiments, clusters, models, profiles, schedules.
inline constexpr std::size_t kMaxInputBytes = std::size_t{64} << 20;
// The largest trace graph read (1 GiB): `replay --graph` and the JSON of `replay --chakra`'s traces,
// which grow with the iteration's tasks (Mixtral 8x7B on 64 GPUs: 92 MB).
inline constexpr std::size_t kMaxTraceBytes = std::size_t{1} << 30;

// "a directory", "a FIFO", "a character device", ... for a stat() st_mode (in messages).
std::string file_kind(unsigned mode);

// The whole content of `path`, which must be a regular file of at most `limit` bytes. Errors:
//   cannot read "PATH": No such file or directory
//   cannot read "PATH": not a regular file (a directory)
//   cannot read "PATH": larger than the 64 MiB limit for input files
Result<std::string> read_input_file(const std::string& path, std::size_t limit = kMaxInputBytes);

// Whether `path` is a file this process read with read_input_file (the same file: device and inode),
// so that no output replaces an input (output::write_file_safely refuses it).
bool was_read_as_input(const std::string& path);

// The whole of `in` (standard input), at most kMaxInputBytes; `name` (e.g. "<stdin>") names it.
Result<std::string> read_input_stream(std::istream& in, const std::string& name);

}  // namespace pipegrid
