#include "bench/serve/serve_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <fmt/core.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tessera/accounting/projection.h"
#include "tessera/apisim/server.h"
#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/cycle/cycle.h"
#include "tessera/device/codec.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/decode.h"
#include "tessera/ledger/ledger.h"
#include "tessera/schedule/score.h"
#include "tessera/serve/service.h"
#include "tessera/sim/synthetic.h"

namespace tessera::bench {

using serve::ServeOptions;
using serve::Service;

namespace {

using SteadyClock = std::chrono::steady_clock;

double Ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) {
    return 0;
  }
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

double ResidentMiB() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) {
    return 0;
  }
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) {
    resident = 0;
  }
  std::fclose(f);
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
         (1024.0 * 1024.0);
}

// CPU seconds used so far by the whole process (every thread), and by the calling thread.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}
// Context switches so far of the whole process (every thread), voluntary and involuntary.
int64_t ProcessContextSwitches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_nvcsw) + static_cast<int64_t>(u.ru_nivcsw);
}
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

const apisim::ResourceInfo& Resource(const char* name) {
  return *apisim::FindResource("", "v1", name);
}

// A pending pod in apisim: its JSON as created (with uid) and its identity.
struct PendingPod {
  std::string json;
  std::string name;
  std::string uid;
};

// Candidate lists, `sets` of them drawn up front and handed out in turn: kube-scheduler's own
// filtering is not what is measured, so the clients must not spend the cores on it (drawing
// 500 of 5,000 names per call was 2 % of the process's samples).
class Candidates {
 public:
  struct Set {
    std::vector<std::string> names;
    std::string json;  // the names as the elements of a JSON array: "a","b",…
  };

  Candidates(int nodes, int count, uint64_t seed, int sets = 256) {
    std::vector<std::string> all;
    all.reserve(static_cast<size_t>(nodes));
    for (int i = 0; i < nodes; ++i) {
      all.push_back(sim::NodeName(i));
    }
    std::mt19937_64 rng(seed);
    sets_.resize(static_cast<size_t>(sets));
    for (Set& set : sets_) {
      std::sample(all.begin(), all.end(), std::back_inserter(set.names), std::min(count, nodes),
                  rng);
      for (const std::string& name : set.names) {
        set.json += set.json.empty() ? "\"" : ",\"";
        set.json += name;  // node names need no escaping
        set.json += '"';
      }
    }
  }
  // Thread-safe.
  const Set& Next() { return sets_[next_.fetch_add(1) % sets_.size()]; }

 private:
  std::vector<Set> sets_;
  std::atomic<size_t> next_{0};
};

// The ExtenderArgs kube-scheduler sends, built by concatenation (the client must not spend
// the CPU the service is measured on).
std::string FilterBody(const PendingPod& pod, const Candidates::Set& set) {
  std::string body;
  body.reserve(pod.json.size() + set.json.size() + 48);
  body += R"({"Pod":)";
  body += pod.json;
  body += R"(,"Nodes":null,"NodeNames":[)";
  body += set.json;
  body += "]}";
  return body;
}

// One /filter call; the chosen node ("" when none) or an error.
absl::StatusOr<std::string> PostFilter(httplib::Client& client, const std::string& body) {
  auto res = client.Post("/filter", body, "application/json");
  if (!res) {
    return absl::UnavailableError("/filter: no response (" + httplib::to_string(res.error()) + ")");
  }
  if (res->status != 200) {
    return absl::InternalError(fmt::format("/filter: HTTP {}: {}", res->status, res->body));
  }
  nlohmann::json reply = nlohmann::json::parse(res->body, nullptr, false);
  if (!reply.is_object()) {
    return absl::InternalError("/filter: not JSON: " + res->body);
  }
  if (reply.contains("Error") && reply["Error"].is_string() &&
      !reply["Error"].get<std::string>().empty()) {
    return absl::InternalError("/filter: " + reply["Error"].get<std::string>());
  }
  if (reply["NodeNames"].is_array() && reply["NodeNames"].size() == 1) {
    return reply["NodeNames"][0].get<std::string>();
  }
  return std::string();
}

absl::Status PostBind(httplib::Client& client, const PendingPod& pod, const std::string& ns,
                      const std::string& node) {
  nlohmann::json body = {
      {"PodName", pod.name}, {"PodNamespace", ns}, {"PodUID", pod.uid}, {"Node", node}};
  auto res = client.Post("/bind", body.dump(), "application/json");
  if (!res) {
    return absl::UnavailableError("/bind: no response");
  }
  nlohmann::json reply = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status != 200 || !reply.is_object()) {
    return absl::InternalError(fmt::format("/bind: HTTP {}: {}", res->status, res->body));
  }
  const std::string error = reply.value("Error", "");
  return error.empty() ? absl::OkStatus() : absl::AbortedError(error);
}

}  // namespace

absl::StatusOr<ServeBenchResult> RunServeBench(const ServeBenchOptions& o) {
  if (o.nodes < 1 || o.gpus_per_node < 1 || o.pods < 0 || o.candidates < 1 || o.clients < 1 ||
      o.duration <= absl::ZeroDuration() || o.baseline_calls < 1) {
    return absl::InvalidArgumentError(
        "bench serve: --nodes, --gpus, --candidates, --clients and --duration must be positive, "
        "--pods non-negative");
  }
  if (o.pending_mem_percent < 0 || o.pending_mem_percent > 100 || !(o.quota_headroom >= 0)) {
    return absl::InvalidArgumentError(
        "bench serve: --pending-mem-percent must be 0-100, --quota-headroom non-negative");
  }
  ServeBenchResult r;
  r.nodes = o.nodes;
  r.gpus = o.nodes * o.gpus_per_node;
  r.pods = o.pods;
  r.candidates = std::min(o.candidates, o.nodes);

  // 1. The cluster in apisim.
  apisim::ServerOptions sim_options;
  sim_options.watch_history = 200000;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<apisim::Server> sim, apisim::Server::Start(sim_options));
  sim::SyntheticClusterOptions cluster_options;
  cluster_options.nodes = o.nodes;
  cluster_options.gpus_per_node = o.gpus_per_node;
  cluster_options.pods = o.pods;
  {
    sim::SyntheticCluster cluster = sim::GenerateCluster(cluster_options);
    TESSERA_RETURN_IF_ERROR(sim::Populate(sim->store(), cluster));
  }
  char dir[] = "/tmp/tessera-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    return absl::InternalError("bench serve: cannot create a temporary directory");
  }
  const std::string kubeconfig = std::string(dir) + "/kubeconfig";
  std::ofstream(kubeconfig) << sim->Kubeconfig();

  const std::string ns = cluster_options.ns;
  const int phase2_pool = 500;
  // Enough that the clients do not run out at 2,400 pairs/s (phase 3 is two thirds of `duration`).
  const int phase3_pool =
      std::max(2000, static_cast<int>(absl::ToDoubleSeconds(o.duration) * 1600));
  if (o.quota_headroom > 0) {
    const double pods = static_cast<double>(o.pods) + phase2_pool + phase3_pool;
    const auto mem = static_cast<int64_t>(o.quota_headroom * pods * cluster_options.devmem_mib);
    const auto cores = static_cast<int64_t>(o.quota_headroom * pods * 100);
    nlohmann::json quota = {{"apiVersion", "v1"},
                            {"kind", "ResourceQuota"},
                            {"metadata", {{"name", "gpu"}, {"namespace", ns}}},
                            {"spec",
                             {{"hard",
                               {{"limits.nvidia.com/gpumem", std::to_string(mem)},
                                {"limits.nvidia.com/gpucores", std::to_string(cores)}}}}}};
    TESSERA_RETURN_IF_ERROR(
        sim->store().Create(Resource("resourcequotas"), ns, quota.dump()).status());
  }

  ServeOptions serve_options;
  serve_options.http_bind = "127.0.0.1:0";
  serve_options.metrics_bind_address = "";
  serve_options.kube.path = kubeconfig;
  serve_options.kube_qps = 0;  // unlimited: the benchmark measures the service, not the limiter
  serve_options.resync_period = absl::ZeroDuration();  // phase 2b runs its passes itself
  serve_options.resync_pace = o.resync_pace;
  serve_options.http_threads = static_cast<size_t>(o.clients) + 4;
  // A refused bind is retried by the clients below after 2, 4, 8 … ms (the lock is released
  // right after each bind), so the extender's own wait for a held lock stays off: the figures
  // keep measuring what they measured before --node-lock-retry-timeout existed.
  serve_options.node_lock_retry_timeout = absl::ZeroDuration();
  TESSERA_ASSIGN_OR_RETURN(serve_options.node_policy, device::ParseNodePolicy(o.node_policy));
  serve_options.avoid_busy_nodes = o.avoid_busy_nodes;
  const double rss_before = ResidentMiB();
  const SteadyClock::time_point sync_start = SteadyClock::now();
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Service> service, Service::Start(serve_options));
  if (!service->WaitForSync(absl::Minutes(5))) {
    return absl::DeadlineExceededError("bench serve: the informers did not sync in 5 minutes");
  }
  r.sync_seconds = Ms(SteadyClock::now() - sync_start) / 1000.0;
  r.rss_mib = ResidentMiB() - rss_before;
  std::remove(kubeconfig.c_str());
  rmdir(dir);

  // Pending pods for phases 2 and 3 (created after the sync so they do not count in it).
  std::vector<PendingPod> pending;
  pending.reserve(phase2_pool + phase3_pool);
  for (int i = 0; i < phase2_pool + phase3_pool; ++i) {
    PendingPod p;
    p.name = fmt::format("bench-{:06d}", i);
    std::string json = sim::PendingPodJson(ns, p.name, 1, 1000, 10);
    if (o.pending_mem_percent > 0) {
      nlohmann::json pod = nlohmann::json::parse(json);
      nlohmann::json& limits = pod["spec"]["containers"][0]["resources"]["limits"];
      limits.erase("nvidia.com/gpumem");
      limits["nvidia.com/gpumem-percentage"] = std::to_string(o.pending_mem_percent);
      json = pod.dump();
    }
    TESSERA_ASSIGN_OR_RETURN(p.json, sim->store().Create(Resource("pods"), ns, json));
    nlohmann::json parsed = nlohmann::json::parse(p.json);
    p.uid = parsed["metadata"]["uid"];
    pending.push_back(std::move(p));
  }
  Candidates candidates(o.nodes, o.candidates, o.seed);

  // 2. Filter latency, one client, sequential.
  {
    TESSERA_LOG(kInfo, "bench serve: phase 2, /filter latency with one client for {}",
                absl::FormatDuration(o.duration / 3));
    httplib::Client client("127.0.0.1", service->port());
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);
    client.set_read_timeout(30, 0);
    std::vector<double> latencies;
    const double process_cpu0 = ProcessCpuSeconds();
    const double client_cpu0 = ThreadCpuSeconds();
    const SteadyClock::time_point end =
        SteadyClock::now() + absl::ToChronoNanoseconds(o.duration / 3);
    for (int i = 0; SteadyClock::now() < end; ++i) {
      const std::string body = FilterBody(pending[i % phase2_pool], candidates.Next());
      const SteadyClock::time_point t0 = SteadyClock::now();
      absl::StatusOr<std::string> node = PostFilter(client, body);
      latencies.push_back(Ms(SteadyClock::now() - t0));
      if (!node.ok()) {
        return node.status();
      }
      if (node->empty()) {
        return absl::InternalError(
            "bench serve: a filter found no node in an empty-enough cluster");
      }
    }
    r.filters = static_cast<int64_t>(latencies.size());
    // Everything but this client thread: the service's threads and the in-process apisim
    // answering its patches and events (counted against Tessera).
    const double server_cpu =
        (ProcessCpuSeconds() - process_cpu0) - (ThreadCpuSeconds() - client_cpu0);
    r.filter_cpu_ms = r.filters > 0 ? server_cpu * 1000.0 / static_cast<double>(r.filters) : 0;
    r.filter_p50_ms = Percentile(latencies, 0.50);
    r.filter_p99_ms = Percentile(latencies, 0.99);
    r.filter_max_ms = latencies.empty() ? 0 : *std::max_element(latencies.begin(), latencies.end());
  }

  // 2a. The floor: the same client and candidate names, but a pod that requests no managed
  // device, which the service passes through without a decision, patch or event. What is left
  // is the machine's loopback round trip, the HTTP server and the request's decoding.
  {
    TESSERA_LOG(kInfo, "bench serve: phase 2a, the floor (a pod with no managed device) for {}",
                absl::FormatDuration(o.duration / 6));
    httplib::Client client("127.0.0.1", service->port());
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);
    client.set_read_timeout(30, 0);
    PendingPod passthrough;
    passthrough.json = nlohmann::json({{"apiVersion", "v1"},
                                       {"kind", "Pod"},
                                       {"metadata",
                                        {{"name", "bench-floor"},
                                         {"namespace", ns},
                                         {"uid", "00000000-0000-4000-8000-00000000f100"}}},
                                       {"spec",
                                        {{"schedulerName", "hami-scheduler"},
                                         {"containers",
                                          {{{"name", "main"},
                                            {"image", "busybox"},
                                            {"resources", {{"limits", {{"cpu", "1"}}}}}}}}}},
                                       {"status", {{"phase", "Pending"}}}})
                           .dump();
    std::vector<double> latencies;
    const SteadyClock::time_point end =
        SteadyClock::now() + absl::ToChronoNanoseconds(o.duration / 6);
    while (SteadyClock::now() < end) {
      const std::string body = FilterBody(passthrough, candidates.Next());
      const SteadyClock::time_point t0 = SteadyClock::now();
      absl::StatusOr<std::string> node = PostFilter(client, body);
      latencies.push_back(Ms(SteadyClock::now() - t0));
      if (!node.ok()) {
        return node.status();
      }
    }
    r.floor_calls = static_cast<int64_t>(latencies.size());
    r.floor_p50_ms = Percentile(latencies, 0.50);
    r.floor_p99_ms = Percentile(latencies, 0.99);
  }

  // 2b. Filter latency while resync passes run on another thread.
  if (o.resync_min_filters > 0) {
    TESSERA_LOG(kInfo, "bench serve: phase 2b, /filter latency during resync passes");
    httplib::Client client("127.0.0.1", service->port());
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);
    client.set_read_timeout(30, 0);
    std::vector<double> latencies;
    int i = 0;
    while (static_cast<int>(latencies.size()) < o.resync_min_filters) {
      std::atomic<bool> done{false};
      accounting::ResyncReport report;
      std::thread pass([&] {
        report = service->ResyncNow();
        done.store(true);
      });
      while (!done.load()) {
        const std::string body = FilterBody(pending[i++ % phase2_pool], candidates.Next());
        const SteadyClock::time_point t0 = SteadyClock::now();
        absl::StatusOr<std::string> node = PostFilter(client, body);
        const double ms = Ms(SteadyClock::now() - t0);
        if (!done.load()) {
          latencies.push_back(ms);
        }
        if (!node.ok()) {
          pass.join();
          return node.status();
        }
      }
      pass.join();
      if (!report.error.empty()) {
        return absl::InternalError("bench serve: resync: " + report.error);
      }
      if (r.resync_passes++ == 0) {
        r.resync_seconds = absl::ToDoubleSeconds(report.took);
        r.resync_list_requests = report.requests;
      }
      for (const auto& [kind, n] : report.corrections) {
        r.resync_corrections += n;
      }
    }
    r.filters_during_resync = static_cast<int64_t>(latencies.size());
    r.filter_during_resync_p50_ms = Percentile(latencies, 0.50);
    r.filter_during_resync_p99_ms = Percentile(latencies, 0.99);
  }

  // 3. Filter + bind pairs, `clients` at once; each client releases the node lock after its bind,
  // as the device plugin would after Allocate.
  {
    TESSERA_LOG(kInfo, "bench serve: phase 3, filter+bind pairs with {} clients for {}", o.clients,
                absl::FormatDuration(o.duration * 2 / 3));
    std::atomic<int> next{phase2_pool};
    std::atomic<int64_t> pairs{0}, errors{0}, retries{0};
    std::mutex mu;
    std::vector<double> bind_latencies;
    std::string first_error;
    const double process_cpu0 = ProcessCpuSeconds();
    const int64_t switches0 = ProcessContextSwitches();
    const SteadyClock::time_point start = SteadyClock::now();
    const SteadyClock::time_point end = start + absl::ToChronoNanoseconds(o.duration * 2 / 3);
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(o.clients));
    for (int c = 0; c < o.clients; ++c) {
      threads.emplace_back([&] {
        httplib::Client client("127.0.0.1", service->port());
        client.set_keep_alive(true);
        client.set_tcp_nodelay(true);
        client.set_read_timeout(30, 0);
        std::vector<double> local;
        while (SteadyClock::now() < end) {
          const int i = next.fetch_add(1);
          if (i >= static_cast<int>(pending.size())) {
            break;
          }
          const PendingPod& pod = pending[i];
          absl::StatusOr<std::string> node;
          absl::Status bound;
          for (int attempt = 1;; ++attempt) {
            node = PostFilter(client, FilterBody(pod, candidates.Next()));
            bound = node.ok() ? absl::OkStatus() : node.status();
            if (bound.ok() && node->empty()) {
              bound = absl::ResourceExhaustedError("no node fits");
            }
            if (bound.ok()) {
              const SteadyClock::time_point t0 = SteadyClock::now();
              bound = PostBind(client, pod, ns, *node);
              local.push_back(Ms(SteadyClock::now() - t0));
            }
            // Only a bind the extender refused is retried (PostBind's kAborted): the pod goes
            // back to the queue, as in kube-scheduler, and is filtered again after a backoff
            // (2, 4, 8 … ms here; kube-scheduler's starts at 1 s) that lets the lock's holder
            // finish its bind and release it.
            if (!absl::IsAborted(bound) || attempt >= std::max(o.pair_attempts, 1)) {
              break;
            }
            retries.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::milliseconds(2 << std::min(attempt - 1, 8)));
          }
          if (bound.ok()) {
            pairs.fetch_add(1);
            (void)sim->store().Patch(Resource("nodes"), "", *node, "", apisim::PatchType::kMerge,
                                     R"({"metadata":{"annotations":{"hami.io/mutex.lock":null}}})");
          } else {
            errors.fetch_add(1);
            std::lock_guard<std::mutex> lock(mu);
            if (first_error.empty()) {
              first_error = std::string(bound.message());
            }
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        bind_latencies.insert(bind_latencies.end(), local.begin(), local.end());
      });
    }
    for (std::thread& t : threads) {
      t.join();
    }
    const double seconds = Ms(SteadyClock::now() - start) / 1000.0;
    r.pairs = pairs.load();
    r.pair_cpu_ms =
        r.pairs > 0 ? (ProcessCpuSeconds() - process_cpu0) * 1000.0 / static_cast<double>(r.pairs)
                    : 0;
    r.pair_context_switches = r.pairs > 0
                                  ? static_cast<double>(ProcessContextSwitches() - switches0) /
                                        static_cast<double>(r.pairs)
                                  : 0;
    r.pair_errors = errors.load();
    r.pair_retries = retries.load();
    r.pairs_per_second = seconds > 0 ? static_cast<double>(r.pairs) / seconds : 0;
    r.bind_p50_ms = Percentile(bind_latencies, 0.50);
    r.bind_p99_ms = Percentile(bind_latencies, 0.99);
    if (!first_error.empty()) {
      TESSERA_LOG(kInfo, "bench serve: {} pairs failed; the first: {}", r.pair_errors, first_error);
    }
  }
  service->Stop();

  // 4. The baseline: every node's usage rebuilt from every pod, then the same decision.
  {
    TESSERA_LOG(kInfo, "bench serve: phase 4, the full-recompute baseline ({} calls)",
                o.baseline_calls);
    std::unique_ptr<device::Vendor> vendor = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
    TESSERA_ASSIGN_OR_RETURN(std::string node_list, sim->store().List(Resource("nodes"), "", {}));
    TESSERA_ASSIGN_OR_RETURN(kube::NodeList nodes, kube::DecodeNodeList(node_list));
    TESSERA_ASSIGN_OR_RETURN(std::string pod_list, sim->store().List(Resource("pods"), "", {}));
    TESSERA_ASSIGN_OR_RETURN(kube::PodList pods, kube::DecodePodList(pod_list));
    std::vector<std::shared_ptr<const device::NodeDevices>> registrations;
    for (const kube::Node& node : nodes.items) {
      if (auto devices = accounting::ProjectNode(*vendor, node); devices.ok()) {
        registrations.push_back(*devices);
      }
    }
    std::vector<ledger::PodAllocation> allocations;
    for (const kube::Pod& pod : pods.items) {
      if (auto a = accounting::ProjectPod(*vendor, pod); a.ok() && !a->node.empty()) {
        allocations.push_back(*std::move(a));
      }
    }
    TESSERA_ASSIGN_OR_RETURN(kube::Pod pod, kube::DecodePod(pending[0].json));
    const cycle::Decoded decoded = cycle::Decode(*vendor, pod, cycle::DecodeMode::kStrict);
    if (decoded.code == cycle::DecodeCode::kError) {
      return decoded.error;
    }
    const cycle::Config config{.node_policy = serve_options.node_policy};
    std::vector<double> latencies;
    const double baseline_cpu0 = ThreadCpuSeconds();
    for (int call = 0; call < o.baseline_calls; ++call) {
      const std::vector<std::string>& names = candidates.Next().names;
      const SteadyClock::time_point t0 = SteadyClock::now();
      std::unique_ptr<ledger::Ledger> ledger =
          ledger::Ledger::Recompute(registrations, allocations, {});
      std::vector<schedule::Candidate> list(names.size());
      for (size_t i = 0; i < names.size(); ++i) {
        list[i].name = names[i];
      }
      const cycle::Result d = cycle::Run(config,
                                         {.pod = &pod,
                                          .request = &decoded.request,
                                          .constraints = &decoded.constraints,
                                          .ledger = ledger.get()},
                                         &list);
      latencies.push_back(Ms(SteadyClock::now() - t0));
      if (!d.decision.winner) {
        return absl::InternalError("bench serve: the baseline found no node");
      }
    }
    r.baseline_cpu_ms = (ThreadCpuSeconds() - baseline_cpu0) * 1000.0 / o.baseline_calls;
    r.baseline_filter_p50_ms = Percentile(latencies, 0.50);
    r.baseline_ratio = r.filter_p50_ms > 0 ? r.baseline_filter_p50_ms / r.filter_p50_ms : 0;
    r.baseline_cpu_ratio = r.filter_cpu_ms > 0 ? r.baseline_cpu_ms / r.filter_cpu_ms : 0;
  }
  return r;
}

std::string ServeBenchJson(const ServeBenchResult& r) {
  nlohmann::json j = {{"nodes", r.nodes},
                      {"gpus", r.gpus},
                      {"pods", r.pods},
                      {"candidates", r.candidates},
                      {"filter_p50_ms", r.filter_p50_ms},
                      {"filter_p99_ms", r.filter_p99_ms},
                      {"pairs_per_second", r.pairs_per_second},
                      {"baseline_filter_p50_ms", r.baseline_filter_p50_ms},
                      {"baseline_ratio", r.baseline_ratio},
                      {"rss_mib", r.rss_mib},
                      {"sync_seconds", r.sync_seconds},
                      {"filters", r.filters},
                      {"filter_max_ms", r.filter_max_ms},
                      {"pairs", r.pairs},
                      {"pair_errors", r.pair_errors},
                      {"pair_retries", r.pair_retries},
                      {"bind_p50_ms", r.bind_p50_ms},
                      {"bind_p99_ms", r.bind_p99_ms},
                      {"resync_passes", r.resync_passes},
                      {"resync_seconds", r.resync_seconds},
                      {"resync_list_requests", r.resync_list_requests},
                      {"resync_corrections", r.resync_corrections},
                      {"filters_during_resync", r.filters_during_resync},
                      {"filter_during_resync_p50_ms", r.filter_during_resync_p50_ms},
                      {"filter_during_resync_p99_ms", r.filter_during_resync_p99_ms},
                      {"floor_calls", r.floor_calls},
                      {"floor_p50_ms", r.floor_p50_ms},
                      {"floor_p99_ms", r.floor_p99_ms},
                      {"filter_cpu_ms", r.filter_cpu_ms},
                      {"baseline_cpu_ms", r.baseline_cpu_ms},
                      {"baseline_cpu_ratio", r.baseline_cpu_ratio},
                      {"pair_cpu_ms", r.pair_cpu_ms},
                      {"pair_context_switches", r.pair_context_switches}};
  return j.dump();
}

std::string ServeBenchText(const ServeBenchResult& r) {
  return fmt::format(
      "cluster: {} nodes, {} GPUs, {} pods; {} candidates per filter\n"
      "initial sync: {:.2f} s; resident memory added by the service: {:.0f} MiB\n"
      "/filter: p50 {:.3f} ms, p99 {:.3f} ms, max {:.3f} ms over {} calls\n"
      "floor (/filter of a pod without devices: round trip, HTTP, decoding): p50 {:.3f} ms, p99 "
      "{:.3f} ms over {} calls\n"
      "filter+bind: {:.0f} pairs/s ({} pairs, {} failed, {} retried after a refused bind); bind "
      "p50 {:.3f} ms, p99 {:.3f} ms; CPU "
      "per pair {:.3f} ms and {:.1f} context switches (every thread)\n"
      "baseline (full recompute per filter): p50 {:.3f} ms = {:.0f}x Tessera's /filter p50\n"
      "resync: {:.2f} s and {} LIST requests per pass, {} corrections over {} passes; /filter "
      "during it: p50 {:.3f} ms, p99 {:.3f} ms over {} calls\n"
      "CPU per call: /filter {:.3f} ms (service and apisim threads), baseline {:.3f} ms = "
      "{:.0f}x\n",
      r.nodes, r.gpus, r.pods, r.candidates, r.sync_seconds, r.rss_mib, r.filter_p50_ms,
      r.filter_p99_ms, r.filter_max_ms, r.filters, r.floor_p50_ms, r.floor_p99_ms, r.floor_calls,
      r.pairs_per_second, r.pairs, r.pair_errors, r.pair_retries, r.bind_p50_ms, r.bind_p99_ms,
      r.pair_cpu_ms, r.pair_context_switches, r.baseline_filter_p50_ms, r.baseline_ratio,
      r.resync_seconds, r.resync_list_requests, r.resync_corrections, r.resync_passes,
      r.filter_during_resync_p50_ms, r.filter_during_resync_p99_ms, r.filters_during_resync,
      r.filter_cpu_ms, r.baseline_cpu_ms, r.baseline_cpu_ratio);
}

}  // namespace tessera::bench
