// `tessera explain`: where a pod would be placed, with which devices, and why not elsewhere.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sys/stat.h>

#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/clock.h"
#include "tessera/base/status_macros.h"
#include "tessera/device/ascend.h"
#include "tessera/device/codec.h"
#include "tessera/device/device_config.h"
#include "tessera/device/vendor.h"
#include "tessera/explain/explain.h"
#include "tessera/explain/live.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/manifest.h"
#include "tessera/kube/objects.h"
#include "tessera/kube/transport.h"

namespace tessera::cmd {
namespace {

struct ExplainOptions {
  std::string cluster;
  std::string kubeconfig;
  std::string context;
  std::string pod;         // --pod
  std::string pod_arg;     // the positional POD, as kubectl takes it
  std::string namespace_;  // -n: the namespace of a POD given by name
  std::string node_policy = "binpack";
  std::string gpu_policy = "spread";
  std::string device_config;
  std::string output = "text";
  std::string reservation_ttl = "5m";
  int64_t now_unix = 0;
  Clock* clock = Clock::Real();  // "now" without --now
};

int Fail(const absl::Status& status, int code = kExitUsage) {
  fmt::print(stderr, "tessera explain: {}\n", std::string(status.message()));
  return code;
}

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A manifest's name (".yaml", ".yml", ".json"): a missing one is a mistyped file, not a pod name.
bool LooksLikeAFile(std::string_view ref) {
  return ref.ends_with(".yaml") || ref.ends_with(".yml") || ref.ends_with(".json");
}

// "ns/name" → {ns, name}; nullopt for anything else.
std::optional<std::pair<std::string, std::string>> ParsePodRef(const std::string& ref) {
  const size_t slash = ref.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == ref.size() ||
      ref.find('/', slash + 1) != std::string::npos) {
    return std::nullopt;
  }
  return std::make_pair(ref.substr(0, slash), ref.substr(slash + 1));
}

// A JSON scalar as YAML: JSON's string escapes are YAML's double-quoted ones; plain keys stay
// unquoted.
std::string YamlKey(const std::string& key) {
  const bool plain = !key.empty() && key.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789_-./") == std::string::npos;
  return plain ? key : nlohmann::json(key).dump();
}

// `value` as block YAML at `indent` spaces (`-o yaml`: the document of `-o json`).
void AppendYaml(const nlohmann::json& value, int indent, std::string* out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      *out += pad + YamlKey(key) + ":";
      if ((item.is_object() || item.is_array()) && !item.empty()) {
        *out += "\n";
        AppendYaml(item, indent + 2, out);
      } else {
        *out += " " + item.dump() + "\n";
      }
    }
  } else if (value.is_array()) {
    for (const nlohmann::json& item : value) {
      if ((item.is_object() || item.is_array()) && !item.empty()) {
        // "- " then the item's first line; the rest indented under it.
        std::string nested;
        AppendYaml(item, indent + 2, &nested);
        *out += pad + "- " + nested.substr(static_cast<size_t>(indent) + 2);
      } else {
        *out += pad + "- " + item.dump() + "\n";
      }
    }
  } else {
    *out += pad + value.dump() + "\n";
  }
}

// The nodes, the pods and the pod to place, from the manifest files or the API server.
struct Sources {
  std::vector<kube::Node> nodes;
  std::vector<kube::Pod> pods;
  std::vector<kube::ResourceQuota> quotas;
  kube::Pod pod;
  bool pod_from_file = false;  // as a user submits it: the admission webhook has not run
  std::vector<std::string> warnings;
};

// The Ascend chip of `config` whose count resource a container of `pod` names (limits or
// requests), or nullptr for an NVIDIA pod. Two chips in one pod: InvalidArgument.
absl::StatusOr<const device::AscendChipConfig*> AscendChipOf(const device::AscendConfig& config,
                                                             const kube::Pod& pod) {
  const device::AscendChipConfig* found = nullptr;
  for (const device::AscendChipConfig& chip : config.chips) {
    for (const auto* list : {&pod.init_containers, &pod.containers}) {
      for (const kube::Container& c : *list) {
        if (c.limits.Find(chip.resource_name) == nullptr &&
            c.requests.Find(chip.resource_name) == nullptr) {
          continue;
        }
        if (found != nullptr && found != &chip) {
          return absl::InvalidArgumentError(
              fmt::format("pod {} asks for {} and {}: Tessera schedules one device kind per pod",
                          pod.Key(), found->resource_name, chip.resource_name));
        }
        found = &chip;
      }
    }
  }
  return found;
}

// Loads --pod as a manifest file. Errors are bad input (exit 2).
absl::StatusOr<kube::Pod> LoadPodFile(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(kube::Manifests pod_file, kube::LoadManifestFile(path));
  if (pod_file.pods.size() != 1) {
    return absl::InvalidArgumentError(
        fmt::format("{}: expected exactly one Pod, found {}", path, pod_file.pods.size()));
  }
  return std::move(pod_file.pods[0]);
}

// Fills `sources` from the cluster of --kubeconfig; returns the exit code on failure.
std::optional<int> LoadLive(const ExplainOptions& opts, Sources* sources) {
  const bool pod_is_file = IsFile(opts.pod);
  std::optional<std::pair<std::string, std::string>> ref;
  if (!pod_is_file && LooksLikeAFile(opts.pod)) {
    return Fail(absl::InvalidArgumentError(fmt::format("no such file \"{}\"", opts.pod)));
  }
  if (!pod_is_file) {
    ref = opts.pod.find('/') != std::string::npos || !kube::IsDnsSubdomain(opts.pod)
              ? ParsePodRef(opts.pod)
              : std::make_optional(std::make_pair(opts.namespace_, opts.pod));
    if (!ref) {
      return Fail(absl::InvalidArgumentError(fmt::format(
          "pod \"{}\" is neither a file, a pod name nor NAMESPACE/NAME of a pod", opts.pod)));
    }
    if (!opts.namespace_.empty() && ref->first != opts.namespace_) {
      return Fail(absl::InvalidArgumentError(fmt::format(
          "pod \"{}\" names namespace {}, -n says {}", opts.pod, ref->first, opts.namespace_)));
    }
  } else {
    absl::StatusOr<kube::Pod> pod = LoadPodFile(opts.pod);
    if (!pod.ok()) {
      return Fail(pod.status());
    }
    sources->pod = *std::move(pod);
    sources->pod_from_file = true;
  }
  kube::KubeconfigOptions kc;
  kc.path = opts.kubeconfig;
  kc.context = opts.context;
  absl::StatusOr<kube::RestConfig> rest = kube::LoadKubeconfig(kc);
  if (!rest.ok()) {
    return Fail(
        Annotate(rest.status(), opts.kubeconfig.empty()
                                    ? "a live cluster needs a kubeconfig ($KUBECONFIG, else "
                                      "~/.kube/config; or read a manifest with --cluster FILE)"
                                    : "--kubeconfig"));
  }
  if (pod_is_file && sources->pod.meta.ns.empty()) {
    sources->pod.meta.ns = !opts.namespace_.empty() ? opts.namespace_ : rest->namespace_;
  }
  if (ref && ref->first.empty()) {
    ref->first = rest->namespace_.empty() ? "default" : rest->namespace_;  // as kubectl does
  }
  // A one-shot command: fail fast rather than wait out a long outage.
  rest->connect_timeout = absl::Seconds(10);
  rest->request_timeout = absl::Seconds(30);
  const std::string server = rest->server;
  kube::CurlTransport::Options transport_options;
  transport_options.user_agent = "tessera/" TESSERA_VERSION " (explain)";
  absl::StatusOr<std::unique_ptr<kube::CurlTransport>> transport = kube::CurlTransport::Create(
      *rest, kube::MakeTokenSource(*rest, Clock::Real()), transport_options);
  if (!transport.ok()) {
    return Fail(Annotate(transport.status(), "--kubeconfig"));
  }
  kube::ApiClient::Options client_options;
  client_options.retry.max_attempts = 3;
  kube::ApiClient client(transport->get(), std::move(client_options));
  auto api_failure = [&server](const absl::Status& status) {
    return Fail(Annotate(status, fmt::format("API server {}", server)), kExitFailure);
  };
  if (ref) {
    absl::StatusOr<kube::Pod> pod = client.GetPod(ref->first, ref->second);
    if (!pod.ok()) {
      return api_failure(
          Annotate(pod.status(), fmt::format("getting pod {}/{}", ref->first, ref->second)));
    }
    sources->pod = *std::move(pod);
  }
  absl::StatusOr<explain::LiveCluster> live = explain::ListCluster(client);
  if (!live.ok()) {
    return api_failure(live.status());
  }
  sources->nodes = std::move(live->nodes);
  sources->pods = std::move(live->pods);
  sources->quotas = std::move(live->quotas);
  if (!live->quota_error.empty()) {
    sources->warnings.push_back(live->quota_error + ": namespace quota not checked");
  }
  return std::nullopt;
}

// Fills `sources` from --cluster and --pod files; returns the exit code on failure.
std::optional<int> LoadFiles(const ExplainOptions& opts, Sources* sources) {
  if (!IsFile(opts.pod)) {
    return Fail(absl::InvalidArgumentError(fmt::format(
        "no such file \"{}\" (a pod of the cluster needs a kubeconfig, not --cluster)", opts.pod)));
  }
  absl::StatusOr<kube::Manifests> cluster = kube::LoadManifestFile(opts.cluster);
  if (!cluster.ok()) {
    return Fail(cluster.status());
  }
  absl::StatusOr<kube::Pod> pod = LoadPodFile(opts.pod);
  if (!pod.ok()) {
    return Fail(pod.status());
  }
  sources->nodes = std::move(cluster->nodes);
  sources->pods = std::move(cluster->pods);
  sources->quotas = std::move(cluster->quotas);
  sources->pod = *std::move(pod);
  sources->pod_from_file = true;
  sources->warnings = std::move(cluster->warnings);
  return std::nullopt;
}

int RunExplain(ExplainOptions opts) {
  if (opts.pod.empty() == opts.pod_arg.empty()) {
    return Fail(absl::InvalidArgumentError(
        "name the pod once: POD (a name with -n, NAMESPACE/NAME or a file) or --pod"));
  }
  if (opts.pod.empty()) {
    opts.pod = opts.pod_arg;
  }
  const bool live = opts.cluster.empty();
  if (!live && (!opts.kubeconfig.empty() || !opts.context.empty())) {
    return Fail(absl::InvalidArgumentError(
        "--cluster FILE (a manifest) or a live cluster (--kubeconfig, $KUBECONFIG or "
        "~/.kube/config, --context): not both"));
  }
  absl::StatusOr<device::NodePolicy> node_policy = device::ParseNodePolicy(opts.node_policy);
  if (!node_policy.ok()) {
    return Fail(Annotate(node_policy.status(), "--node-policy"));
  }
  absl::StatusOr<device::GpuPolicy> gpu_policy = device::ParseGpuPolicy(opts.gpu_policy);
  if (!gpu_policy.ok()) {
    return Fail(Annotate(gpu_policy.status(), "--gpu-policy"));
  }
  absl::Duration ttl;
  if (!absl::ParseDuration(opts.reservation_ttl, &ttl) || ttl < absl::ZeroDuration()) {
    return Fail(absl::InvalidArgumentError(
        fmt::format("--reservation-ttl: not a duration: \"{}\"", opts.reservation_ttl)));
  }
  device::DeviceConfig devices = device::DefaultDeviceConfig();
  if (!opts.device_config.empty()) {
    absl::StatusOr<device::DeviceConfig> loaded = device::LoadDeviceConfigFile(opts.device_config);
    if (!loaded.ok()) {
      return Fail(loaded.status());
    }
    devices = *std::move(loaded);
  }
  const device::NvidiaConfig& config = devices.nvidia;
  Sources sources;
  if (std::optional<int> failed = live ? LoadLive(opts, &sources) : LoadFiles(opts, &sources)) {
    return *failed;
  }

  explain::ExplainInput input;
  input.nodes = std::move(sources.nodes);
  input.pods = std::move(sources.pods);
  input.pod = std::move(sources.pod);
  input.quotas = std::move(sources.quotas);
  input.quota_names = {.memory_name = config.resource_memory_name,
                       .cores_name = config.resource_core_name,
                       .memory_factor = config.memory_factor};
  if (input.pod.meta.ns.empty()) {
    input.pod.meta.ns = "default";
  }
  input.node_policy = *node_policy;
  input.gpu_policy = *gpu_policy;
  input.now = opts.now_unix != 0 ? absl::FromUnixSeconds(opts.now_unix) : opts.clock->Now();
  input.reservation_ttl = ttl;

  // The pod's device kind decides; the others' registrations join the nodes (docs/ascend.md).
  absl::StatusOr<const device::AscendChipConfig*> chip = AscendChipOf(devices.ascend, input.pod);
  if (!chip.ok()) {
    return Fail(chip.status());
  }
  std::vector<std::string> webhook;
  if (*chip != nullptr && sources.pod_from_file) {
    // As the user submits it: HAMi's webhook rewrites or refuses it first.
    absl::StatusOr<device::AscendPodAdmission> admitted =
        device::AdmitAscendPod(**chip, &input.pod);
    if (!admitted.ok()) {
      fmt::print(stderr,
                 "tessera explain: the admission webhook refuses pod {}: {} (HAMi's webhook "
                 "answers HTTP 500 with this text)\n",
                 input.pod.Key(), std::string(admitted.status().message()));
      return kExitFailure;
    }
    webhook = std::move(admitted->notes);
  }
  std::vector<std::unique_ptr<device::Vendor>> kinds;
  kinds.push_back(*chip != nullptr ? device::NewAscendVendor(**chip, devices.ascend.hami_vnpu_core)
                                   : device::NewNvidiaVendor(config));
  if (*chip != nullptr) {
    kinds.push_back(device::NewNvidiaVendor(config));
    input.quota_names = {.memory_name = (*chip)->resource_memory_name,
                         .cores_name = (*chip)->resource_core_name,
                         .memory_factor = (*chip)->memory_factor};
  }
  for (const device::AscendChipConfig& other : devices.ascend.chips) {
    if (&other != *chip) {
      kinds.push_back(device::NewAscendVendor(other, devices.ascend.hami_vnpu_core));
    }
  }
  for (size_t k = 1; k < kinds.size(); ++k) {
    input.node_vendors.push_back(kinds[k].get());
  }
  absl::StatusOr<explain::ExplainResult> result = explain::Explain(*kinds.front(), input);
  if (!result.ok()) {
    return Fail(result.status());
  }
  result->webhook = std::move(webhook);
  for (const std::string& w : sources.warnings) {
    result->warnings.push_back(w);
  }
  std::string text;
  if (opts.output == "json") {
    text = explain::RenderExplainJson(*result);
  } else if (opts.output == "yaml") {
    AppendYaml(nlohmann::json::parse(explain::RenderExplainJson(*result)), 0, &text);
  } else {
    text = explain::RenderExplainText(*result, opts.output == "wide");
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return (result->node || result->no_request) ? kExitOk : kExitFailure;
}

}  // namespace

void AddExplainCommand(CLI::App& app, Runner* run) {
  auto opts = std::make_shared<ExplainOptions>();
  CLI::App* sub = app.add_subcommand(
      "explain",
      "Explain where a pod would be placed: the chosen node, the devices per container, the "
      "annotations Tessera would write, and for every node that does not fit, why (HAMi's "
      "reason strings). Reads the live cluster as kubectl does (--kubeconfig, else "
      "$KUBECONFIG, else ~/.kube/config) or a manifest (--cluster). Also a kubectl plugin: "
      "`kubectl tessera explain POD -n NAMESPACE`. Exit code 0 when a node fits, 1 when none "
      "does or the API server failed, 2 on bad input.");
  sub->add_option("pod", opts->pod_arg,
                  "The pod to place: a pod name (namespace from -n, else the kubeconfig "
                  "context's, else default), NAMESPACE/NAME, or a file (YAML or JSON, one Pod)");
  sub->add_option("-n,--namespace", opts->namespace_,
                  "The namespace of a POD given by name (as kubectl's -n)");
  sub->add_option("--cluster", opts->cluster,
                  "Nodes and pods as `kubectl get nodes,pods -A -o yaml` writes them (YAML or "
                  "JSON; a List or several documents) instead of the live cluster")
      ->check(CLI::ExistingFile);
  sub->add_option("--kubeconfig", opts->kubeconfig,
                  "The kubeconfig of the live cluster whose nodes and pods are read (LISTs, "
                  "read-only); default: $KUBECONFIG (':'-separated, merged as kubectl does), "
                  "else ~/.kube/config");
  sub->add_option("--context", opts->context,
                  "The kubeconfig context to use (default: its current-context)");
  sub->add_option("--pod", opts->pod,
                  "The pod to place, as POD (the positional form); an existing file wins");
  sub->add_option("--node-policy", opts->node_policy,
                  "Node policy when the pod has no hami.io/node-scheduler-policy: binpack or "
                  "spread")
      ->capture_default_str();
  sub->add_option("--gpu-policy", opts->gpu_policy,
                  "GPU policy when the pod has no hami.io/gpu-scheduler-policy: binpack, spread, "
                  "topology-aware, mutex, numa or a chain such as binpack,numa")
      ->capture_default_str();
  sub->add_option("--device-config", opts->device_config,
                  "HAMi device-config YAML (resource names, defaultMemory, defaultCores, "
                  "memoryFactor; its vnpus section's Ascend chips, whose pods are explained "
                  "with HAMi's Ascend rules after its webhook); default: HAMi's chart defaults")
      ->check(CLI::ExistingFile);
  sub->add_option("-o,--output", opts->output,
                  "Output format: text, wide (text with each node's GPUs, shared allocations and "
                  "memory), json or yaml (the JSON document)")
      ->check(CLI::IsMember({"text", "wide", "json", "yaml"}))
      ->capture_default_str();
  sub->add_option("--reservation-ttl", opts->reservation_ttl,
                  "How long an annotated but unbound pod counts as an in-flight reservation")
      ->capture_default_str();
  sub->add_option("--now", opts->now_unix,
                  "Decision time in Unix seconds (default: the current time); for reproducible "
                  "output")
      ->group("");
  sub->callback([run, opts] { *run = [opts] { return RunExplain(*opts); }; });
}

}  // namespace tessera::cmd
