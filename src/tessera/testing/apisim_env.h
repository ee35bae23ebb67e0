// File: tessera/testing/apisim_env.h
//
// Test-only (library tessera::testing). An in-process API server simulator reached the way
// Tessera reaches a real one: apisim::Server on 127.0.0.1 port 0 (default namespaces created),
// the real CurlTransport, a FaultTransport in front of it, and a kube::ApiClient over that.
//
//   testing::ApisimEnv env;
//   ASSERT_NO_FATAL_FAILURE(env.Start());
//   env.CreateNode("gpu-1", R"({"hami.io/node-nvidia-register":"..."})");
//   env.faults()->Inject("PATCH", "/api/v1/namespaces/default/pods/", 500, "InternalError");
//   env.FailRequests({"patch"});       // apisim's own fault: every PATCH answers 500
//   std::string kubeconfig = env.KubeconfigPath();  // for code that takes a kubeconfig file
//   std::string dir = env.ScratchDir();  // a temporary folder, removed with its files by Stop
//
// By default the client does not retry (Options::max_attempts), so an injected failure reaches
// the code under test at once and costs no time.
//
// Thread safety: Start and Stop from the test's thread; the members are as thread-safe as their
// own types (FaultTransport is).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/apisim/server.h"
#include "tessera/apisim/store.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/transport.h"

namespace tessera::testing {

// Forwards to `inner`, records every request, and answers matching requests with a canned
// Kubernetes Status instead (each rule a limited number of times).
class FaultTransport : public kube::Transport {
 public:
  explicit FaultTransport(kube::Transport* inner) : inner_(inner) {}

  // The next `times` requests with this method whose path starts with `path_prefix` get
  // `code` with a Status whose reason is `reason`, without reaching the server.
  void Inject(std::string method, std::string path_prefix, int code, std::string reason,
              int times = 1);
  std::vector<kube::Request> requests();
  // Requests with this method whose path starts with the prefix.
  std::vector<kube::Request> Matching(std::string_view method, std::string_view prefix);
  void Clear();

  void Send(kube::Request request, kube::ResponseCallback done) override;
  kube::StreamId Stream(kube::Request request, kube::StreamHandlers handlers) override;
  void Cancel(kube::StreamId id) override;

 private:
  struct Rule {
    std::string method;
    std::string prefix;
    int code;
    std::string reason;
    int times;
  };
  kube::Transport* const inner_;
  Mutex mu_;
  std::vector<Rule> rules_ ABSL_GUARDED_BY(mu_);
  std::vector<kube::Request> requests_ ABSL_GUARDED_BY(mu_);
};

class ApisimEnv {
 public:
  struct Options {
    apisim::ServerOptions server;
    // Attempts per client request (1: no retry), and retries never sleep. 0: the client's
    // defaults (kube::RetryPolicy, backoff sleeps on the real clock).
    int max_attempts = 1;
  };

  ApisimEnv() = default;
  ~ApisimEnv() { Stop(); }
  ApisimEnv(const ApisimEnv&) = delete;
  ApisimEnv& operator=(const ApisimEnv&) = delete;

  // Fails the test (ASSERT) when the server or the transport cannot start.
  void Start() { Start(Options()); }
  void Start(const Options& options);
  // The client first, then the server; removes the kubeconfig file. Idempotent.
  void Stop();

  apisim::Server* server() { return server_.get(); }
  apisim::Store& store() { return server_->store(); }
  std::string url() const { return server_->url(); }
  kube::ApiClient* client() { return client_.get(); }
  FaultTransport* faults() { return faults_.get(); }
  kube::Transport* transport() { return faults_.get(); }
  // A temporary folder for the test's files (created on first use; Stop removes it and what it
  // holds). Fails the test (ADD_FAILURE) and returns "" when it cannot be created.
  std::string ScratchDir();
  // A kubeconfig file for this server in ScratchDir() (written on first use).
  std::string KubeconfigPath();

  // Every request whose verb is in `verbs` ("get", "list", "patch", "update", ...) answers 500
  // (apisim's fault injection); an empty list ends the fault.
  void FailRequests(std::vector<std::string> verbs);

  // Store calls for core/v1 objects; each fails the test (ASSERT) on an error.
  void Create(std::string_view resource, std::string_view ns, const std::string& body);
  void Delete(std::string_view resource, std::string_view ns, std::string_view name);
  // A node with the given annotations (JSON object text, e.g. {"a":"b"}).
  void CreateNode(const std::string& name, const std::string& annotations_json);
  // A pod in `default` with one container `limits_json` (e.g. {"nvidia.com/gpu":"1"}), for
  // scheduler `scheduler_name`.
  void CreatePod(const std::string& name, const std::string& limits_json,
                 const std::string& annotations_json = "{}",
                 const std::string& scheduler_name = "hami-scheduler");

 private:
  std::unique_ptr<apisim::Server> server_;
  std::unique_ptr<kube::Transport> curl_;
  std::unique_ptr<FaultTransport> faults_;
  std::unique_ptr<kube::ApiClient> client_;
  std::string scratch_dir_;
  std::string kubeconfig_path_;
};

// A CurlTransport and an ApiClient (default options) for one API server: for a server this
// process does not own (ApisimProcess).
class ApiConnection {
 public:
  // Fails the test (ADD_FAILURE) when the transport cannot be created; ok() then says false.
  explicit ApiConnection(const kube::RestConfig& config);
  // The server at `url`, without token or QPS limit.
  explicit ApiConnection(const std::string& url) : ApiConnection(PlainConfig(url)) {}
  static kube::RestConfig PlainConfig(const std::string& url);
  bool ok() const { return client_ != nullptr; }
  kube::Transport* transport() { return transport_.get(); }
  kube::ApiClient* client() { return client_.get(); }
  // One request (content type `content_type` when there is a body).
  absl::StatusOr<kube::Response> Call(const std::string& method, const std::string& path,
                                      const std::string& body = "",
                                      const std::string& content_type = "application/json");
  // Call, failing the test (ASSERT) on a transport error (an HTTP error status is no failure).
  void MustCall(const std::string& method, const std::string& path, const std::string& body = "",
                const std::string& content_type = "application/json");
  // MinimalPodJson(name) created in `default`; deleted at once (grace period 0).
  void CreatePod(const std::string& name);
  void DeletePod(const std::string& name);

 private:
  std::unique_ptr<kube::Transport> transport_;
  std::unique_ptr<kube::ApiClient> client_;
};

// The core/v1 resource `name` ("pods", "nodes", ...); fails the test when unknown.
const apisim::ResourceInfo& CoreResource(std::string_view name);

}  // namespace tessera::testing
