#include "tessera/sim/simulation.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/apisim/tls.h"
#include "tessera/base/child_process.h"
#include "tessera/base/clock.h"
#include "tessera/base/logging.h"
#include "tessera/base/mutex.h"
#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/mig_geometry.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/transport.h"
#include "tessera/sim/control_plane.h"
#include "tessera/sim/emulators.h"
#include "tessera/sim/mig_oracle.h"
#include "tessera/sim/quota_oracle.h"
#include "tessera/sim/synthetic.h"

namespace tessera::sim {
namespace {

using nlohmann::json;
constexpr char kNamespace[] = "default";

// ---- timed task queue -----------------------------------------------------------------------

class TaskQueue {
 public:
  void Post(absl::Time at, std::function<void()> fn) {
    MutexLock l(&mu_);
    q_.push(Item{at, seq_++, std::move(fn)});
    cv_.Signal();
  }
  void Start(int workers) {
    for (int i = 0; i < workers; ++i) {
      threads_.emplace_back([this] { Work(); });
    }
  }
  void Stop() {
    {
      MutexLock l(&mu_);
      stop_ = true;
      cv_.SignalAll();
    }
    for (std::thread& t : threads_) {
      t.join();
    }
    threads_.clear();
  }
  size_t pending() {
    MutexLock l(&mu_);
    return q_.size();
  }

 private:
  struct Item {
    absl::Time at;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Item& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  void Work() {
    while (true) {
      std::function<void()> fn;
      {
        MutexLock l(&mu_);
        while (!stop_) {
          if (!q_.empty() && q_.top().at <= absl::Now()) {
            break;
          }
          const absl::Duration wait =
              q_.empty() ? absl::Milliseconds(200)
                         : std::min(absl::Milliseconds(200), q_.top().at - absl::Now());
          cv_.WaitFor(&mu_, absl::ToChronoMicroseconds(std::max(wait, absl::Microseconds(100))));
        }
        if (stop_) {
          return;
        }
        fn = std::move(const_cast<Item&>(q_.top()).fn);
        q_.pop();
      }
      fn();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> q_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

enum class Stage { kCreating, kPending, kBound, kRunning, kSucceeded, kDeleting, kGone };

struct SimPod {
  std::string name, uid, json, node;
  Stage stage = Stage::kCreating;
  bool full_nodes = false;
  bool ever_unschedulable = false;
  int tries = 0;
};

struct SimNode {
  std::string name;
  std::string json;  // with the registration, for full-Nodes filters
  std::unique_ptr<DevicePlugin> plugin;
  bool alive = true;
  bool mig = false;      // its cards registered in mig mode
  bool stopped = false;  // plugin_stop
  absl::Time next_report;
};

struct Children {
  ChildProcess apisim, serve;
  std::vector<std::string> apisim_args, serve_args;
  int apisim_port = 0, http_port = 0, metrics_port = 0;
};

std::string RandomHex(std::mt19937_64& rng, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) {
    s += fmt::format("{:02x}", static_cast<unsigned>(rng() & 0xff));
  }
  return s;
}

absl::Status WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  return out ? absl::OkStatus() : absl::InternalError("cannot write " + path);
}

// "... (port N) ..." → N, the `which`-th occurrence.
int PortOf(const std::string& line, int which) {
  size_t pos = 0;
  for (int i = 0; i <= which; ++i) {
    pos = line.find("(port ", pos);
    if (pos == std::string::npos) {
      return 0;
    }
    pos += 6;
  }
  return std::atoi(line.c_str() + pos);
}

class Simulation {
 public:
  explicit Simulation(const SimulationOptions& o)
      : o_(o),
        s_(o.scenario),
        real_(o.control_plane == ControlPlaneKind::kReal),
        rng_(s_.seed),
        oracle_(s_.window),
        workload_(s_.shapes, "hami-scheduler", s_.gpu_types.front()) {}

  absl::StatusOr<RunResult> Run();

 private:
  absl::Status StartChildren(const std::vector<std::string>& serve_extra);
  absl::StatusOr<RunResult> RunWorkload();
  absl::Status StartApisim(bool restart);
  // kReal: tools/controlplane.sh up, serve's flags, the kubeconfig and ports.
  absl::Status StartReal(const std::vector<std::string>& serve_args);
  absl::Status StartServe(bool restart);
  absl::Status MakeTransports();
  absl::Status CreateNodes();
  // The scenario's namespaces, each with its ResourceQuota "gpu" (and, on the real control
  // plane, its default ServiceAccount).
  absl::Status CreateQuotaNamespaces();
  // The path prefix of the pods the workload creates: one namespace, or all of them.
  std::string PodScope() const {
    return s_.namespaces.empty() ? fmt::format("/api/v1/namespaces/{}", kNamespace) : "/api/v1";
  }
  absl::Status WaitReady();
  void Tick(absl::Time now, absl::Duration elapsed);
  // The v2.5 plugins whose handshake report is due (every 30 s, as the plugin does; HAMi v2.5
  // takes a node's devices only from a fresh `Reported`); their next one is scheduled.
  std::vector<DevicePlugin*> DueReports(absl::Time now);
  void Progress(absl::Duration elapsed, bool final);

  // pod pipeline (worker threads)
  void CreateTask(const std::string& name);
  void ScheduleTask(const std::string& name);
  void AllocateTask(const std::string& name, int tries);
  void StartTask(const std::string& name);
  void FinishTask(const std::string& name);
  void CleanupTask(const std::string& name);
  void DeleteTask(const std::string& name, bool force);
  void TerminateTask(const std::string& name);
  void DeleteRandomLive(int n, bool force = false);

  // faults
  void Fault(const FaultSpec& f);
  // kReal: the scenario's fault on the real control plane, or recorded as skipped.
  void RealFault(const FaultSpec& f);
  // kReal: serve frozen (SIGSTOP), kube-apiserver killed and restarted (every watch cut),
  // `burst` live pods deleted, until the revision before the deletions is compacted and at least
  // `duration` passed; then serve thawed: its watches resume into 410 and relist.
  void RealWatchLoss(const FaultSpec& f, bool force);
  bool WaitApiserver(absl::Duration limit);
  std::vector<std::string> PickLive(int n);
  // kReal: the pods as kube-scheduler and the API server left them (bindings, unschedulable,
  // graceful deletions for the kubelet); the poll loop's thread.
  void PollLoop();
  void Poll();
  // kReal: what the kubelet does for kube-scheduler's static pod: start it again when it exits
  // (stock kube-scheduler exits when it loses its Lease, e.g. over a kube-apiserver restart).
  void SuperviseLoop();
  // kReal: a pod as the informer delivered it; bound → the node's plugin and kubelet start,
  // bound and being deleted → the kubelet finishes it.
  void OnPodSeen(const kube::Pod& pod);
  void PushFaults();
  void RecordFault(std::string kind, std::string detail);

  // oracle thread
  void OracleLoop();
  void Observe();

  std::vector<std::string> AliveNodes() {
    MutexLock l(&mu_);
    std::vector<std::string> out;
    for (const SimNode& n : nodes_) {
      if (n.alive) {
        out.push_back(n.name);
      }
    }
    return out;
  }
  SimNode* NodeByName(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = node_index_.find(name);
    return it == node_index_.end() ? nullptr : &nodes_[it->second];
  }
  absl::Time Now() const { return absl::Now(); }
  uint64_t Rand() {
    MutexLock l(&rng_mu_);
    return rng_();
  }

  const SimulationOptions& o_;
  const Scenario& s_;
  const bool real_;
  std::string dir_;
  std::unique_ptr<RealControlPlane> cp_;  // kReal
  // kReal: what a kubelet watches (bindings, deletions); Poll() is its backstop.
  std::unique_ptr<kube::Informer<kube::Pod>> pod_informer_;
  Children ch_;
  Mutex child_mu_;  // restarts of children
  Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_);

  std::unique_ptr<kube::CurlTransport> api_t_, ext_t_, met_t_;
  std::unique_ptr<kube::ApiClient> client_;
  // Connections of their own for the node side (device plugins, kubelets) and for the
  // oracle's LISTs, so that neither waits behind the other's traffic.
  std::unique_ptr<kube::CurlTransport> node_t_, obs_t_;
  std::unique_ptr<kube::ApiClient> node_client_, obs_client_;
  std::unique_ptr<ExtenderClient> extender_;
  TaskQueue tasks_;
  // Node-side work (device plugins, kubelets) on workers of its own, so that a backlog of
  // scheduling retries never delays the plugin's lock release (each node has its own agents).
  TaskQueue node_tasks_;
  // Faults (and their ends) on workers of their own, so they fire on schedule even when an
  // error storm keeps every scheduling worker in retries.
  TaskQueue fault_tasks_;

  Mutex mu_;
  std::map<std::string, SimPod> pods_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> pod_names_ ABSL_GUARDED_BY(mu_);
  std::vector<SimNode> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> node_index_ ABSL_GUARDED_BY(mu_);
  SchedulingQueue queue_ ABSL_GUARDED_BY(mu_);
  std::vector<double> filter_ms_ ABSL_GUARDED_BY(mu_);
  RunResult r_ ABSL_GUARDED_BY(mu_);
  std::string last_fault_ ABSL_GUARDED_BY(mu_);
  absl::Time last_fault_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool workload_on_ ABSL_GUARDED_BY(mu_) = true;
  int64_t diverging_now_ ABSL_GUARDED_BY(mu_) = 0;

  Mutex fault_mu_;
  std::optional<std::pair<std::string, double>> drop_ ABSL_GUARDED_BY(fault_mu_);
  struct Fail {
    int code;
    double probability;
    std::vector<std::string> verbs;
  };
  std::optional<Fail> fail_ ABSL_GUARDED_BY(fault_mu_);

  Mutex oracle_mu_;
  Oracle oracle_ ABSL_GUARDED_BY(oracle_mu_);
  std::atomic<bool> oracle_stop_{false};
  std::set<std::string> terminating_ ABSL_GUARDED_BY(mu_);  // kReal: the kubelet is on it
  absl::Time start_;
  Workload workload_;
};

absl::Status Simulation::StartApisim(bool restart) {
  const std::string log = dir_ + "/apisim.log";
  absl::StatusOr<std::string> line;
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::vector<std::string> args = ch_.apisim_args;
    if (restart) {
      args[2] = fmt::format("127.0.0.1:{}", ch_.apisim_port);
    }
    line = ch_.apisim.Start(o_.binary, args, log);
    if (line.ok() || !restart) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));  // the port may still be held for a moment
  }
  if (!line.ok()) {
    return absl::FailedPreconditionError("tessera apisim: " + std::string(line.status().message()));
  }
  const size_t colon = line->rfind(':');
  ch_.apisim_port = colon == std::string::npos ? 0 : std::atoi(line->c_str() + colon + 1);
  if (ch_.apisim_port <= 0) {
    return absl::FailedPreconditionError("tessera apisim printed an unexpected line: " + *line);
  }
  return absl::OkStatus();
}

absl::Status Simulation::StartServe(bool restart) {
  const std::string log = dir_ + "/serve.log";
  absl::StatusOr<std::string> line;
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::vector<std::string> args = ch_.serve_args;
    if (restart) {
      for (size_t i = 0; i + 1 < args.size(); ++i) {
        if (args[i] == "--http_bind") {
          args[i + 1] = fmt::format("127.0.0.1:{}", ch_.http_port);
        }
        if (args[i] == "--metrics-bind-address") {
          args[i + 1] = fmt::format("127.0.0.1:{}", ch_.metrics_port);
        }
      }
    }
    line = ch_.serve.Start(o_.binary, args, log);
    if (line.ok() || !restart) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!line.ok()) {
    return absl::FailedPreconditionError("tessera serve: " + std::string(line.status().message()));
  }
  ch_.http_port = PortOf(*line, 0);
  ch_.metrics_port = PortOf(*line, 1);
  if (ch_.http_port <= 0 || ch_.metrics_port <= 0) {
    return absl::FailedPreconditionError("tessera serve printed an unexpected line: " + *line);
  }
  return absl::OkStatus();
}

absl::Status Simulation::MakeTransports() {
  kube::KubeconfigOptions ko;
  ko.path = real_ ? cp_->env().kubeconfig : dir_ + "/kubeconfig";
  TESSERA_ASSIGN_OR_RETURN(kube::RestConfig config, kube::LoadKubeconfig(ko));
  config.qps = 0;  // the emulators are many clients; no client-side limit
  config.request_timeout = absl::Seconds(20);
  config.connect_timeout = absl::Seconds(3);
  TESSERA_ASSIGN_OR_RETURN(
      api_t_, kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real())));
  auto options = [] {
    kube::ApiClient::Options co;
    co.retry.max_attempts = 3;
    co.retry.backoff = {absl::Milliseconds(50), absl::Milliseconds(500), 2.0, 0.5};
    co.retry.max_retry_after = absl::Seconds(1);
    return co;
  };
  client_ = std::make_unique<kube::ApiClient>(api_t_.get(), options());
  TESSERA_ASSIGN_OR_RETURN(
      node_t_, kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real())));
  node_client_ = std::make_unique<kube::ApiClient>(node_t_.get(), options());
  TESSERA_ASSIGN_OR_RETURN(
      obs_t_, kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real())));
  obs_client_ = std::make_unique<kube::ApiClient>(obs_t_.get(), options());
  kube::RestConfig ext;
  ext.server = fmt::format("http://127.0.0.1:{}", ch_.http_port);
  ext.qps = 0;
  ext.request_timeout = absl::Seconds(30);
  ext.connect_timeout = absl::Seconds(2);
  if (!real_) {  // on the real control plane kube-scheduler calls the extender
    TESSERA_ASSIGN_OR_RETURN(ext_t_, kube::CurlTransport::Create(ext, nullptr));
    extender_ = std::make_unique<ExtenderClient>(ext_t_.get());
  }
  kube::RestConfig met = ext;
  met.server = fmt::format("http://127.0.0.1:{}", ch_.metrics_port);
  met.request_timeout = absl::Seconds(5);
  TESSERA_ASSIGN_OR_RETURN(met_t_, kube::CurlTransport::Create(met, nullptr));
  return absl::OkStatus();
}

absl::Status Simulation::CreateNodes() {
  std::vector<SimNode> nodes;
  const std::vector<bool> mig_nodes = s_.MigNodes();
  size_t mig_index = 0;
  for (int i = 0; i < s_.nodes; ++i) {
    const size_t type = static_cast<size_t>(i) % s_.gpu_types.size();
    const device::MigGpuModel* model = nullptr;
    if (mig_nodes[static_cast<size_t>(i)]) {
      const std::string& name = s_.mig_models[mig_index++ % s_.mig_models.size()];
      for (const device::MigGpuModel& m : device::MigGpuModels()) {
        model = m.model == name ? &m : model;
      }
    }
    std::vector<device::DeviceInfo> devices;
    for (int g = 0; g < s_.gpus_per_node; ++g) {
      device::DeviceInfo d;
      d.id = GpuUuid(i, g);
      d.index = g;
      d.count = s_.slots;
      d.devmem = s_.devmem_mib[type];
      d.devcore = 100;
      d.type = s_.gpu_types[type];
      d.numa = g < s_.gpus_per_node / 2 ? 0 : 1;
      if (model != nullptr) {
        // HAMi v2.10's plugin in `mig` mode: the model's NVML name, its whole memory, and the
        // profiles of its geometry (an allowlist of every profile); as many slots as 1g
        // instances fit (the plugin registers count = the card's maximum instances).
        d.type = fmt::format("NVIDIA {}", model->type_fragments.front());
        d.devmem = model->memory_mib;
        d.mode = "mig";
        d.mig_profiles = device::MigProfilesOf(*model);
        d.count = static_cast<int32_t>(model->profiles.front().max_instances);
      }
      devices.push_back(d);
    }
    const bool delimited = model == nullptr && s_.IsDelimitedNode(i);
    SimNode n;
    n.name = NodeName(i);
    n.mig = model != nullptr;
    n.plugin = std::make_unique<DevicePlugin>(
        n.name, delimited ? device::RegisterFormat::kDelimited : device::RegisterFormat::kJson,
        devices);
    json node = {
        {"apiVersion", "v1"},
        {"kind", "Node"},
        {"metadata",
         {{"name", n.name}, {"labels", {{"kubernetes.io/hostname", n.name}, {"gpu", "on"}}}}},
        {"spec", json::object()},
        {"status",
         {{"allocatable",
           {{"cpu", "64"},
            {"memory", "512Gi"},
            {"nvidia.com/gpu", std::to_string(s_.gpus_per_node * s_.slots)}}},
          {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
    TESSERA_RETURN_IF_ERROR(CreateNode(*api_t_, node.dump()));
    if (real_) {
      // A real API server takes the status only through its subresource, and tainted the node
      // not-ready; kube-scheduler needs `pods` in allocatable.
      json status = node["status"];
      status["allocatable"]["pods"] = "1000";
      status["capacity"] = status["allocatable"];
      const std::string now =
          absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
      status["conditions"] = {{{"type", "Ready"},
                               {"status", "True"},
                               {"reason", "KubeletReady"},
                               {"message", "tessera simulate's kubelet"},
                               {"lastHeartbeatTime", now},
                               {"lastTransitionTime", now}}};
      TESSERA_RETURN_IF_ERROR(MakeNodeReady(*api_t_, n.name, status.dump()));
    }
    TESSERA_RETURN_IF_ERROR(n.plugin->Register(*client_, absl::Now()));
    node["metadata"]["annotations"] = {
        {std::string(device::kNodeRegisterAnnotation), n.plugin->RegisterValue()}};
    n.json = node.dump();
    n.next_report = absl::Now() + absl::Seconds(30);
    nodes.push_back(std::move(n));
  }
  MutexLock l(&mu_);
  nodes_ = std::move(nodes);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    node_index_[nodes_[i].name] = i;
  }
  return absl::OkStatus();
}

absl::Status Simulation::WaitReady() {
  // Ready, and every registered device visible in /metrics. HAMi v2.5 answers a report on its
  // 15 s tick, and a node whose report it overwrote waits for the plugin's next one (30 s).
  const absl::Duration limit = o_.hami_bin.empty() ? absl::Seconds(60) : absl::Seconds(120);
  const absl::Time deadline = absl::Now() + limit;
  const size_t want = static_cast<size_t>(s_.nodes) * static_cast<size_t>(s_.gpus_per_node);
  while (absl::Now() < deadline && !SimulationInterrupted().load()) {
    for (DevicePlugin* p : DueReports(absl::Now())) {
      (void)p->Register(*client_, absl::Now());
    }
    kube::Request r;
    r.path = "/metrics";
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    absl::StatusOr<kube::Response> resp = kube::Do(*met_t_, r, std::move(once));
    if (resp.ok()) {
      absl::StatusOr<Exported> e = ParseMetrics(resp->body);
      if (e.ok() && e->devices.size() >= want) {
        return absl::OkStatus();
      }
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(fmt::format(
      "{} did not export the {} devices within {} (see {})",
      real_ ? cp_->env().extender : "tessera serve", want, absl::FormatDuration(limit),
      real_ ? fmt::format("{}/{}.log", cp_->env().dir, cp_->env().extender) : dir_ + "/serve.log"));
}

// ---- pod pipeline ---------------------------------------------------------------------------

void Simulation::CreateTask(const std::string& name) {
  std::string body;
  bool full_nodes;
  {
    MutexLock l(&rng_mu_);
    const Shape shape = workload_.Pick(rng_);
    body = workload_.PodJson(shape, s_.NamespaceOf(name), name, rng_);
    full_nodes = std::uniform_real_distribution<double>(0, 1)(rng_) < s_.full_nodes_share;
  }
  absl::StatusOr<std::string> created = CreatePod(*api_t_, s_.NamespaceOf(name), name, body);
  MutexLock l(&mu_);
  SimPod& p = pods_[name];
  if (!created.ok()) {
    if (++p.tries < 30 && workload_on_) {
      tasks_.Post(Now() + absl::Milliseconds(300), [this, name] { CreateTask(name); });
    } else {
      p.stage = Stage::kGone;
    }
    return;
  }
  json j = json::parse(*created, nullptr, false);
  p.uid = j.is_object() ? j["metadata"].value("uid", "") : "";
  p.json = std::move(*created);
  p.full_nodes = full_nodes;
  p.tries = 0;
  if (p.stage == Stage::kCreating) {
    p.stage = Stage::kPending;
    ++r_.created;
    if (!real_) {  // else the real kube-scheduler's
      tasks_.Post(Now(), [this, name] { ScheduleTask(name); });
    }
  }
}

void Simulation::ScheduleTask(const std::string& name) {
  std::string pod_json, uid;
  bool full_nodes;
  std::vector<std::string> node_json;
  {
    MutexLock l(&mu_);
    auto it = pods_.find(name);
    if (it == pods_.end() || it->second.stage != Stage::kPending) {
      return;
    }
    pod_json = it->second.json;
    uid = it->second.uid;
    full_nodes = it->second.full_nodes;
    if (full_nodes) {
      for (const SimNode& n : nodes_) {
        if (n.alive) {
          node_json.push_back(n.json);
        }
      }
    }
  }
  const std::vector<std::string> names = AliveNodes();
  if (full_nodes) {
    absl::StatusOr<FilterOutcome> preview = extender_->FilterNodes(pod_json, node_json);
    MutexLock l(&mu_);
    if (preview.ok()) {
      ++r_.full_nodes_filters;
      filter_ms_.push_back(absl::ToDoubleMilliseconds(preview->latency));
    }
  }
  absl::StatusOr<FilterOutcome> f = extender_->Filter(pod_json, names);
  absl::Duration retry;
  {
    MutexLock l(&mu_);
    SimPod& p = pods_[name];
    if (!f.ok()) {
      ++r_.filter_errors;
      retry = absl::Milliseconds(500);
    } else {
      filter_ms_.push_back(absl::ToDoubleMilliseconds(f->latency));
      if (f->node.empty()) {
        ++r_.unschedulable_attempts;
        if (absl::StrContains(f->failed_reason, "ResourceQuotaNotFit")) {
          ++r_.quota_refusals;
        }
        if (std::any_of(f->failed_reasons.begin(), f->failed_reasons.end(),
                        [](const std::string& why) {
                          return absl::StrContains(why, "CardMigTopologyInfeasible");
                        })) {
          ++r_.mig_refusals;
        }
        if (!p.ever_unschedulable) {
          p.ever_unschedulable = true;
          ++r_.unschedulable;
        }
        retry = queue_.Failed(name);
      }
    }
    if (retry > absl::ZeroDuration()) {
      if (p.stage == Stage::kPending) {
        tasks_.Post(Now() + retry, [this, name] { ScheduleTask(name); });
      }
      return;
    }
  }
  absl::Status bound = extender_->Bind(s_.NamespaceOf(name), name, uid, f->node);
  MutexLock l(&mu_);
  SimPod& p = pods_[name];
  if (!bound.ok()) {
    ++r_.bind_errors;
    if (p.stage == Stage::kPending) {
      const absl::Duration d = queue_.Failed(name) / 4;  // lock contention clears fast
      tasks_.Post(Now() + d, [this, name] { ScheduleTask(name); });
    }
    return;
  }
  queue_.Forget(name);
  ++r_.scheduled;
  if (const SimNode* n = NodeByName(f->node); n != nullptr && n->mig) {
    ++r_.mig_pods;
  }
  if (p.stage == Stage::kPending) {
    p.stage = Stage::kBound;
    p.node = f->node;
    node_tasks_.Post(Now(), [this, name] { AllocateTask(name, 0); });
  }
}

void Simulation::AllocateTask(const std::string& name, int tries) {
  DevicePlugin* plugin = nullptr;
  {
    MutexLock l(&mu_);
    auto it = pods_.find(name);
    if (it == pods_.end() || it->second.stage != Stage::kBound) {
      return;
    }
    SimNode* n = NodeByName(it->second.node);
    if (n == nullptr || !n->alive) {
      return;
    }
    if (n->stopped) {  // the kubelet waits for the plugin
      node_tasks_.Post(Now() + absl::Seconds(1),
                       [this, name, tries] { AllocateTask(name, tries); });
      return;
    }
    plugin = n->plugin.get();
  }
  absl::StatusOr<AllocateResult> a = plugin->Allocate(*node_client_, s_.NamespaceOf(name), name);
  if (a.ok() && !a->failure.empty()) {
    // The plugin could not realise a MIG reservation the scheduler wrote: a wrong placement.
    MutexLock o(&oracle_mu_);
    oracle_.AddViolation(Now(), fmt::format("the device plugin of {} failed pod {}: {}",
                                            plugin->node(), a->name, a->failure));
  }
  MutexLock l(&mu_);
  if (a.ok()) {
    r_.mig_instances += a->mig_instances;
  }
  if (a.ok() && a->success && a->name == name) {
    ++r_.allocations;
    node_tasks_.Post(Now(), [this, name] { StartTask(name); });
    return;
  }
  // On the real control plane kube-apiserver restarts (several seconds each, back to back under
  // chaos) can outlast 60 tries; a kubelet keeps retrying, and giving up would leave the node
  // lock held by a bound pod that is never allocated.
  if (tries < (real_ ? 600 : 60)) {
    node_tasks_.Post(Now() + absl::Milliseconds(250),
                     [this, name, tries] { AllocateTask(name, tries + 1); });
  }
}

void Simulation::StartTask(const std::string& name) {
  {
    MutexLock l(&mu_);
    auto it = pods_.find(name);
    if (it == pods_.end() || it->second.stage != Stage::kBound) {
      return;
    }
  }
  absl::Status s = Kubelet::Start(*node_t_, s_.NamespaceOf(name), name);
  absl::Duration life;
  {
    MutexLock l(&rng_mu_);
    life = Kubelet::Lifetime(s_.lifetime_min, s_.lifetime_max, rng_);
  }
  MutexLock l(&mu_);
  SimPod& p = pods_[name];
  if (!s.ok()) {
    if (p.stage == Stage::kBound && !absl::IsNotFound(s)) {
      node_tasks_.Post(Now() + absl::Milliseconds(300), [this, name] { StartTask(name); });
    }
    return;
  }
  if (p.stage == Stage::kBound) {
    p.stage = Stage::kRunning;
    tasks_.Post(Now() + life, [this, name] { FinishTask(name); });
  }
}

void Simulation::FinishTask(const std::string& name) {
  {
    MutexLock l(&mu_);
    auto it = pods_.find(name);
    if (it == pods_.end() || it->second.stage != Stage::kRunning) {
      return;
    }
  }
  absl::Status s = Kubelet::Finish(*node_t_, s_.NamespaceOf(name), name);
  MutexLock l(&mu_);
  SimPod& p = pods_[name];
  if (!s.ok()) {
    tasks_.Post(Now() + absl::Milliseconds(300), [this, name] { FinishTask(name); });
    return;
  }
  if (p.stage == Stage::kRunning) {
    p.stage = Stage::kSucceeded;
    ++r_.completed;
    // A TTL controller removes finished pods a moment later.
    tasks_.Post(Now() + absl::Seconds(1), [this, name] { CleanupTask(name); });
  }
}

void Simulation::CleanupTask(const std::string& name) {
  absl::Status s = DeletePod(*api_t_, s_.NamespaceOf(name), name, 0);
  MutexLock l(&mu_);
  SimPod& p = pods_[name];
  if (!s.ok()) {
    tasks_.Post(Now() + absl::Milliseconds(500), [this, name] { CleanupTask(name); });
    return;
  }
  if (p.stage != Stage::kGone) {
    p.stage = Stage::kGone;
    ++r_.deleted;
  }
}

void Simulation::DeleteTask(const std::string& name, bool force) {
  Stage before;
  {
    MutexLock l(&mu_);
    auto it = pods_.find(name);
    if (it == pods_.end()) {
      return;
    }
    before = it->second.stage;
    if (before != Stage::kPending && before != Stage::kBound && before != Stage::kRunning) {
      return;
    }
    it->second.stage = Stage::kDeleting;
  }
  // Graceful (30 s) unless forced: a forced delete removes the pod at once, with one DELETED
  // event and no update before it.
  absl::Status s = DeletePod(*api_t_, s_.NamespaceOf(name), name, force ? 0 : -1);
  MutexLock l(&mu_);
  SimPod& p = pods_[name];
  if (!s.ok()) {
    p.stage = before;  // try another time
    return;
  }
  if (before == Stage::kPending || force) {
    // Unbound or forced: gone at once (a bind racing with it fails on the server).
    p.stage = Stage::kGone;
    ++r_.deleted;
    return;
  }
  // The kubelet stops the containers, then reports the pod terminal; the API server then
  // removes it (graceful deletion; on a real one the kubelet's DELETE with grace 0 does).
  terminating_.insert(name);
  tasks_.Post(Now() + absl::Milliseconds(300), [this, name] { TerminateTask(name); });
}

void Simulation::TerminateTask(const std::string& name) {
  absl::Status s = Kubelet::Finish(*node_t_, s_.NamespaceOf(name), name);
  if (real_ && (s.ok() || absl::IsNotFound(s))) {
    // A real API server keeps a gracefully deleted pod until its kubelet deletes it with grace
    // 0 once the containers stopped.
    s = DeletePod(*node_t_, s_.NamespaceOf(name), name, 0);
  }
  MutexLock l(&mu_);
  SimPod& p = pods_[name];
  if (!s.ok()) {
    tasks_.Post(Now() + absl::Milliseconds(500), [this, name] { TerminateTask(name); });
    return;
  }
  if (p.stage != Stage::kGone) {
    p.stage = Stage::kGone;
    ++r_.deleted;
  }
}

void Simulation::DeleteRandomLive(int n, bool force) {
  for (std::string& name : PickLive(n)) {
    tasks_.Post(Now(), [this, name, force] { DeleteTask(name, force); });
  }
}

std::vector<std::string> Simulation::PickLive(int n) {
  std::vector<std::string> picked;
  {
    MutexLock l(&mu_);
    for (int attempt = 0; attempt < n * 20 && static_cast<int>(picked.size()) < n; ++attempt) {
      if (pod_names_.empty()) {
        break;
      }
      const std::string& name = pod_names_[Rand() % pod_names_.size()];
      const Stage st = pods_[name].stage;
      if ((st == Stage::kRunning || st == Stage::kBound || st == Stage::kPending) &&
          std::find(picked.begin(), picked.end(), name) == picked.end()) {
        picked.push_back(name);
      }
    }
  }
  return picked;
}

// ---- faults ---------------------------------------------------------------------------------

void Simulation::RecordFault(std::string kind, std::string detail) {
  MutexLock l(&mu_);
  r_.faults.push_back({Now() - start_, kind, std::move(detail)});
  last_fault_ = std::move(kind);
  last_fault_at_ = Now();
}

void Simulation::PushFaults() {
  json cfg = json::object();
  {
    MutexLock l(&fault_mu_);
    if (drop_.has_value()) {
      cfg["dropWatchEvents"] = {{{"resource", "pods"},
                                 {"type", drop_->first},
                                 {"probability", drop_->second},
                                 {"count", -1}}};
    }
    if (fail_.has_value()) {
      cfg["failRequests"] = {
          {"probability", fail_->probability}, {"code", fail_->code}, {"verbs", fail_->verbs}};
    }
  }
  kube::Request r;
  r.path = "/simulator/v1/faults";
  if (cfg.empty()) {
    r.method = "DELETE";
  } else {
    cfg["seed"] = s_.seed;
    r.method = "PUT";
    r.body = cfg.dump();
    r.content_type = "application/json";
  }
  absl::Status s = kube::Do(*api_t_, r, QuickRetry()).status();
  if (!s.ok()) {
    TESSERA_LOG(kWarning, "simulate: {} /simulator/v1/faults: {}", r.method, s.ToString());
  }
}

void Simulation::Fault(const FaultSpec& f) {
  if (real_ && f.kind != FaultKind::kNodeDelete && f.kind != FaultKind::kPluginStop) {
    RealFault(f);  // the emulators' own faults (node, plugin) run below on both
    return;
  }
  const std::string kind(FaultKindName(f.kind));
  auto simulator = [this](const char* path) {
    kube::Request r;
    r.method = "POST";
    r.path = path;
    return kube::Do(*api_t_, r, QuickRetry()).status();
  };
  switch (f.kind) {
    case FaultKind::kDropEvents: {
      {
        MutexLock l(&fault_mu_);
        drop_ = std::make_pair(f.event_type, f.probability);
      }
      PushFaults();
      RecordFault(kind, fmt::format("{} pod events dropped (p={}) for {}",
                                    f.event_type.empty() ? "all" : f.event_type, f.probability,
                                    absl::FormatDuration(f.duration)));
      DeleteRandomLive(f.delete_burst, f.force);
      fault_tasks_.Post(Now() + f.duration, [this] {
        {
          MutexLock l(&fault_mu_);
          drop_.reset();
        }
        PushFaults();
      });
      break;
    }
    case FaultKind::kSeverWatches:
      (void)simulator("/simulator/v1/sever-watches");
      RecordFault(kind, "every watch stream cut");
      DeleteRandomLive(f.delete_burst);
      break;
    case FaultKind::kCompact:
      (void)simulator("/simulator/v1/compact");
      (void)simulator("/simulator/v1/sever-watches");
      RecordFault(kind, "watch history compacted and every watch cut: informers relist");
      DeleteRandomLive(f.delete_burst);
      break;
    case FaultKind::kWatchOutage: {
      {
        MutexLock l(&fault_mu_);
        fail_ = Fail{500, 1.0, {"watch"}};
      }
      PushFaults();
      (void)simulator("/simulator/v1/sever-watches");
      RecordFault(kind,
                  fmt::format("watches cut and refused for {}{}", absl::FormatDuration(f.duration),
                              f.compact ? ", then history compacted (relist)"
                                        : ", then resumed from the history"));
      DeleteRandomLive(f.delete_burst);
      const bool compact = f.compact;
      fault_tasks_.Post(Now() + f.duration, [this, simulator, compact] {
        {
          MutexLock l(&fault_mu_);
          fail_.reset();
        }
        if (compact) {
          (void)simulator("/simulator/v1/compact");
        }
        PushFaults();
      });
      break;
    }
    case FaultKind::kApisimRestart: {
      RecordFault(kind, "apisim stopped (state saved) and started again");
      MutexLock l(&child_mu_);
      ch_.apisim.Stop();
      absl::Status s = StartApisim(true);
      if (!s.ok()) {
        TESSERA_LOG(kError, "simulate: {}", s.ToString());
      }
      PushFaults();
      break;
    }
    case FaultKind::kTesseraKill: {
      RecordFault(kind, fmt::format("tessera serve SIGKILLed, restarted after {}",
                                    absl::FormatDuration(f.duration)));
      {
        MutexLock l(&child_mu_);
        ch_.serve.Kill();
      }
      fault_tasks_.Post(Now() + f.duration, [this] {
        MutexLock l(&child_mu_);
        absl::Status s = StartServe(true);
        if (!s.ok()) {
          TESSERA_LOG(kError, "simulate: {}", s.ToString());
        }
      });
      break;
    }
    case FaultKind::kNodeDelete: {
      std::vector<std::string> victims;
      std::vector<std::string> pods;
      {
        MutexLock l(&mu_);
        std::vector<size_t> alive;
        for (size_t i = 0; i < nodes_.size(); ++i) {
          if (nodes_[i].alive) {
            alive.push_back(i);
          }
        }
        for (int k = 0; k < f.count && alive.size() > 1; ++k) {
          const size_t pick = Rand() % alive.size();
          nodes_[alive[pick]].alive = false;
          victims.push_back(nodes_[alive[pick]].name);
          alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(pick));
        }
        for (auto& [name, p] : pods_) {
          if (p.stage != Stage::kGone && p.stage != Stage::kPending &&
              p.stage != Stage::kCreating &&
              std::find(victims.begin(), victims.end(), p.node) != victims.end()) {
            pods.push_back(name);
          }
        }
      }
      for (const std::string& v : victims) {
        (void)DeleteNode(*api_t_, v);
      }
      // The node lifecycle controller's eviction, done at once.
      for (const std::string& name : pods) {
        if (DeletePod(*api_t_, s_.NamespaceOf(name), name, 0).ok()) {
          MutexLock l(&mu_);
          if (pods_[name].stage != Stage::kGone) {
            pods_[name].stage = Stage::kGone;
            ++r_.deleted;
          }
        }
      }
      std::string names;
      for (const std::string& v : victims) {
        names += (names.empty() ? "" : ", ") + v;
      }
      RecordFault(kind, fmt::format("{} deleted with {} pods", names, pods.size()));
      break;
    }
    case FaultKind::kPluginStop: {
      std::string victim;
      {
        MutexLock l(&mu_);
        for (int attempt = 0; attempt < 50 && victim.empty(); ++attempt) {
          SimNode& n = nodes_[Rand() % nodes_.size()];
          if (n.alive && !n.stopped) {
            n.stopped = true;
            victim = n.name;
          }
        }
      }
      if (victim.empty()) {
        break;
      }
      RecordFault(kind, fmt::format("device plugin of {} silent for {}", victim,
                                    absl::FormatDuration(f.duration)));
      fault_tasks_.Post(Now() + f.duration, [this, victim] {
        MutexLock l(&mu_);
        if (SimNode* n = NodeByName(victim); n != nullptr) {
          n->stopped = false;
          n->next_report = Now();
        }
      });
      break;
    }
    case FaultKind::kErrorStorm: {
      {
        MutexLock l(&fault_mu_);
        fail_ = Fail{f.code, f.probability, {}};
      }
      PushFaults();
      RecordFault(kind, fmt::format("{} of requests answered {} for {}", f.probability, f.code,
                                    absl::FormatDuration(f.duration)));
      fault_tasks_.Post(Now() + f.duration, [this] {
        {
          MutexLock l(&fault_mu_);
          fail_.reset();
        }
        PushFaults();
      });
      break;
    }
  }
}

// ---- the real control plane ------------------------------------------------------------------

absl::Status Simulation::StartReal(const std::vector<std::string>& serve_args) {
  if (o_.controlplane_script.empty()) {
    return absl::FailedPreconditionError("--control-plane=real needs the control-plane script");
  }
  std::error_code ec;
  const std::string binary = std::filesystem::canonical(o_.binary, ec).string();
  if (ec) {
    return absl::FailedPreconditionError(
        fmt::format("cannot resolve the tessera binary {}: {}", o_.binary, ec.message()));
  }
  cp_ = std::make_unique<RealControlPlane>(o_.controlplane_script, dir_ + "/controlplane",
                                           dir_ + "/controlplane.log", &SimulationInterrupted());
  if (o_.progress != nullptr) {
    fmt::print(o_.progress, "simulate: starting the real control plane ({} up {}/controlplane)\n",
               o_.controlplane_script, dir_);
    std::fflush(o_.progress);
  }
  // Compaction every 2 s: a watch resumed after an outage meets a compacted revision (410),
  // as in test/controlplane/seed_test.sh.
  TESSERA_RETURN_IF_ERROR(cp_->Up(binary, {"--etcd-compaction-interval", "2s"}));
  if (!o_.hami_bin.empty()) {
    // HAMi's scheduler in serve's place, the args its flags.
    TESSERA_RETURN_IF_ERROR(cp_->UseHami(o_.hami_bin, serve_args));
  } else {
    // serve runs with the scenario's flags: appended to its command line, then restarted.
    TESSERA_RETURN_IF_ERROR(cp_->AddServeArgs(serve_args));
  }
  ch_.http_port = cp_->env().tessera_port;
  ch_.metrics_port = cp_->env().metrics_port;
  return absl::OkStatus();
}

bool Simulation::WaitApiserver(absl::Duration limit) {
  const absl::Time deadline = Now() + limit;
  while (Now() < deadline) {
    kube::Request r;
    r.path = "/readyz";
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    if (kube::Do(*api_t_, r, std::move(once)).ok()) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return false;
}

void Simulation::RealWatchLoss(const FaultSpec& f, bool force) {
  const std::string kind(FaultKindName(f.kind));
  const absl::Time t0 = Now();
  const std::string target = cp_->env().extender;  // the scheduler under test
  absl::Status frozen = cp_->Signal(target, SIGSTOP);
  if (!frozen.ok()) {
    TESSERA_LOG(kError, "simulate: {}: cannot freeze {}: {}", kind, target, frozen.ToString());
    return;
  }
  // Every watch cut while serve cannot reconnect; the new API server's watch cache starts at
  // the current revision.
  absl::Status restarted = cp_->Restart("kube-apiserver", true);
  const bool ready = restarted.ok() && WaitApiserver(absl::Seconds(60));
  if (!ready) {
    TESSERA_LOG(kError, "simulate: {}: kube-apiserver not ready again after its restart: {}", kind,
                restarted.ToString());
  }
  // The revision before the deletions.
  std::string rv;
  {
    kube::Request r;
    r.path = fmt::format("/api/v1/namespaces/{}/pods?limit=1", kNamespace);
    absl::StatusOr<kube::Response> resp = kube::Do(*api_t_, r, QuickRetry());
    if (resp.ok()) {
      json j = json::parse(resp->body, nullptr, false);
      if (j.is_object()) {
        rv = j["metadata"].value("resourceVersion", "");
      }
    }
  }
  const std::vector<std::string> victims = PickLive(f.delete_burst);
  RecordFault(kind, "");  // the detail follows below, once known
  for (const std::string& name : victims) {
    DeleteTask(name, force);
  }
  // Until an exact LIST at that revision is refused (410): it is compacted (bounded).
  bool compacted = false;
  const absl::Time deadline = Now() + absl::Seconds(30);
  while (!rv.empty() && Now() < deadline) {
    kube::Request r;
    r.path = fmt::format(
        "/api/v1/namespaces/{}/pods?resourceVersion={}&resourceVersionMatch=Exact&limit=1",
        kNamespace, rv);
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    absl::StatusOr<kube::Response> resp = kube::Do(*api_t_, r, std::move(once));
    if (!resp.ok() && absl::IsOutOfRange(resp.status())) {
      compacted = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  if (Now() < t0 + f.duration) {
    absl::SleepFor(t0 + f.duration - Now());
  }
  const absl::Status thawed = cp_->Signal(target, SIGCONT);
  const std::string detail = fmt::format(
      "{} frozen (SIGSTOP) for {:.1f} s; kube-apiserver SIGKILLed and restarted{} "
      "while frozen (every watch cut); {} pods deleted{}; {}; {} thawed{}: its watches "
      "resume into 410 and relist",
      target == "tessera" ? "tessera serve" : target, absl::ToDoubleSeconds(Now() - t0),
      ready ? "" : " (NOT ready again within 60 s)", victims.size(), force ? " with grace 0" : "",
      compacted ? fmt::format("revision {} (before the deletions) compacted", rv)
                : fmt::format("revision {} NOT compacted within 30 s", rv),
      target, thawed.ok() ? "" : " (SIGCONT failed: " + thawed.ToString() + ")");
  MutexLock l(&mu_);
  for (auto it = r_.faults.rbegin(); it != r_.faults.rend(); ++it) {
    if (it->kind == kind && it->detail.empty()) {
      it->detail = detail;
      break;
    }
  }
}

void Simulation::RealFault(const FaultSpec& f) {
  const std::string kind(FaultKindName(f.kind));
  auto skip = [&](const std::string& why) {
    MutexLock l(&mu_);
    r_.skipped_faults.push_back({Now() - start_, kind, why});
  };
  auto restart_apiserver = [&](bool kill) {
    absl::Status s = cp_->Restart("kube-apiserver", kill);
    if (!s.ok() || !WaitApiserver(absl::Seconds(60))) {
      TESSERA_LOG(kError, "simulate: {}: kube-apiserver not ready again after its restart: {}",
                  kind, s.ToString());
    }
  };
  switch (f.kind) {
    case FaultKind::kDropEvents:
      if (f.event_type != "DELETED" && !f.event_type.empty()) {
        skip(fmt::format("a real kube-apiserver does not drop {} events on demand (apisim only)",
                         f.event_type));
        break;
      }
      // The real way to lose DELETED events: deletions while serve's watches are down, past a
      // compaction, so that its watches resume into 410 (the seed path).
      RealWatchLoss(f, f.force);
      break;
    case FaultKind::kWatchOutage:
      RealWatchLoss(f, false);
      break;
    case FaultKind::kSeverWatches:
    case FaultKind::kCompact:
      RecordFault(kind, f.kind == FaultKind::kSeverWatches
                            ? "kube-apiserver SIGKILLed and restarted: every watch cut"
                            : "kube-apiserver SIGKILLed and restarted: every watch cut, the new "
                              "watch cache starts at the current revision (compaction every 2 s)");
      restart_apiserver(true);
      DeleteRandomLive(f.delete_burst);
      break;
    case FaultKind::kApisimRestart:
      RecordFault(kind, "kube-apiserver restarted (SIGTERM, graceful), etcd kept");
      restart_apiserver(false);
      break;
    case FaultKind::kTesseraKill: {
      absl::Status s = cp_->Signal(cp_->env().extender, SIGKILL);
      if (!s.ok()) {
        TESSERA_LOG(kError, "simulate: tessera_kill: {}", s.ToString());
        break;
      }
      RecordFault(kind, fmt::format("tessera serve SIGKILLed, restarted after {}",
                                    absl::FormatDuration(f.duration)));
      fault_tasks_.Post(Now() + f.duration, [this] {
        absl::Status r = cp_->Restart(cp_->env().extender, false);
        if (!r.ok()) {
          TESSERA_LOG(kError, "simulate: restarting serve: {}", r.ToString());
        }
      });
      break;
    }
    case FaultKind::kErrorStorm:
      skip(fmt::format("a real kube-apiserver does not answer {} on demand (apisim only)", f.code));
      break;
    case FaultKind::kNodeDelete:
    case FaultKind::kPluginStop:
      break;  // not reached: the emulators' own faults run in Fault()
  }
}

void Simulation::OnPodSeen(const kube::Pod& pod) {
  if (pod.node_name.empty()) {
    return;
  }
  const std::string& name = pod.meta.name;
  MutexLock l(&mu_);
  auto it = pods_.find(name);
  if (it == pods_.end()) {
    return;
  }
  if (it->second.stage == Stage::kPending) {
    it->second.stage = Stage::kBound;
    it->second.node = pod.node_name;
    ++r_.scheduled;
    node_tasks_.Post(Now(), [this, name] { AllocateTask(name, 0); });
  }
  if (pod.Deleting() && terminating_.insert(name).second) {
    node_tasks_.Post(Now() + absl::Milliseconds(300), [this, name] { TerminateTask(name); });
  }
}

void Simulation::Poll() {
  std::vector<std::pair<std::string, std::string>> bound;  // name, node
  std::vector<std::string> unschedulable, terminating;
  std::string cont;
  do {
    kube::Request r;
    std::string escaped;
    for (char c : cont) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '~') {
        escaped += c;
      } else {
        escaped += fmt::format("%{:02X}", static_cast<unsigned>(static_cast<unsigned char>(c)));
      }
    }
    r.path =
        fmt::format("{}/pods?limit=500{}", PodScope(), cont.empty() ? "" : "&continue=" + escaped);
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    absl::StatusOr<kube::Response> resp = kube::Do(*obs_t_, r, std::move(once));
    if (!resp.ok()) {
      return;  // the API server restarting: the next poll
    }
    json j = json::parse(resp->body, nullptr, false);
    if (!j.is_object() || !j["items"].is_array()) {
      return;
    }
    for (const json& p : j["items"]) {
      const json& meta = p["metadata"];
      const std::string name = meta.value("name", "");
      const std::string node = p.contains("spec") ? p["spec"].value("nodeName", "") : "";
      if (!node.empty()) {
        bound.emplace_back(name, node);
        if (meta.contains("deletionTimestamp")) {
          terminating.push_back(name);
        }
        continue;
      }
      if (p.contains("status") && p["status"].contains("conditions")) {
        for (const json& c : p["status"]["conditions"]) {
          if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False" &&
              c.value("reason", "") == "Unschedulable") {
            unschedulable.push_back(name);
          }
        }
      }
    }
    cont = j["metadata"].is_object() ? j["metadata"].value("continue", "") : "";
  } while (!cont.empty());
  MutexLock l(&mu_);
  for (const auto& binding : bound) {
    const std::string name = binding.first;
    auto it = pods_.find(name);
    if (it == pods_.end() || it->second.stage != Stage::kPending) {
      continue;
    }
    it->second.stage = Stage::kBound;
    it->second.node = binding.second;
    ++r_.scheduled;
    node_tasks_.Post(Now(), [this, name] { AllocateTask(name, 0); });
  }
  for (const std::string& name : unschedulable) {
    auto it = pods_.find(name);
    if (it != pods_.end() && !it->second.ever_unschedulable) {
      it->second.ever_unschedulable = true;
      ++r_.unschedulable;
    }
  }
  // A bound pod being deleted that no kubelet task handles yet (deleted while it looked
  // pending here, then bound): the kubelet finishes it.
  for (const std::string& name : terminating) {
    if (terminating_.insert(name).second) {
      node_tasks_.Post(Now() + absl::Milliseconds(300), [this, name] { TerminateTask(name); });
    }
  }
}

void Simulation::SuperviseLoop() {
  while (!oracle_stop_.load()) {
    absl::SleepFor(absl::Seconds(1));
    if (oracle_stop_.load() || cp_->Alive("kube-scheduler")) {
      continue;
    }
    RecordFault("scheduler_restart",
                fmt::format("kube-scheduler had exited (see {}/kube-scheduler.log; stock "
                            "kube-scheduler exits when it loses its Lease): started again, as "
                            "its kubelet would",
                            cp_->env().dir));
    absl::Status s = cp_->Restart("kube-scheduler", false);
    if (!s.ok()) {
      TESSERA_LOG(kError, "simulate: restarting kube-scheduler: {}", s.ToString());
    }
  }
}

void Simulation::PollLoop() {
  while (!oracle_stop_.load()) {
    const absl::Time next = Now() + absl::Seconds(2);
    Poll();
    while (!oracle_stop_.load() && Now() < next) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
}

absl::Status Simulation::CreateQuotaNamespaces() {
  for (const QuotaNamespace& ns : s_.namespaces) {
    TESSERA_RETURN_IF_ERROR(CreateNamespace(*api_t_, ns.name));
    if (real_) {
      TESSERA_RETURN_IF_ERROR(CreateDefaultServiceAccount(*api_t_, ns.name));
    }
    std::vector<std::pair<std::string, std::string>> hard;
    if (ns.gpumem.has_value()) {
      hard.emplace_back(fmt::format("limits.{}", kQuotaMemoryResource), std::to_string(*ns.gpumem));
    }
    if (ns.gpucores.has_value()) {
      hard.emplace_back(fmt::format("limits.{}", kQuotaCoresResource),
                        std::to_string(*ns.gpucores));
    }
    if (!hard.empty()) {
      TESSERA_RETURN_IF_ERROR(CreateResourceQuota(*api_t_, ns.name, "gpu", hard));
    }
  }
  return absl::OkStatus();
}

// ---- oracle ---------------------------------------------------------------------------------

void Simulation::Observe() {
  std::vector<kube::Pod> pods;
  std::vector<kube::Node> nodes;
  kube::ListOptions lo;
  lo.limit = 500;
  while (true) {
    absl::StatusOr<kube::PodList> page = obs_client_->ListPods(lo);
    if (!page.ok()) {
      return;  // apisim down or failing: no observation
    }
    for (kube::Pod& p : page->items) {
      pods.push_back(std::move(p));
    }
    if (page->meta.continue_token.empty()) {
      break;
    }
    lo.continue_token = page->meta.continue_token;
  }
  kube::ListOptions no;
  absl::StatusOr<kube::NodeList> nl = obs_client_->ListNodes(no);
  if (!nl.ok()) {
    return;
  }
  nodes = std::move(nl->items);
  std::vector<kube::ResourceQuota> quotas;
  if (!s_.namespaces.empty()) {
    absl::StatusOr<kube::ResourceQuotaList> ql = obs_client_->ListResourceQuotas(no);
    if (!ql.ok()) {
      return;
    }
    quotas = std::move(ql->items);
  }
  const absl::Time now = Now();
  kube::Request r;
  r.path = "/metrics";
  kube::DoOptions once;
  once.retry.max_attempts = 1;
  absl::StatusOr<kube::Response> resp = kube::Do(*met_t_, r, std::move(once));
  std::optional<Exported> exported;
  if (resp.ok()) {
    absl::StatusOr<Exported> e = ParseMetrics(resp->body);
    if (e.ok()) {
      exported = std::move(*e);
    }
  }
  const Truth truth = ComputeTruth(nodes, pods);
  std::optional<MigObservation> mig;
  if (s_.mig_share > 0) {
    mig.emplace();
    mig->truth = ComputeMigTruth(nodes, pods);
    if (resp.ok()) {
      absl::StatusOr<MigInstances> instances = ParseMigInstances(resp->body);
      if (instances.ok()) {
        mig->exported = std::move(*instances);
      }
    }
  }
  std::optional<QuotaObservation> quota;
  if (!s_.namespaces.empty()) {
    quota.emplace();
    quota->truth = ComputeQuotaTruth(truth, pods, quotas);
    if (resp.ok()) {
      absl::StatusOr<QuotaUsed> used = ParseQuotaUsed(resp->body);
      if (used.ok()) {
        quota->exported = std::move(*used);
      }
    }
  }
  std::string cause;
  {
    MutexLock l(&mu_);
    if (now - last_fault_at_ <= s_.window) {
      cause = last_fault_;
    }
  }
  Sample sample;
  sample.at = now - start_;
  sample.truth_mib = truth.total_usedmem;
  sample.live_pods = static_cast<int64_t>(pods.size());
  if (exported.has_value()) {
    sample.exported_mib = 0;
    for (const auto& [uuid, d] : exported->devices) {
      sample.exported_mib += d.usedmem;
    }
  }
  {
    MutexLock l(&oracle_mu_);
    oracle_.Observe(now, truth, exported.has_value() ? &*exported : nullptr, cause,
                    quota.has_value() ? &*quota : nullptr, mig.has_value() ? &*mig : nullptr);
    sample.diverging = static_cast<int64_t>(oracle_.open());
    sample.diverging_shares = static_cast<int64_t>(oracle_.open_shares());
  }
  MutexLock l(&mu_);
  diverging_now_ = sample.diverging;
  r_.samples.push_back(sample);
}

void Simulation::OracleLoop() {
  absl::Time next = Now();
  while (!oracle_stop_.load()) {
    const absl::Time now = Now();
    if (now < next) {
      absl::SleepFor(std::min(next - now, absl::Milliseconds(100)));
      continue;
    }
    next = now + absl::Seconds(1);
    Observe();
  }
}

// ---- main loop ------------------------------------------------------------------------------

void Simulation::Tick(absl::Time now, absl::Duration elapsed) {
  bool on;
  {
    MutexLock l(&mu_);
    on = workload_on_;
  }
  if (on) {
    const int64_t due = std::min<int64_t>(
        s_.max_pods, static_cast<int64_t>(absl::ToDoubleSeconds(elapsed) * s_.create_rate));
    MutexLock l(&mu_);
    while (static_cast<int64_t>(pod_names_.size()) < due) {
      std::string name = fmt::format("sim-{:06d}", pod_names_.size());
      pods_[name].name = name;
      pod_names_.push_back(name);
      tasks_.Post(now, [this, name] { CreateTask(name); });
    }
  }
  for (DevicePlugin* p : DueReports(now)) {
    tasks_.Post(now, [this, p] { (void)p->Register(*client_, Now()); });
  }
}

std::vector<DevicePlugin*> Simulation::DueReports(absl::Time now) {
  std::vector<DevicePlugin*> report;
  MutexLock l(&mu_);
  for (SimNode& n : nodes_) {
    if (n.alive && !n.stopped && n.plugin->format() == device::RegisterFormat::kDelimited &&
        now >= n.next_report) {
      n.next_report = now + absl::Seconds(30);
      report.push_back(n.plugin.get());
    }
  }
  return report;
}

void Simulation::Progress(absl::Duration elapsed, bool final) {
  if (o_.progress == nullptr) {
    return;
  }
  const absl::Duration total = s_.duration + s_.drain;
  int64_t created, scheduled, deleted, faults, diverging;
  {
    MutexLock l(&mu_);
    created = r_.created;
    scheduled = r_.scheduled;
    deleted = r_.deleted;
    faults = static_cast<int64_t>(r_.faults.size());
    diverging = diverging_now_;
  }
  const double frac = std::clamp(absl::FDivDuration(elapsed, total), 0.0, 1.0);
  const std::string phase = elapsed < s_.duration ? "run  " : "drain";
  const std::string counts = fmt::format(
      "{} {:5.1f}s/{:.0f}s  created {}  scheduled {}  deleted {}  faults {}  diverging {}", phase,
      absl::ToDoubleSeconds(elapsed), absl::ToDoubleSeconds(total), created, scheduled, deleted,
      faults, diverging);
  if (o_.progress_bar) {
    const int width = 30;
    const int filled = static_cast<int>(frac * width);
    fmt::print(o_.progress, "\r[{}{}] {}\x1b[K", std::string(static_cast<size_t>(filled), '#'),
               std::string(static_cast<size_t>(width - filled), '.'), counts);
    if (final) {
      fmt::print(o_.progress, "\n");
    }
  } else {
    fmt::print(o_.progress, "simulate: {}\n", counts);
  }
  std::fflush(o_.progress);
}

std::vector<std::string> SplitArgs(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view piece : absl::StrSplit(s, ' ', absl::SkipEmpty())) {
    out.emplace_back(piece);
  }
  return out;
}

absl::StatusOr<RunResult> Simulation::Run() {
  if (o_.work_dir.empty()) {
    char tmpl[] = "/tmp/tessera-simulate-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      return absl::InternalError("mkdtemp failed");
    }
    dir_ = tmpl;
  } else {
    std::error_code ec;
    dir_ = std::filesystem::absolute(o_.work_dir, ec).lexically_normal().string();
    if (!dir_.empty() && dir_.back() == '/') {
      dir_.pop_back();
    }
    std::filesystem::create_directories(dir_, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          fmt::format("cannot create the work directory {}: {}", dir_, ec.message()));
    }
  }
  std::vector<std::string> user = SplitArgs(o_.scheduler_args);
  auto has = [&](std::string_view flag) {
    for (const std::string& a : user) {
      if (a == flag || a.rfind(std::string(flag) + "=", 0) == 0) {
        return true;
      }
    }
    return false;
  };
  // The simulated cluster is busier than HAMi's default client limit (50 qps) allows.
  std::vector<std::string> serve_extra;
  if (!has("--kube-qps")) {
    serve_extra.insert(serve_extra.end(), {"--kube-qps", "2000"});
  }
  if (!has("--kube-burst")) {
    serve_extra.insert(serve_extra.end(), {"--kube-burst", "4000"});
  }
  serve_extra.insert(serve_extra.end(), user.begin(), user.end());
  if (real_) {
    // HAMi's flags are the user's alone (v2.5 has no --kube-qps).
    TESSERA_RETURN_IF_ERROR(StartReal(o_.hami_bin.empty() ? serve_extra : user));
  } else {
    TESSERA_RETURN_IF_ERROR(StartChildren(serve_extra));
  }
  TESSERA_RETURN_IF_ERROR(MakeTransports());
  if (real_) {
    // No kube-controller-manager: the ServiceAccount admission plugin wants `default`.
    TESSERA_RETURN_IF_ERROR(CreateDefaultServiceAccount(*api_t_, kNamespace));
  }
  TESSERA_RETURN_IF_ERROR(CreateQuotaNamespaces());
  TESSERA_RETURN_IF_ERROR(CreateNodes());
  TESSERA_RETURN_IF_ERROR(WaitReady());
  return RunWorkload();
}

absl::Status Simulation::StartChildren(const std::vector<std::string>& serve_extra) {
  std::string token;
  {
    MutexLock l(&rng_mu_);
    std::random_device rd;
    std::mt19937_64 tr(rd());
    token = RandomHex(tr, 16);
  }
  TESSERA_ASSIGN_OR_RETURN(apisim::PemPair pem, apisim::GenerateSelfSignedCert());
  TESSERA_RETURN_IF_ERROR(WriteFile(dir_ + "/apisim.crt", pem.cert_pem));
  TESSERA_RETURN_IF_ERROR(WriteFile(dir_ + "/apisim.key", pem.key_pem));
  std::remove((dir_ + "/apisim.state").c_str());
  ch_.apisim_args = {"apisim",
                     "--listen",
                     "127.0.0.1:0",
                     "--tls-cert",
                     dir_ + "/apisim.crt",
                     "--tls-key",
                     dir_ + "/apisim.key",
                     "--token",
                     token,
                     "--state",
                     dir_ + "/apisim.state",
                     "--watch-history",
                     "50000",
                     "--write-kubeconfig",
                     dir_ + "/kubeconfig"};
  TESSERA_RETURN_IF_ERROR(StartApisim(false));

  ch_.serve_args = {"serve",       "--kubeconfig",           dir_ + "/kubeconfig", "--http_bind",
                    "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0"};
  // serve runs with its default --reservation-ttl (5m): since a relist ends the reservations of
  // pods it does not return, a shorter TTL is no longer needed to bound them (docs/simulate.md,
  // "Findings" 1).
  ch_.serve_args.insert(ch_.serve_args.end(), serve_extra.begin(), serve_extra.end());
  // Tessera starts on an empty cluster; the nodes appear while it watches.
  return StartServe(false);
}

absl::StatusOr<RunResult> Simulation::RunWorkload() {
  {
    MutexLock l(&mu_);
    r_.scenario = s_.name;
    r_.label = o_.label;
    r_.seed = s_.seed;
    r_.duration = s_.duration;
    r_.window = s_.window;
    r_.nodes = s_.nodes;
    r_.gpus = s_.nodes * s_.gpus_per_node;
    r_.work_dir = dir_;
    r_.scheduler_args = o_.scheduler_args;
    r_.control_plane = real_ ? "real" : "apisim";
    if (!o_.hami_bin.empty()) {
      r_.scheduler = fmt::format("HAMi ({})", o_.hami_bin);
    }
  }
  start_ = Now();
  {
    MutexLock l(&mu_);
    r_.start = start_;
  }
  tasks_.Start(o_.workers);
  node_tasks_.Start(3);
  // On the real control plane a fault blocks its worker for the restarts it waits out (seconds
  // each, serialised); more workers keep a due restart of serve from waiting behind them.
  fault_tasks_.Start(real_ ? 4 : 2);
  std::thread oracle([this] { OracleLoop(); });
  std::thread poll, supervise;
  if (real_) {
    kube::Informer<kube::Pod>::Options io;
    io.name = "sim-kubelet";
    io.reflector.ns = s_.namespaces.empty() ? kNamespace : "";  // "": every namespace
    kube::EventHandlers<kube::Pod> h;
    h.on_add = [this](const kube::Pod& p, bool) { OnPodSeen(p); };
    h.on_update = [this](const kube::Pod&, const kube::Pod& p) { OnPodSeen(p); };
    pod_informer_ = std::make_unique<kube::Informer<kube::Pod>>(client_.get(), io, std::move(h));
    pod_informer_->Start();
    poll = std::thread([this] { PollLoop(); });
    supervise = std::thread([this] { SuperviseLoop(); });
  }

  // The fault schedule, expanded.
  std::vector<std::pair<absl::Duration, const FaultSpec*>> schedule;
  for (const FaultSpec& f : s_.faults) {
    for (absl::Duration at = f.at; at < s_.duration; at += f.every) {
      schedule.emplace_back(at, &f);
      if (f.every <= absl::ZeroDuration()) {
        break;
      }
    }
  }
  std::sort(schedule.begin(), schedule.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t next_fault = 0;
  double deletes_due = 0;
  absl::Time last_progress = absl::InfinitePast();
  const absl::Duration progress_every =
      o_.progress_bar ? absl::Milliseconds(250) : absl::Seconds(5);
  while (true) {
    const absl::Time now = Now();
    const absl::Duration elapsed = now - start_;
    if (elapsed >= s_.duration + s_.drain) {
      break;
    }
    if (SimulationInterrupted().load()) {
      MutexLock l(&mu_);
      r_.interrupted = true;
      break;
    }
    if (elapsed < s_.duration) {
      Tick(now, elapsed);
      while (next_fault < schedule.size() && schedule[next_fault].first <= elapsed) {
        const FaultSpec* f = schedule[next_fault++].second;
        fault_tasks_.Post(now, [this, f] { Fault(*f); });
      }
      const double want = absl::ToDoubleSeconds(elapsed) * s_.delete_rate;
      if (want - deletes_due >= 1) {
        const int n = static_cast<int>(want - deletes_due);
        deletes_due += n;
        DeleteRandomLive(n);
      }
    } else {
      bool first = false;
      {
        MutexLock l(&mu_);
        first = workload_on_;
        workload_on_ = false;
      }
      if (first) {
        // Drain: no new pods or faults; whatever was broken is repaired.
        fault_tasks_.Post(now, [this] {
          {
            MutexLock l(&fault_mu_);
            drop_.reset();
            fail_.reset();
          }
          if (real_) {
            if (!cp_->Alive(cp_->env().extender)) {
              (void)cp_->Restart(cp_->env().extender, false);  // a kill whose restart is due
            }
          } else {
            PushFaults();
            MutexLock cl(&child_mu_);
            if (!ch_.serve.running()) {
              (void)StartServe(true);  // a kill whose restart is due
            }
          }
          MutexLock l(&mu_);
          for (SimNode& n : nodes_) {
            n.stopped = false;
          }
        });
      }
      Tick(now, elapsed);
    }
    if (now - last_progress >= progress_every) {
      last_progress = now;
      Progress(elapsed, false);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  oracle_stop_ = true;
  oracle.join();
  if (poll.joinable()) {
    poll.join();
  }
  if (supervise.joinable()) {
    supervise.join();
  }
  if (pod_informer_ != nullptr) {
    pod_informer_->Stop();
  }
  fault_tasks_.Stop();
  tasks_.Stop();
  node_tasks_.Stop();
  Progress(Now() - start_, true);
  {
    MutexLock l(&oracle_mu_);
    oracle_.Finish(Now());
  }
  {
    // Tessera's own view at the end, for whoever investigates a divergence.
    kube::Request r;
    r.path = "/debug/ledger";
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    absl::StatusOr<kube::Response> ledger = kube::Do(*met_t_, r, std::move(once));  // /debug
    if (ledger.ok()) {
      (void)WriteFile(dir_ + "/ledger-at-end.json", ledger->body);
    }
    // Close the kept-alive connections first: an HTTP server waits for its idle keep-alive
    // connections when it shuts down.
    extender_.reset();
    ext_t_.reset();
    met_t_.reset();
  }
  if (real_) {
    client_.reset();
    api_t_.reset();
    node_client_.reset();
    node_t_.reset();
    obs_client_.reset();
    obs_t_.reset();
    const absl::Time t0 = Now();
    absl::Status down = cp_->Down();
    TESSERA_LOG(kInfo, "simulate: the control plane stopped in {}",
                absl::FormatDuration(Now() - t0));
    if (!down.ok()) {
      return absl::InternalError(
          fmt::format("stopping the real control plane: {}", std::string(down.message())));
    }
  } else {
    MutexLock l(&child_mu_);
    const absl::Time t0 = Now();
    ch_.serve.Stop();
    const absl::Time t1 = Now();
    client_.reset();
    api_t_.reset();
    node_client_.reset();
    node_t_.reset();
    obs_client_.reset();
    obs_t_.reset();
    ch_.apisim.Stop();
    TESSERA_LOG(kInfo, "simulate: serve stopped in {}, apisim in {}", absl::FormatDuration(t1 - t0),
                absl::FormatDuration(Now() - t1));
  }
  RunResult out;
  {
    MutexLock l(&mu_);
    out = r_;
    std::vector<double> ms = filter_ms_;
    std::sort(ms.begin(), ms.end());
    auto pct = [&](double q) {
      if (ms.empty()) {
        return absl::ZeroDuration();
      }
      const size_t i =
          std::min(ms.size() - 1, static_cast<size_t>(q * static_cast<double>(ms.size())));
      return absl::Microseconds(static_cast<int64_t>(ms[i] * 1000));
    };
    out.filter_p50 = pct(0.5);
    out.filter_p99 = pct(0.99);
  }
  {
    MutexLock l(&oracle_mu_);
    out.divergences = oracle_.divergences();
    out.violations = oracle_.violations();
    out.transient_divergences = oracle_.transient();
    out.observations = oracle_.observations();
    out.compared = oracle_.compared();
  }
  out.elapsed = Now() - start_;
  return out;
}

}  // namespace

std::atomic<bool>& SimulationInterrupted() {
  static std::atomic<bool> interrupted{false};
  return interrupted;
}

absl::StatusOr<RunResult> RunSimulation(const SimulationOptions& options) {
  Simulation sim(options);
  return sim.Run();
}

}  // namespace tessera::sim
