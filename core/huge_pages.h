// Large arrays on transparent huge pages where the kernel gives them on request (Linux THP in
// "madvise" mode, Debian's default): one page fault per 2 MiB instead of per 4 KiB when first
// touched, and fewer TLB misses. A hint only: no result depends on it.
#pragma once

#include <cstddef>
#include <vector>

namespace pipegrid {

// madvise(MADV_HUGEPAGE) on the whole pages of [data, data + bytes); nothing below 4 MiB or
// where the system has no such hint.
void advise_huge_pages(const void* data, size_t bytes);

// v.reserve(n), then the hint on the new buffer (before anything is written to it).
template <class T>
void reserve_huge(std::vector<T>& v, size_t n) {
  v.reserve(n);
  advise_huge_pages(v.data(), v.capacity() * sizeof(T));
}

// v = n copies of `value`, on a hinted buffer.
template <class T>
void assign_huge(std::vector<T>& v, size_t n, const T& value) {
  v.clear();
  reserve_huge(v, n);
  v.assign(n, value);
}

}  // namespace pipegrid
