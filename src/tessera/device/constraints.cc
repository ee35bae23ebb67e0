// The pod-level user annotations (nvidia.com/use-gputype and friends, the scheduler policies).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include <fmt/core.h>

#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/codec_internal.h"

namespace tessera::device {
namespace {

using internal::Quote;
using internal::TrimAscii;

// HAMi v2.10 list semantics: split on ',', trim, drop empty tokens.
std::vector<std::string> ParseList(const kube::StringMap& annotations, std::string_view key) {
  std::vector<std::string> out;
  const std::string* value = annotations.Find(key);
  if (value == nullptr) {
    return out;
  }
  for (std::string_view token : internal::Split(*value, ',')) {
    token = TrimAscii(token);
    if (!token.empty()) {
      out.emplace_back(token);
    }
  }
  return out;
}

std::string_view PolicyKeyName(GpuPolicyKey key) {
  switch (key) {
    case GpuPolicyKey::kBinpack:
      return "binpack";
    case GpuPolicyKey::kSpread:
      return "spread";
    case GpuPolicyKey::kNuma:
      return "numa";
    case GpuPolicyKey::kMutex:
      return "mutex";
    case GpuPolicyKey::kTopologyAware:
      return "topology-aware";
  }
  return "?";
}

}  // namespace

std::string NodePolicyName(NodePolicy policy) {
  return policy == NodePolicy::kSpread ? "spread" : "binpack";
}

std::string GpuPolicyName(const GpuPolicy& policy) {
  std::string out;
  for (GpuPolicyKey key : policy.chain) {
    if (!out.empty()) {
      out += ',';
    }
    out += PolicyKeyName(key);
  }
  return out;
}

absl::StatusOr<NodePolicy> ParseNodePolicy(std::string_view value) {
  std::string_view v = TrimAscii(value);
  if (v == "binpack") {
    return NodePolicy::kBinpack;
  }
  if (v == "spread") {
    return NodePolicy::kSpread;
  }
  return absl::InvalidArgumentError(
      fmt::format("unknown node scheduler policy {} (want binpack or spread)", Quote(value)));
}

absl::StatusOr<NumaAlignment> ParseNumaAlignment(std::string_view value) {
  std::string lower;
  const std::string_view trimmed = TrimAscii(value);
  lower.reserve(trimmed.size());
  for (size_t i = 0; i < trimmed.size(); ++i) {
    if (trimmed.substr(i, 2) == "\xc4\xb0") {  // U+0130: Go's ToLower gives 'i'
      lower += 'i';
      ++i;
      continue;
    }
    const char c = trimmed[i];
    lower += c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
  }
  if (lower == "best-effort") {
    return NumaAlignment::kBestEffort;
  }
  if (lower == "strict") {
    return NumaAlignment::kStrict;
  }
  return absl::InvalidArgumentError(
      fmt::format("invalid {} annotation {}: expected \"best-effort\" or \"strict\"",
                  kNumaAlignmentAnnotation, Quote(value)));
}

absl::StatusOr<GpuPolicy> ParseGpuPolicy(std::string_view value) {
  GpuPolicy policy;
  policy.chain.clear();
  for (std::string_view token : internal::Split(value, ',')) {
    token = TrimAscii(token);
    if (token.empty()) {
      continue;
    }
    GpuPolicyKey key;
    if (token == "binpack") {
      key = GpuPolicyKey::kBinpack;
    } else if (token == "spread") {
      key = GpuPolicyKey::kSpread;
    } else if (token == "numa") {
      key = GpuPolicyKey::kNuma;
    } else if (token == "mutex") {
      key = GpuPolicyKey::kMutex;
    } else if (token == "topology-aware") {
      key = GpuPolicyKey::kTopologyAware;
    } else {
      return absl::InvalidArgumentError(fmt::format(
          "unknown GPU scheduler policy {} (want binpack, spread, numa, mutex, topology-aware or "
          "a comma chain of them)",
          Quote(token)));
    }
    for (GpuPolicyKey seen : policy.chain) {
      if (seen == key) {
        return absl::InvalidArgumentError(fmt::format("GPU scheduler policy {}: {} given twice",
                                                      Quote(value), PolicyKeyName(key)));
      }
      if ((seen == GpuPolicyKey::kBinpack && key == GpuPolicyKey::kSpread) ||
          (seen == GpuPolicyKey::kSpread && key == GpuPolicyKey::kBinpack)) {
        return absl::InvalidArgumentError(fmt::format(
            "GPU scheduler policy {}: binpack and spread contradict each other", Quote(value)));
      }
    }
    policy.chain.push_back(key);
  }
  if (policy.chain.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("GPU scheduler policy {}: no policy given", Quote(value)));
  }
  return policy;
}

absl::StatusOr<PodConstraints> ParsePodConstraints(const kube::StringMap& annotations) {
  PodConstraints c;
  c.use_types = ParseList(annotations, kUseGpuTypeAnnotation);
  c.nouse_types = ParseList(annotations, kNoUseGpuTypeAnnotation);
  c.use_uuids = ParseList(annotations, kUseGpuUuidAnnotation);
  c.nouse_uuids = ParseList(annotations, kNoUseGpuUuidAnnotation);
  if (const std::string* mode = annotations.Find(kVgpuModeAnnotation); mode != nullptr) {
    std::string_view v = TrimAscii(*mode);
    if (!v.empty()) {
      c.vgpu_mode = std::string(v);
    }
  }
  if (const std::string* numa = annotations.Find(kNumaBindAnnotation); numa != nullptr) {
    std::optional<bool> b = internal::ParseGoBool(*numa);
    if (!b.has_value()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: not a boolean: {} (want one of 1,t,T,TRUE,true,True,0,f,F,FALSE,"
                      "false,False)",
                      kNumaBindAnnotation, Quote(*numa)));
    }
    c.numa_bind = *b;
  }
  if (const std::string* p = annotations.Find(kNodeSchedulerPolicyAnnotation);
      p != nullptr && !TrimAscii(*p).empty()) {
    absl::StatusOr<NodePolicy> policy = ParseNodePolicy(*p);
    if (!policy.ok()) {
      return Annotate(policy.status(), kNodeSchedulerPolicyAnnotation);
    }
    c.node_policy = *policy;
  }
  if (const std::string* p = annotations.Find(kGpuSchedulerPolicyAnnotation);
      p != nullptr && !TrimAscii(*p).empty()) {
    absl::StatusOr<GpuPolicy> policy = ParseGpuPolicy(*p);
    if (!policy.ok()) {
      return Annotate(policy.status(), kGpuSchedulerPolicyAnnotation);
    }
    c.gpu_policy = *std::move(policy);
  }
  return c;
}

}  // namespace tessera::device
