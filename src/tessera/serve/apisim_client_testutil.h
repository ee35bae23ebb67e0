// File: tessera/serve/apisim_client_testutil.h
//
// For tests of serve/ components against an in-process apisim: the server on 127.0.0.1 port 0
// with the default namespaces, and an ApiClient over the CurlTransport that tries a request
// twice without sleeping between the attempts (so injected 5xx cost no time).
//
//   ApisimClient api;
//   ASSERT_NO_FATAL_FAILURE(api.Start());
//   api.FailRequests({"patch"});   // every PATCH answers 500; {} ends the fault
//
// Thread safety: as the members' own types; Start and Stop from the test's thread.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/apisim/server.h"
#include "tessera/apisim/store.h"
#include "tessera/base/clock.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/transport.h"

namespace tessera::serve {

struct ApisimClient {
  std::unique_ptr<apisim::Server> server;
  std::unique_ptr<kube::Transport> transport;
  std::unique_ptr<kube::ApiClient> client;

  void Start() {
    absl::StatusOr<std::unique_ptr<apisim::Server>> started = apisim::Server::Start({});
    ASSERT_TRUE(started.ok()) << started.status();
    server = *std::move(started);
    server->store().EnsureDefaultNamespaces();
    kube::RestConfig config;
    config.server = server->url();
    config.qps = 0;
    auto curl = kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real()));
    ASSERT_TRUE(curl.ok()) << curl.status();
    transport = *std::move(curl);
    kube::ApiClient::Options options;
    options.retry.max_attempts = 2;
    options.sleep = [](absl::Duration) {};
    client = std::make_unique<kube::ApiClient>(transport.get(), std::move(options));
  }

  // The client first, then the server. Idempotent.
  void Stop() {
    client.reset();
    transport.reset();
    if (server != nullptr) {
      server->Stop();
    }
  }

  // Every request whose verb is in `verbs` ("get", "list", "patch", "update", ...) answers 500;
  // an empty list ends the fault.
  void FailRequests(std::vector<std::string> verbs) {
    apisim::Faults f;
    f.fail_probability = verbs.empty() ? 0 : 1;
    f.fail_code = 500;
    f.fail_verbs = std::move(verbs);
    server->store().SetFaults(f);
  }
};

}  // namespace tessera::serve
