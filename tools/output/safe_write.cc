#include "tools/output/safe_write.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/file_io.h"

namespace pipegrid::output {
namespace {

namespace fs = std::filesystem;

// The file a path names, for comparisons: its device and inode when it exists, else its absolute
// path with symbolic links in the existing part resolved.
struct Identity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string path;
  bool operator==(const Identity& o) const {
    return exists == o.exists && (exists ? dev == o.dev && ino == o.ino : path == o.path);
  }
};

Identity identity(const std::string& path) {
  Identity id;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    id.exists = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    return id;
  }
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  id.path = ec ? fs::absolute(path).lexically_normal().string() : p.string();
  return id;
}

}  // namespace

Status write_file_safely(const std::string& path, std::string_view content) {
  auto fail = [&](const std::string& why) {
    return Error{fmt::format("cannot write \"{}\": {} (nothing was changed)", path, why)};
  };
  if (path.empty()) return Error{"cannot write \"\": empty path"};
  struct stat target {};
  const bool exists = ::lstat(path.c_str(), &target) == 0;
  if (!exists && errno != ENOENT) return fail(std::strerror(errno));
  if (exists && !S_ISREG(target.st_mode))
    return fail(
        fmt::format("it is {}; outputs are written to regular files only", file_kind(target.st_mode)));
  // An input this command read (the experiment, a cluster or model file it names, ...): never replaced.
  if (exists && was_read_as_input(path))
    return fail("it is a file this command read as an input; an output must not overwrite an input");
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  struct stat dir {};
  if (::stat(folder.c_str(), &dir) != 0)
    return fail(fmt::format("folder \"{}\": {}", folder.string(), std::strerror(errno)));
  if (!S_ISDIR(dir.st_mode)) return fail(fmt::format("\"{}\" is not a folder", folder.string()));

  std::string temp =
      (folder / fmt::format(".{}.pipegrid-XXXXXX", fs::path(path).filename().string())).string();
  const int fd = ::mkstemp(temp.data());
  if (fd < 0)
    return fail(
        fmt::format("cannot create a temporary file in \"{}\": {}", folder.string(), std::strerror(errno)));
  auto abandon = [&](int err, std::string_view step) {
    ::close(fd);
    ::unlink(temp.c_str());
    return fail(fmt::format("{}{}", step, std::strerror(err)));
  };
  // mkstemp creates 0600: give the file the target's mode, or the usual 0666 minus the umask.
  mode_t mode = target.st_mode & 07777;
  if (!exists) {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  if (::fchmod(fd, mode) != 0) return abandon(errno, "");
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return abandon(errno, "");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) return abandon(errno, "fsync: ");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    return fail(fmt::format("close: {}", std::strerror(err)));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    return fail(fmt::format("rename: {}", std::strerror(err)));
  }
  // Make the rename itself durable (best effort: some file systems refuse fsync on a folder).
  if (const int d = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);
    ::close(d);
  }
  return {};
}

Status check_distinct_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  auto skip = [](const NamedPath& p) { return p.path.empty() || p.path == "-"; };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (skip(outputs[i])) continue;
    const Identity out = identity(outputs[i].path);
    for (const NamedPath& in : inputs)
      if (const Identity id = identity(in.path); !skip(in) && id.exists && id == out)
        return Error{fmt::format("{} \"{}\" is {}: an output must not overwrite an input", outputs[i].what,
                                 outputs[i].path, in.what)};
    for (std::size_t j = 0; j < i; ++j)
      if (!skip(outputs[j]) && identity(outputs[j].path) == out)
        return Error{fmt::format("{} \"{}\" and {} \"{}\" are the same file: each output needs its own",
                                 outputs[j].what, outputs[j].path, outputs[i].what, outputs[i].path)};
  }
  return {};
}

}  // namespace pipegrid::output
