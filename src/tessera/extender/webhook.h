// File: tessera/extender/webhook.h
//
// The mutating admission webhook HAMi's scheduler serves on POST /webhook (docs/hami-protocol.md
// §6.3, docs/hami-device-plugin.md §7): pure logic, bytes in and bytes out. The HTTP server
// (http_server.h) routes the request here; kube-apiserver calls it for every pod CREATE through
// the MutatingWebhookConfiguration in deploy/base.
//
//   WebhookOptions options;  options.scheduler_name = "hami-scheduler";
//   WebhookReply reply = HandleAdmissionReview("application/json", body, options);
//   // reply.http_status, reply.body (an AdmissionReview, application/json)
//
// Transport (controller-runtime's, docs/hami-device-plugin.md §7.2):
//   - the body must be a non-empty AdmissionReview, apiVersion admission.k8s.io/v1 or
//     admission.k8s.io/v1beta1, with request.uid a string and request.object a JSON object, and
//     the Content-Type application/json (parameters such as "; charset=utf-8" are allowed).
//     Otherwise: HTTP 400 with an AdmissionReview whose response is allowed:false,
//     status.code 400 and a message saying what is wrong (and the request's uid when it could be
//     read). kube-apiserver counts such a reply as a failed call, so the failurePolicy applies.
//   - Otherwise: HTTP 200, the reply echoes the request's apiVersion and kind,
//     response.uid == request.uid, response.status.code is 200 (allowed), 403 (denied, reason
//     Forbidden) or 500 (errored), and a mutation is a base64 JSON Patch with
//     patchType "JSONPatch" (no patch and no patchType when nothing changes).
//
// Decision (HAMi HEAD's Handle and NVIDIA MutateAdmission, §7.3), for a Pod CREATE:
//   1. No app containers → denied "pod has no containers".
//   1a. metadata.annotations has a scheduler-owned key (present with any value, even empty) →
//      denied "annotation <key> is written by the scheduler and cannot be set when creating a
//      pod" (HAMi PR #3042). The keys, in the order checked: hami.io/vgpu-node,
//      hami.io/bind-time, hami.io/bind-phase, hami.io/vgpu-devices-to-allocate,
//      hami.io/vgpu-devices-allocated. This runs before step 2, so it applies to pods naming any
//      scheduler and to pods that ask for no device: such annotations would otherwise be read
//      as an allocation nobody made.
//   2. spec.schedulerName set, not ours and not "default-scheduler" (or "default-scheduler" with
//      force_overwrite_default_scheduler false) → allowed, unchanged, with the message
//      "pod already has different scheduler assigned".
//   3. Every container, init containers first, then app containers (paths
//      /spec/initContainers/<i>/... and /spec/containers/<i>/...), looking at resources.limits
//      only (the API server requires limits for extended resources):
//      - gpumem-percentage that is not an integer in 0..100 → errored 500 "invalid
//        nvidia.com/gpumem-percentage value <v> in container <c>: must be an integer between 0
//        and 100";
//      - a privileged container (securityContext.privileged) is not mutated; it still counts
//        for "the pod asks for a managed resource" (below);
//      - limits[priority] → env CUDA_TASK_PRIORITY=<integer> appended;
//      - gpuCorePolicy force|disable → env GPU_CORE_UTILIZATION_POLICY=<policy> appended;
//      - the container asks for a device when limits[count] is present, or when it gives
//        gpucores, gpumem or gpumem-percentage and defaultGPUNum > 0: then
//        limits[count] = "<defaultGPUNum>" is added;
//      - exclusive cores: when it asks for a device, gives no gpucores and its request as
//        request.h derives it books the whole memory of each device (percentage 100: no gpumem
//        and no percentage with defaultMemory 0, or percentage 100) → limits[gpucores] = "100";
//      - a container that asks for no device gets NVIDIA_VISIBLE_DEVICES=none when overwriteEnv;
//      - runtimeClassName from the device config is set when a container asks for a device and
//        spec.runtimeClassName is unset.
//   4. Some container privileged and the pod asks for a device → denied
//      "container <name> is privileged".
//   5. The pod asks for a device and scheduler_name is non-empty: spec.nodeName set → denied
//      "pod has node assigned"; else spec.schedulerName := scheduler_name.
// Other operations (UPDATE, DELETE, CONNECT) and other resources are allowed unchanged: the
// configuration registers CREATE of pods only. Not implemented: HAMi HEAD's quota pre-check
// (Tessera has no quota).
//
// Env additions follow the JSON Patch HAMi's diff produces: "add /.../env/<n>" when the
// container has an env list, else "add /.../env" with a one-element list.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/device/device_config.h"

namespace tessera::extender {

struct WebhookOptions {
  // --scheduler-name: written into spec.schedulerName. Empty: never set (nor refuse a bound pod),
  // as HAMi behaves without the flag.
  std::string scheduler_name = "hami-scheduler";
  // --force-overwrite-default-scheduler (HAMi HEAD, default true): also take pods that carry
  // the API server's default "default-scheduler".
  bool force_overwrite_default_scheduler = true;
  // The device config's nvidia section (resource names, defaultGPUNum, overwriteEnv, ...).
  device::NvidiaConfig nvidia = device::DefaultNvidiaConfig();
};

inline constexpr std::string_view kAdmissionV1 = "admission.k8s.io/v1";
inline constexpr std::string_view kAdmissionV1Beta1 = "admission.k8s.io/v1beta1";

// The parts of an AdmissionReview request the webhook reads.
struct AdmissionRequest {
  std::string api_version;  // kAdmissionV1 or kAdmissionV1Beta1, echoed in the reply
  std::string uid;
  std::string kind;          // request.kind.kind, e.g. "Pod"; empty when absent
  std::string resource;      // request.resource.resource, e.g. "pods"; empty when absent
  std::string sub_resource;  // request.subResource
  std::string operation;     // CREATE, UPDATE, DELETE, CONNECT
  std::string ns;            // request.namespace
  std::string name;          // request.name (often empty for CREATE with generateName)
  std::string object_json;   // request.object as compact JSON; empty when absent (DELETE)
};

// Decodes an AdmissionReview. InvalidArgument naming the problem ("not JSON: ...",
// "apiVersion: want admission.k8s.io/v1 or admission.k8s.io/v1beta1, got \"v1\"",
// "request.uid: missing", "request.object: expected an object", nesting deeper than 512, ...).
absl::StatusOr<AdmissionRequest> DecodeAdmissionReview(std::string_view body);

// One JSON Patch operation ("add" or "replace"); `path` is an RFC 6901 pointer, `value_json`
// the value as JSON text.
struct PatchOp {
  std::string op;
  std::string path;
  std::string value_json;

  friend bool operator==(const PatchOp&, const PatchOp&) = default;
};

struct AdmissionResponse {
  bool allowed = true;
  int32_t code = 200;          // response.status.code
  std::string reason;          // response.status.reason ("Forbidden" when denied)
  std::string message;         // response.status.message
  std::vector<PatchOp> patch;  // empty: no mutation
};

// The decision for one request (steps 1-5 above).
AdmissionResponse ReviewPod(const AdmissionRequest& request, const WebhookOptions& options);

// The JSON Patch document of `ops` (a JSON array).
std::string EncodePatch(const std::vector<PatchOp>& ops);

// The AdmissionReview reply: {"apiVersion":<api_version>,"kind":"AdmissionReview","response":{
// "uid":..,"allowed":..,"status":{"code":..,...},"patchType":"JSONPatch","patch":<base64>}}.
std::string EncodeAdmissionReview(std::string_view api_version, std::string_view uid,
                                  const AdmissionResponse& response);

struct WebhookReply {
  int http_status = 200;
  std::string body;  // always an AdmissionReview, application/json
};

// Decode, review, encode; see the file comment for the status codes.
WebhookReply HandleAdmissionReview(std::string_view content_type, std::string_view body,
                                   const WebhookOptions& options);

}  // namespace tessera::extender
