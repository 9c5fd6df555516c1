// jemalloc's options for the processes it is linked into (CMakeLists.txt, pipegrid_allocator), read
// from this symbol when the allocator starts: its extents on transparent huge pages (Debian's THP mode
// is "madvise": jemalloc asks with MADV_HUGEPAGE), its metadata too. One page fault per 2 MiB instead
// of per 4 KiB, and fewer TLB misses: `pipegrid search` of GPT-3 175B on 1,024 A100s spent 13 of its 14 s
// of system time in page faults before its replays (docs/speed.md, "Design choices, measured"). A hint
// only: no result depends on it.
extern "C" {
// NOLINTNEXTLINE: the name jemalloc looks up.
const char* malloc_conf = "thp:always,metadata_thp:always";
}
