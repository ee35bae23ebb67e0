#include "tessera/ledger/heap_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include <malloc.h>

namespace {

std::atomic<int64_t> g_live_bytes{0};

int64_t BlockBytes(void* p) { return static_cast<int64_t>(malloc_usable_size(p) + sizeof(size_t)); }

}  // namespace

// g++ cannot see that these replace the global pair, and flags free() of operator-new memory.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) {
    throw std::bad_alloc();
  }
  g_live_bytes.fetch_add(BlockBytes(p), std::memory_order_relaxed);
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept {
  if (p != nullptr) {
    g_live_bytes.fetch_sub(BlockBytes(p), std::memory_order_relaxed);
    std::free(p);
  }
}
void operator delete[](void* p) noexcept { operator delete(p); }
void operator delete(void* p, size_t) noexcept { operator delete(p); }
void operator delete[](void* p, size_t) noexcept { operator delete(p); }

namespace tessera::ledger {

int64_t LiveHeapBytes() { return g_live_bytes.load(std::memory_order_relaxed); }

}  // namespace tessera::ledger
