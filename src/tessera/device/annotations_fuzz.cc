// Fuzz target for the small annotation codecs: handshake, cordon list, policies and pod
// constraints. The input is split at '\n' into annotation values; every parser must be total,
// and the formatters must round-trip what the parsers accept.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/civil_time.h"

#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"

namespace {

using namespace tessera::device;

void CheckHandshake(std::string_view value) {
  Handshake h = ParseHandshake(value);
  if (!h.time.has_value()) {
    return;
  }
  absl::CivilSecond utc = absl::ToCivilSecond(*h.time, absl::UTCTimeZone());
  if (utc.year() < 0 || utc.year() > 9999) {
    return;
  }
  absl::Time whole = absl::FromCivil(utc, absl::UTCTimeZone());
  if (h.kind == HandshakeKind::kRequesting || h.kind == HandshakeKind::kDeleted) {
    std::string again = h.kind == HandshakeKind::kRequesting ? FormatHandshakeRequesting(*h.time)
                                                             : FormatHandshakeDeleted(*h.time);
    Handshake back = ParseHandshake(again);
    if (back.kind != h.kind || back.time != whole) {
      __builtin_trap();
    }
  } else if (h.kind == HandshakeKind::kReported) {
    Handshake back = ParseHandshake(FormatHandshakeReported(*h.time));
    if (back.kind != h.kind || back.time != h.time) {
      __builtin_trap();
    }
  }
}

void CheckCordon(std::string_view value) {
  std::vector<std::string> list = ParseCordonList(value);
  std::string joined;
  for (const std::string& uuid : list) {
    if (uuid.empty()) {
      __builtin_trap();
    }
    joined += uuid + ",";
  }
  if (ParseCordonList(joined) != list) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (true) {
    size_t nl = input.find('\n', start);
    lines.push_back(input.substr(start, nl == std::string_view::npos ? nl : nl - start));
    if (nl == std::string_view::npos) {
      break;
    }
    start = nl + 1;
  }
  static constexpr std::string_view kKeys[] = {
      kUseGpuTypeAnnotation,          kNoUseGpuTypeAnnotation,      kUseGpuUuidAnnotation,
      kNoUseGpuUuidAnnotation,        kVgpuModeAnnotation,          kNumaBindAnnotation,
      kNodeSchedulerPolicyAnnotation, kGpuSchedulerPolicyAnnotation};
  tessera::kube::StringMap annotations;
  for (size_t i = 0; i < lines.size(); ++i) {
    CheckHandshake(lines[i]);
    CheckCordon(lines[i]);
    (void)ParseNodePolicy(lines[i]);
    absl::StatusOr<GpuPolicy> policy = ParseGpuPolicy(lines[i]);
    if (policy.ok() && policy->chain.empty()) {
      __builtin_trap();
    }
    annotations.Set(std::string(kKeys[i % std::size(kKeys)]), std::string(lines[i]));
  }
  absl::StatusOr<PodConstraints> constraints = ParsePodConstraints(annotations);
  if (constraints.ok()) {
    for (const auto* list : {&constraints->use_types, &constraints->nouse_types,
                             &constraints->use_uuids, &constraints->nouse_uuids}) {
      for (const std::string& token : *list) {
        if (token.empty() || token.front() == ' ' || token.back() == ' ') {
          __builtin_trap();
        }
      }
    }
  } else if (constraints.status().message().empty()) {
    __builtin_trap();
  }
  return 0;
}
