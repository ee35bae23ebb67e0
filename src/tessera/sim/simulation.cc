#include "tessera/sim/simulation.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <stdlib.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/clock.h"
#include "tessera/base/logging.h"
#include "tessera/base/mutex.h"
#include "tessera/base/status_macros.h"
#include "tessera/device/annotations.h"
#include "tessera/device/mig_geometry.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/decode.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/transport.h"
#include "tessera/sim/child_processes.h"
#include "tessera/sim/cluster_setup.h"
#include "tessera/sim/control_plane.h"
#include "tessera/sim/emulators.h"
#include "tessera/sim/fault_injector.h"
#include "tessera/sim/observer.h"
#include "tessera/sim/pod_pipeline.h"
#include "tessera/sim/quota_oracle.h"
#include "tessera/sim/real_kubelet.h"
#include "tessera/sim/run_book.h"
#include "tessera/sim/scheduler_events.h"
#include "tessera/sim/synthetic.h"
#include "tessera/sim/task_queue.h"

namespace tessera::sim {
namespace {

using nlohmann::json;

// One run: sets up the cluster (children or the real control plane, transports, namespaces,
// nodes), then drives the workload and the fault schedule, and assembles the RunResult. The
// pod pipeline (create, schedule, allocate, start, finish, delete) runs here as tasks; the
// children, the faults and the observations are components of their own.
class Simulation {
 public:
  explicit Simulation(const SimulationOptions& options)
      : options_(options),
        scenario_(options.scenario),
        real_(options.control_plane == ControlPlaneKind::kReal),
        clock_(options.clock),
        tasks_(clock_),
        node_tasks_(clock_),
        fault_tasks_(clock_) {}

  absl::StatusOr<RunResult> Run();

 private:
  absl::StatusOr<RunResult> RunWorkload();
  // kReal: tools/controlplane.sh up, serve's flags, the kubeconfig and ports.
  absl::Status StartReal(const std::vector<std::string>& serve_args);
  absl::Status MakeTransports();
  absl::Status CreateNodes();
  absl::Status WaitReady();
  // apisim, a scenario with priorities: the preemption oracle's judgement of the run's evictions
  // (apisim's records, Tessera's Preempted events, the run book's pods).
  absl::StatusOr<PreemptionFindings> JudgeRunPreemptions();
  void Tick(absl::Time now, absl::Duration elapsed);
  // The v2.5 plugins whose handshake report is due (every 30 s, as the plugin does; HAMi v2.5
  // takes a node's devices only from a fresh `Reported`); their next one is scheduled.
  std::vector<DevicePlugin*> DueReports(absl::Time now);
  void Progress(absl::Duration elapsed, bool final);
  std::unique_ptr<FaultInjector> MakeFaultInjector();

  absl::Time Now() const { return clock_->Now(); }

  const SimulationOptions& options_;
  const Scenario& scenario_;
  const bool real_;
  Clock* const clock_;
  std::string work_dir_;
  std::unique_ptr<RealControlPlane> control_plane_;  // kReal
  std::unique_ptr<ChildProcesses> children_;         // kApisim
  // serve's ports (kReal: those of the scheduler under test).
  int http_port_ = 0;
  int metrics_port_ = 0;

  std::unique_ptr<kube::CurlTransport> api_transport_, extender_transport_, metrics_transport_;
  std::unique_ptr<kube::ApiClient> client_;
  // Connections of their own for the node side (device plugins, kubelets) and for the
  // oracle's LISTs, so that neither waits behind the other's traffic.
  std::unique_ptr<kube::CurlTransport> node_transport_, observer_transport_;
  std::unique_ptr<kube::ApiClient> node_client_, observer_client_;
  std::unique_ptr<ExtenderClient> extender_;
  TaskQueue tasks_;
  // Node-side work (device plugins, kubelets) on workers of its own, so that a backlog of
  // scheduling retries never delays the plugin's lock release (each node has its own agents).
  TaskQueue node_tasks_;
  // Faults (and their ends) on workers of their own, so they fire on schedule even when an
  // error storm keeps every scheduling worker in retries.
  TaskQueue fault_tasks_;

  RunBook book_;
  std::unique_ptr<Observer> observer_;
  std::unique_ptr<PodPipeline> pipeline_;
  std::unique_ptr<FaultInjector> faults_;
  std::unique_ptr<RealKubelet> real_kubelet_;                 // kReal
  std::unique_ptr<kube::CurlTransport> scheduler_transport_;  // apisim: the emulated scheduler's
  std::unique_ptr<kube::ApiClient> scheduler_client_;
  std::unique_ptr<SchedulerEvents> scheduler_events_;
  absl::Time start_;
};

absl::Status Simulation::MakeTransports() {
  kube::KubeconfigOptions ko;
  ko.path = real_ ? control_plane_->env().kubeconfig : work_dir_ + "/kubeconfig";
  TESSERA_ASSIGN_OR_RETURN(kube::RestConfig config, kube::LoadKubeconfig(ko));
  config.qps = 0;  // the emulators are many clients; no client-side limit
  config.request_timeout = absl::Seconds(20);
  config.connect_timeout = absl::Seconds(3);
  TESSERA_ASSIGN_OR_RETURN(
      api_transport_,
      kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real())));
  auto options = [] {
    kube::ApiClient::Options co;
    co.retry.max_attempts = 3;
    co.retry.backoff = {absl::Milliseconds(50), absl::Milliseconds(500), 2.0, 0.5};
    co.retry.max_retry_after = absl::Seconds(1);
    return co;
  };
  client_ = std::make_unique<kube::ApiClient>(api_transport_.get(), options());
  TESSERA_ASSIGN_OR_RETURN(
      node_transport_,
      kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real())));
  node_client_ = std::make_unique<kube::ApiClient>(node_transport_.get(), options());
  TESSERA_ASSIGN_OR_RETURN(
      observer_transport_,
      kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real())));
  observer_client_ = std::make_unique<kube::ApiClient>(observer_transport_.get(), options());
  if (!real_) {
    TESSERA_ASSIGN_OR_RETURN(
        scheduler_transport_,
        kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real())));
    scheduler_client_ = std::make_unique<kube::ApiClient>(scheduler_transport_.get(), options());
  }
  kube::RestConfig ext;
  ext.server = fmt::format("http://127.0.0.1:{}", http_port_);
  ext.qps = 0;
  ext.request_timeout = absl::Seconds(30);
  ext.connect_timeout = absl::Seconds(2);
  if (!real_) {  // on the real control plane kube-scheduler calls the extender
    TESSERA_ASSIGN_OR_RETURN(extender_transport_, kube::CurlTransport::Create(ext, nullptr));
    extender_ = std::make_unique<ExtenderClient>(extender_transport_.get());
  }
  kube::RestConfig met = ext;
  met.server = fmt::format("http://127.0.0.1:{}", metrics_port_);
  met.request_timeout = absl::Seconds(5);
  TESSERA_ASSIGN_OR_RETURN(metrics_transport_, kube::CurlTransport::Create(met, nullptr));
  return absl::OkStatus();
}

absl::Status Simulation::CreateNodes() {
  TESSERA_ASSIGN_OR_RETURN(
      std::vector<SimNode> nodes,
      CreateScenarioNodes(scenario_, real_, *api_transport_, *client_, clock_));
  MutexLock l(&book_.mutex);
  book_.nodes = std::move(nodes);
  for (size_t i = 0; i < book_.nodes.size(); ++i) {
    book_.node_index[book_.nodes[i].name] = i;
  }
  return absl::OkStatus();
}

absl::Status Simulation::WaitReady() {
  // Ready, and every registered device visible in /metrics. HAMi v2.5 answers a report on its
  // 15 s tick, and a node whose report it overwrote waits for the plugin's next one (30 s).
  const absl::Duration limit = options_.hami_bin.empty() ? absl::Seconds(60) : absl::Seconds(120);
  const absl::Time deadline = Now() + limit;
  const size_t want =
      static_cast<size_t>(scenario_.nodes) * static_cast<size_t>(scenario_.gpus_per_node);
  while (Now() < deadline && !SimulationInterrupted().load()) {
    for (DevicePlugin* p : DueReports(Now())) {
      (void)p->Register(*client_, Now());
    }
    kube::Request r;
    r.path = "/metrics";
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    absl::StatusOr<kube::Response> resp = kube::Do(*metrics_transport_, r, std::move(once));
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
      real_ ? control_plane_->env().extender : "tessera serve", want, absl::FormatDuration(limit),
      real_ ? fmt::format("{}/{}.log", control_plane_->env().dir, control_plane_->env().extender)
            : work_dir_ + "/serve.log"));
}

// ---- the real control plane ------------------------------------------------------------------

absl::Status Simulation::StartReal(const std::vector<std::string>& serve_args) {
  if (options_.controlplane_script.empty()) {
    return absl::FailedPreconditionError("--control-plane=real needs the control-plane script");
  }
  std::error_code ec;
  const std::string binary = std::filesystem::canonical(options_.binary, ec).string();
  if (ec) {
    return absl::FailedPreconditionError(
        fmt::format("cannot resolve the tessera binary {}: {}", options_.binary, ec.message()));
  }
  control_plane_ =
      std::make_unique<RealControlPlane>(options_.controlplane_script, work_dir_ + "/controlplane",
                                         work_dir_ + "/controlplane.log", &SimulationInterrupted());
  if (options_.progress != nullptr) {
    fmt::print(options_.progress,
               "simulate: starting the real control plane ({} up {}/controlplane)\n",
               options_.controlplane_script, work_dir_);
    std::fflush(options_.progress);
  }
  // Compaction every 2 s: a watch resumed after an outage meets a compacted revision (410),
  // as in test/controlplane/seed_test.sh.
  TESSERA_RETURN_IF_ERROR(control_plane_->Up(binary, {"--etcd-compaction-interval", "2s"}));
  if (!options_.hami_bin.empty()) {
    // HAMi's scheduler in serve's place, the args its flags.
    TESSERA_RETURN_IF_ERROR(control_plane_->UseHami(options_.hami_bin, serve_args));
  } else {
    // serve runs with the scenario's flags: appended to its command line, then restarted.
    TESSERA_RETURN_IF_ERROR(control_plane_->AddServeArgs(serve_args));
  }
  http_port_ = control_plane_->env().tessera_port;
  metrics_port_ = control_plane_->env().metrics_port;
  return absl::OkStatus();
}

// ---- main loop ------------------------------------------------------------------------------

void Simulation::Tick(absl::Time now, absl::Duration elapsed) {
  bool on;
  {
    MutexLock l(&book_.mutex);
    on = book_.workload_on;
  }
  if (on) {
    const int64_t due = std::min<int64_t>(
        scenario_.max_pods,
        static_cast<int64_t>(absl::ToDoubleSeconds(elapsed) * scenario_.create_rate));
    MutexLock l(&book_.mutex);
    while (static_cast<int64_t>(book_.pod_names.size()) < due) {
      std::string name = fmt::format("sim-{:06d}", book_.pod_names.size());
      book_.pods[name].name = name;
      book_.pod_names.push_back(name);
      tasks_.Post(now, [this, name] { pipeline_->CreateTask(name); });
    }
  }
  for (DevicePlugin* p : DueReports(now)) {
    tasks_.Post(now, [this, p] { (void)p->Register(*client_, Now()); });
  }
}

std::vector<DevicePlugin*> Simulation::DueReports(absl::Time now) {
  std::vector<DevicePlugin*> report;
  MutexLock l(&book_.mutex);
  for (SimNode& n : book_.nodes) {
    if (n.alive && !n.stopped && n.plugin->format() == device::RegisterFormat::kDelimited &&
        now >= n.next_report) {
      n.next_report = now + absl::Seconds(30);
      report.push_back(n.plugin.get());
    }
  }
  return report;
}

void Simulation::Progress(absl::Duration elapsed, bool final) {
  if (options_.progress == nullptr) {
    return;
  }
  const absl::Duration total = scenario_.duration + scenario_.drain;
  int64_t created, scheduled, deleted, faults, diverging;
  {
    MutexLock l(&book_.mutex);
    created = book_.result.created;
    scheduled = book_.result.scheduled;
    deleted = book_.result.deleted;
    faults = static_cast<int64_t>(book_.result.faults.size());
    diverging = book_.diverging_now;
  }
  const double frac = std::clamp(absl::FDivDuration(elapsed, total), 0.0, 1.0);
  const std::string phase = elapsed < scenario_.duration ? "run  " : "drain";
  const std::string counts = fmt::format(
      "{} {:5.1f}s/{:.0f}s  created {}  scheduled {}  deleted {}  faults {}  diverging {}", phase,
      absl::ToDoubleSeconds(elapsed), absl::ToDoubleSeconds(total), created, scheduled, deleted,
      faults, diverging);
  if (options_.progress_bar) {
    const int width = 30;
    const int filled = static_cast<int>(frac * width);
    fmt::print(options_.progress, "\r[{}{}] {}\x1b[K",
               std::string(static_cast<size_t>(filled), '#'),
               std::string(static_cast<size_t>(width - filled), '.'), counts);
    if (final) {
      fmt::print(options_.progress, "\n");
    }
  } else {
    fmt::print(options_.progress, "simulate: {}\n", counts);
  }
  std::fflush(options_.progress);
}

std::vector<std::string> SplitArgs(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view piece : absl::StrSplit(s, ' ', absl::SkipEmpty())) {
    out.emplace_back(piece);
  }
  return out;
}

absl::StatusOr<RunResult> Simulation::Run() {
  if (options_.work_dir.empty()) {
    char tmpl[] = "/tmp/tessera-simulate-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      return absl::InternalError("mkdtemp failed");
    }
    work_dir_ = tmpl;
  } else {
    std::error_code ec;
    work_dir_ = std::filesystem::absolute(options_.work_dir, ec).lexically_normal().string();
    if (!work_dir_.empty() && work_dir_.back() == '/') {
      work_dir_.pop_back();
    }
    std::filesystem::create_directories(work_dir_, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          fmt::format("cannot create the work directory {}: {}", work_dir_, ec.message()));
    }
  }
  std::vector<std::string> user = SplitArgs(options_.scheduler_args);
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
    TESSERA_RETURN_IF_ERROR(StartReal(options_.hami_bin.empty() ? serve_extra : user));
  } else {
    children_ = std::make_unique<ChildProcesses>(options_.binary, work_dir_);
    TESSERA_RETURN_IF_ERROR(children_->Start(serve_extra));
    http_port_ = children_->http_port();
    metrics_port_ = children_->metrics_port();
  }
  TESSERA_RETURN_IF_ERROR(MakeTransports());
  if (real_) {
    // No kube-controller-manager: the ServiceAccount admission plugin wants `default`.
    TESSERA_RETURN_IF_ERROR(CreateDefaultServiceAccount(*api_transport_, kNamespace));
  }
  TESSERA_RETURN_IF_ERROR(CreateQuotaNamespaces(scenario_, real_, *api_transport_));
  TESSERA_RETURN_IF_ERROR(CreatePriorityClasses(scenario_, real_, *api_transport_));
  TESSERA_RETURN_IF_ERROR(CreateNodes());
  TESSERA_RETURN_IF_ERROR(WaitReady());
  return RunWorkload();
}

std::unique_ptr<FaultInjector> Simulation::MakeFaultInjector() {
  FaultInjector::Options fo;
  fo.scenario = &scenario_;
  fo.real = real_;
  fo.api = api_transport_.get();
  fo.book = &book_;
  fo.children = children_.get();
  fo.control_plane = control_plane_.get();
  fo.later = &fault_tasks_;
  fo.clock = clock_;
  fo.delete_random_live = [this](int n, bool force) { pipeline_->DeleteRandomLive(n, force); };
  fo.pick_live = [this](int n, bool bound_only) { return pipeline_->PickLive(n, bound_only); };
  fo.delete_pod = [this](const std::string& name, bool force) {
    pipeline_->DeleteTask(name, force);
  };
  fo.random = [this] { return pipeline_->Rand(); };
  return std::make_unique<FaultInjector>(std::move(fo));
}

absl::StatusOr<PreemptionFindings> Simulation::JudgeRunPreemptions() {
  kube::Request r;
  r.path = "/simulator/v1/evictions";
  TESSERA_ASSIGN_OR_RETURN(kube::Response evictions, kube::Do(*api_transport_, r, QuickRetry()));
  PreemptionInput in;
  TESSERA_ASSIGN_OR_RETURN(in.evictions, ParseEvictions(evictions.body));
  std::string token;
  do {
    kube::ListOptions lo;
    lo.limit = 500;
    lo.continue_token = token;
    kube::Request page;
    page.path = "/api/v1/events" + kube::ListQuery(lo);
    TESSERA_ASSIGN_OR_RETURN(kube::Response events, kube::Do(*api_transport_, page, QuickRetry()));
    TESSERA_ASSIGN_OR_RETURN(std::vector<PreemptedEvent> found, ParsePreemptedEvents(events.body));
    in.events.insert(in.events.end(), found.begin(), found.end());
    const nlohmann::json list = nlohmann::json::parse(events.body, nullptr, false);
    token = list.is_object() && list.contains("metadata") && list["metadata"].is_object()
                ? list["metadata"].value("continue", "")
                : "";
  } while (!token.empty());
  TESSERA_ASSIGN_OR_RETURN(kube::NodeList nodes, client_->ListNodes(kube::ListOptions{}));
  in.nodes = std::move(nodes.items);
  kube::Decoder decoder;
  MutexLock l(&book_.mutex);
  for (const auto& [name, p] : book_.pods) {
    if (p.json.empty()) {
      continue;  // never created
    }
    absl::StatusOr<kube::Pod> pod = decoder.DecodePod(p.json);
    if (!pod.ok()) {
      return pod.status();
    }
    const std::string key = pod->meta.ns + "/" + pod->meta.name;
    in.pods[key] = {.pod = *std::move(pod), .node = p.node, .bound_at = p.bound_at};
    if (!p.node.empty() && p.left_at != absl::InfiniteFuture()) {
      in.departures.push_back({.pod = key, .node = p.node, .at = p.left_at});
    }
  }
  return JudgePreemptions(in);
}

absl::StatusOr<RunResult> Simulation::RunWorkload() {
  {
    MutexLock l(&book_.mutex);
    book_.result.scenario = scenario_.name;
    book_.result.label = options_.label;
    book_.result.seed = scenario_.seed;
    book_.result.duration = scenario_.duration;
    book_.result.window = scenario_.window;
    book_.result.nodes = scenario_.nodes;
    book_.result.gpus = scenario_.nodes * scenario_.gpus_per_node;
    book_.result.work_dir = work_dir_;
    book_.result.scheduler_args = options_.scheduler_args;
    book_.result.control_plane = real_ ? "real" : "apisim";
    if (!options_.hami_bin.empty()) {
      book_.result.scheduler = fmt::format("HAMi ({})", options_.hami_bin);
    }
  }
  start_ = Now();
  {
    MutexLock l(&book_.mutex);
    book_.result.start = start_;
  }
  tasks_.Start(options_.workers);
  node_tasks_.Start(3);
  // On the real control plane a fault blocks its worker for the restarts it waits out (seconds
  // each, serialised); more workers keep a due restart of serve from waiting behind them.
  fault_tasks_.Start(real_ ? 4 : 2);
  // apisim: the observer notices evictions for the kubelet (the pipeline, made next, is called
  // once the observer has started).
  std::function<void(const std::string&)> on_evicted;
  if (!real_) {
    on_evicted = [this](const std::string& name) { pipeline_->OnTerminating(name); };
  }
  observer_ = std::make_unique<Observer>(Observer::Options{.scenario = &scenario_,
                                                           .client = observer_client_.get(),
                                                           .metrics = metrics_transport_.get(),
                                                           .book = &book_,
                                                           .clock = clock_,
                                                           .on_evicted = std::move(on_evicted)});
  pipeline_ = std::make_unique<PodPipeline>(PodPipeline::Options{.scenario = &scenario_,
                                                                 .real = real_,
                                                                 .book = &book_,
                                                                 .api = api_transport_.get(),
                                                                 .node = node_transport_.get(),
                                                                 .node_client = node_client_.get(),
                                                                 .extender = extender_.get(),
                                                                 .observer = observer_.get(),
                                                                 .tasks = &tasks_,
                                                                 .node_tasks = &node_tasks_,
                                                                 .clock = clock_});
  faults_ = MakeFaultInjector();
  observer_->Start();
  if (!real_) {
    scheduler_events_ = std::make_unique<SchedulerEvents>(SchedulerEvents::Options{
        .scenario = &scenario_,
        .book = &book_,
        .client = scheduler_client_.get(),
        .clock = clock_,
        .retry = [this](const SchedulingQueue::Now& names) { pipeline_->Retry(names); }});
    scheduler_events_->Start();
  }
  if (real_) {
    RealKubelet::Options ko;
    ko.scenario = &scenario_;
    ko.book = &book_;
    ko.client = client_.get();
    ko.poll = observer_transport_.get();
    ko.control_plane = control_plane_.get();
    ko.clock = clock_;
    // Called with book_.mutex held, as the pipeline posts its next steps.
    ko.on_bound = [this](const std::string& name) { pipeline_->OnBound(name); };
    ko.on_terminating = [this](const std::string& name) { pipeline_->OnTerminating(name); };
    real_kubelet_ = std::make_unique<RealKubelet>(std::move(ko));
    real_kubelet_->Start();
  }

  // The fault schedule, expanded.
  std::vector<std::pair<absl::Duration, const FaultSpec*>> schedule;
  for (const FaultSpec& f : scenario_.faults) {
    for (absl::Duration at = f.at; at < scenario_.duration; at += f.every) {
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
  absl::Time next_flush = Now() + absl::Seconds(30);
  const absl::Duration progress_every =
      options_.progress_bar ? absl::Milliseconds(250) : absl::Seconds(5);
  while (true) {
    const absl::Time now = Now();
    const absl::Duration elapsed = now - start_;
    if (elapsed >= scenario_.duration + scenario_.drain) {
      break;
    }
    if (SimulationInterrupted().load()) {
      MutexLock l(&book_.mutex);
      book_.result.interrupted = true;
      break;
    }
    if (elapsed < scenario_.duration) {
      Tick(now, elapsed);
      while (next_fault < schedule.size() && schedule[next_fault].first <= elapsed) {
        const FaultSpec* f = schedule[next_fault++].second;
        fault_tasks_.Post(now, [this, f] { faults_->Inject(*f); });
      }
      const double want = absl::ToDoubleSeconds(elapsed) * scenario_.delete_rate;
      if (want - deletes_due >= 1) {
        const int n = static_cast<int>(want - deletes_due);
        deletes_due += n;
        pipeline_->DeleteRandomLive(n);
      }
    } else {
      bool first = false;
      {
        MutexLock l(&book_.mutex);
        first = book_.workload_on;
        book_.workload_on = false;
      }
      if (first) {
        // Drain: no new pods or faults; whatever was broken is repaired.
        fault_tasks_.Post(now, [this] { faults_->Repair(); });
      }
      Tick(now, elapsed);
    }
    if (scheduler_events_ != nullptr) {
      scheduler_events_->Pump();
      if (now >= next_flush) {
        next_flush = now + absl::Seconds(30);
        scheduler_events_->Flush();
      }
    }
    if (now - last_progress >= progress_every) {
      last_progress = now;
      Progress(elapsed, false);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  observer_->Stop();
  if (scheduler_events_ != nullptr) {
    scheduler_events_->Stop();
  }
  if (real_kubelet_ != nullptr) {
    real_kubelet_->Stop();
  }
  fault_tasks_.Stop();
  tasks_.Stop();
  node_tasks_.Stop();
  Progress(Now() - start_, true);
  observer_->Finish(Now());
  std::optional<absl::StatusOr<PreemptionFindings>> preemption;
  if (!real_ && !scenario_.priorities.empty()) {
    preemption = JudgeRunPreemptions();
  }
  {
    // Tessera's own view at the end, for whoever investigates a divergence.
    kube::Request r;
    r.path = "/debug/ledger";
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    absl::StatusOr<kube::Response> ledger =
        kube::Do(*metrics_transport_, r, std::move(once));  // /debug
    if (ledger.ok()) {
      (void)WriteWorkFile(work_dir_ + "/ledger-at-end.json", ledger->body);
    }
    // Close the kept-alive connections first: an HTTP server waits for its idle keep-alive
    // connections when it shuts down.
    extender_.reset();
    extender_transport_.reset();
    metrics_transport_.reset();
  }
  if (real_) {
    client_.reset();
    api_transport_.reset();
    node_client_.reset();
    node_transport_.reset();
    observer_client_.reset();
    observer_transport_.reset();
    const absl::Time t0 = Now();
    absl::Status down = control_plane_->Down();
    TESSERA_LOG(kInfo, "simulate: the control plane stopped in {}",
                absl::FormatDuration(Now() - t0));
    if (!down.ok()) {
      return absl::InternalError(
          fmt::format("stopping the real control plane: {}", std::string(down.message())));
    }
  } else {
    const absl::Time t0 = Now();
    children_->StopServe();
    const absl::Time t1 = Now();
    client_.reset();
    api_transport_.reset();
    node_client_.reset();
    node_transport_.reset();
    observer_client_.reset();
    observer_transport_.reset();
    children_->StopApisim();
    TESSERA_LOG(kInfo, "simulate: serve stopped in {}, apisim in {}", absl::FormatDuration(t1 - t0),
                absl::FormatDuration(Now() - t1));
  }
  RunResult out;
  std::vector<PodTimes> times;
  {
    MutexLock l(&book_.mutex);
    out = book_.result;
    for (const auto& [name, p] : book_.pods) {
      times.push_back({.created = p.created_at,
                       .refused = p.refused_at,
                       .bound = p.bound_at,
                       .gone_unbound = p.bound_at == absl::InfiniteFuture() &&
                                       (p.stage == Stage::kGone || p.stage == Stage::kDeleting)});
    }
    std::vector<double> ms = book_.filter_ms;
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
  observer_->Report(&out);
  if (preemption.has_value()) {
    if (!preemption->ok()) {
      out.violations.push_back({Now(),
                                fmt::format("the preemption oracle could not judge the run: {}",
                                            std::string(preemption->status().message())),
                                /*overcommit=*/false});
    } else {
      out.preemption = **preemption;
      for (const PreemptionFindings::Finding& v : out.preemption->violations) {
        out.violations.push_back({v.at, v.what, /*overcommit=*/false});
      }
    }
  }
  out.repair_waits =
      ComputeRepairWaits(out.divergences, out.transient_fault_spans, times, absl::Seconds(1));
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
