#include "core/huge_pages.h"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace pipegrid {

void prepare_heap(size_t heap_bytes) {
#if defined(__GLIBC__) && defined(M_TOP_PAD)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, static_cast<int>(heap_bytes));
  // An allocation larger than what is left at the heap's top grows it by heap_bytes more (the top
  // pad); freed, it returns to the top. The hint applies to the whole area from it to the break.
  void* probe = malloc(size_t{1} << 20);
  void* end = sbrk(0);
  if (probe != nullptr && end != reinterpret_cast<void*>(-1) && end > probe)
    advise_huge_pages(probe, static_cast<size_t>(static_cast<char*>(end) - static_cast<char*>(probe)));
  free(probe);
#else
  (void)heap_bytes;
#endif
}

void advise_huge_pages(const void* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  if (data == nullptr || bytes < (size_t{4} << 20)) return;
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(page - 1);
  if (end > begin)
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // a hint: errors ignored
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace pipegrid
