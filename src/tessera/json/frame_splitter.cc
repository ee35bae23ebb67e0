#include "tessera/json/frame_splitter.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "fmt/format.h"

#include "tessera/json/text.h"

namespace tessera::json {

namespace {

// Bit k of each mask is set when byte k of a 64-byte block is '"', '\\', an opening bracket
// ('{' '[') or a closing one ('}' ']').
struct BlockMasks {
  uint64_t quote = 0;
  uint64_t backslash = 0;
  uint64_t open = 0;
  uint64_t close = 0;
};

BlockMasks Classify(const char* block) {  // reads 64 bytes
  BlockMasks m;
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  const __m128i case_bit = _mm_set1_epi8(0x20);  // '[' | 0x20 == '{', ']' | 0x20 == '}'
  const __m128i open = _mm_set1_epi8('{');
  const __m128i close = _mm_set1_epi8('}');
  for (int part = 0; part < 4; ++part) {
    const __m128i v =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + std::ptrdiff_t{16} * part));
    const __m128i folded = _mm_or_si128(v, case_bit);
    auto bits = [&](__m128i eq) {
      return static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(eq)) & 0xffffu)
             << (16 * part);
    };
    m.quote |= bits(_mm_cmpeq_epi8(v, quote));
    m.backslash |= bits(_mm_cmpeq_epi8(v, backslash));
    m.open |= bits(_mm_cmpeq_epi8(folded, open));
    m.close |= bits(_mm_cmpeq_epi8(folded, close));
  }
#else
  for (int k = 0; k < 64; ++k) {
    const uint64_t bit = uint64_t{1} << k;
    switch (block[k]) {
      case '"':
        m.quote |= bit;
        break;
      case '\\':
        m.backslash |= bit;
        break;
      case '{':
      case '[':
        m.open |= bit;
        break;
      case '}':
      case ']':
        m.close |= bit;
        break;
      default:
        break;
    }
  }
#endif
  return m;
}

// Bit k of the result is the parity of the set bits of x at positions <= k.
uint64_t PrefixXor(uint64_t x) {
  x ^= x << 1;
  x ^= x << 2;
  x ^= x << 4;
  x ^= x << 8;
  x ^= x << 16;
  x ^= x << 32;
  return x;
}

}  // namespace

size_t FrameSplitter::ScanBlock(const char* data, size_t len, bool* closed) {
  char padded[64];
  const char* block = data;
  if (len < 64) {
    std::memset(padded, 0, sizeof(padded));  // NUL is not special
    std::memcpy(padded, data, len);
    block = padded;
  }
  const BlockMasks m = Classify(block);
  // Escapes: a backslash that is not itself escaped escapes the next byte (which may be the
  // first byte of the next block).
  uint64_t escaped = escape_ ? 1 : 0;
  bool carry = false;
  for (uint64_t b = m.backslash & ~escaped; b != 0; b &= b - 1) {
    const int k = std::countr_zero(b);
    if ((escaped >> k) & 1) {
      continue;
    }
    if (static_cast<size_t>(k) + 1 >= len) {
      carry = true;
    } else {
      escaped |= uint64_t{1} << (k + 1);
    }
  }
  uint64_t in_string = PrefixXor(m.quote & ~escaped);
  if (in_string_) {
    in_string = ~in_string;
  }
  const uint64_t brackets = (m.open | m.close) & ~in_string & ~escaped;
  for (uint64_t b = brackets; b != 0; b &= b - 1) {
    const int k = std::countr_zero(b);
    if ((m.open >> k) & 1) {
      ++depth_;
    } else if (--depth_ == 0) {
      *closed = true;
      in_string_ = false;
      escape_ = false;
      return static_cast<size_t>(k) + 1;
    }
  }
  *closed = false;
  in_string_ = ((in_string >> (len - 1)) & 1) != 0;
  escape_ = carry;
  return len;
}

FrameSplitter::FrameSplitter(size_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}

void FrameSplitter::Reset() {
  partial_.clear();
  offset_ = 0;
  depth_ = 0;
  in_frame_ = false;
  in_string_ = false;
  escape_ = false;
  error_ = absl::OkStatus();
}

absl::Status FrameSplitter::Feed(std::string_view chunk, std::vector<std::string>* frames) {
  if (!error_.ok()) {
    return error_;
  }
  const char* const data = chunk.data();
  const size_t n = chunk.size();
  size_t i = 0;
  size_t start = 0;  // first byte of the current frame within this chunk
  while (i < n) {
    if (!in_frame_) {
      while (i < n && IsJsonSpace(data[i])) {
        ++i;
      }
      if (i == n) {
        break;
      }
      if (data[i] != '{') {
        error_ = absl::InvalidArgumentError(
            fmt::format("json stream: unexpected byte 0x{:02x} at offset {} between objects",
                        static_cast<unsigned char>(data[i]), offset_ + i));
        offset_ += n;
        return error_;
      }
      in_frame_ = true;
      depth_ = 1;
      start = i;
      ++i;
    }
    // Inside an object: advance to the byte that closes it, or to the end of the chunk, one
    // 64-byte block at a time.
    bool closed = false;
    while (i < n && !closed) {
      const size_t len = std::min<size_t>(64, n - i);
      i += ScanBlock(data + i, len, &closed);
    }
    const size_t length = partial_.size() + (i - start);
    if (length > max_frame_bytes_) {
      error_ = absl::ResourceExhaustedError(
          fmt::format("json stream: object starting at offset {} exceeds {} bytes",
                      offset_ + start - partial_.size(), max_frame_bytes_));
      partial_.clear();
      partial_.shrink_to_fit();
      offset_ += n;
      return error_;
    }
    if (closed) {
      in_frame_ = false;
      if (partial_.empty()) {
        frames->emplace_back(data + start, i - start);
      } else {
        partial_.append(data + start, i - start);
        frames->push_back(std::move(partial_));
        partial_.clear();
      }
    } else {
      partial_.append(data + start, n - start);
    }
  }
  offset_ += n;
  return absl::OkStatus();
}

}  // namespace tessera::json
