// Integration: a PodInformer over the real CurlTransport against `tessera apisim` subprocesses
// under the faults of issue 4 that informer_apisim_test.cc does not cover:
//   - a simulator restart from its --state file, with changes made while the informer was
//     disconnected (by another simulator process started from the same file);
//   - 500 and 429 storms on list and watch: the informer backs off (requests counted by the
//     server's /simulator/v1/stats) and converges once the storm ends;
//   - HTTPS with CA verification and a bearer token from the kubeconfig apisim writes; a CA
//     that did not sign the server's certificate and a wrong token are refused with clear errors.
// Convergence means: the store holds exactly the server's objects with the same uids and
// resourceVersions, and every pod deleted behind the informer's back reached the handlers as a
// "final state unknown" deletion exactly once.
//
// Every wait has a deadline; the simulators are always killed (ApisimProcess's destructor).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/informer.h"
#include "tessera/kube/transport.h"
#include "tessera/testing/apisim_env.h"
#include "tessera/testing/apisim_process.h"
#include "tessera/testing/objects.h"
#include "tessera/testing/wait.h"

namespace tessera::kube {
namespace {

using ::tessera::testing::ApisimProcess;
using ::testing::HasSubstr;
using ::testing::Not;

// key → (uid, resourceVersion)
using State = std::map<std::string, std::pair<std::string, std::string>>;

using ::tessera::testing::Eventually;

// The deadline of a wait on the apisim process (generous for a loaded machine).
constexpr absl::Duration kWait = absl::Seconds(30);

std::string PodBody(const std::string& name) { return ::tessera::testing::MinimalPodJson(name); }

int64_t Rv(const std::string& rv) {
  int64_t v = -1;
  return absl::SimpleAtoi(rv, &v) ? v : -1;
}

// A transport and a client for one server, and the calls the tests make through them.
struct Conn : ::tessera::testing::ApiConnection {
  using ApiConnection::ApiConnection;
  static RestConfig Plain(const std::string& url) { return PlainConfig(url); }

  void LabelPod(const std::string& name, const std::string& value) {
    MustCall("PATCH", "/api/v1/namespaces/default/pods/" + name,
             fmt::format(R"({{"metadata":{{"labels":{{"x":"{}"}}}}}})", value),
             "application/merge-patch+json");
  }
  // The server's pods and the list's resourceVersion.
  std::pair<State, std::string> ServerState() {
    absl::StatusOr<PodList> list = client()->ListPods(ListOptions());
    EXPECT_TRUE(list.ok()) << list.status();
    State s;
    if (!list.ok()) {
      return {s, ""};
    }
    for (const Pod& p : list->items) {
      s[p.Key()] = {p.meta.uid, p.meta.resource_version};
    }
    return {s, list->meta.resource_version};
  }
  nlohmann::json Stats() {
    absl::StatusOr<Response> r = Call("GET", "/simulator/v1/stats");
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) {
      return nlohmann::json::object();
    }
    return nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  }
};

State StoreState(const PodInformer& informer) {
  State s;
  for (const auto& p : informer.store().List()) {
    s[p->Key()] = {p->meta.uid, p->meta.resource_version};
  }
  return s;
}

// The store changes before the handlers of the same delivery run: waits until the worker has
// finished every delivery queued so far.
bool Delivered(PodInformer& informer) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  informer.Wake([done] { done->store(true); });
  return Eventually([&] { return done->load(); }, kWait);
}

// What the handlers saw.
struct Recorder {
  EventHandlers<Pod> Handlers() {
    EventHandlers<Pod> h;
    h.on_add = [this](const Pod& p, bool) {
      MutexLock l(&mu);
      alive[p.Key()] = p.meta.uid;
    };
    h.on_update = [this](const Pod& old_pod, const Pod& p) {
      MutexLock l(&mu);
      alive[p.Key()] = p.meta.uid;
      if (old_pod.meta.uid == p.meta.uid &&
          Rv(p.meta.resource_version) < Rv(old_pod.meta.resource_version)) {
        regressions.push_back(fmt::format("{}: {} -> {}", p.Key(), old_pod.meta.resource_version,
                                          p.meta.resource_version));
      }
    };
    h.on_delete = [this](const Pod& p, bool unknown) {
      MutexLock l(&mu);
      alive.erase(p.Key());
      ++(unknown ? tombstones : deletes)[p.Key()];
    };
    return h;
  }
  int Tombstones(const std::string& key) {
    MutexLock l(&mu);
    return tombstones[key];
  }
  int Deletes(const std::string& key) {
    MutexLock l(&mu);
    return deletes[key];
  }
  std::set<std::string> Alive() {
    MutexLock l(&mu);
    std::set<std::string> keys;
    for (const auto& [k, uid] : alive) {
      keys.insert(k);
    }
    return keys;
  }
  std::vector<std::string> Regressions() {
    MutexLock l(&mu);
    return regressions;
  }

  Mutex mu;
  std::map<std::string, std::string> alive ABSL_GUARDED_BY(mu);  // key → uid
  std::map<std::string, int> tombstones ABSL_GUARDED_BY(mu);
  std::map<std::string, int> deletes ABSL_GUARDED_BY(mu);
  std::vector<std::string> regressions ABSL_GUARDED_BY(mu);
};

std::set<std::string> KeysOf(const State& s) {
  std::set<std::string> keys;
  for (const auto& [k, v] : s) {
    keys.insert(k);
  }
  return keys;
}

PodInformer::Options FastOptions(const std::string& name) {
  PodInformer::Options opts;
  opts.name = name;
  opts.reflector.page_size = 4;
  // No jitter: the storm test bounds the number of attempts from these delays.
  opts.reflector.backoff = {absl::Milliseconds(100), absl::Seconds(1), 2.0, 0.0};
  return opts;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "/tessera-kubetests-XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) {
      path_ = tmpl;
    }
  }
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string PortOf(const std::string& url) { return url.substr(url.rfind(':') + 1); }

// A write the simulator acknowledged is never lost across a SIGTERM restart, as etcd never loses
// a committed write. The simulator used to save its state before it stopped serving, so creates
// answered 201 between the save and the stop vanished and the restarted server reused their
// resourceVersions: an informer that had seen them resumed its watch past new objects
// (`tessera simulate --scenario chaos` found it as an over-commit after an apisim restart).
TEST(InformerApisimFaultsTest, AcknowledgedWritesSurviveASigtermRestart) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string state_file = dir.path() + "/state.json";
  const std::string bin = ApisimProcess::DefaultBinary();
  ApisimProcess sim;
  const std::string url = sim.Start(bin, {"--state", state_file});
  ASSERT_FALSE(url.empty()) << "tessera apisim did not start; tried '" << bin << "'";
  std::vector<std::string> acknowledged;
  std::atomic<int> written{0};
  std::atomic<bool> stop_writing{false};
  std::thread writer([&] {
    Conn conn(Conn::Plain(url));
    for (int i = 0; !stop_writing.load() && conn.ok(); ++i) {
      const std::string name = fmt::format("w{}", i);
      absl::StatusOr<Response> r =
          conn.Call("POST", "/api/v1/namespaces/default/pods", PodBody(name));
      if (!r.ok()) {
        break;  // the server went away
      }
      if (r->status_code == 201) {
        acknowledged.push_back(name);
        written.fetch_add(1);
      }
    }
  });
  // The writer is under way (it goes on until the server stops).
  EXPECT_TRUE(Eventually([&] { return written.load() >= 20; }, kWait));
  const int status = sim.Stop();  // SIGTERM while creates are in flight
  stop_writing.store(true);
  writer.join();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_FALSE(acknowledged.empty());

  ApisimProcess again;
  const std::string url2 = again.Start(bin, {"--state", state_file});
  ASSERT_FALSE(url2.empty());
  Conn conn(Conn::Plain(url2));
  auto [server, rv] = conn.ServerState();
  std::vector<std::string> lost;
  for (const std::string& name : acknowledged) {
    if (server.count("default/" + name) == 0) {
      lost.push_back(name);
    }
  }
  EXPECT_THAT(lost, ::testing::IsEmpty()) << acknowledged.size() << " creates acknowledged";
}

TEST(InformerApisimFaultsTest, ConvergesAcrossARestartFromTheStateFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string state_file = dir.path() + "/state.json";
  const std::string bin = ApisimProcess::DefaultBinary();
  ApisimProcess sim;
  const std::string url = sim.Start(bin, {"--state", state_file});
  ASSERT_FALSE(url.empty()) << "tessera apisim did not start (set TESSERA_APISIM_BIN); tried '"
                            << bin << "'";
  Conn conn(Conn::Plain(url));
  ASSERT_TRUE(conn.ok());
  for (int i = 0; i < 8; ++i) {
    conn.CreatePod(fmt::format("p{}", i));
  }
  Recorder rec;
  PodInformer informer(conn.client(), FastOptions("restart"), rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(20)));
  conn.DeletePod("p7");  // seen by the watch
  ASSERT_TRUE(Eventually([&] { return informer.store().Get("default/p7") == nullptr; }, kWait));
  auto [before, rv_before] = conn.ServerState();
  ASSERT_EQ(StoreState(informer), before);
  const std::string old_p2_uid = before.at("default/p2").first;

  // SIGTERM: the simulator saves its state and exits 0.
  const int status = sim.Stop();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_TRUE(std::filesystem::exists(state_file));

  // The outage: another simulator (another port) serves the saved state and takes changes the
  // informer cannot see, then saves them in turn.
  {
    ApisimProcess other;
    const std::string other_url = other.Start(bin, {"--state", state_file});
    ASSERT_FALSE(other_url.empty());
    Conn b(Conn::Plain(other_url));
    auto [loaded, loaded_rv] = b.ServerState();
    EXPECT_EQ(loaded, before) << "the state file did not keep uids and resourceVersions";
    EXPECT_GE(Rv(loaded_rv), Rv(rv_before));
    b.DeletePod("p0");
    b.DeletePod("p1");
    b.DeletePod("p2");
    b.CreatePod("p2");  // same name, new uid
    b.LabelPod("p3", "changed");
    b.CreatePod("r0");
    const int other_status = other.Stop();
    ASSERT_TRUE(WIFEXITED(other_status) && WEXITSTATUS(other_status) == 0) << other_status;
  }
  // Still the old view: nothing reached the informer.
  EXPECT_NE(informer.store().Get("default/p0"), nullptr);

  // The simulator comes back on the informer's port from the file.
  std::string url2;
  Eventually(  // until the port is no longer held
      [&] {
        url2 = sim.Start(bin, {"--state", state_file, "--listen", "127.0.0.1:" + PortOf(url)});
        return !url2.empty();
      },
      absl::Seconds(10), absl::Milliseconds(200));
  ASSERT_EQ(url2, url);
  const absl::Time restarted = absl::Now();

  State server;
  std::string server_rv;
  ASSERT_TRUE(Eventually(
      [&] {
        std::tie(server, server_rv) = conn.ServerState();
        return StoreState(informer) == server;
      },
      kWait))
      << ::testing::PrintToString(StoreState(informer))
      << " != " << ::testing::PrintToString(server);
  ASSERT_TRUE(Delivered(informer));
  RecordProperty("convergence_ms",
                 std::to_string(absl::ToInt64Milliseconds(absl::Now() - restarted)));
  EXPECT_EQ(KeysOf(server), (std::set<std::string>{"default/p2", "default/p3", "default/p4",
                                                   "default/p5", "default/p6", "default/r0"}));
  EXPECT_EQ(rec.Alive(), KeysOf(server));
  EXPECT_NE(server.at("default/p2").first, old_p2_uid);
  EXPECT_GT(Rv(server.at("default/p3").second), Rv(before.at("default/p3").second));
  // Deleted during the outage: one final-state-unknown deletion each; p7 by its watch event.
  for (const char* key : {"default/p0", "default/p1"}) {
    EXPECT_EQ(rec.Tombstones(key), 1) << key;
    EXPECT_EQ(rec.Deletes(key), 0) << key;
  }
  EXPECT_EQ(rec.Deletes("default/p7"), 1);
  EXPECT_EQ(rec.Tombstones("default/p7"), 0);
  // resourceVersions never went backwards across the restart.
  EXPECT_THAT(rec.Regressions(), ::testing::IsEmpty());
  EXPECT_GT(Rv(server_rv), Rv(rv_before));
  EXPECT_GE(Rv(informer.counters().reflector.last_resource_version), Rv(server_rv))
      << "the informer did not reach the server's revision";
  EXPECT_GE(informer.counters().reflector.relists, 1);
  informer.Stop();
}

class StormTest : public ::testing::TestWithParam<int> {};

TEST_P(StormTest, BacksOffDuringTheStormAndConvergesAfter) {
  const int code = GetParam();
  const std::string bin = ApisimProcess::DefaultBinary();
  ApisimProcess sim;
  const std::string url = sim.Start(bin);
  ASSERT_FALSE(url.empty()) << "tessera apisim did not start; tried '" << bin << "'";
  Conn conn(Conn::Plain(url));
  ASSERT_TRUE(conn.ok());
  for (int i = 0; i < 6; ++i) {
    conn.CreatePod(fmt::format("p{}", i));
  }
  Recorder rec;
  PodInformer informer(conn.client(), FastOptions(fmt::format("storm{}", code)), rec.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(20)));
  ASSERT_TRUE(Eventually([&] { return informer.counters().reflector.watches >= 1; }, kWait));

  const nlohmann::json stats_before = conn.Stats();
  const auto reads = [](const nlohmann::json& s) {
    return s["requests"].value("list", int64_t{0}) + s["requests"].value("watch", int64_t{0});
  };
  const int64_t reads_before = reads(stats_before);
  const int64_t injected_before = stats_before.value("faultsInjected", int64_t{0});

  conn.MustCall("PUT", "/simulator/v1/faults",
                fmt::format(R"({{"failRequests":{{"probability":1.0,"code":{},)"
                            R"("verbs":["list","watch"]}}}})",
                            code));
  const absl::Time storm_start = absl::Now();
  conn.MustCall("POST", "/simulator/v1/sever-watches", "{}");
  // Changes during the storm (create and delete are not failed).
  conn.DeletePod("p0");
  conn.DeletePod("p1");
  conn.CreatePod("s0");
  conn.LabelPod("p2", "storm");
  // The storm lasts until the backoff has reached its cap and one more attempt has failed
  // after a capped wait (about 2.5 s; see below): what the bounds below check, with no fixed wait.
  int64_t errors_at_cap = -1;
  ASSERT_TRUE(Eventually(
      [&] {
        const ReflectorCounters c = informer.counters().reflector;
        if (c.last_backoff < absl::Seconds(1)) {
          return false;
        }
        if (errors_at_cap < 0) {
          errors_at_cap = c.list_errors + c.watch_errors;
        }
        return c.list_errors + c.watch_errors > errors_at_cap;
      },
      kWait))
      << "the backoff did not reach its cap: " << informer.counters().reflector.last_backoff;
  const nlohmann::json stats_storm = conn.Stats();
  const absl::Duration storm = absl::Now() - storm_start;
  const InformerCounters during = informer.counters();
  conn.MustCall("DELETE", "/simulator/v1/faults");
  const absl::Time storm_end = absl::Now();

  // Attempts after the first failure come at 0.1, 0.3, 0.7, 1.5 s, then one a second at most
  // (cap 1 s, no jitter): at most 4 + storm seconds. Slack 2: a watch restarted at once when the
  // severed stream looked like a clean close, and the attempt in flight at either end.
  const int64_t attempts = reads(stats_storm) - reads_before;
  const int64_t injected = stats_storm.value("faultsInjected", int64_t{0}) - injected_before;
  const int64_t bound = 6 + static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(storm)));
  EXPECT_GE(attempts, 3) << "the informer gave up instead of retrying";
  EXPECT_LE(attempts, bound) << "the informer hammered the server during a " << code << " storm of "
                             << storm;
  EXPECT_GE(injected, attempts - 1) << "requests during the storm were not failed";
  EXPECT_GE(during.reflector.last_backoff, absl::Milliseconds(800))
      << "the backoff did not grow: " << during.reflector.last_backoff;
  EXPECT_FALSE(during.reflector.last_error.ok());
  EXPECT_EQ(informer.store().Get("default/s0"), nullptr) << "an event got through the storm";

  State server;
  ASSERT_TRUE(Eventually(
      [&] {
        server = conn.ServerState().first;
        return StoreState(informer) == server;
      },
      kWait))
      << ::testing::PrintToString(StoreState(informer))
      << " != " << ::testing::PrintToString(server);
  ASSERT_TRUE(Delivered(informer));
  const absl::Duration converged = absl::Now() - storm_end;
  RecordProperty("attempts_during_storm", std::to_string(attempts));
  RecordProperty("convergence_ms", std::to_string(absl::ToInt64Milliseconds(converged)));
  // The next retry is at most one capped backoff (1 s) away.
  EXPECT_LE(converged, absl::Seconds(10));
  EXPECT_EQ(KeysOf(server), (std::set<std::string>{"default/p2", "default/p3", "default/p4",
                                                   "default/p5", "default/s0"}));
  EXPECT_EQ(rec.Alive(), KeysOf(server));
  for (const char* key : {"default/p0", "default/p1"}) {
    EXPECT_EQ(rec.Tombstones(key) + rec.Deletes(key), 1) << key;
  }
  if (code == 500) {
    // A 500 on the watch is not a "come back later": the informer relisted, and the deletions
    // it missed came back as final-state-unknown tombstones.
    EXPECT_GE(informer.counters().reflector.relists, 1);
    EXPECT_EQ(rec.Tombstones("default/p0"), 1);
  }
  EXPECT_THAT(rec.Regressions(), ::testing::IsEmpty());
  informer.Stop();
}

INSTANTIATE_TEST_SUITE_P(Codes, StormTest, ::testing::Values(500, 429),
                         [](const ::testing::TestParamInfo<int>& param_info) {
                           return fmt::format("Http{}", param_info.param);
                         });

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(InformerApisimFaultsTest, HttpsWithCaAndTokenAndRefusals) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string token = "s3cret-token-4f1a";
  const std::string kc = dir.path() + "/kubeconfig";
  const std::string bin = ApisimProcess::DefaultBinary();
  ApisimProcess sim;
  const std::string url =
      sim.Start(bin, {"--tls-self-signed", "--token", token, "--write-kubeconfig", kc});
  ASSERT_FALSE(url.empty()) << "tessera apisim did not start; tried '" << bin << "'";
  ASSERT_EQ(url.rfind("https://", 0), 0u) << url;

  KubeconfigOptions ko;
  ko.path = kc;
  absl::StatusOr<RestConfig> config = LoadKubeconfig(ko);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, url);
  EXPECT_FALSE(config->ca_pem.empty());
  EXPECT_FALSE(config->insecure_skip_tls_verify);
  {
    Conn conn(*config);
    ASSERT_TRUE(conn.ok());
    for (int i = 0; i < 5; ++i) {
      conn.CreatePod(fmt::format("p{}", i));
    }
    Recorder rec;
    PodInformer informer(conn.client(), FastOptions("https"), rec.Handlers());
    informer.Start();
    ASSERT_TRUE(informer.WaitForSync(absl::Seconds(20)));
    conn.DeletePod("p0");
    conn.CreatePod("q0");
    State server;
    ASSERT_TRUE(Eventually(
        [&] {
          server = conn.ServerState().first;
          return StoreState(informer) == server;
        },
        kWait));
    ASSERT_TRUE(Delivered(informer));
    EXPECT_EQ(server.size(), 5u);
    EXPECT_EQ(rec.Deletes("default/p0"), 1);
    informer.Stop();
  }

  // A CA that did not sign the server's certificate (same names, so only trust differs).
  const std::string other_key = dir.path() + "/other.key";
  const std::string other_crt = dir.path() + "/other.crt";
  const std::string cmd = fmt::format(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout '{}' "
      "-out '{}' -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost -days 1 "
      ">/dev/null 2>&1",
      other_key, other_crt);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a certificate: " << cmd;
  const std::string untrusted_kc = dir.path() + "/untrusted-kubeconfig";
  {
    std::ofstream out(untrusted_kc);
    out << fmt::format(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\n"
        "users:\n- name: u\n  user:\n    token: {}\n"
        "contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n",
        url, other_crt, token);
  }
  ko.path = untrusted_kc;
  absl::StatusOr<RestConfig> untrusted = LoadKubeconfig(ko);
  ASSERT_TRUE(untrusted.ok()) << untrusted.status();
  {
    Conn conn(*untrusted);
    ASSERT_TRUE(conn.ok());
    absl::StatusOr<PodList> list = conn.client()->ListPods(ListOptions());
    ASSERT_FALSE(list.ok());
    EXPECT_EQ(list.status().code(), absl::StatusCode::kFailedPrecondition) << list.status();
    EXPECT_THAT(std::string(list.status().message()), HasSubstr("not trusted"));
    EXPECT_THAT(std::string(list.status().message()), Not(HasSubstr(token)));
    // The informer does not sync and reports the same error.
    Recorder rec;
    PodInformer informer(conn.client(), FastOptions("untrusted"), rec.Handlers());
    informer.Start();
    EXPECT_TRUE(Eventually(
        [&] {
          return informer.counters().reflector.last_error.code() ==
                 absl::StatusCode::kFailedPrecondition;
        },
        absl::Seconds(10)))
        << informer.counters().reflector.last_error;
    EXPECT_FALSE(informer.HasSynced());
    EXPECT_EQ(informer.store().size(), 0u);
    informer.Stop();
  }

  // The right CA, a wrong token.
  const std::string wrong = "wrong-token-9c2e";
  const std::string wrong_kc = dir.path() + "/wrong-token-kubeconfig";
  {
    const std::string original = ReadFile(kc);
    ASSERT_THAT(original, HasSubstr("token: " + token));
    std::ofstream out(wrong_kc);
    out << absl::StrReplaceAll(original, {{"token: " + token, "token: " + wrong}});
  }
  ko.path = wrong_kc;
  absl::StatusOr<RestConfig> wrong_config = LoadKubeconfig(ko);
  ASSERT_TRUE(wrong_config.ok()) << wrong_config.status();
  {
    Conn conn(*wrong_config);
    ASSERT_TRUE(conn.ok());
    absl::StatusOr<PodList> list = conn.client()->ListPods(ListOptions());
    ASSERT_FALSE(list.ok());
    EXPECT_EQ(list.status().code(), absl::StatusCode::kUnauthenticated) << list.status();
    const std::string message(list.status().message());
    EXPECT_THAT(message, HasSubstr("Unauthorized"));
    EXPECT_THAT(message, Not(HasSubstr(wrong)));
    EXPECT_THAT(message, Not(HasSubstr(token)));
  }
}

}  // namespace
}  // namespace tessera::kube
