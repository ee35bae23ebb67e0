#include "tessera/extender/webhook.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "fmt/format.h"
#include <nlohmann/json.hpp>

#include "tessera/device/annotations.h"
#include "tessera/device/codec.h"
#include "tessera/device/mig.h"
#include "tessera/device/quantity.h"
#include "tessera/device/request.h"
#include "tessera/extender/admission_warnings.h"
#include "tessera/json/text.h"
#include "tessera/kube/decode.h"
#include "tessera/kube/objects.h"

namespace tessera::extender {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 512;
constexpr std::string_view kDefaultScheduler = "default-scheduler";

// HAMi PR #3042's keys with the NVIDIA backend, in its order, then the others Tessera writes.
constexpr std::string_view kSchedulerOwnedAnnotations[] = {
    device::kVgpuNodeAnnotation,         device::kBindTimeAnnotation,
    device::kBindPhaseAnnotation,        device::kDevicesToAllocateAnnotation,
    device::kDevicesAllocatedAnnotation, device::kMigAllocationsAnnotation,
    device::kVgpuTimeAnnotation,         device::kVerdictAnnotation,
};

constexpr std::string_view kDevicePluginAnnotations[] = {
    device::kBindPhaseAnnotation,
    device::kDevicesToAllocateAnnotation,
    device::kMigAllocationsAnnotation,
};

constexpr std::string_view kServiceAccountPrefix = "system:serviceaccount:";
// Kubernetes' superuser group: authorization never stops it (it may delete this webhook), so
// neither does this check; repairs by hand need it.
constexpr std::string_view kSuperuserGroup = "system:masters";

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

PatchOp Op(std::string op, std::string path, const json& value) {
  return PatchOp{std::move(op), std::move(path), Dump(value)};
}

// A string member of an object, or "" when absent or not a string.
std::string StringAt(const json& object, std::string_view key) {
  if (!object.is_object()) {
    return {};
  }
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return {};
  }
  return it->get<std::string>();
}

const json* MemberAt(const json& object, std::string_view key) {
  if (!object.is_object()) {
    return nullptr;
  }
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// metadata.annotations of a pod, or nullptr when absent or not an object.
const json* AnnotationsOf(const json& pod) {
  const json* meta = MemberAt(pod, "metadata");
  const json* annotations = meta != nullptr ? MemberAt(*meta, "annotations") : nullptr;
  return annotations != nullptr && annotations->is_object() ? annotations : nullptr;
}

// Whether `key` is present in one of `old_annotations`, `new_annotations` and not the other, or
// present in both with different values.
bool Changed(const json* old_annotations, const json* new_annotations, std::string_view key) {
  auto find = [key](const json* annotations) -> const json* {
    if (annotations == nullptr) {
      return nullptr;
    }
    auto it = annotations->find(key);
    return it == annotations->end() ? nullptr : &*it;
  };
  const json* before = find(old_annotations);
  const json* after = find(new_annotations);
  if (before == nullptr || after == nullptr) {
    return before != after;
  }
  return *before != *after;
}

// A quantity as text: the API server sends strings; numbers keep their JSON text.
std::optional<std::string> QuantityText(const json& value) {
  if (value.is_string()) {
    return value.get<std::string>();
  }
  if (value.is_number()) {
    return Dump(value);
  }
  return std::nullopt;
}

// The mutation of one container, and what the pod-level steps need from it.
class ContainerMutation {
 public:
  ContainerMutation(const json& container, std::string path, const WebhookOptions& options)
      : path_(std::move(path)), options_(options) {
    name_ = StringAt(container, "name");
    if (const json* resources = MemberAt(container, "resources")) {
      has_resources_ = resources->is_object();
      if (const json* limits = MemberAt(*resources, "limits"); limits && limits->is_object()) {
        has_limits_ = true;
        for (const auto& [key, value] : limits->items()) {
          if (std::optional<std::string> text = QuantityText(value)) {
            limits_.Set(key, *std::move(text));
          }
        }
      }
    }
    if (const json* sc = MemberAt(container, "securityContext")) {
      const json* privileged = MemberAt(*sc, "privileged");
      privileged_ = privileged != nullptr && privileged->is_boolean() && privileged->get<bool>();
    }
    if (const json* env = MemberAt(container, "env"); env && env->is_array()) {
      env_size_ = env->size();
      has_env_ = true;
    }
  }

  const std::string& name() const { return name_; }
  bool privileged() const { return privileged_; }

  // Whether the container asks for a device, counting the count HAMi would default.
  bool AsksForDevice() const {
    const device::NvidiaConfig& c = options_.nvidia;
    if (limits_.Contains(c.resource_count_name)) {
      return true;
    }
    return options_.nvidia.default_gpu_num > 0 &&
           (limits_.Contains(c.resource_core_name) || limits_.Contains(c.resource_memory_name) ||
            limits_.Contains(c.resource_memory_percentage_name));
  }

  // HAMi's percentage check; the errored message when it fails.
  std::optional<std::string> CheckPercentage() const {
    const std::string& key = options_.nvidia.resource_memory_percentage_name;
    const kube::ShortString* text = limits_.Find(key);
    if (text == nullptr) {
      return std::nullopt;
    }
    absl::StatusOr<device::Quantity> q = device::ParseQuantity(*text);
    absl::StatusOr<int64_t> v =
        q.ok() ? q->AsInt64() : absl::StatusOr<int64_t>(absl::InvalidArgumentError(""));
    if (v.ok() && *v >= 0 && *v <= 100) {
      return std::nullopt;
    }
    return fmt::format("invalid {} value {} in container {}: must be an integer between 0 and 100",
                       key, text->view(), name_);
  }

  // Appends this container's operations to `ops`; an error message when a value is unusable.
  std::optional<std::string> Mutate(std::vector<PatchOp>* ops) {
    const device::NvidiaConfig& c = options_.nvidia;
    if (const kube::ShortString* priority = limits_.Find(c.resource_priority_name)) {
      absl::StatusOr<device::Quantity> q = device::ParseQuantity(*priority);
      absl::StatusOr<int64_t> v =
          q.ok() ? q->AsInt64() : absl::StatusOr<int64_t>(absl::InvalidArgumentError(""));
      if (!v.ok()) {
        return fmt::format("invalid {} value {} in container {}: must be an integer",
                           c.resource_priority_name, device::QuoteForError(*priority), name_);
      }
      AddEnv("CUDA_TASK_PRIORITY", std::to_string(*v), ops);
    }
    if (c.gpu_core_policy != device::GpuCorePolicy::kDefault) {
      AddEnv("GPU_CORE_UTILIZATION_POLICY",
             std::string(device::GpuCorePolicyName(c.gpu_core_policy)), ops);
    }
    const bool asks = AsksForDevice();
    if (asks && !limits_.Contains(c.resource_count_name)) {
      AddLimit(c.resource_count_name, std::to_string(c.default_gpu_num), ops);
    }
    if (asks && !limits_.Contains(c.resource_core_name) && WholeMemory()) {
      AddLimit(c.resource_core_name, "100", ops);
    }
    if (!asks && c.overwrite_env) {
      AddEnv("NVIDIA_VISIBLE_DEVICES", "none", ops);
    }
    return std::nullopt;
  }

 private:
  // Whether the request, derived as the scheduler derives it, books each device's whole memory.
  bool WholeMemory() const {
    kube::Container view;
    view.name = name_;
    view.limits = limits_;
    absl::StatusOr<std::optional<device::ContainerRequest>> r =
        device::DeriveContainerRequest(view, options_.nvidia);
    return r.ok() && r->has_value() && (*r)->memreq == 0 && (*r)->mem_percentage == 100;
  }

  void AddLimit(const std::string& resource, std::string value, std::vector<PatchOp>* ops) {
    limits_.Set(resource, value);
    if (!has_resources_) {
      ops->push_back(Op("add", path_ + "/resources", json{{"limits", {{resource, value}}}}));
      has_resources_ = has_limits_ = true;
    } else if (!has_limits_) {
      ops->push_back(Op("add", path_ + "/resources/limits", json{{resource, value}}));
      has_limits_ = true;
    } else {
      ops->push_back(
          Op("add", path_ + "/resources/limits/" + tessera::json::PointerEscape(resource), value));
    }
  }

  void AddEnv(std::string name, std::string value, std::vector<PatchOp>* ops) {
    json var = {{"name", std::move(name)}, {"value", std::move(value)}};
    if (!has_env_) {
      ops->push_back(Op("add", path_ + "/env", json::array({std::move(var)})));
      has_env_ = true;
      env_size_ = 1;
    } else {
      ops->push_back(Op("add", fmt::format("{}/env/{}", path_, env_size_), var));
      ++env_size_;
    }
  }

  const std::string path_;
  const WebhookOptions& options_;
  std::string name_;
  kube::ResourceList limits_;
  bool has_resources_ = false;
  bool has_limits_ = false;
  bool has_env_ = false;
  size_t env_size_ = 0;
  bool privileged_ = false;
};

AdmissionResponse Denied(std::string message) {
  AdmissionResponse r;
  r.allowed = false;
  r.code = 403;
  r.reason = "Forbidden";
  r.message = std::move(message);
  return r;
}

AdmissionResponse Errored(int32_t code, std::string message) {
  AdmissionResponse r;
  r.allowed = false;
  r.code = code;
  r.message = std::move(message);
  return r;
}

AdmissionResponse AllowedWith(std::string message) {
  AdmissionResponse r;
  r.message = std::move(message);
  return r;
}

bool Contains(std::span<const std::string_view> keys, std::string_view key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

// A user name as HAMi prints it (raw) when it is plain printable ASCII, else quoted and escaped.
std::string UserForMessage(const std::string& username) {
  if (username.empty()) {
    return "an anonymous request";
  }
  const bool plain =
      username.size() <= 256 &&
      std::all_of(username.begin(), username.end(), [](char c) { return c > ' ' && c < 0x7f; });
  return plain ? username : device::QuoteForError(username);
}

// An UPDATE of a pod: the scheduler-owned annotations change only by the scheduler, or by a
// trusted writer for the keys the device plugin writes. Nothing is mutated.
AdmissionResponse ReviewPodUpdate(const AdmissionRequest& request, const WebhookOptions& options) {
  const json pod = json::parse(request.object_json, nullptr, /*allow_exceptions=*/false);
  const json old = json::parse(request.old_object_json, nullptr, /*allow_exceptions=*/false);
  const json* after = AnnotationsOf(pod);
  const json* before = AnnotationsOf(old);
  const bool owner =
      (!options.self_username.empty() && request.username == options.self_username) ||
      std::find(request.groups.begin(), request.groups.end(), kSuperuserGroup) !=
          request.groups.end();
  const bool trusted = !request.username.empty() &&
                       std::find(options.trusted_annotation_writers.begin(),
                                 options.trusted_annotation_writers.end(),
                                 request.username) != options.trusted_annotation_writers.end();
  bool changed = false;
  for (std::string_view key : kSchedulerOwnedAnnotations) {
    if (!Changed(before, after, key)) {
      continue;
    }
    changed = true;
    if (owner || (trusted && Contains(kDevicePluginAnnotations, key))) {
      continue;
    }
    return Denied(fmt::format("annotation {} is written by the scheduler and cannot be set by {}",
                              key, UserForMessage(request.username)));
  }
  return AllowedWith(changed ? "scheduler-owned annotations changed by their writer"
                             : "no scheduler-owned annotation changed");
}

}  // namespace

std::span<const std::string_view> SchedulerOwnedAnnotations() { return kSchedulerOwnedAnnotations; }

std::span<const std::string_view> DevicePluginAnnotations() { return kDevicePluginAnnotations; }

absl::StatusOr<std::string> ServiceAccountUsername(std::string_view token) {
  const size_t first = token.find('.');
  const size_t second = first == std::string_view::npos ? first : token.find('.', first + 1);
  if (second == std::string_view::npos || token.find('.', second + 1) != std::string_view::npos) {
    return absl::InvalidArgumentError("the token is not a JWT (want three dot-separated parts)");
  }
  const std::string_view encoded = token.substr(first + 1, second - first - 1);
  std::string payload;
  if (!absl::WebSafeBase64Unescape(absl::string_view(encoded.data(), encoded.size()), &payload)) {
    return absl::InvalidArgumentError("the token's payload is not base64url");
  }
  if (tessera::json::ExceedsDepth(payload, kMaxDepth)) {
    return absl::InvalidArgumentError("the token's payload nests too deep");
  }
  const json claims = json::parse(payload, nullptr, /*allow_exceptions=*/false);
  const std::string sub = StringAt(claims, "sub");
  // system:serviceaccount:<namespace>:<name>, both non-empty and without another colon.
  const std::string_view rest =
      std::string_view(sub).substr(std::min(sub.size(), kServiceAccountPrefix.size()));
  const size_t colon = rest.find(':');
  if (!sub.starts_with(kServiceAccountPrefix) || colon == 0 || colon == std::string_view::npos ||
      colon + 1 == rest.size() || rest.find(':', colon + 1) != std::string_view::npos) {
    return absl::InvalidArgumentError(
        fmt::format("the token's subject {} is not a service account", device::QuoteForError(sub)));
  }
  return sub;
}

absl::StatusOr<AdmissionRequest> DecodeAdmissionReview(std::string_view body) {
  if (body.empty()) {
    return absl::InvalidArgumentError("request body is empty");
  }
  if (tessera::json::ExceedsDepth(body, kMaxDepth)) {
    return absl::InvalidArgumentError(
        fmt::format("the document nests deeper than {} levels", kMaxDepth));
  }
  json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError("not JSON: the body cannot be parsed");
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError("expected a JSON object (an AdmissionReview)");
  }
  AdmissionRequest out;
  out.api_version = StringAt(doc, "apiVersion");
  if (out.api_version != kAdmissionV1 && out.api_version != kAdmissionV1Beta1) {
    return absl::InvalidArgumentError(fmt::format("apiVersion: want {} or {}, got {}", kAdmissionV1,
                                                  kAdmissionV1Beta1,
                                                  device::QuoteForError(out.api_version)));
  }
  const std::string kind = StringAt(doc, "kind");
  if (kind != "AdmissionReview") {
    return absl::InvalidArgumentError(
        fmt::format("kind: want AdmissionReview, got {}", device::QuoteForError(kind)));
  }
  const json* request = MemberAt(doc, "request");
  if (request == nullptr || !request->is_object()) {
    return absl::InvalidArgumentError("request: missing or not an object");
  }
  const json* uid = MemberAt(*request, "uid");
  if (uid == nullptr || !uid->is_string() || uid->get<std::string>().empty()) {
    return absl::InvalidArgumentError("request.uid: missing or not a non-empty string");
  }
  out.uid = uid->get<std::string>();
  if (const json* k = MemberAt(*request, "kind")) {
    out.kind = StringAt(*k, "kind");
  }
  if (const json* r = MemberAt(*request, "resource")) {
    out.resource = StringAt(*r, "resource");
  }
  out.sub_resource = StringAt(*request, "subResource");
  out.operation = StringAt(*request, "operation");
  out.ns = StringAt(*request, "namespace");
  out.name = StringAt(*request, "name");
  const bool update = out.operation == "UPDATE";
  if (const json* object = MemberAt(*request, "object")) {
    if (!object->is_object()) {
      return absl::InvalidArgumentError("request.object: expected an object");
    }
    out.object_json = Dump(*object);
  } else if (out.operation == "CREATE" || out.operation.empty() || update) {
    return absl::InvalidArgumentError("request.object: missing");
  }
  if (const json* old = MemberAt(*request, "oldObject")) {
    if (!old->is_object()) {
      return absl::InvalidArgumentError("request.oldObject: expected an object");
    }
    out.old_object_json = Dump(*old);
  } else if (update) {
    return absl::InvalidArgumentError("request.oldObject: missing");
  }
  if (const json* user = MemberAt(*request, "userInfo")) {
    if (!user->is_object()) {
      return absl::InvalidArgumentError("request.userInfo: expected an object");
    }
    if (const json* username = MemberAt(*user, "username")) {
      if (!username->is_string()) {
        return absl::InvalidArgumentError("request.userInfo.username: expected a string");
      }
      out.username = username->get<std::string>();
    }
    if (const json* groups = MemberAt(*user, "groups")) {
      if (!groups->is_array() || !std::all_of(groups->begin(), groups->end(),
                                              [](const json& g) { return g.is_string(); })) {
        return absl::InvalidArgumentError("request.userInfo.groups: expected an array of strings");
      }
      for (const json& g : *groups) {
        out.groups.push_back(g.get<std::string>());
      }
    }
  }
  return out;
}

AdmissionResponse ReviewPod(const AdmissionRequest& request, const WebhookOptions& options) {
  const bool pod_or_subresource = (request.kind.empty() || request.kind == "Pod") &&
                                  (request.resource.empty() || request.resource == "pods");
  if (pod_or_subresource && request.operation == "UPDATE") {
    // A subresource's object is the whole pod as well: its annotations are judged alike.
    return ReviewPodUpdate(request, options);
  }
  if (!pod_or_subresource || !request.sub_resource.empty()) {
    return AllowedWith("not a pod: left unchanged");
  }
  if (!request.operation.empty() && request.operation != "CREATE") {
    return AllowedWith(fmt::format("{} is not mutated", request.operation));
  }
  const json pod = json::parse(request.object_json, nullptr, /*allow_exceptions=*/false);
  const json* spec = MemberAt(pod, "spec");
  const json* containers = spec != nullptr ? MemberAt(*spec, "containers") : nullptr;
  if (containers == nullptr || !containers->is_array() || containers->empty()) {
    return Denied("pod has no containers");
  }
  if (const json* meta = MemberAt(pod, "metadata")) {
    if (const json* annotations = MemberAt(*meta, "annotations");
        annotations != nullptr && annotations->is_object()) {
      for (std::string_view key : kSchedulerOwnedAnnotations) {
        if (annotations->contains(key)) {
          return Denied(fmt::format(
              "annotation {} is written by the scheduler and cannot be set when creating a pod",
              key));
        }
      }
    }
  }
  const std::string scheduler = StringAt(*spec, "schedulerName");
  if (!scheduler.empty() && scheduler != options.scheduler_name &&
      (scheduler != kDefaultScheduler || !options.force_overwrite_default_scheduler)) {
    return AllowedWith("pod already has different scheduler assigned");
  }
  // hami.io/numa-alignment (HAMi after v2.10): a bad value is denied now rather than found by
  // the device plugin at Allocate; only for pods that are ours, as HAMi checks it here.
  if (const json* meta = MemberAt(pod, "metadata")) {
    if (const json* annotations = MemberAt(*meta, "annotations");
        annotations != nullptr && annotations->contains(device::kNumaAlignmentAnnotation)) {
      absl::StatusOr<device::NumaAlignment> alignment =
          device::ParseNumaAlignment(StringAt(*annotations, device::kNumaAlignmentAnnotation));
      if (!alignment.ok()) {
        return Denied(std::string(alignment.status().message()));
      }
    }
  }
  std::vector<std::string> warnings;
  if (absl::StatusOr<kube::Pod> decoded = kube::DecodePod(request.object_json); decoded.ok()) {
    // Every annotation: the decoder keeps only hami.io/ and nvidia.com/ keys, and the device
    // config may name resources under any prefix.
    const json* meta = MemberAt(pod, "metadata");
    const json* annotations = meta != nullptr ? MemberAt(*meta, "annotations") : nullptr;
    if (annotations != nullptr && annotations->is_object()) {
      for (const auto& [key, value] : annotations->items()) {
        if (value.is_string()) {
          decoded->meta.annotations.Set(key, value.get<std::string>());
        }
      }
    }
    warnings = AdmissionWarnings(*decoded, options.nvidia);
  }

  std::vector<ContainerMutation> all;
  auto collect = [&](std::string_view list) {
    const json* items = MemberAt(*spec, list);
    if (items == nullptr || !items->is_array()) {
      return;
    }
    for (size_t i = 0; i < items->size(); ++i) {
      all.emplace_back((*items)[i], fmt::format("/spec/{}/{}", list, i), options);
    }
  };
  collect("initContainers");
  collect("containers");

  AdmissionResponse response;
  bool asks = false;
  const ContainerMutation* privileged = nullptr;
  for (ContainerMutation& c : all) {
    if (std::optional<std::string> bad = c.CheckPercentage()) {
      return Errored(500, *std::move(bad));
    }
    asks = asks || c.AsksForDevice();
    if (c.privileged()) {
      if (privileged == nullptr) {
        privileged = &c;
      }
      continue;
    }
    if (std::optional<std::string> bad = c.Mutate(&response.patch)) {
      return Errored(500, *std::move(bad));
    }
  }
  response.warnings = std::move(warnings);
  if (!asks) {
    return response;  // only env additions (overwriteEnv, gpuCorePolicy), if any
  }
  if (privileged != nullptr) {
    return Denied(fmt::format("container {} is privileged", privileged->name()));
  }
  if (!options.nvidia.runtime_class_name.empty() && StringAt(*spec, "runtimeClassName").empty()) {
    response.patch.push_back(
        Op("add", "/spec/runtimeClassName", options.nvidia.runtime_class_name));
  }
  if (!options.scheduler_name.empty()) {
    if (!StringAt(*spec, "nodeName").empty()) {
      return Denied("pod has node assigned");
    }
    if (scheduler != options.scheduler_name) {
      response.patch.push_back(Op(MemberAt(*spec, "schedulerName") != nullptr ? "replace" : "add",
                                  "/spec/schedulerName", options.scheduler_name));
    }
  }
  return response;
}

std::string EncodePatch(const std::vector<PatchOp>& ops) {
  json out = json::array();
  for (const PatchOp& op : ops) {
    json value = json::parse(op.value_json, nullptr, /*allow_exceptions=*/false);
    out.push_back({{"op", op.op}, {"path", op.path}, {"value", std::move(value)}});
  }
  return Dump(out);
}

std::string EncodeAdmissionReview(std::string_view api_version, std::string_view uid,
                                  const AdmissionResponse& response) {
  json status = {{"metadata", json::object()}, {"code", response.code}};
  if (!response.reason.empty()) {
    status["reason"] = response.reason;
  }
  if (!response.message.empty()) {
    status["message"] = response.message;
  }
  json r = {
      {"uid", std::string(uid)}, {"allowed", response.allowed}, {"status", std::move(status)}};
  if (!response.warnings.empty()) {
    r["warnings"] = response.warnings;
  }
  if (response.allowed && !response.patch.empty()) {
    r["patchType"] = "JSONPatch";
    r["patch"] = absl::Base64Escape(EncodePatch(response.patch));
  }
  return Dump(json{{"apiVersion", std::string(api_version)},
                   {"kind", "AdmissionReview"},
                   {"response", std::move(r)}});
}

WebhookReply HandleAdmissionReview(std::string_view content_type, std::string_view body,
                                   const WebhookOptions& options) {
  auto bad = [](std::string message, std::string_view api_version, std::string_view uid) {
    return WebhookReply{400,
                        EncodeAdmissionReview(api_version, uid, Errored(400, std::move(message)))};
  };
  std::string media(content_type.substr(0, content_type.find(';')));
  absl::StripAsciiWhitespace(&media);
  if (absl::AsciiStrToLower(media) != "application/json") {
    return bad(fmt::format("contentType={}, expected application/json",
                           device::QuoteForError(content_type)),
               kAdmissionV1, "");
  }
  absl::StatusOr<AdmissionRequest> request = DecodeAdmissionReview(body);
  if (!request.ok()) {
    return bad(std::string(request.status().message()), kAdmissionV1, "");
  }
  return WebhookReply{
      200, EncodeAdmissionReview(request->api_version, request->uid, ReviewPod(*request, options))};
}

}  // namespace tessera::extender
