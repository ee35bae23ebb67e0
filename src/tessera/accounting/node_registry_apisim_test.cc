// HandshakeWriter against an in-process apisim (127.0.0.1, port 0): the registry's Requesting_
// patch lands on the node, a patch with a stale resourceVersion is a 409 the writer reports as a
// conflict (and the node keeps the newer value), a missing node is NotFound, and a follower
// writes nothing.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tessera/accounting/node_registry.h"
#include "tessera/apisim/server.h"
#include "tessera/base/clock.h"
#include "tessera/device/codec.h"
#include "tessera/device/vendor.h"
#include "tessera/kube/client.h"
#include "tessera/kube/config.h"
#include "tessera/kube/transport.h"
#include "tessera/ledger/ledger.h"

namespace tessera::accounting {
namespace {

constexpr char kHs[] = "hami.io/node-handshake";

class RegistryApisimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<apisim::Server>> server = apisim::Server::Start({});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    kube::RestConfig config;
    config.server = server_->url();
    config.qps = 0;
    auto transport =
        kube::CurlTransport::Create(config, kube::MakeTokenSource(config, Clock::Real()));
    ASSERT_TRUE(transport.ok()) << transport.status();
    transport_ = *std::move(transport);
    client_ = std::make_unique<kube::ApiClient>(transport_.get());
  }
  void TearDown() override {
    client_.reset();
    transport_.reset();
    if (server_ != nullptr) {
      server_->Stop();
    }
  }

  void CreateNode(const std::string& name, const std::string& reg, const std::string& hs) {
    kube::Request r;
    r.method = "POST";
    r.path = "/api/v1/nodes";
    r.content_type = "application/json";
    r.body = R"({"apiVersion":"v1","kind":"Node","metadata":{"name":")" + name +
             R"(","annotations":{"hami.io/node-nvidia-register":")" + reg +
             R"(","hami.io/node-handshake":")" + hs + R"("}}})";
    absl::StatusOr<kube::Response> resp = kube::Do(*transport_, r);
    ASSERT_TRUE(resp.ok()) << resp.status();
  }

  std::unique_ptr<apisim::Server> server_;
  std::unique_ptr<kube::Transport> transport_;
  std::unique_ptr<kube::ApiClient> client_;
};

TEST_F(RegistryApisimTest, RequestingLandsAndAStaleResourceVersionIsAConflict) {
  const absl::Time t0 = absl::FromUnixSeconds(1800000000);
  CreateNode("g1",
             "GPU-a,10,7680,100,NVIDIA-Tesla P4,0,true:", device::FormatHandshakeReported(t0));
  absl::StatusOr<kube::Node> node = client_->GetNode("g1");
  ASSERT_TRUE(node.ok()) << node.status();

  std::unique_ptr<device::Vendor> vendor = device::NewNvidiaVendor(device::DefaultNvidiaConfig());
  ledger::Ledger ledger;
  NodeRegistry registry(vendor.get(), &ledger, {});
  std::vector<NodePatch> patches = registry.Observe(*node, t0);
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0].resource_version, node->meta.resource_version);

  HandshakeWriter writer(client_.get());
  EXPECT_EQ(writer.Write(patches[0]), HandshakeWriter::Outcome::kWritten);
  absl::StatusOr<kube::Node> after = client_->GetNode("g1");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->meta.annotations.Get(kHs), "Requesting_2027-01-15 08:00:00");
  EXPECT_NE(after->meta.resource_version, node->meta.resource_version);
  // The register annotation is untouched.
  EXPECT_EQ(after->meta.annotations.Get("hami.io/node-nvidia-register"),
            "GPU-a,10,7680,100,NVIDIA-Tesla P4,0,true:");

  // The same patch again carries the old resourceVersion: 409, reported as a conflict, and the
  // node is not changed.
  NodePatch stale = patches[0];
  stale.value = "Deleted_2027-01-15 08:05:00";
  EXPECT_EQ(writer.Write(stale), HandshakeWriter::Outcome::kConflict);
  EXPECT_EQ(writer.conflicts(), 1u);
  EXPECT_EQ(client_->GetNode("g1")->meta.annotations.Get(kHs), "Requesting_2027-01-15 08:00:00");

  // The registry, observing the node as it now is, asks for nothing more.
  EXPECT_TRUE(registry.Observe(*after, t0 + absl::Seconds(1)).empty());

  // A node that is gone, and a follower.
  EXPECT_EQ(writer.Write(NodePatch{"nope", kHs, "x", ""}), HandshakeWriter::Outcome::kNotFound);
  HandshakeWriter follower(client_.get(), {.is_leader = [] { return false; }});
  HandshakeWriter::Summary s = follower.WriteAll({NodePatch{"g1", kHs, "Requesting_x", ""}});
  EXPECT_EQ(s.skipped, 1u);
  EXPECT_EQ(client_->GetNode("g1")->meta.annotations.Get(kHs), "Requesting_2027-01-15 08:00:00");
  EXPECT_EQ(writer.written(), 1u);
  EXPECT_EQ(writer.failures(), 0u);
}

}  // namespace
}  // namespace tessera::accounting
