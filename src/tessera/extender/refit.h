// File: tessera/extender/refit.h
//
// The NUMA refit's wire format and text rules (HAMi after v2.10, PR #2731): HAMi's NVIDIA device
// plugin POSTs a RefitRequest to /refit when kubelet's Topology Manager left it no replica of a
// card the scheduler annotated; the scheduler re-fits that one container onto the cards kubelet
// allows and answers a RefitResponse (always HTTP 200; a refusal is `failureReason`). The
// decision itself is Scheduler::Refit (scheduler.h, in refit_scheduler.cc); the rules, failure
// strings and the JSON shapes: docs/serve.md "NUMA refit", docs/wire-formats.md.
//
//   absl::StatusOr<RefitRequest> req = DecodeRefitRequest(body);  // untrusted bytes
//   RefitResponse resp = scheduler.Refit(*req);
//   std::string reply = EncodeRefitResponse(resp);
//
// Errors: DecodeRefitRequest returns InvalidArgument naming the field; the other functions say
// theirs. Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/device/model.h"

namespace tessera::extender {

// A request may name at most this many allowed devices (HAMi's maxAllowedDeviceUUIDs).
inline constexpr size_t kMaxRefitAllowedDevices = 512;
// Event reasons of the refit's outcome on the pod (HAMi's EventReasonNumaRefit*).
inline constexpr std::string_view kNumaRefitSucceedReason = "NumaRefitSucceed";
inline constexpr std::string_view kNumaRefitFailedReason = "NumaRefitFailed";

// HAMi's NumaRefitRequest (pkg/device/numa_refit.go).
struct RefitRequest {
  std::string pod_uid;        // podUID
  std::string pod_namespace;  // podNamespace
  std::string pod_name;       // podName
  std::string node_name;      // nodeName
  // containerIndex: the container's position, init containers first (the allocation
  // annotations' entry index).
  int64_t container_index = 0;
  std::string container_name;  // containerName; optional (empty: not cross-checked)
  std::string device_type;     // deviceType, "NVIDIA"
  // allowedDeviceUUIDs: physical card UUIDs kubelet can still satisfy the container from.
  std::vector<std::string> allowed_device_uuids;

  friend bool operator==(const RefitRequest&, const RefitRequest&) = default;
};

// HAMi's NumaRefitResponse.
struct RefitResponse {
  bool succeeded = false;
  // On success: the container's devices, "UUID,Type,MiB,cores:" each (EncodeContainerDevices).
  std::string container_devices;
  std::string failure_reason;  // on failure
};

// Decodes a /refit body as Go's encoding/json decodes HAMi's request, but strictly: one JSON
// object (whitespace around it; nothing after it), nesting at most 64 deep; keys matched
// ASCII-case-insensitively (json::KeyEqualsFold), a repeated key read again (the last wins),
// unknown keys ignored, null read as the zero value; in one pass, linear in the body (/refit is
// unauthenticated: any number of keys may come); the string fields must be strings, containerIndex
// an integer in int64 range, allowedDeviceUUIDs an array of strings (its length is checked by
// Scheduler::Refit, which answers HAMi's limit message). InvalidArgument otherwise, e.g. `refit
// request: podUID: expected a string`.
absl::StatusOr<RefitRequest> DecodeRefitRequest(std::string_view body);

// What one DecodeRefitRequest did, for the test that holds it to linear work without timing it.
struct RefitDecodeStats {
  size_t keys = 0;  // object keys read at the top level
  // Comparisons of a key with a request field's name (at most kRefitFields per key).
  size_t key_comparisons = 0;
  // The most keys held at once to match later keys against: a decoder that builds the object
  // (nlohmann's ordered_map) holds every key and searches them for each new one, quadratic.
  size_t max_keys_held = 0;
};
inline constexpr size_t kRefitFields = 8;
// DecodeRefitRequest, counting its work in `*stats`.
absl::StatusOr<RefitRequest> DecodeRefitRequest(std::string_view body, RefitDecodeStats* stats);
// The request as HAMi's plugin marshals it (containerName omitted when empty); for tests and the
// fuzz target's round trip.
std::string EncodeRefitRequest(const RefitRequest& request);
// {"succeeded":<bool>[,"containerDevices":"…"][,"failureReason":"…"]}: Go's encoding/json with
// omitempty on both strings, strings escaped as Go writes them.
std::string EncodeRefitResponse(const RefitResponse& response);

// One container's devices as HAMi's EncodeContainerDevices writes them: "UUID,Type,MiB,cores:"
// per device, no trailing ';' (EncodePodDevices of one container, less its terminator).
std::string EncodeContainerDevices(const device::ContainerDevices& devices);
// The UUIDs as Go's %s formats a []string: "[GPU-a GPU-b]" (the refit event's text).
std::string DeviceIdList(const device::ContainerDevices& devices);

// `annotation` (an allocation annotation's raw value) with its `index`th ';'-separated segment
// replaced by EncodeContainerDevices(devices); every other byte is kept as it is. InvalidArgument
// `annotation has no container entry at index <i>` when the segment does not exist or is empty
// (the plugin consumed it).
absl::StatusOr<std::string> ReplaceContainerEntry(std::string_view annotation, int64_t index,
                                                  const device::ContainerDevices& devices);

}  // namespace tessera::extender
