#include "tessera/device/ascend.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "fmt/format.h"

#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/codec_internal.h"
#include "tessera/device/quantity.h"
#include "tessera/device/request.h"
#include "tessera/json/text.h"

namespace tessera::device {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// limits[name], else requests[name] when `requests_too`; nullptr when absent.
const kube::ShortString* Lookup(const kube::Container& container, std::string_view name,
                                bool requests_too = true) {
  if (name.empty()) {
    return nullptr;
  }
  const kube::ShortString* value = container.limits.Find(name);
  return value != nullptr || !requests_too ? value : container.requests.Find(name);
}

absl::Status ValueError(std::string_view name, std::string_view value, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("{}: {} {}", name, QuoteForError(value), what));
}

absl::StatusOr<Quantity> QuantityOf(std::string_view name, std::string_view text) {
  absl::StatusOr<Quantity> q = ParseQuantity(text);
  if (!q.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", name, std::string(q.status().message())));
  }
  return q;
}

// An integer resource (no fraction), or nullopt when the container does not give it.
absl::StatusOr<std::optional<int64_t>> IntegerOf(const kube::Container& container,
                                                 std::string_view name) {
  const kube::ShortString* text = Lookup(container, name);
  if (text == nullptr) {
    return std::nullopt;
  }
  TESSERA_ASSIGN_OR_RETURN(Quantity q, QuantityOf(name, text->view()));
  absl::StatusOr<int64_t> v = q.AsInt64();
  if (!v.ok()) {
    return ValueError(name, text->view(), "is not an integer");
  }
  if (*v < 0) {
    return ValueError(name, text->view(), "is negative");
  }
  return std::optional<int64_t>(*v);
}

// The comma list of a UUID selector as HAMi's CheckUUID reads it: nullopt (no constraint) when
// absent or blank; else every token trimmed, empty ones kept (they match no device).
std::vector<std::string> UuidList(const kube::StringMap& annotations, std::string_view key) {
  std::vector<std::string> out;
  const std::string* value = annotations.Find(key);
  if (value == nullptr || internal::TrimAscii(*value).empty()) {
    return out;
  }
  for (std::string_view token : internal::Split(*value, ',')) {
    out.emplace_back(internal::TrimAscii(token));
  }
  return out;
}

class AscendVendor : public Vendor {
 public:
  AscendVendor(AscendChipConfig chip, bool hami_vnpu_core)
      : chip_(std::move(chip)),
        keys_(AscendKeysOf(chip_.common_word)),
        hami_vnpu_core_(hami_vnpu_core) {}

  std::string_view Key() const override { return chip_.common_word; }
  std::string_view RegisterAnnotation() const override { return keys_.register_key; }
  std::string_view HandshakeAnnotation() const override { return keys_.handshake_key; }
  std::string_view ToAllocateAnnotation() const override { return keys_.to_allocate; }
  std::string_view AllocatedAnnotation() const override { return keys_.allocated; }

  std::vector<std::string> ManagedResources() const override {
    std::vector<std::string> out = {chip_.resource_name, chip_.resource_memory_name};
    if (!chip_.resource_core_name.empty()) {
      out.push_back(chip_.resource_core_name);
    }
    return out;
  }

  absl::StatusOr<NodeDevices> DecodeNode(const kube::Node& node) const override {
    const std::string* value = node.meta.annotations.Find(keys_.register_key);
    if (value == nullptr) {
      return absl::NotFoundError(
          fmt::format("node {}: no {} annotation", node.meta.name, keys_.register_key));
    }
    std::string_view text = internal::TrimAscii(*value);
    if (text.empty() || text.front() != '[') {
      return absl::InvalidArgumentError(
          fmt::format("node {}: {}: not a JSON list (the Ascend device plugin writes JSON)",
                      node.meta.name, keys_.register_key));
    }
    absl::StatusOr<DecodedRegister> decoded = DecodeNodeRegister(*value);
    if (!decoded.ok()) {
      return Annotate(decoded.status(),
                      fmt::format("node {}: {}", node.meta.name, keys_.register_key));
    }
    NodeDevices out;
    out.node = node.meta.name;
    out.format = RegisterFormat::kJson;
    out.devices = std::move(decoded->devices);
    // The plugin's own word wins over the configured default (HAMi's Fit).
    const std::string* allowed = node.meta.annotations.Find(kVnpuNodeAnnotation);
    out.hami_core_allowed = allowed != nullptr ? *allowed == "true" : hami_vnpu_core_;
    return out;
  }

  absl::StatusOr<PodRequest> DecodeRequest(const kube::Pod& pod) const override {
    return DerivePodRequestWith(
        pod, [this](const kube::Container& c) { return DeriveAscendRequest(chip_, c); });
  }

  absl::StatusOr<PodConstraints> DecodeConstraints(const kube::Pod& pod) const override {
    const kube::StringMap& annotations = pod.meta.annotations;
    PodConstraints c;
    c.use_uuids = UuidList(annotations, keys_.use_uuid);
    c.nouse_uuids = UuidList(annotations, keys_.no_use_uuid);
    if (const std::string* mode = annotations.Find(kVnpuModeAnnotation); mode != nullptr) {
      c.vgpu_mode = *mode;  // compared exactly, as HAMi does
    }
    if (const std::string* p = annotations.Find(kNodeSchedulerPolicyAnnotation);
        p != nullptr && !internal::TrimAscii(*p).empty()) {
      absl::StatusOr<NodePolicy> policy = ParseNodePolicy(*p);
      if (!policy.ok()) {
        return Annotate(policy.status(),
                        fmt::format("pod {}: {}", pod.Key(), kNodeSchedulerPolicyAnnotation));
      }
      c.node_policy = *policy;
    }
    if (const std::string* p = annotations.Find(kGpuSchedulerPolicyAnnotation);
        p != nullptr && !internal::TrimAscii(*p).empty()) {
      absl::StatusOr<GpuPolicy> policy = ParseGpuPolicy(*p);
      if (!policy.ok()) {
        return Annotate(policy.status(),
                        fmt::format("pod {}: {}", pod.Key(), kGpuSchedulerPolicyAnnotation));
      }
      c.gpu_policy = *std::move(policy);
    }
    return c;
  }

  absl::StatusOr<PodDevices> DecodeAllocation(const kube::Pod& pod) const override {
    const std::string* value = pod.meta.annotations.Find(keys_.allocated);
    if (value == nullptr) {
      return absl::NotFoundError(
          fmt::format("pod {}: no {} annotation", pod.Key(), keys_.allocated));
    }
    absl::StatusOr<PodDevices> devices = DecodePodDevices(*value);
    if (!devices.ok()) {
      return Annotate(devices.status(), fmt::format("pod {}: {}", pod.Key(), keys_.allocated));
    }
    return devices;
  }

  std::string EncodeAllocation(const PodDevices& devices) const override {
    return EncodePodDevices(devices);
  }

  void AddFilterAnnotations(const kube::Pod& pod, const PodDevices& devices, absl::Time now,
                            kube::StringMap* out) const override {
    const std::string* mode = pod.meta.annotations.Find(kVnpuModeAnnotation);
    const bool hami_core = mode != nullptr && *mode == kVnpuModeHamiCore;
    out->Set(std::string(kPredicateTimeAnnotation), std::to_string(absl::ToUnixSeconds(now)));
    out->Set(keys_.runtime_info, EncodeAscendRuntimeInfo(chip_, devices, hami_core));
  }

 private:
  AscendChipConfig chip_;
  AscendKeys keys_;
  bool hami_vnpu_core_;
};

}  // namespace

AscendKeys AscendKeysOf(std::string_view cw) {
  return AscendKeys{
      .register_key = fmt::format("hami.io/node-register-{}", cw),
      .handshake_key = fmt::format("hami.io/node-handshake-{}", cw),
      .to_allocate = fmt::format("hami.io/{}-devices-to-allocate", cw),
      .allocated = fmt::format("hami.io/{}-devices-allocated", cw),
      .use_uuid = fmt::format("hami.io/use-{}-uuid", cw),
      .no_use_uuid = fmt::format("hami.io/no-use-{}-uuid", cw),
      .runtime_info = fmt::format("huawei.com/{}", cw),
  };
}

TrimmedMemory TrimAscendMemory(const AscendChipConfig& chip, int64_t memory) {
  for (const AscendTemplate& t : chip.templates) {
    if (memory <= t.memory) {
      return TrimmedMemory{t.memory, t.name};
    }
  }
  if (memory <= chip.memory_capacity) {
    return TrimmedMemory{chip.memory_allocatable, ""};
  }
  return TrimmedMemory{};
}

absl::StatusOr<AscendAdmission> AdmitAscendContainer(const AscendChipConfig& chip,
                                                     const kube::Container& container,
                                                     bool hami_core) {
  AscendAdmission out;
  // Only limits make a container ours here (the scheduler reads requests too).
  const kube::ShortString* count_text = Lookup(container, chip.resource_name, false);
  if (count_text == nullptr) {
    out.empty_visible_devices = chip.overwrite_env;
    return out;
  }
  TESSERA_ASSIGN_OR_RETURN(Quantity count, QuantityOf(chip.resource_name, count_text->view()));
  const int64_t asked = count.Value();
  if (chip.common_word == kAscend910C && chip.super_pod) {
    if (asked == 1) {
      out.count = 2;  // the smallest unit is one module: two NPUs
    } else if (asked % 2 != 0) {
      return absl::InvalidArgumentError(
          fmt::format("Ascend910C device request must be 1 or 2*n, got {}", asked));
    }
  }
  if (!hami_core && !chip.resource_core_name.empty()) {
    if (const kube::ShortString* core = Lookup(container, chip.resource_core_name);
        core != nullptr) {
      TESSERA_ASSIGN_OR_RETURN(Quantity cores, QuantityOf(chip.resource_core_name, core->view()));
      if (cores.Value() > 0) {
        return absl::InvalidArgumentError(fmt::format(
            "{} is only supported in hami-core (soft split) mode", chip.resource_core_name));
      }
    }
  }
  int64_t memory = chip.memory_allocatable;
  if (const kube::ShortString* mem = Lookup(container, chip.resource_memory_name, false);
      mem != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(Quantity q, QuantityOf(chip.resource_memory_name, mem->view()));
    if (hami_core) {
      memory = q.Value();
    } else {
      memory = TrimAscendMemory(chip, q.Value()).memory;
      if (memory <= 0) {
        return absl::InvalidArgumentError(
            fmt::format("{} {} is invalid", chip.resource_memory_name, q.Value()));
      }
    }
  }
  if (asked > 1 && !hami_core && memory != chip.memory_allocatable) {
    return absl::InvalidArgumentError("vNPU not supported for multiple devices");
  }
  out.found = true;
  out.memory = memory;
  return out;
}

absl::StatusOr<AscendPodAdmission> AdmitAscendPod(const AscendChipConfig& chip, kube::Pod* pod) {
  AscendPodAdmission out;
  const std::string* mode = pod->meta.annotations.Find(kVnpuModeAnnotation);
  const bool hami_core = mode != nullptr && *mode == kVnpuModeHamiCore;
  auto admit = [&](kube::Container& c) -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(AscendAdmission a, AdmitAscendContainer(chip, c, hami_core));
    const std::string who = fmt::format("container {}", QuoteForError(c.name));
    if (a.empty_visible_devices) {
      out.notes.push_back(fmt::format("{}: ASCEND_VISIBLE_DEVICES=\"\" added (overwriteEnv)", who));
    }
    if (!a.found) {
      return absl::OkStatus();
    }
    out.found = true;
    if (a.count.has_value()) {
      const std::string count = Quantity::FromInt64(*a.count).ToString();
      out.notes.push_back(fmt::format("{}: {} {} becomes {} (whole modules of two NPUs)", who,
                                      chip.resource_name, c.limits.Get(chip.resource_name), count));
      c.limits.Set(chip.resource_name, count);
      if (c.requests.Find(chip.resource_name) != nullptr) {
        c.requests.Set(chip.resource_name, count);
      }
    }
    const std::string memory = Quantity::FromInt64(a.memory).ToString();
    const kube::ShortString* asked = c.limits.Find(chip.resource_memory_name);
    const std::string why =
        hami_core ? "hami-core mode"
        : TrimAscendMemory(chip, a.memory).template_name.empty()
            ? "the whole card"
            : fmt::format("template {}", TrimAscendMemory(chip, a.memory).template_name);
    if (asked == nullptr) {
      out.notes.push_back(
          fmt::format("{}: {} set to {} ({})", who, chip.resource_memory_name, memory, why));
    } else if (asked->view() != memory) {
      out.notes.push_back(fmt::format("{}: {} {} becomes {} ({})", who, chip.resource_memory_name,
                                      asked->view(), memory, why));
    }
    c.limits.Set(chip.resource_memory_name, memory);
    c.requests.Set(chip.resource_memory_name, memory);
    return absl::OkStatus();
  };
  for (kube::Container& c : pod->init_containers) {
    TESSERA_RETURN_IF_ERROR(admit(c));
  }
  for (kube::Container& c : pod->containers) {
    TESSERA_RETURN_IF_ERROR(admit(c));
  }
  if (out.found && !chip.runtime_class_name.empty()) {
    out.notes.push_back(fmt::format("runtimeClassName {} unless the pod names one",
                                    QuoteForError(chip.runtime_class_name)));
  }
  return out;
}

absl::StatusOr<std::optional<ContainerRequest>> DeriveAscendRequest(
    const AscendChipConfig& chip, const kube::Container& container) {
  TESSERA_ASSIGN_OR_RETURN(std::optional<int64_t> count, IntegerOf(container, chip.resource_name));
  if (!count.has_value() || *count == 0) {
    return std::nullopt;
  }
  if (*count > kMaxInt32) {
    return ValueError(chip.resource_name, Lookup(container, chip.resource_name)->view(),
                      fmt::format("is too large: the maximum is {}", kMaxInt32));
  }
  ContainerRequest request;
  request.nums = static_cast<int32_t>(*count);
  request.type = chip.common_word;
  request.family = DeviceFamily::kAscend;

  TESSERA_ASSIGN_OR_RETURN(std::optional<int64_t> mem,
                           IntegerOf(container, chip.resource_memory_name));
  int64_t memory = mem.value_or(0);
  const int64_t factor = chip.memory_factor > 1 ? chip.memory_factor : 1;
  if (memory > kMaxInt32 / factor) {
    return ValueError(
        chip.resource_memory_name, Lookup(container, chip.resource_memory_name)->view(),
        fmt::format("is too large: the maximum is {}{}; the unit is MiB, not bytes (16Gi is "
                    "invalid, ask 16384 for 16 GiB)",
                    kMaxInt32 / factor,
                    factor > 1 ? fmt::format(" (2147483647 / memoryFactor {})", factor) : ""));
  }
  request.memreq = static_cast<int32_t>(memory * factor);
  // No memory: the whole card (HAMi's MemPercentagereq 100).
  request.mem_percentage = request.memreq == 0 ? 100 : kPercentageUnset;

  if (const kube::ShortString* core = Lookup(container, chip.resource_core_name); core != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(Quantity q, QuantityOf(chip.resource_core_name, core->view()));
    const int64_t cores = q.Value();  // rounded up, as HAMi reads it
    if (cores < 0) {
      return ValueError(chip.resource_core_name, core->view(), "is negative");
    }
    if (cores > kMaxInt32) {
      return ValueError(chip.resource_core_name, core->view(),
                        fmt::format("is too large: the maximum is {}", kMaxInt32));
    }
    request.coresreq = static_cast<int32_t>(cores);
  }
  return std::optional<ContainerRequest>(std::move(request));
}

std::string EncodeAscendRuntimeInfo(const AscendChipConfig& chip, const PodDevices& devices,
                                    bool hami_core) {
  std::string out;
  for (const ContainerDevices& container : devices) {
    for (const ContainerDevice& d : container) {
      out += out.empty() ? "[{" : ",{";
      bool first = true;
      auto key = [&](std::string_view k) {
        out += first ? "\"" : ",\"";
        first = false;
        out += k;
        out += "\":";
      };
      if (!d.uuid.empty()) {
        key("UUID");
        json::AppendGoString(&out, d.uuid);
      }
      if (!hami_core) {
        std::string name = TrimAscendMemory(chip, d.usedmem).template_name;
        if (!name.empty()) {
          key("temp");
          json::AppendGoString(&out, name);
        }
      }
      if (d.usedmem != 0) {
        key("memory");
        out += std::to_string(d.usedmem);
      }
      if (d.usedcores != 0) {
        key("core");
        out += std::to_string(d.usedcores);
      }
      out += '}';
    }
  }
  return out.empty() ? "null" : out + "]";
}

float AscendNetworkScore(std::string_view common_word, const PodDevices& devices,
                         const NodeDevices& node) {
  if (!common_word.starts_with(kAscend910Prefix)) {
    return 0;
  }
  float score = 0;
  std::vector<std::pair<int64_t, int32_t>> groups;  // NetworkID, devices on it
  for (const ContainerDevices& container : devices) {
    groups.clear();
    int32_t total = 0;
    for (const ContainerDevice& d : container) {
      if (d.type != common_word) {
        continue;
      }
      const int at = node.Find(d.uuid);
      if (at < 0 || node.devices[static_cast<size_t>(at)].network_key == NetworkKey::kNone) {
        return 0;
      }
      const DeviceInfo& info = node.devices[static_cast<size_t>(at)];
      if (info.network_key != NetworkKey::kNumber) {
        continue;  // present but not a number: counted nowhere
      }
      ++total;
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.first == info.network_id; });
      if (it == groups.end()) {
        groups.emplace_back(info.network_id, 1);
      } else {
        ++it->second;
      }
    }
    if (total == 0) {
      continue;
    }
    int32_t largest = 0;
    for (const auto& g : groups) {
      largest = std::max(largest, g.second);
    }
    score += static_cast<float>(largest) / static_cast<float>(total);
  }
  return score * static_cast<float>(kAscend910NetworkWeight);
}

std::unique_ptr<Vendor> NewAscendVendor(AscendChipConfig chip, bool hami_vnpu_core) {
  return std::make_unique<AscendVendor>(std::move(chip), hami_vnpu_core);
}

}  // namespace tessera::device
