// Any bytes, split into frames as a watch stream, decode to events or errors, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/json/frame_splitter.h"
#include "tessera/kube/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tessera::kube::Decoder* decoder = new tessera::kube::Decoder();
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The whole input as one event, for each object type.
  auto pod = decoder->DecodeWatchEvent<tessera::kube::Pod>(bytes);
  auto node = decoder->DecodeWatchEvent<tessera::kube::Node>(bytes);
  auto lease = decoder->DecodeWatchEvent<tessera::kube::Lease>(bytes);
  if ((!pod.ok() && pod.status().message().empty()) ||
      (!node.ok() && node.status().message().empty()) ||
      (!lease.ok() && lease.status().message().empty())) {
    std::abort();
  }
  // And as a stream.
  tessera::json::FrameSplitter splitter(1 << 16);
  std::vector<std::string> frames;
  (void)splitter.Feed(bytes, &frames);
  for (const std::string& frame : frames) {
    auto event = decoder->DecodeWatchEvent<tessera::kube::Pod>(frame);
    if (event.ok() && event->type == tessera::kube::WatchEventType::kError &&
        !event->object.meta.name.empty()) {
      std::abort();  // an ERROR event carries no object
    }
  }
  return 0;
}
