#include "tessera/device/other_vendors.h"

#include <array>
#include <string>
#include <utility>

#include <fmt/core.h>

#include "tessera/device/quantity.h"

namespace tessera::device {
namespace {

// Resource-name prefix -> vendor. Source: the managedResources of HAMi's chart
// (charts/hami/templates/scheduler/configmap.yaml) and the defaults of its scheduler's vendor
// flags, v2.5.2 and v2.10.0.
constexpr std::array<std::pair<std::string_view, std::string_view>, 12> kOtherVendors = {{
    {"cambricon.com/", "Cambricon MLU"},
    {"hygon.com/", "Hygon DCU"},
    {"metax-tech.com/", "MetaX GPU"},
    {"mthreads.com/", "Moore Threads GPU"},
    {"enflame.com/", "Enflame GCU"},
    {"kunlunxin.com/", "Kunlunxin XPU"},
    {"aws.amazon.com/neuron", "AWS Neuron"},
    {"vastaitech.com/", "Vastai"},
    {"birentech.com/", "Biren GPU"},
    {"amd.com/gpu", "AMD GPU"},
    {"huawei.com/Ascend", "Huawei Ascend"},
    {"iluvatar.ai/", "Iluvatar GPU"},
}};

bool IsNvidiaName(std::string_view resource, const NvidiaConfig& c) {
  for (const std::string* name :
       {&c.resource_count_name, &c.resource_memory_name, &c.resource_memory_percentage_name,
        &c.resource_core_name, &c.resource_priority_name}) {
    if (resource == *name) {
      return true;
    }
  }
  return false;
}

absl::Status Check(const kube::Pod& pod, const kube::Container& container, std::string_view kind,
                   const NvidiaConfig& config) {
  for (const kube::ResourceList* list : {&container.limits, &container.requests}) {
    for (const auto& [resource, quantity] : *list) {
      std::optional<std::string_view> vendor = OtherVendorOf(resource);
      if (vendor.has_value() && !IsNvidiaName(resource, config)) {
        return absl::UnimplementedError(fmt::format(
            "pod {}: {} {} asks for {}: {} devices are not supported by Tessera (NVIDIA only); "
            "schedule this pod with HAMi or the vendor's own scheduler",
            pod.Key(), kind, QuoteForError(container.name), resource, *vendor));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<std::string_view> OtherVendorOf(std::string_view resource) {
  for (const auto& [prefix, vendor] : kOtherVendors) {
    if (resource.starts_with(prefix)) {
      return vendor;
    }
  }
  return std::nullopt;
}

absl::Status RefuseOtherVendors(const kube::Pod& pod, const NvidiaConfig& config) {
  for (const kube::Container& c : pod.init_containers) {
    if (absl::Status s = Check(pod, c, "init container", config); !s.ok()) {
      return s;
    }
  }
  for (const kube::Container& c : pod.containers) {
    if (absl::Status s = Check(pod, c, "container", config); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::device
