#include "tessera/base/allocator.h"

#include <cstdlib>

#include <unistd.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace tessera {

bool ShouldRetuneAllocator(const char* current) {
#if defined(__GLIBC__)
  return current == nullptr;
#else
  (void)current;
  return false;
#endif
}

void ReleaseFreeMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

void TuneAllocator(char** argv) {
#if defined(__GLIBC__)
  // setenv and unsetenv race with other threads' getenv; main() calls this first, before any
  // thread exists (allocator.h).
  // NOLINTBEGIN(concurrency-mt-unsafe)
  if (ShouldRetuneAllocator(std::getenv("GLIBC_TUNABLES")) && argv != nullptr &&
      argv[0] != nullptr && setenv("GLIBC_TUNABLES", kAllocatorTunables, 1) == 0) {
    execv("/proc/self/exe", argv);
    // Still here: the binary could not be executed again. Run on untuned, and do not leave a
    // setting behind that child processes would take for the operator's.
    unsetenv("GLIBC_TUNABLES");
  }
  // NOLINTEND(concurrency-mt-unsafe)
#else
  (void)argv;
#endif
}

}  // namespace tessera
