// Feeds the same bytes to two splitters, once whole and once cut into chunks whose lengths come
// from the input's first bytes, and checks that both see the same frames and the same outcome,
// and that these match a byte-at-a-time reference scanner.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/json/frame_splitter.h"

namespace {

// The specification, one byte at a time: frames before the first error, and the error's code.
absl::StatusCode Reference(std::string_view s, size_t max_frame, std::vector<std::string>* out) {
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
      ++i;
      continue;
    }
    if (s[i] != '{') {
      return absl::StatusCode::kInvalidArgument;
    }
    const size_t start = i++;
    size_t depth = 1;
    bool in_string = false;
    bool escape = false;
    while (i < s.size() && depth > 0) {
      const char c = s[i++];
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (in_string) {
        in_string = c != '"';
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        --depth;
      }
    }
    if (i - start > max_frame) {
      return absl::StatusCode::kResourceExhausted;
    }
    if (depth == 0) {
      out->emplace_back(s.substr(start, i - start));
    }
  }
  return absl::StatusCode::kOk;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) {
    return 0;
  }
  std::string_view cuts(reinterpret_cast<const char*>(data), 4);
  std::string_view stream(reinterpret_cast<const char*>(data) + 4, size - 4);
  const size_t max_frame = 64 + static_cast<unsigned char>(cuts[0]) * 4;

  tessera::json::FrameSplitter whole(max_frame);
  std::vector<std::string> whole_frames;
  absl::Status whole_status = whole.Feed(stream, &whole_frames);

  tessera::json::FrameSplitter chunked(max_frame);
  std::vector<std::string> chunked_frames;
  absl::Status chunked_status;
  size_t pos = 0;
  size_t k = 1;
  while (pos < stream.size() && chunked_status.ok()) {
    size_t len = 1 + static_cast<unsigned char>(cuts[k++ % 4]) % 37;
    len = std::min(len, stream.size() - pos);
    chunked_status = chunked.Feed(stream.substr(pos, len), &chunked_frames);
    pos += len;
  }
  if (whole_status.code() != chunked_status.code() || whole_frames != chunked_frames) {
    std::abort();
  }
  std::vector<std::string> reference_frames;
  if (Reference(stream, max_frame, &reference_frames) != whole_status.code() ||
      reference_frames != whole_frames) {
    std::abort();
  }
  if (whole_status.ok() && whole.InFrame() != chunked.InFrame()) {
    std::abort();
  }
  for (const std::string& f : whole_frames) {
    if (f.size() > max_frame || f.front() != '{' || (f.back() != '}' && f.back() != ']')) {
      std::abort();
    }
  }
  return 0;
}
