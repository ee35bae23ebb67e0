// Any bytes give a reply that is an AdmissionReview (HTTP 200 or 400), never a crash; a review
// that decodes gets a 200 whose uid is the request's and whose patch, when there is one, is a
// JSON array of add/replace operations; an UPDATE is never mutated, and one by a user that is
// neither the scheduler nor a superuser is allowed only when no scheduler-owned annotation
// differs between oldObject and object; warnings only on an allowed review, bounded in number
// and size. The same bytes as a service-account token give a subject or an error with a
// message, never a crash.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/strings/escaping.h"
#include <nlohmann/json.hpp>

#include "tessera/extender/admission_warnings.h"
#include "tessera/extender/webhook.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::json;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  tessera::extender::WebhookOptions options;
  if (size > 0 && (data[0] & 1) != 0) {
    options.nvidia.overwrite_env = true;
    options.nvidia.gpu_core_policy = tessera::device::GpuCorePolicy::kDisable;
    options.nvidia.runtime_class_name = "nvidia";
  }
  options.self_username = "system:serviceaccount:tessera-system:tessera";
  options.trusted_annotation_writers = {"plugin"};
  if (absl::StatusOr<std::string> user = tessera::extender::ServiceAccountUsername(body);
      user.ok() ? user->rfind("system:serviceaccount:", 0) != 0 : user.status().message().empty()) {
    std::abort();
  }
  absl::StatusOr<tessera::extender::AdmissionRequest> request =
      tessera::extender::DecodeAdmissionReview(body);
  if (!request.ok() && request.status().message().empty()) {
    std::abort();
  }
  tessera::extender::WebhookReply reply =
      tessera::extender::HandleAdmissionReview("application/json", body, options);
  if (reply.http_status != (request.ok() ? 200 : 400)) {
    std::abort();
  }
  json review = json::parse(reply.body, nullptr, false);
  if (review.is_discarded() || !review.is_object() || review["kind"] != "AdmissionReview") {
    std::abort();
  }
  if (request.ok()) {
    const json& response = review["response"];
    if (response["uid"] != request->uid) {
      std::abort();
    }
    if (response.contains("patch")) {
      std::string patch;
      if (!absl::Base64Unescape(response["patch"].get<std::string>(), &patch)) {
        std::abort();
      }
      json ops = json::parse(patch, nullptr, false);
      if (!ops.is_array() || ops.empty()) {
        std::abort();
      }
      for (const json& op : ops) {
        if (op["op"] != "add" && op["op"] != "replace") {
          std::abort();
        }
      }
    }
    if (request->operation == "UPDATE") {
      if (response.contains("patch")) {
        std::abort();
      }
      const bool owner = request->username == options.self_username ||
                         std::find(request->groups.begin(), request->groups.end(),
                                   "system:masters") != request->groups.end();
      if (!owner && request->username != "plugin" && response["allowed"].get<bool>()) {
        // Allowed for anyone else: every owned annotation is the same before and after.
        json before = json::parse(request->old_object_json, nullptr, false);
        json after = json::parse(request->object_json, nullptr, false);
        auto annotations = [](const json& pod) {
          if (!pod.is_object() || !pod.contains("metadata") || !pod["metadata"].is_object() ||
              !pod["metadata"].contains("annotations") ||
              !pod["metadata"]["annotations"].is_object()) {
            return json::object();
          }
          return pod["metadata"]["annotations"];
        };
        const bool is_pod = (request->kind.empty() || request->kind == "Pod") &&
                            (request->resource.empty() || request->resource == "pods");
        const json a = annotations(before);
        const json b = annotations(after);
        for (std::string_view key : tessera::extender::SchedulerOwnedAnnotations()) {
          const std::string k(key);
          if (is_pod && (a.contains(k) != b.contains(k) || (a.contains(k) && a[k] != b[k]))) {
            std::abort();
          }
        }
      }
    }
    if (response.contains("warnings")) {
      const json& warnings = response["warnings"];
      if (!response["allowed"].get<bool>() || !warnings.is_array() || warnings.empty() ||
          warnings.size() > tessera::extender::kMaxAdmissionWarnings) {
        std::abort();
      }
      for (const json& w : warnings) {
        if (!w.is_string() ||
            w.get<std::string>().size() > tessera::extender::kMaxAdmissionWarningBytes) {
          std::abort();
        }
      }
    }
  }
  return 0;
}
