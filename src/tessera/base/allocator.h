// File: tessera/base/allocator.h
//
// glibc's allocator, tuned for Tessera's threads: they decode and encode JSON, so they allocate
// and free bursts of small objects (a pod's strings, a watch event's fields), often freeing on
// one thread what another allocated. glibc caches 7 freed chunks per size class and thread
// (the "tcache"); a burst overflows it into the shared arena, whose slow paths (`_int_malloc`,
// `_int_free`, `malloc_consolidate`, `sysmalloc`) were 8–9 % of `tessera bench serve`'s CPU
// samples. With 256 per size class they fell to ~4 % (docs/benchmarks.md, 2026-12-04 third
// session).
//
// The cache size can only be set before the process starts, through the environment variable
// GLIBC_TUNABLES, which glibc reads once at start-up. So main() calls TuneAllocator() first:
//
//   int main(int argc, char** argv) {
//     tessera::TuneAllocator(argv);  // may execute the binary again; returns otherwise
//
// When GLIBC_TUNABLES is absent it sets it to kAllocatorTunables and executes /proc/self/exe
// again with the same arguments (the PID stays the same; child processes inherit the setting).
// When GLIBC_TUNABLES is present — even empty — the operator chose, and it is left alone; so
// `GLIBC_TUNABLES= tessera serve` runs with glibc's defaults. Where the binary cannot be
// executed again (no /proc), it runs on untuned. A higher trim threshold and a fixed mmap
// threshold were measured too and added nothing.
//
// The number of arenas is bounded to 2 (glibc's default is 8 per core): every thread that
// allocates while the others hold their arenas gets one of its own, and huge requests left
// memory in such arenas that even malloc_trim did not return: after eight sequential
// 60,000-name /filters `tessera serve` kept 142 MB with ReleaseFreeMemory after each, 18 MB
// with 2 arenas; after a hundred, sixteen at once, 91 MB and 21 MB (peaks 236 and 156 MB;
// before issue 21's changes 677 MB, peak 858 MB). glibc 2.36 as Debian patches it applies
// arena_max but leaves it out of the GLIBC_TUNABLES that /proc/<pid>/environ shows. `tessera bench
// serve`'s resident memory went 281-296
// -> 179-188 MiB, its pairs per second and CPU per pair unchanged within the noise
// (docs/benchmarks.md, "Hostile clients and huge requests").
//
// ReleaseFreeMemory() returns the allocator's free memory to the system (glibc's malloc_trim:
// every arena, the pages inside them too). glibc otherwise keeps what a thread freed in that
// thread's arena for its next allocations: a 60,000-name /filter left ~50 MB behind per serving
// thread (issue 21). It walks every arena under its lock, so call it after large requests only.
//
// Thread safety: call TuneAllocator() once, from main(), before any other thread starts.
// ReleaseFreeMemory() is thread-safe.
#pragma once

namespace tessera {

// What TuneAllocator sets GLIBC_TUNABLES to.
inline constexpr char kAllocatorTunables[] =
    "glibc.malloc.tcache_count=256:glibc.malloc.arena_max=2";

// Whether a process whose GLIBC_TUNABLES is `current` (nullptr: unset) should be executed again
// with kAllocatorTunables: only when it is unset and the C library is glibc.
bool ShouldRetuneAllocator(const char* current);

// See the file comment. Returns only when the process was not executed again.
void TuneAllocator(char** argv);

// See the file comment. Does nothing where the C library is not glibc.
void ReleaseFreeMemory();

}  // namespace tessera
