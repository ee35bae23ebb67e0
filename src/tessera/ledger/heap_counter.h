// File: tessera/ledger/heap_counter.h
//
// Live heap bytes of the process, for the ledger's memory test and benchmark only. The counting
// comes from replacing the global operator new/delete in heap_counter.cc, so that file is added
// to a test or benchmark executable's sources — never to a library. Each block counts at its
// usable size plus the allocator's per-chunk header, so hash-table slack, vector growth and string
// buffers are all included.
//
// Thread safety: LiveHeapBytes may be called from any thread (a relaxed atomic read).
#pragma once

#include <cstdint>

namespace tessera::ledger {

int64_t LiveHeapBytes();

}  // namespace tessera::ledger
