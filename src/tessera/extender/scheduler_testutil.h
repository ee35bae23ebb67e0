// Test helpers for the extender: an in-process apisim reached over the real CurlTransport, with
// transport wrappers that record requests and inject canned responses, or hold requests.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "tessera/apisim/server.h"
#include "tessera/apisim/store.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/transport.h"

namespace tessera::extender::testing {

// Forwards to `inner`, records every request, and answers matching requests with a canned
// response instead (each rule a limited number of times).
class FaultTransport : public kube::Transport {
 public:
  explicit FaultTransport(kube::Transport* inner) : inner_(inner) {}

  // The next `times` requests with this method whose path starts with `path_prefix` get
  // `code` with `body` (a Kubernetes Status) without reaching the server.
  void Inject(std::string method, std::string path_prefix, int code, std::string reason,
              int times = 1) {
    MutexLock l(&mu_);
    rules_.push_back(
        Rule{std::move(method), std::move(path_prefix), code, std::move(reason), times});
  }
  std::vector<kube::Request> requests() {
    MutexLock l(&mu_);
    return requests_;
  }
  // Requests with this method whose path starts with the prefix.
  std::vector<kube::Request> Matching(std::string_view method, std::string_view prefix) {
    std::vector<kube::Request> out;
    for (kube::Request& r : requests()) {
      if (r.method == method && std::string_view(r.path).substr(0, prefix.size()) == prefix) {
        out.push_back(std::move(r));
      }
    }
    return out;
  }
  void Clear() {
    MutexLock l(&mu_);
    requests_.clear();
  }

  void Send(kube::Request request, kube::ResponseCallback done) override {
    std::optional<kube::Response> canned;
    {
      MutexLock l(&mu_);
      requests_.push_back(request);
      for (Rule& rule : rules_) {
        if (rule.times > 0 && rule.method == request.method &&
            request.path.compare(0, rule.prefix.size(), rule.prefix) == 0) {
          --rule.times;
          canned.emplace();
          canned->status_code = rule.code;
          canned->body = fmt::format(
              R"({{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure",)"
              R"("message":"injected {}","reason":"{}","code":{}}})",
              rule.reason, rule.reason, rule.code);
          break;
        }
      }
    }
    if (canned) {
      done(*std::move(canned));
      return;
    }
    inner_->Send(std::move(request), std::move(done));
  }
  kube::StreamId Stream(kube::Request request, kube::StreamHandlers handlers) override {
    return inner_->Stream(std::move(request), std::move(handlers));
  }
  void Cancel(kube::StreamId id) override { inner_->Cancel(id); }

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

// Forwards to `inner`, but holds every request with `method` whose path contains `path_part`
// until Open(), so that a test can act while a writer or sender is on the wire.
class GateTransport : public kube::Transport {
 public:
  GateTransport(kube::Transport* inner, std::string method, std::string path_part)
      : inner_(inner), method_(std::move(method)), path_part_(std::move(path_part)) {}

  void Send(kube::Request request, kube::ResponseCallback done) override {
    if (request.method == method_ && request.path.find(path_part_) != std::string::npos) {
      MutexLock l(&mu_);
      ++held_;
      cv_.SignalAll();
      while (!open_) {
        cv_.Wait(&mu_);
      }
    }
    inner_->Send(std::move(request), std::move(done));
  }
  kube::StreamId Stream(kube::Request request, kube::StreamHandlers handlers) override {
    return inner_->Stream(std::move(request), std::move(handlers));
  }
  void Cancel(kube::StreamId id) override { inner_->Cancel(id); }

  // Blocks until `n` requests have been held in all.
  void WaitHeld(int n) {
    MutexLock l(&mu_);
    while (held_ < n) {
      cv_.Wait(&mu_);
    }
  }
  int held() {
    MutexLock l(&mu_);
    return held_;
  }
  // Lets the held requests and every later one through.
  void Open() {
    MutexLock l(&mu_);
    open_ = true;
    cv_.SignalAll();
  }

 private:
  kube::Transport* const inner_;
  const std::string method_;
  const std::string path_part_;
  Mutex mu_;
  CondVar cv_;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

// apisim on 127.0.0.1 port 0 + CurlTransport + FaultTransport + ApiClient (no retries).
class ApisimEnv {
 public:
  void Start() {
    absl::StatusOr<std::unique_ptr<apisim::Server>> server = apisim::Server::Start({});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    kube::RestConfig config;
    config.server = server_->url();
    config.qps = 0;
    auto transport =
        kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real()));
    ASSERT_TRUE(transport.ok()) << transport.status();
    curl_ = *std::move(transport);
    faults_ = std::make_unique<FaultTransport>(curl_.get());
    client_ = std::make_unique<kube::ApiClient>(
        faults_.get(), kube::ApiClient::Options{kube::RetryPolicy{.max_attempts = 1}, nullptr});
  }

  kube::ApiClient* client() { return client_.get(); }
  FaultTransport* faults() { return faults_.get(); }
  apisim::Store& store() { return server_->store(); }

  void Create(std::string_view resource, std::string_view ns, const std::string& body) {
    const apisim::ResourceInfo* r = apisim::FindResource("", "v1", resource);
    ASSERT_NE(r, nullptr);
    absl::StatusOr<std::string> created = store().Create(*r, ns, body);
    ASSERT_TRUE(created.ok()) << created.status() << "\n" << body;
  }
  void Delete(std::string_view resource, std::string_view ns, std::string_view name) {
    const apisim::ResourceInfo* r = apisim::FindResource("", "v1", resource);
    ASSERT_NE(r, nullptr);
    absl::StatusOr<std::string> deleted =
        store().Delete(*r, ns, name, R"({"kind":"DeleteOptions","gracePeriodSeconds":0})");
    ASSERT_TRUE(deleted.ok()) << deleted.status();
  }
  // A node with the given annotations (JSON object text, e.g. {"a":"b"}).
  void CreateNode(const std::string& name, const std::string& annotations_json) {
    Create("nodes", "",
           fmt::format(R"({{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{}",)"
                       R"("annotations":{}}}}})",
                       name, annotations_json));
  }
  // A pod in `default` with one container `limits_json` (e.g. {"nvidia.com/gpu":"1"}), for
  // scheduler `scheduler_name` (the Scheduler's default name unless given).
  void CreatePod(const std::string& name, const std::string& limits_json,
                 const std::string& annotations_json = "{}",
                 const std::string& scheduler_name = "hami-scheduler") {
    Create("pods", "default",
           fmt::format(R"({{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{}",)"
                       R"("namespace":"default","annotations":{}}},"spec":{{)"
                       R"("schedulerName":"{}","containers":)"
                       R"([{{"name":"main","image":"x","resources":{{"limits":{}}}}}]}}}})",
                       name, annotations_json, scheduler_name, limits_json));
  }

 private:
  std::unique_ptr<apisim::Server> server_;
  std::unique_ptr<kube::CurlTransport> curl_;
  std::unique_ptr<FaultTransport> faults_;
  std::unique_ptr<kube::ApiClient> client_;
};

}  // namespace tessera::extender::testing
