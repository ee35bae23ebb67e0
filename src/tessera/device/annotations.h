// File: tessera/device/annotations.h
//
// The annotation and label keys of the HAMi wire protocol that the NVIDIA vendor reads or
// writes, and the fixed values some of them take. The value encodings are documented in
// tessera/device/codec.h and docs/wire-formats.md.
//
// Thread safety: constants only.
#pragma once

#include <string_view>

namespace tessera::device {

// ---- Node annotations ----------------------------------------------------------------------

// The device registration written by the NVIDIA device plugin (delimited before v2.8, a JSON
// array since). Tessera only reads it.
inline constexpr std::string_view kNodeRegisterAnnotation = "hami.io/node-nvidia-register";
// The liveness handshake of the NVIDIA vendor: "Requesting_…", "Deleted_…", "Reported …".
inline constexpr std::string_view kNodeHandshakeAnnotation = "hami.io/node-handshake";
// The node lock "<RFC3339>,<pod namespace>,<pod name>" (legacy: "<RFC3339>").
inline constexpr std::string_view kNodeLockAnnotation = "hami.io/mutex.lock";
// Operator-set comma list of GPU UUIDs that get no new allocations (HAMi v2.10).
inline constexpr std::string_view kDeviceCordonAnnotation = "hami.io/device-cordon";
// The GPU pair scores written with ENABLE_TOPOLOGY_SCORE, read by the topology-aware GPU policy
// (device/node_scores.h).
inline constexpr std::string_view kNodeScoreAnnotation = "hami.io/node-nvidia-score";

// ---- Pod annotations and labels written by the scheduler -----------------------------------

// The node chosen at filter time. Written both as an annotation and as a label.
inline constexpr std::string_view kVgpuNodeAnnotation = "hami.io/vgpu-node";
inline constexpr std::string_view kVgpuNodeLabel = "hami.io/vgpu-node";
// Unix seconds (decimal) of the filter decision.
inline constexpr std::string_view kVgpuTimeAnnotation = "hami.io/vgpu-time";
// The allocation, consumed container by container by the device plugin.
inline constexpr std::string_view kDevicesToAllocateAnnotation = "hami.io/vgpu-devices-to-allocate";
// The same allocation, never modified by the plugin: the ledger's source of truth.
inline constexpr std::string_view kDevicesAllocatedAnnotation = "hami.io/vgpu-devices-allocated";
// Bind progress: the scheduler writes "allocating", the plugin "success" or "failed".
inline constexpr std::string_view kBindPhaseAnnotation = "hami.io/bind-phase";
// Unix seconds (decimal) of the bind.
inline constexpr std::string_view kBindTimeAnnotation = "hami.io/bind-time";

inline constexpr std::string_view kBindPhaseAllocating = "allocating";
inline constexpr std::string_view kBindPhaseSuccess = "success";
inline constexpr std::string_view kBindPhaseFailed = "failed";

// ---- Pod annotations owned by Tessera (not part of HAMi's protocol) -----------------------

// The verdict on a pod /filter left without a node: a JSON document of at most 1 KiB
// (extender/verdict.h, docs/explain.md "tessera why"). Removed by the filter that finds a node.
inline constexpr std::string_view kVerdictAnnotation = "tessera.io/verdict";
// When Tessera last put a pod it had refused back into kube-scheduler's queue because capacity
// it fits in freed (RFC 3339, UTC, microseconds; extender/requeue.h, docs/requeue.md). Only the
// change matters: any update of a pending pod requeues it.
inline constexpr std::string_view kRequeueAnnotation = "tessera.io/requeue";

// ---- Pod annotations set by users (read by the scheduler) ----------------------------------

// Comma list; a device passes when any token is a case-insensitive substring of its type.
inline constexpr std::string_view kUseGpuTypeAnnotation = "nvidia.com/use-gputype";
// Comma list; a device is rejected when any token is a case-insensitive substring of its type.
inline constexpr std::string_view kNoUseGpuTypeAnnotation = "nvidia.com/nouse-gputype";
// Comma list of UUIDs; only these devices may be used.
inline constexpr std::string_view kUseGpuUuidAnnotation = "nvidia.com/use-gpuuuid";
// Comma list of UUIDs that must not be used.
inline constexpr std::string_view kNoUseGpuUuidAnnotation = "nvidia.com/nouse-gpuuuid";
// A device passes when this value contains the device's mode ("hami-core", "mig", "mps").
inline constexpr std::string_view kVgpuModeAnnotation = "nvidia.com/vgpu-mode";
// Go ParseBool; true = all GPUs of one container on one NUMA node.
inline constexpr std::string_view kNumaBindAnnotation = "nvidia.com/numa-bind";
// "best-effort" or "strict" (HAMi after v2.10, PR #2731): what the device plugin does when
// kubelet's Topology Manager leaves no replica of a card the scheduler picked (asks POST /refit,
// extender/refit.h). Validated by the webhook (ParseNumaAlignment).
inline constexpr std::string_view kNumaAlignmentAnnotation = "hami.io/numa-alignment";
// "binpack" or "spread": overrides the node scheduling policy for this pod.
inline constexpr std::string_view kNodeSchedulerPolicyAnnotation = "hami.io/node-scheduler-policy";
// A GPU policy chain such as "binpack", "spread", "binpack,numa", "mutex".
inline constexpr std::string_view kGpuSchedulerPolicyAnnotation = "hami.io/gpu-scheduler-policy";

}  // namespace tessera::device
