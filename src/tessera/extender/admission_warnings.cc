#include "tessera/extender/admission_warnings.h"

#include <string_view>

#include "absl/status/statusor.h"
#include "fmt/format.h"

#include "tessera/device/codec.h"
#include "tessera/device/quantity.h"

namespace tessera::extender {
namespace {

void Add(std::string text, std::vector<std::string>* out) {
  if (out->size() >= kMaxAdmissionWarnings) {
    return;
  }
  if (text.size() > kMaxAdmissionWarningBytes) {
    text.resize(kMaxAdmissionWarningBytes - 3);
    text += "...";
  }
  out->push_back(std::move(text));
}

bool Gives(const kube::Container& c, std::string_view resource) {
  return c.limits.Contains(resource) || c.requests.Contains(resource);
}

void WarnAboutContainer(const kube::Container& c, std::string_view kind,
                        const device::NvidiaConfig& config, std::vector<std::string>* out) {
  if (config.default_memory != 0 || !Gives(c, config.resource_count_name) ||
      Gives(c, config.resource_memory_name) || Gives(c, config.resource_memory_percentage_name)) {
    return;
  }
  const kube::ShortString* count = c.limits.Find(config.resource_count_name);
  if (count == nullptr) {
    count = c.requests.Find(config.resource_count_name);
  }
  Add(fmt::format("{} {} asks for {}: {} without {} or {}: each of its GPUs is booked whole, not "
                  "shared (the device config's defaultMemory is 0); give {} to share a GPU",
                  kind, device::QuoteForError(c.name), config.resource_count_name, count->view(),
                  config.resource_memory_name, config.resource_memory_percentage_name,
                  config.resource_memory_name),
      out);
}

}  // namespace

std::vector<std::string> AdmissionWarnings(const kube::Pod& pod,
                                           const device::NvidiaConfig& config) {
  std::vector<std::string> out;
  for (const std::string* resource :
       {&config.resource_count_name, &config.resource_memory_name,
        &config.resource_memory_percentage_name, &config.resource_core_name}) {
    if (pod.meta.annotations.Contains(*resource)) {
      Add(fmt::format("annotation {} is not read by the scheduler or the device plugin: give it "
                      "in the containers' resources.limits",
                      *resource),
          &out);
    }
  }
  for (const kube::Container& c : pod.init_containers) {
    WarnAboutContainer(c, "init container", config, &out);
  }
  for (const kube::Container& c : pod.containers) {
    WarnAboutContainer(c, "container", config, &out);
  }
  absl::StatusOr<device::PodConstraints> constraints =
      device::ParsePodConstraints(pod.meta.annotations);
  if (!constraints.ok()) {
    Add(fmt::format("the scheduler will refuse this pod: {}",
                    std::string(constraints.status().message())),
        &out);
  }
  return out;
}

}  // namespace tessera::extender
