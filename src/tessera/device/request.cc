#include "tessera/device/request.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "fmt/format.h"

#include "tessera/base/status_macros.h"
#include "tessera/device/quantity.h"

namespace tessera::device {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// limits[name], else requests[name]; nullptr when neither has it.
const kube::ShortString* Lookup(const kube::Container& container, const std::string& name) {
  const kube::ShortString* value = container.limits.Find(name);
  return value != nullptr ? value : container.requests.Find(name);
}

absl::Status ValueError(const std::string& name, std::string_view value, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("{}: {} {}", name, QuoteForError(value), what));
}

// The integer value of resource `name`, or nullopt when the container does not give it.
absl::StatusOr<std::optional<int64_t>> IntegerResource(const kube::Container& container,
                                                       const std::string& name) {
  const kube::ShortString* text = Lookup(container, name);
  if (text == nullptr) {
    return std::nullopt;
  }
  absl::StatusOr<Quantity> q = ParseQuantity(*text);
  if (!q.ok()) {
    // Out-of-range quantities are invalid requests too: one code for every bad value.
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", name, std::string(q.status().message())));
  }
  absl::StatusOr<int64_t> v = q->AsInt64();
  if (!v.ok()) {
    return ValueError(name, *text, "is not an integer");
  }
  return std::optional<int64_t>(*v);
}

// As IntegerResource, additionally requiring 0 <= value <= `max`.
absl::StatusOr<std::optional<int64_t>> BoundedResource(const kube::Container& container,
                                                       const std::string& name, int64_t max,
                                                       std::string_view max_reason) {
  TESSERA_ASSIGN_OR_RETURN(std::optional<int64_t> v, IntegerResource(container, name));
  if (v.has_value() && *v < 0) {
    return ValueError(name, *Lookup(container, name), "is negative");
  }
  if (v.has_value() && *v > max) {
    return ValueError(name, *Lookup(container, name),
                      fmt::format("is too large: the maximum is {}{}", max, max_reason));
  }
  return v;
}

}  // namespace

absl::StatusOr<std::optional<ContainerRequest>> DeriveContainerRequest(
    const kube::Container& container, const NvidiaConfig& config) {
  TESSERA_ASSIGN_OR_RETURN(std::optional<int64_t> count,
                           BoundedResource(container, config.resource_count_name, kMaxInt32, ""));
  if (!count.has_value() || *count == 0) {
    return std::nullopt;
  }
  ContainerRequest request;
  request.nums = static_cast<int32_t>(*count);
  request.type = std::string(kNvidiaVendor);

  int64_t factor = config.memory_factor > 1 ? config.memory_factor : 1;
  TESSERA_ASSIGN_OR_RETURN(
      std::optional<int64_t> mem,
      BoundedResource(container, config.resource_memory_name, kMaxInt32 / factor,
                      factor > 1 ? fmt::format(" (2147483647 / memoryFactor {})", factor) : ""));
  request.memreq = static_cast<int32_t>(mem.value_or(0) * factor);

  TESSERA_ASSIGN_OR_RETURN(std::optional<int64_t> pct,
                           IntegerResource(container, config.resource_memory_percentage_name));
  request.mem_percentage = kPercentageUnset;
  if (pct.has_value() && *pct > 0) {
    request.mem_percentage = *pct > 100 ? 100 : static_cast<int32_t>(*pct);
  }
  if (request.mem_percentage == kPercentageUnset && request.memreq == 0) {
    if (config.default_memory != 0) {
      request.memreq = config.default_memory;
    } else {
      request.mem_percentage = 100;
    }
  }

  TESSERA_ASSIGN_OR_RETURN(std::optional<int64_t> cores,
                           BoundedResource(container, config.resource_core_name, kMaxInt32, ""));
  request.coresreq = cores.has_value() ? static_cast<int32_t>(*cores) : config.default_cores;
  return std::optional<ContainerRequest>(std::move(request));
}

absl::StatusOr<PodRequest> DerivePodRequestWith(const kube::Pod& pod, ContainerRule rule) {
  PodRequest out;
  out.containers.reserve(pod.init_containers.size() + pod.containers.size());
  out.init_count = pod.init_containers.size();
  auto derive = [&](const kube::Container& container, std::string_view kind) -> absl::Status {
    absl::StatusOr<std::optional<ContainerRequest>> request = rule(container);
    if (!request.ok()) {
      return Annotate(request.status(),
                      fmt::format("pod {}: {} {}", pod.Key(), kind, QuoteForError(container.name)));
    }
    out.containers.push_back(*std::move(request));
    return absl::OkStatus();
  };
  for (const kube::Container& c : pod.init_containers) {
    TESSERA_RETURN_IF_ERROR(derive(c, "init container"));
  }
  for (const kube::Container& c : pod.containers) {
    TESSERA_RETURN_IF_ERROR(derive(c, "container"));
  }
  return out;
}

absl::StatusOr<PodRequest> DerivePodRequest(const kube::Pod& pod, const NvidiaConfig& config) {
  return DerivePodRequestWith(
      pod, [&config](const kube::Container& c) { return DeriveContainerRequest(c, config); });
}

}  // namespace tessera::device
