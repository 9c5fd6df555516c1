#include "core/file_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace pipegrid {
namespace {

Error too_large(const std::string& name, std::size_t limit = kMaxInputBytes) {
  return Error{
      fmt::format("cannot read \"{}\": larger than the {} MiB limit for input files", name, limit >> 20)};
}

}  // namespace

std::string file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "a special file";
}

namespace {

// The files read (device, inode), for was_read_as_input.
std::mutex inputs_mutex;
std::vector<std::pair<dev_t, ino_t>> inputs_read;

void remember_input(const struct stat& st) {
  const std::lock_guard<std::mutex> lock(inputs_mutex);
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  if (std::find(inputs_read.begin(), inputs_read.end(), id) == inputs_read.end()) inputs_read.push_back(id);
}

}  // namespace

bool was_read_as_input(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  const std::lock_guard<std::mutex> lock(inputs_mutex);
  return std::find(inputs_read.begin(), inputs_read.end(), std::pair<dev_t, ino_t>{st.st_dev, st.st_ino}) !=
         inputs_read.end();
}

Result<std::string> read_input_file(const std::string& path, std::size_t limit) {
  auto os_error = [&](int err) {
    return Error{fmt::format("cannot read \"{}\": {}", path, std::strerror(err))};
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked right after.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return os_error(errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return os_error(errno);
  if (!S_ISREG(st.st_mode))
    return Error{fmt::format("cannot read \"{}\": {}, not a regular file", path, file_kind(st.st_mode))};
  remember_input(st);
  if (static_cast<unsigned long long>(st.st_size) > limit) return too_large(path, limit);
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return os_error(errno);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > limit) return too_large(path, limit);  // the file grew while read
  }
  return text;
}

Result<std::string> read_input_stream(std::istream& in, const std::string& name) {
  std::string text;
  char buffer[1 << 16];
  while (in) {
    in.read(buffer, sizeof buffer);
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxInputBytes) return too_large(name);
  }
  if (in.bad()) return Error{fmt::format("cannot read \"{}\": read error", name)};
  return text;
}

}  // namespace pipegrid
