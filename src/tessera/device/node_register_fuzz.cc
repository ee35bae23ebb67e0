// Fuzz target: DecodeNodeRegister is total, and what decodes round-trips through the encoder
// of its own format: decode -> encode -> decode yields the same devices and format.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "simdjson.h"

#include "tessera/device/codec.h"

namespace {
bool AllUtf8(const std::vector<tessera::device::DeviceInfo>& devices) {
  for (const auto& d : devices) {
    for (const std::string* s : {&d.id, &d.type, &d.mode}) {
      if (!simdjson::validate_utf8(s->data(), s->size())) {
        return false;
      }
    }
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::device;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<DecodedRegister> first = DecodeNodeRegister(input);
  if (!first.ok()) {
    if (first.status().message().empty()) {
      __builtin_trap();  // every error names what is wrong
    }
    return 0;
  }
  std::string encoded = first->format == RegisterFormat::kJson
                            ? EncodeNodeRegisterJson(first->devices)
                            : EncodeNodeRegisterDelimited(first->devices);
  absl::StatusOr<DecodedRegister> second = DecodeNodeRegister(encoded);
  if (first->format == RegisterFormat::kDelimited && first->devices.empty()) {
    __builtin_trap();  // a delimited value without devices is an error
  }
  if (!second.ok() || !(*second == *first)) {
    __builtin_trap();
  }
  // The JSON form must carry every decoded device too, whatever its source format (JSON
  // replaces invalid UTF-8, so only valid text is expected back unchanged).
  if (!AllUtf8(first->devices)) {
    return 0;
  }
  absl::StatusOr<DecodedRegister> as_json =
      DecodeNodeRegister(EncodeNodeRegisterJson(first->devices));
  if (!as_json.ok() || as_json->devices != first->devices) {
    __builtin_trap();
  }
  return 0;
}
