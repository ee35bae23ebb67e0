// `tessera serve`: the HAMi-compatible scheduler extender (docs/serve.md).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>

#include <signal.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cmd/tessera/commands.h"
#include "cmd/tessera/hami_compat.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tessera/base/limits.h"
#include "tessera/base/logging.h"
#include "tessera/device/codec.h"
#include "tessera/extender/node_lock.h"
#include "tessera/serve/service.h"

namespace tessera::cmd {
namespace {

// A bool flag's default as help and the start log show it (CLI11 captures none for flags).
const char* BoolText(bool value) { return value ? "true" : "false"; }

// The command line binds to a serve::ServeOptions, so that each flag's default is the field's
// default in service.h, stated once. Durations, policies and the leader mode are read as text and
// parsed in RunServe (errors read "tessera serve: --flag: ..."); each text starts as its field's
// default, formatted, which is also what --help shows.
struct ServeFlags {
  serve::ServeOptions options;
  std::string node_scheduler_policy = device::NodePolicyName(options.node_policy);
  std::string gpu_scheduler_policy = device::GpuPolicyName(options.gpu_policy);
  std::string node_lock_timeout = absl::FormatDuration(options.node_lock_timeout);
  std::string node_lock_retry_timeout = absl::FormatDuration(options.node_lock_retry_timeout);
  std::string reservation_ttl = absl::FormatDuration(options.reservation_ttl);
  std::string audit_period = absl::FormatDuration(options.audit_period);
  std::string resync_period = absl::FormatDuration(options.resync_period);
  std::string debug_auth = "loopback";
  std::string preemption = "extender";
  std::string preemption_settle = absl::FormatDuration(options.self_preempt.settle);
  // Comma-separated; empty: nobody.
  std::string trusted_annotation_writers = absl::StrJoin(options.trusted_annotation_writers, ",");
  // Leadership. The CLI11 options are kept to tell "not given" from a given empty value. The
  // Lease's name and namespace are derived when not given (LeaderOptions), so their flags start
  // empty rather than at ElectorOptions' defaults.
  bool leader_elect = false;
  std::string leader_elect_mode{serve::LeaderModeName(options.leader.mode)};
  std::string leader_elect_resource_name;
  std::string leader_elect_resource_namespace;
  std::string leader_elect_lease_duration = absl::FormatDuration(options.leader.lease_duration);
  std::string leader_elect_renew_deadline = absl::FormatDuration(options.leader.renew_deadline);
  std::string leader_elect_retry_period = absl::FormatDuration(options.leader.retry_period);
  CLI::Option* leader_elect_flag = nullptr;
  CLI::Option* leader_elect_mode_flag = nullptr;
  CLI::Option* leader_elect_name_flag = nullptr;
  CLI::Option* node_lock_timeout_flag = nullptr;
  // HAMi's flags without an effect here (hami_compat.h).
  IgnoredFlags hami;
};

int Usage(const std::string& message) {
  fmt::print(stderr, "tessera serve: {}\n", message);
  return kExitUsage;
}

bool ParsePositiveDuration(const std::string& flag, const std::string& text, absl::Duration* out,
                           std::string* error) {
  if (!absl::ParseDuration(text, out) || *out <= absl::ZeroDuration()) {
    *error =
        fmt::format("{}: want a positive duration such as 30s, 5m or 1h, got \"{}\"", flag, text);
    return false;
  }
  return true;
}

// The leadership flags (docs/serve.md "Leadership"). HAMi's extender reads --leader-elect as
// "follow the kube-scheduler sidecar's Lease named by --leader-elect-resource-name", and its
// chart passes that Lease's name; so --leader-elect (=true) selects follow mode here too, and
// --leader-elect=false HAMi's "no election". Tessera's own Lease is --leader-elect-mode=lease:
// reading --leader-elect as kube-scheduler does would make Tessera contend for the
// kube-scheduler's own Lease in a HAMi chart deployment (docs/compatibility.md).
int LeaderOptions(const ServeFlags& f, serve::ElectorOptions* out) {
  absl::StatusOr<serve::LeaderMode> mode = serve::ParseLeaderMode(f.leader_elect_mode);
  if (!mode.ok()) {
    return Usage("--leader-elect-mode: " + std::string(mode.status().message()));
  }
  if (f.leader_elect_flag->count() > 0) {
    const serve::LeaderMode implied =
        f.leader_elect ? serve::LeaderMode::kFollow : serve::LeaderMode::kNone;
    if (f.leader_elect_mode_flag->count() > 0 && *mode != implied &&
        !(f.leader_elect && *mode == serve::LeaderMode::kLease)) {
      return Usage(fmt::format("--leader-elect={} contradicts --leader-elect-mode={}",
                               f.leader_elect ? "true" : "false", f.leader_elect_mode));
    }
    if (f.leader_elect_mode_flag->count() == 0) {
      *mode = implied;
    }
  }
  serve::ElectorOptions& o = *out;
  o.mode = *mode;
  if (f.leader_elect_name_flag->count() > 0) {
    o.name = f.leader_elect_resource_name;
    if (o.name.empty() && o.mode == serve::LeaderMode::kFollow) {
      o.mode = serve::LeaderMode::kNone;  // nothing to follow: this replica always leads
    } else if (o.name.empty() && o.mode == serve::LeaderMode::kLease) {
      return Usage("--leader-elect-mode=lease needs a --leader-elect-resource-name");
    }
  } else {
    // Follow: the chart names the sidecar's Lease after the scheduler. Lease: a name of its
    // own, never the kube-scheduler's.
    const std::string& scheduler = f.options.scheduler_name;
    o.name = o.mode == serve::LeaderMode::kLease ? scheduler + "-tessera" : scheduler;
  }
  o.ns = f.leader_elect_resource_namespace;
  if (o.ns.empty()) {
    const char* pod_ns = std::getenv("POD_NAMESPACE");
    o.ns = pod_ns != nullptr && *pod_ns != '\0' ? pod_ns : serve::ElectorOptions{}.ns;
  }
  std::string error;
  if (!ParsePositiveDuration("--leader-elect-lease-duration", f.leader_elect_lease_duration,
                             &o.lease_duration, &error) ||
      !ParsePositiveDuration("--leader-elect-renew-deadline", f.leader_elect_renew_deadline,
                             &o.renew_deadline, &error) ||
      !ParsePositiveDuration("--leader-elect-retry-period", f.leader_elect_retry_period,
                             &o.retry_period, &error)) {
    return Usage(error);
  }
  return kExitOk;
}

int RunServe(const ServeFlags& f) {
  f.hami.LogGiven();
  serve::ServeOptions o = f.options;
  if (o.cert_file.empty() != o.key_file.empty()) {
    return Usage("--cert_file and --key_file go together: give both for TLS, or neither");
  }
  if (o.max_connections < 16) {
    return Usage("--max-connections must be at least 16");
  }
  absl::StatusOr<device::NodePolicy> node_policy = device::ParseNodePolicy(f.node_scheduler_policy);
  if (!node_policy.ok()) {
    return Usage("--node-scheduler-policy: " + std::string(node_policy.status().message()));
  }
  o.node_policy = *node_policy;
  absl::StatusOr<device::GpuPolicy> gpu_policy = device::ParseGpuPolicy(f.gpu_scheduler_policy);
  if (!gpu_policy.ok()) {
    return Usage("--gpu-scheduler-policy: " + std::string(gpu_policy.status().message()));
  }
  o.gpu_policy = *gpu_policy;
  o.trusted_annotation_writers.clear();
  for (absl::string_view user : absl::StrSplit(f.trusted_annotation_writers, ',')) {
    user = absl::StripAsciiWhitespace(user);
    if (!user.empty()) {
      o.trusted_annotation_writers.emplace_back(user);
    }
  }
  std::string error;
  if (!ParsePositiveDuration("--reservation-ttl", f.reservation_ttl, &o.reservation_ttl, &error)) {
    return Usage(error);
  }
  // HAMi's chart sets HAMI_NODELOCK_EXPIRE (scheduler.nodeLockExpire) and never passes the flag;
  // HAMi v2.10 reads the variable but then overwrites it with the flag's default. Here the flag
  // wins only when given.
  if (f.node_lock_timeout_flag->count() > 0) {
    if (!ParsePositiveDuration("--node-lock-timeout", f.node_lock_timeout, &o.node_lock_timeout,
                               &error)) {
      return Usage(error);
    }
  } else {
    std::string warning;
    o.node_lock_timeout = extender::NodeLockTimeoutFromEnv(std::getenv("HAMI_NODELOCK_EXPIRE"),
                                                           f.options.node_lock_timeout, &warning);
    if (!warning.empty()) {
      TESSERA_LOG(kWarning, "serve: {}", warning);
    }
  }
  if (f.node_lock_retry_timeout == "0") {
    o.node_lock_retry_timeout = absl::ZeroDuration();
  } else if (!absl::ParseDuration(f.node_lock_retry_timeout, &o.node_lock_retry_timeout) ||
             o.node_lock_retry_timeout < absl::ZeroDuration() ||
             o.node_lock_retry_timeout == absl::InfiniteDuration()) {
    return Usage(fmt::format(
        "--node-lock-retry-timeout: want a duration such as 28s, or 0 to fail at once, got \"{}\"",
        f.node_lock_retry_timeout));
  }
  // The periods: 0 disables, anything else must be a positive duration.
  for (auto [flag, text, period] :
       {std::tuple{"--audit-period", &f.audit_period, &o.audit_period},
        std::tuple{"--resync-period", &f.resync_period, &o.resync_period}}) {
    if (*text == "0") {
      *period = absl::ZeroDuration();
    } else if (!ParsePositiveDuration(flag, *text, period, &error)) {
      return Usage(error);
    }
  }
  if (int rc = LeaderOptions(f, &o.leader); rc != kExitOk) {
    return rc;
  }
  o.preemption = f.preemption == "self"  ? serve::PreemptionMode::kSelf
                 : f.preemption == "off" ? serve::PreemptionMode::kOff
                                         : serve::PreemptionMode::kExtender;
  if (!ParsePositiveDuration("--preemption-settle", f.preemption_settle, &o.self_preempt.settle,
                             &error)) {
    return Usage(error);
  }
  if (absl::StatusOr<serve::DebugAuthMode> mode = serve::ParseDebugAuthMode(f.debug_auth);
      mode.ok()) {
    o.debug_auth = *mode;
  } else {
    return Usage(std::string(mode.status().message()));
  }
  // HAMi's scheduler-role labels: the pod's own name and namespace from the downward API.
  if (const char* name = std::getenv("POD_NAME"); name != nullptr) {
    o.role_labels.pod_name = name;
  }
  if (const char* ns = std::getenv("POD_NAMESPACE"); ns != nullptr) {
    o.role_labels.ns = ns;
  }

  // One descriptor per connection: make room for --max-connections (docs/serve.md "Listener
  // limits").
  if (absl::StatusOr<uint64_t> files = RaiseOpenFileLimit(); !files.ok()) {
    TESSERA_LOG(kWarning, "{}; keeping the open-file limit", std::string(files.status().message()));
  } else if (*files < 2 * o.max_connections + 256) {
    TESSERA_LOG(kWarning,
                "the open-file limit {} is below twice --max-connections ({}) plus 256: "
                "connections may be refused before the cap",
                *files, o.max_connections);
  }

  // Block the stop signals before any thread starts, then wait for them here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  absl::StatusOr<std::unique_ptr<serve::Service>> service = serve::Service::Start(o);
  if (!service.ok()) {
    fmt::print(stderr, "tessera serve: {}\n", std::string(service.status().message()));
    return absl::IsInvalidArgument(service.status()) || absl::IsNotFound(service.status())
               ? kExitUsage
               : kExitFailure;
  }
  fmt::print("serving on {} (port {}); metrics on {} (port {})\n", o.http_bind, (*service)->port(),
             o.metrics_bind_address, (*service)->metrics_port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  TESSERA_LOG(kInfo, "serve: signal {}, stopping", sig);
  (*service)->Stop();
  return kExitOk;
}

}  // namespace

void AddServeCommand(CLI::App& app, Runner* run) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* sub = app.add_subcommand(
      "serve",
      "Run the scheduler extender: kube-scheduler calls /filter and /bind, HAMi's device plugin "
      "reads the annotations it writes, Prometheus scrapes /metrics. Flag names follow HAMi's "
      "scheduler, so a deployment can switch images.");
  sub->add_option("--http_bind", flags->options.http_bind,
                  "Address of the extender routes (/filter /bind /webhook /healthz /readyz), "
                  "host:port; port 0 picks a free one")
      ->capture_default_str();
  sub->add_option("--cert_file", flags->options.cert_file,
                  "TLS certificate (PEM, leaf first) for the extender; reloaded when the file "
                  "changes. With --key_file; neither = plain HTTP");
  sub->add_option("--key_file", flags->options.key_file,
                  "TLS private key (PEM) matching --cert_file");
  sub->add_option("--metrics-bind-address", flags->options.metrics_bind_address,
                  "Address of the Prometheus /metrics listener, which also serves the operator "
                  "routes /debug/ledger, /debug/audit and /debug/why (to the callers "
                  "--debug-auth admits) (\":9395\" = every interface); empty disables it")
      ->capture_default_str();
  sub->add_option("--debug-auth", flags->debug_auth,
                  "Who may read the metrics listener's /debug routes (the ledger lists every GPU "
                  "pod): loopback = only loopback peers (kubectl port-forward); kubernetes = "
                  "also callers whose bearer token the API server authenticates (TokenReview) "
                  "and allows to get the path (SubjectAccessReview on the non-resource URL, "
                  "e.g. /debug/ledger); needs RBAC create on tokenreviews and "
                  "subjectaccessreviews. /metrics and /healthz are never checked")
      ->check(CLI::IsMember({"loopback", "kubernetes"}))
      ->capture_default_str();
  sub->add_option("--max-connections", flags->options.max_connections,
                  "Open connections each listener keeps (one thread each); at the cap the one "
                  "idle longest is closed for a new one, with none idle the one stalled longest "
                  "inside a request (a head or body begun 250 ms ago or more), and with neither "
                  "the new one gets 503. The open-file limit is raised to its hard limit at start")
      ->capture_default_str();
  sub->add_option("--scheduler-name", flags->options.scheduler_name,
                  "The scheduler profile name: the source of the events Tessera records and the "
                  "schedulerName the /webhook writes into GPU pods")
      ->capture_default_str();
  sub->add_flag("--force-overwrite-default-scheduler",
                flags->options.force_overwrite_default_scheduler,
                "The /webhook also gives our scheduler name to pods that carry "
                "\"default-scheduler\" (default true); =false leaves them to the default scheduler")
      ->default_str(BoolText(flags->options.force_overwrite_default_scheduler));
  sub->add_option("--self-username", flags->options.self_username,
                  "The user the API server reports for this process's own writes, who may write "
                  "the scheduler-owned pod annotations (the /webhook denies everyone else). "
                  "Default: the subject of the client's service-account token "
                  "(system:serviceaccount:<namespace>:<name>)");
  sub->add_option("--trusted-annotation-writers", flags->trusted_annotation_writers,
                  "Comma-separated users that may also write the pod annotations HAMi's device "
                  "plugin writes at Allocate (hami.io/bind-phase, "
                  "hami.io/vgpu-devices-to-allocate, hami.io/vgpu-mig-allocations); empty: nobody")
      ->capture_default_str();
  sub->add_option("--node-scheduler-policy", flags->node_scheduler_policy,
                  "Default node policy, binpack or spread (a pod's "
                  "hami.io/node-scheduler-policy overrides it)")
      ->capture_default_str();
  sub->add_option("--gpu-scheduler-policy", flags->gpu_scheduler_policy,
                  "Default GPU policy: binpack, spread, topology-aware, mutex, numa or a chain "
                  "such as binpack,numa (hami.io/gpu-scheduler-policy overrides it)")
      ->capture_default_str();
  sub->add_option("--device-config-file", flags->options.device_config_file,
                  "HAMi's device-config YAML (the hami-scheduler-device ConfigMap); empty = "
                  "HAMi's defaults (nvidia.com/gpu, gpumem, gpucores, ...)");
  sub->add_option("--node-label-selector", flags->options.node_label_selector,
                  "Only nodes with all these labels take GPU pods: key=value[,key=value]");
  flags->node_lock_timeout_flag =
      sub->add_option("--node-lock-timeout", flags->node_lock_timeout,
                      "A node lock (hami.io/mutex.lock) older than this is taken over, unless "
                      "its pod still waits for the device plugin's Allocate. Not given: "
                      "$HAMI_NODELOCK_EXPIRE (HAMi's chart sets it), else 5m")
          ->capture_default_str();
  sub->add_option("--node-lock-retry-timeout", flags->node_lock_retry_timeout,
                  "A bind that finds the node locked by another pod's bind waits up to this "
                  "long for the lock (polling from 100 ms, backing off to 1 s) before it fails; "
                  "0 fails at once. Keep it below kube-scheduler's extender httpTimeout (30s)")
      ->capture_default_str();
  sub->add_flag("--avoid-busy-nodes", flags->options.avoid_busy_nodes,
                "Among the nodes a GPU pod fits, prefer those where no other pod's bind is in "
                "flight (its filter decision made, or HAMi's node lock held until the device "
                "plugin's Allocate): a bind there would be refused \"node locked\" and the pod "
                "scheduled again (default true); =false picks by the node policy alone, as HAMi")
      ->default_str(BoolText(flags->options.avoid_busy_nodes));
  sub->add_option("--reservation-ttl", flags->reservation_ttl,
                  "How long a filter decision holds its devices while waiting for bind")
      ->capture_default_str();
  sub->add_option("--audit-period", flags->audit_period,
                  "Every this often the ledger is recomputed from the informers' objects and "
                  "repaired where it differs (counted in tessera_ledger_audit_corrections_total); "
                  "0 disables")
      ->capture_default_str();
  sub->add_option("--resync-period", flags->resync_period,
                  "Every this often (jittered by 10%) pods and nodes are LISTed from the API "
                  "server in pages of 500 and the informers repaired where they differ (lost "
                  "watch events; counted in tessera_resync_corrections_total); 0 disables")
      ->capture_default_str();
  sub->add_option("--kube-qps", flags->options.kube_qps,
                  "Client-side limit of API requests per second (0 = unlimited)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--kube-burst", flags->options.kube_burst, "Burst of the client-side limit")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--requeue-qps", flags->options.requeue.qps,
                  "Refused GPU pods are put back into kube-scheduler's queue (an update of their "
                  "tessera.io/requeue annotation) as soon as capacity they fit in frees where "
                  "kube-scheduler cannot see it (a reservation expired, a repair, a device "
                  "healthy again, a quota raised): at most this many writes per second "
                  "(0 = off; docs/requeue.md)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--requeue-burst", flags->options.requeue.burst,
                  "Burst of the requeue's write limit")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--preemption", flags->preemption,
                  "How a pending GPU pod of higher priority gets the share it needs from pods of "
                  "lower priority (docs/preemption.md): extender = answer kube-scheduler's "
                  "/preempt with the fewest victims on concrete devices (Kubernetes 1.38 and "
                  "later ask for it); self = also evict them through the Eviction API for a pod "
                  "of priority above 0 Tessera keeps refusing (kube-scheduler before 1.38 never "
                  "asks; needs RBAC create on pods/eviction); off = /preempt answers 404 and "
                  "nobody is evicted")
      ->check(CLI::IsMember({"extender", "self", "off"}))
      ->capture_default_str();
  sub->add_option("--preemption-settle", flags->preemption_settle,
                  "With --preemption=self: how long a pod must stay refused before Tessera evicts "
                  "for it (kube-scheduler may still be retrying it, or capacity freeing)")
      ->capture_default_str();
  sub->add_option("--patch-threads", flags->options.patch_threads,
                  "Threads writing the filter's annotation patches behind its reply")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_flag("--legacy-metrics", flags->options.legacy_metrics,
                "Also export the v2.5-era metric names (GPUDeviceMemoryAllocated, ...)");
  sub->add_flag("--scheduler-role-labels", flags->options.role_labels.enabled,
                "The leader sets HAMi's label hami.io/scheduler-role (leader/follower) on the "
                "pods app.kubernetes.io/component=hami-scheduler of $POD_NAMESPACE, its own pod "
                "being $POD_NAME (default true; off without POD_NAME); =false never writes it")
      ->default_str(BoolText(flags->options.role_labels.enabled));
  sub->add_option("--kubeconfig", flags->options.kube.path,
                  "kubeconfig file; default: $KUBECONFIG when set, else in-cluster when "
                  "KUBERNETES_SERVICE_HOST is set, else ~/.kube/config");
  sub->add_option("--context", flags->options.kube.context,
                  "kubeconfig context (default: current-context)");
  flags->leader_elect_flag =
      sub->add_flag("--leader-elect", flags->leader_elect,
                    "HAMi's flag: --leader-elect (=true) follows the kube-scheduler Lease named by "
                    "--leader-elect-resource-name, as HAMi v2.8+ does (the default anyway); "
                    "--leader-elect=false turns leader election off (every replica writes)");
  flags->leader_elect_mode_flag =
      sub->add_option("--leader-elect-mode", flags->leader_elect_mode,
                      "Which replica runs the background writers (node handshakes): follow = "
                      "the one whose co-located kube-scheduler holds the Lease (holder "
                      "<hostname>_...; a missing Lease counts as no election: lead); lease = "
                      "Tessera holds its own Lease (client-go's algorithm, released on stop); "
                      "none = always lead")
          ->capture_default_str();
  flags->leader_elect_name_flag = sub->add_option(
      "--leader-elect-resource-name", flags->leader_elect_resource_name,
      "The Lease: follow mode reads it, lease mode holds it. Default: the --scheduler-name "
      "(hami-scheduler, the name HAMi's chart gives the kube-scheduler's Lease); in lease mode "
      "<scheduler-name>-tessera. \"\" in follow mode = leader election off");
  sub->add_option("--leader-elect-resource-namespace", flags->leader_elect_resource_namespace,
                  "Namespace of the Lease. Default: $POD_NAMESPACE, else kube-system");
  sub->add_option("--leader-elect-identity", flags->options.leader.identity,
                  "This replica's name: follow mode leads when the holder is <identity>_...; "
                  "lease mode holds the Lease as <identity>_<uuid>. Default: the host name "
                  "(the pod name)");
  sub->add_option("--leader-elect-lease-duration", flags->leader_elect_lease_duration,
                  "lease: how long a holder's claim lasts after its last change before another "
                  "replica may take over; follow: the duration of a Lease that states none")
      ->capture_default_str();
  sub->add_option("--leader-elect-renew-deadline", flags->leader_elect_renew_deadline,
                  "lease: the leader steps down when no renewal has succeeded for this long "
                  "(less than the lease duration)")
      ->capture_default_str();
  sub->add_option("--leader-elect-retry-period", flags->leader_elect_retry_period,
                  "How often the Lease is renewed or tried (lease) or read (follow)")
      ->capture_default_str();
  flags->hami.AddHamiFlags(*sub);
  sub->callback([run, flags] { *run = [flags] { return RunServe(*flags); }; });
}

}  // namespace tessera::cmd
