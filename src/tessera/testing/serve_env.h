// File: tessera/testing/serve_env.h
//
// Test-only (library tessera::testing_serve). The fixture of the end-to-end `tessera serve`
// tests: an in-process apisim (ApisimEnv), a serve::Service on 127.0.0.1 port 0 over its
// kubeconfig, and kube-scheduler played by an HTTP client posting the extender JSON it sends.
//
//   class MyTest : public testing::ServeFixture {};
//   TEST_F(MyTest, X) {
//     AddNode(node_json);
//     ASSERT_NO_FATAL_FAILURE(StartService(TestOptions()));
//     nlohmann::json reply = Filter(AddPod(pod_json), {"a"});
//   }
//
// Errors: the helpers fail the test (ASSERT in those returning void, EXPECT otherwise).
// Thread safety: from the test's thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tessera/apisim/server.h"
#include "tessera/kube/objects.h"
#include "tessera/serve/service.h"
#include "tessera/testing/apisim_env.h"

namespace tessera::testing {

class ServeFixture : public ::testing::Test {
 protected:
  // Starts apisim; TearDown stops the service, then apisim.
  void SetUp() override;
  void TearDown() override;

  // The tests' defaults: both listeners on 127.0.0.1 port 0, this apisim's kubeconfig,
  // housekeeping every 50 ms. A fixture overrides it to change its tests' defaults.
  virtual serve::ServeOptions TestOptions();
  // Starts the service, waits until its informers have synced (at most `sync_timeout`) and, for
  // plain HTTP, opens client() on its extender port.
  void StartService(const serve::ServeOptions& options, absl::Duration sync_timeout);
  // The same with TestOptions() changed by `adjust`, waiting at most 20 s.
  void StartService(const std::function<void(serve::ServeOptions&)>& adjust = nullptr);
  // Another replica, not waited for; nullptr (and a failure) when it does not start.
  std::unique_ptr<serve::Service> StartReplica(const serve::ServeOptions& options);
  // Closes client() and stops the service. Idempotent.
  void StopService();

  ApisimEnv& apisim() { return env_; }
  apisim::Store& store() { return env_.store(); }
  serve::Service* service() { return service_.get(); }
  httplib::Client* client() { return client_.get(); }

  // apisim's objects (core/v1; pods in `default`).
  void AddNode(const std::string& json);
  // The pod as stored ("" and a failure when it cannot be created).
  std::string AddPod(const std::string& json);
  kube::Pod GetPod(const std::string& name);
  kube::Node GetNode(const std::string& name);
  void DeletePod(const std::string& name);  // grace period 0

  // POST /filter as kube-scheduler does (nodeCacheCapable: true) for the pod stored as
  // `pod_json`; the reply. When one node is chosen, waits until the filter's annotation patch
  // (written behind the reply) has landed, as the device plugin effectively does.
  nlohmann::json Filter(const std::string& pod_json, const std::vector<std::string>& nodes);
  // POST /bind; the reply.
  nlohmann::json Bind(const std::string& name, const std::string& uid, const std::string& node);
  // GET `path` on the metrics listener (/metrics, /debug/...).
  httplib::Result GetMetricsPort(const std::string& path);

 private:
  ApisimEnv env_;
  std::unique_ptr<serve::Service> service_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace tessera::testing
