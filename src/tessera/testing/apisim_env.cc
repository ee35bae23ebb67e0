#include "tessera/testing/apisim_env.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include <unistd.h>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "tessera/base/clock.h"
#include "tessera/kube/config.h"
#include "tessera/testing/objects.h"

namespace tessera::testing {

void FaultTransport::Inject(std::string method, std::string path_prefix, int code,
                            std::string reason, int times) {
  MutexLock l(&mu_);
  rules_.push_back(Rule{std::move(method), std::move(path_prefix), code, std::move(reason), times});
}

std::vector<kube::Request> FaultTransport::requests() {
  MutexLock l(&mu_);
  return requests_;
}

std::vector<kube::Request> FaultTransport::Matching(std::string_view method,
                                                    std::string_view prefix) {
  std::vector<kube::Request> out;
  for (kube::Request& r : requests()) {
    if (r.method == method && std::string_view(r.path).substr(0, prefix.size()) == prefix) {
      out.push_back(std::move(r));
    }
  }
  return out;
}

void FaultTransport::Clear() {
  MutexLock l(&mu_);
  requests_.clear();
}

void FaultTransport::Send(kube::Request request, kube::ResponseCallback done) {
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
        canned->body =
            fmt::format(R"({{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure",)"
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

kube::StreamId FaultTransport::Stream(kube::Request request, kube::StreamHandlers handlers) {
  return inner_->Stream(std::move(request), std::move(handlers));
}

void FaultTransport::Cancel(kube::StreamId id) { inner_->Cancel(id); }

void ApisimEnv::Start(const Options& options) {
  Stop();
  absl::StatusOr<std::unique_ptr<apisim::Server>> server = apisim::Server::Start(options.server);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  server_->store().EnsureDefaultNamespaces();
  kube::RestConfig config;
  config.server = server_->url();
  config.qps = 0;
  auto curl = kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real()));
  ASSERT_TRUE(curl.ok()) << curl.status();
  curl_ = *std::move(curl);
  faults_ = std::make_unique<FaultTransport>(curl_.get());
  if (options.max_attempts == 0) {
    client_ = std::make_unique<kube::ApiClient>(faults_.get());
    return;
  }
  kube::ApiClient::Options client_options;
  client_options.retry.max_attempts = options.max_attempts;
  client_options.sleep = [](absl::Duration) {};
  client_ = std::make_unique<kube::ApiClient>(faults_.get(), std::move(client_options));
}

void ApisimEnv::Stop() {
  client_.reset();
  faults_.reset();
  curl_.reset();
  if (server_ != nullptr) {
    server_->Stop();
    server_.reset();
  }
  kubeconfig_path_.clear();
  if (!scratch_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(scratch_dir_, ignored);
    scratch_dir_.clear();
  }
}

std::string ApisimEnv::ScratchDir() {
  if (scratch_dir_.empty()) {
    char dir[] = "/tmp/tessera-test-XXXXXX";
    if (mkdtemp(dir) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return "";
    }
    scratch_dir_ = dir;
  }
  return scratch_dir_;
}

std::string ApisimEnv::KubeconfigPath() {
  if (kubeconfig_path_.empty() && server_ != nullptr && !ScratchDir().empty()) {
    kubeconfig_path_ = scratch_dir_ + "/kubeconfig";
    std::ofstream(kubeconfig_path_) << server_->Kubeconfig();
  }
  return kubeconfig_path_;
}

kube::RestConfig ApiConnection::PlainConfig(const std::string& url) {
  kube::RestConfig config;
  config.server = url;
  config.qps = 0;
  return config;
}

ApiConnection::ApiConnection(const kube::RestConfig& config) {
  auto curl = kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real()));
  if (!curl.ok()) {
    ADD_FAILURE() << curl.status();
    return;
  }
  transport_ = *std::move(curl);
  client_ = std::make_unique<kube::ApiClient>(transport_.get());
}

absl::StatusOr<kube::Response> ApiConnection::Call(const std::string& method,
                                                   const std::string& path, const std::string& body,
                                                   const std::string& content_type) {
  kube::Request r;
  r.method = method;
  r.path = path;
  r.body = body;
  if (!body.empty()) {
    r.content_type = content_type;
  }
  return kube::Do(*transport_, r);
}

void ApisimEnv::FailRequests(std::vector<std::string> verbs) {
  apisim::Faults f;
  f.fail_probability = verbs.empty() ? 0 : 1;
  f.fail_code = 500;
  f.fail_verbs = std::move(verbs);
  server_->store().SetFaults(f);
}

const apisim::ResourceInfo& CoreResource(std::string_view name) {
  const apisim::ResourceInfo* r = apisim::FindResource("", "v1", name);
  if (r == nullptr) {
    ADD_FAILURE() << "no core/v1 resource " << name;
    std::abort();
  }
  return *r;
}

void ApisimEnv::Create(std::string_view resource, std::string_view ns, const std::string& body) {
  absl::StatusOr<std::string> created = store().Create(CoreResource(resource), ns, body);
  ASSERT_TRUE(created.ok()) << created.status() << "\n" << body;
}

void ApisimEnv::Delete(std::string_view resource, std::string_view ns, std::string_view name) {
  absl::StatusOr<std::string> deleted = store().Delete(
      CoreResource(resource), ns, name, R"({"kind":"DeleteOptions","gracePeriodSeconds":0})");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
}

void ApisimEnv::CreateNode(const std::string& name, const std::string& annotations_json) {
  Create("nodes", "",
         fmt::format(R"({{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{}",)"
                     R"("annotations":{}}}}})",
                     name, annotations_json));
}

void ApisimEnv::CreatePod(const std::string& name, const std::string& limits_json,
                          const std::string& annotations_json, const std::string& scheduler_name) {
  Create("pods", "default",
         fmt::format(R"({{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{}",)"
                     R"("namespace":"default","annotations":{}}},"spec":{{)"
                     R"("schedulerName":"{}","containers":)"
                     R"([{{"name":"main","image":"x","resources":{{"limits":{}}}}}]}}}})",
                     name, annotations_json, scheduler_name, limits_json));
}

void ApiConnection::MustCall(const std::string& method, const std::string& path,
                             const std::string& body, const std::string& content_type) {
  absl::StatusOr<kube::Response> r = Call(method, path, body, content_type);
  ASSERT_TRUE(r.ok()) << method << " " << path << ": " << r.status();
}

void ApiConnection::CreatePod(const std::string& name) {
  MustCall("POST", "/api/v1/namespaces/default/pods", MinimalPodJson(name));
}

void ApiConnection::DeletePod(const std::string& name) {
  MustCall("DELETE", "/api/v1/namespaces/default/pods/" + name,
           R"({"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0})");
}

}  // namespace tessera::testing
