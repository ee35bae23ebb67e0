// File: tessera/base/allocator.h
//
// Tunes glibc's allocator for Tessera's many threads: TuneAllocator() (first thing in main) sets
// GLIBC_TUNABLES to kAllocatorTunables — at most 2 arenas; glibc's own thread caches, as larger
// ones made serve's memory grow with pod churn — and executes the binary again, unless the
// operator set GLIBC_TUNABLES (even empty).
// ReleaseFreeMemory() returns the allocator's free memory to the system after large requests. Why
// and the measurements: docs/serve.md "The allocator".
//
//   int main(int argc, char** argv) {
//     tessera::TuneAllocator(argv);  // may execute the binary again; returns otherwise
//
// Errors: none; where the binary cannot be executed again (no /proc) it runs on untuned.
//
// Thread safety: call TuneAllocator() once, from main(), before any other thread starts.
// ReleaseFreeMemory() is thread-safe.
#pragma once

namespace tessera {

// What TuneAllocator sets GLIBC_TUNABLES to.
inline constexpr char kAllocatorTunables[] = "glibc.malloc.arena_max=2";

// Whether a process whose GLIBC_TUNABLES is `current` (nullptr: unset) should be executed again
// with kAllocatorTunables: only when it is unset and the C library is glibc.
bool ShouldRetuneAllocator(const char* current);

// See the file comment. Returns only when the process was not executed again.
void TuneAllocator(char** argv);

// See the file comment. Does nothing where the C library is not glibc.
void ReleaseFreeMemory();

}  // namespace tessera
