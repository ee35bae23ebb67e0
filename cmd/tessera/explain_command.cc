// `tessera explain`: where a pod would be placed, with which devices, and why not elsewhere.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <sys/stat.h>

#include "absl/time/clock.h"
#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tessera/base/clock.h"
#include "tessera/base/status_macros.h"
#include "tessera/device/codec.h"
#include "tessera/device/device_config.h"
#include "tessera/device/vendor.h"
#include "tessera/explain/explain.h"
#include "tessera/explain/live.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/manifest.h"
#include "tessera/kube/transport.h"

namespace tessera::cmd {
namespace {

struct ExplainOptions {
  std::string cluster;
  std::string kubeconfig;
  std::string context;
  std::string pod;
  std::string node_policy = "binpack";
  std::string gpu_policy = "spread";
  std::string device_config;
  std::string output = "text";
  std::string reservation_ttl = "5m";
  int64_t now_unix = 0;
};

int Fail(const absl::Status& status, int code = kExitUsage) {
  fmt::print(stderr, "tessera explain: {}\n", std::string(status.message()));
  return code;
}

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
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

// The nodes, the pods and the pod to place, from the manifest files or the API server.
struct Sources {
  std::vector<kube::Node> nodes;
  std::vector<kube::Pod> pods;
  kube::Pod pod;
  std::vector<std::string> warnings;
};

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
  if (!pod_is_file) {
    ref = ParsePodRef(opts.pod);
    if (!ref) {
      return Fail(absl::InvalidArgumentError(
          fmt::format("--pod: \"{}\" is neither a file nor NAMESPACE/NAME of a pod", opts.pod)));
    }
  } else {
    absl::StatusOr<kube::Pod> pod = LoadPodFile(opts.pod);
    if (!pod.ok()) {
      return Fail(pod.status());
    }
    sources->pod = *std::move(pod);
  }
  kube::KubeconfigOptions kc;
  kc.path = opts.kubeconfig;
  kc.context = opts.context;
  absl::StatusOr<kube::RestConfig> rest = kube::LoadKubeconfig(kc);
  if (!rest.ok()) {
    return Fail(Annotate(rest.status(), "--kubeconfig"));
  }
  if (pod_is_file && sources->pod.meta.ns.empty()) {
    sources->pod.meta.ns = rest->namespace_;  // as kubectl would place it
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
      return api_failure(Annotate(pod.status(), fmt::format("getting pod {}", opts.pod)));
    }
    sources->pod = *std::move(pod);
  }
  absl::StatusOr<explain::LiveCluster> live = explain::ListCluster(client);
  if (!live.ok()) {
    return api_failure(live.status());
  }
  sources->nodes = std::move(live->nodes);
  sources->pods = std::move(live->pods);
  return std::nullopt;
}

// Fills `sources` from --cluster and --pod files; returns the exit code on failure.
std::optional<int> LoadFiles(const ExplainOptions& opts, Sources* sources) {
  if (!IsFile(opts.pod)) {
    return Fail(absl::InvalidArgumentError(
        fmt::format("--pod: no such file \"{}\" (NAMESPACE/NAME needs --kubeconfig)", opts.pod)));
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
  sources->pod = *std::move(pod);
  sources->warnings = std::move(cluster->warnings);
  return std::nullopt;
}

int RunExplain(const ExplainOptions& opts) {
  if (opts.cluster.empty() == opts.kubeconfig.empty()) {
    return Fail(absl::InvalidArgumentError(
        "exactly one of --cluster FILE (a manifest) and --kubeconfig FILE (a live cluster) is "
        "required"));
  }
  if (!opts.context.empty() && opts.kubeconfig.empty()) {
    return Fail(absl::InvalidArgumentError("--context needs --kubeconfig"));
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
  device::NvidiaConfig config = device::DefaultNvidiaConfig();
  if (!opts.device_config.empty()) {
    absl::StatusOr<device::NvidiaConfig> loaded = device::LoadDeviceConfigFile(opts.device_config);
    if (!loaded.ok()) {
      return Fail(loaded.status());
    }
    config = *std::move(loaded);
  }
  Sources sources;
  if (std::optional<int> failed =
          opts.kubeconfig.empty() ? LoadFiles(opts, &sources) : LoadLive(opts, &sources)) {
    return *failed;
  }

  explain::ExplainInput input;
  input.nodes = std::move(sources.nodes);
  input.pods = std::move(sources.pods);
  input.pod = std::move(sources.pod);
  if (input.pod.meta.ns.empty()) {
    input.pod.meta.ns = "default";
  }
  input.node_policy = *node_policy;
  input.gpu_policy = *gpu_policy;
  input.now = opts.now_unix != 0 ? absl::FromUnixSeconds(opts.now_unix) : absl::Now();
  input.reservation_ttl = ttl;
  std::unique_ptr<device::Vendor> vendor = device::NewNvidiaVendor(config);
  absl::StatusOr<explain::ExplainResult> result = explain::Explain(*vendor, input);
  if (!result.ok()) {
    return Fail(result.status());
  }
  for (const std::string& w : sources.warnings) {
    result->warnings.push_back(w);
  }
  std::string text = opts.output == "json" ? explain::RenderExplainJson(*result)
                                           : explain::RenderExplainText(*result);
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
      "reason strings). Reads a manifest (--cluster) or the live cluster (--kubeconfig). Exit "
      "code 0 when a node fits, 1 when none does or the API server failed, 2 on bad input.");
  sub->add_option("--cluster", opts->cluster,
                  "Nodes and pods as `kubectl get nodes,pods -A -o yaml` writes them (YAML or "
                  "JSON; a List or several documents). Exactly one of --cluster and --kubeconfig")
      ->check(CLI::ExistingFile);
  sub->add_option("--kubeconfig", opts->kubeconfig,
                  "Read every node and pod from the live cluster of this kubeconfig instead of "
                  "--cluster (LISTs, read-only)");
  sub->add_option("--context", opts->context,
                  "The kubeconfig context to use (default: its current-context)");
  sub->add_option("--pod", opts->pod,
                  "The pod to place: a file (YAML or JSON, one Pod), or with --kubeconfig "
                  "NAMESPACE/NAME of a pod in the cluster; an existing file wins")
      ->required();
  sub->add_option("--node-policy", opts->node_policy,
                  "Node policy when the pod has no hami.io/node-scheduler-policy: binpack or "
                  "spread")
      ->capture_default_str();
  sub->add_option("--gpu-policy", opts->gpu_policy,
                  "GPU policy when the pod has no hami.io/gpu-scheduler-policy: binpack, spread, "
                  "mutex, numa or a chain such as binpack,numa")
      ->capture_default_str();
  sub->add_option("--device-config", opts->device_config,
                  "HAMi device-config YAML (resource names, defaultMemory, defaultCores, "
                  "memoryFactor); default: HAMi's chart defaults")
      ->check(CLI::ExistingFile);
  sub->add_option("-o,--output", opts->output, "Output format: text or json")
      ->check(CLI::IsMember({"text", "json"}))
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
