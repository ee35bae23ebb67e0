// File: tessera/extender/webhook.h
//
// The mutating admission webhook HAMi's scheduler serves on POST /webhook (docs/hami-protocol.md
// §6.3, docs/hami-device-plugin.md §7): pure logic, bytes in and bytes out. kube-apiserver calls
// it for every pod CREATE, and for a pod UPDATE that touches a scheduler-owned annotation
// (deploy/base); http_server.h routes the request here.
//
//   WebhookReply reply = HandleAdmissionReview("application/json", body, options);
//   // reply.http_status, reply.body (an AdmissionReview, application/json)
//
// Errors: a malformed review or content type → HTTP 400 with an errored AdmissionReview; otherwise
// HTTP 200 with status.code 200 (allowed, maybe a JSON Patch), 403 (denied: no containers,
// scheduler-owned annotations, a bad hami.io/numa-alignment on a pod of ours, privileged GPU
// container, node already assigned; on UPDATE, a scheduler-owned annotation changed by someone
// else than the scheduler or, for the keys it writes, HAMi's device plugin) or 500 (a bad
// gpumem-percentage). Every rule, in order: docs/serve.md "The admission webhook".
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/device/device_config.h"

namespace tessera::extender {

// The pod annotations only the scheduler writes (its filter, bind and verdict patches), which the
// ledger, the audit and the device plugin read as a pod's allocation, in the order they are
// checked: a CREATE that carries any of them is denied, and so is an UPDATE that adds, changes
// or removes one unless the requester is the scheduler itself or, for DevicePluginAnnotations()
// only, a trusted writer; members of system:masters, whom authorization never stops, pass too.
// deploy/ registers UPDATE for exactly these keys (webhook_test checks).
std::span<const std::string_view> SchedulerOwnedAnnotations();
// Of those, the keys HAMi's device plugin rewrites at Allocate: hami.io/bind-phase (success or
// failed), hami.io/vgpu-devices-to-allocate (consumed entry by entry) and
// hami.io/vgpu-mig-allocations (the MIG instance's runtime identity).
std::span<const std::string_view> DevicePluginAnnotations();

// The user HAMi's chart runs its device plugin as (ServiceAccount <release>-device-plugin, release
// hami in kube-system as HAMi's installation guide has it): the default trusted writer.
inline constexpr std::string_view kHamiDevicePluginUsername =
    "system:serviceaccount:kube-system:hami-device-plugin";

struct WebhookOptions {
  // --scheduler-name: written into spec.schedulerName. Empty: never set (nor refuse a bound pod),
  // as HAMi behaves without the flag.
  std::string scheduler_name = "hami-scheduler";
  // --force-overwrite-default-scheduler (HAMi HEAD, default true): also take pods that carry
  // the API server's default "default-scheduler".
  bool force_overwrite_default_scheduler = true;
  // The device config's nvidia section (resource names, defaultGPUNum, overwriteEnv, ...).
  device::NvidiaConfig nvidia = device::DefaultNvidiaConfig();
  // --self-username: the user the API server reports for this scheduler's own writes; it may
  // change every scheduler-owned annotation. Empty: nobody is the scheduler.
  std::string self_username;
  // --trusted-annotation-writers: users that may change DevicePluginAnnotations() on UPDATE.
  std::vector<std::string> trusted_annotation_writers = {std::string(kHamiDevicePluginUsername)};
};

inline constexpr std::string_view kAdmissionV1 = "admission.k8s.io/v1";
inline constexpr std::string_view kAdmissionV1Beta1 = "admission.k8s.io/v1beta1";

// The parts of an AdmissionReview request the webhook reads.
struct AdmissionRequest {
  std::string api_version;  // kAdmissionV1 or kAdmissionV1Beta1, echoed in the reply
  std::string uid;
  std::string kind;                 // request.kind.kind, e.g. "Pod"; empty when absent
  std::string resource;             // request.resource.resource, e.g. "pods"; empty when absent
  std::string sub_resource;         // request.subResource
  std::string operation;            // CREATE, UPDATE, DELETE, CONNECT
  std::string ns;                   // request.namespace
  std::string name;                 // request.name (often empty for CREATE with generateName)
  std::string object_json;          // request.object as compact JSON; empty when absent (DELETE)
  std::string old_object_json;      // request.oldObject as compact JSON (UPDATE); empty when absent
  std::string username;             // request.userInfo.username; empty when absent
  std::vector<std::string> groups;  // request.userInfo.groups
};

// Decodes an AdmissionReview. InvalidArgument naming the problem ("not JSON: ...",
// "apiVersion: want admission.k8s.io/v1 or admission.k8s.io/v1beta1, got \"v1\"",
// "request.uid: missing", "request.object: expected an object", "request.oldObject: missing" on
// an UPDATE, "request.userInfo.groups: expected an array of strings", nesting deeper than 512,
// ...).
absl::StatusOr<AdmissionRequest> DecodeAdmissionReview(std::string_view body);

// The user name a service-account token authenticates as: the `sub` claim of the JWT
// ("system:serviceaccount:<namespace>:<name>"), the default of --self-username in a pod. The
// signature is not checked (the token is this pod's own, read from its mounted file).
// InvalidArgument when the token is not a JWT or its subject is not a service account.
absl::StatusOr<std::string> ServiceAccountUsername(std::string_view token);

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
  // response.warnings (admission_warnings.h), for the pods the webhook takes.
  std::vector<std::string> warnings;
};

// The decision for one request (docs/serve.md "The admission webhook").
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
