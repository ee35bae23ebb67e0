#include "tessera/testing/serve_env.h"

#include <utility>

#include "tessera/kube/decode.h"
#include "tessera/testing/wait.h"

namespace tessera::testing {

void ServeFixture::SetUp() { ASSERT_NO_FATAL_FAILURE(env_.Start()); }

void ServeFixture::TearDown() {
  StopService();
  env_.Stop();
}

serve::ServeOptions ServeFixture::TestOptions() {
  serve::ServeOptions o;
  o.http_bind = "127.0.0.1:0";
  o.metrics_bind_address = "127.0.0.1:0";
  o.kube.path = env_.KubeconfigPath();
  o.housekeeping_period = absl::Milliseconds(50);
  return o;
}

void ServeFixture::StartService(const serve::ServeOptions& options, absl::Duration sync_timeout) {
  auto service = serve::Service::Start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  service_ = *std::move(service);
  ASSERT_TRUE(service_->WaitForSync(sync_timeout));
  if (options.cert_file.empty()) {
    client_ = std::make_unique<httplib::Client>("127.0.0.1", service_->port());
    client_->set_read_timeout(30, 0);
  }
}

void ServeFixture::StartService(const std::function<void(serve::ServeOptions&)>& adjust) {
  serve::ServeOptions options = TestOptions();
  if (adjust) {
    adjust(options);
  }
  StartService(options, absl::Seconds(20));
}

std::unique_ptr<serve::Service> ServeFixture::StartReplica(const serve::ServeOptions& options) {
  auto service = serve::Service::Start(options);
  EXPECT_TRUE(service.ok()) << service.status();
  return service.ok() ? *std::move(service) : nullptr;
}

void ServeFixture::StopService() {
  client_.reset();
  if (service_ != nullptr) {
    service_->Stop();
  }
  service_.reset();
}

void ServeFixture::AddNode(const std::string& json) {
  absl::StatusOr<std::string> created = store().Create(CoreResource("nodes"), "", json);
  ASSERT_TRUE(created.ok()) << created.status();
}

std::string ServeFixture::AddPod(const std::string& json) {
  absl::StatusOr<std::string> created = store().Create(CoreResource("pods"), "default", json);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? *created : "";
}

kube::Pod ServeFixture::GetPod(const std::string& name) {
  absl::StatusOr<std::string> json = store().Get(CoreResource("pods"), "default", name);
  EXPECT_TRUE(json.ok()) << json.status();
  absl::StatusOr<kube::Pod> pod = kube::DecodePod(json.ok() ? *json : "{}");
  EXPECT_TRUE(pod.ok()) << pod.status();
  return pod.ok() ? *pod : kube::Pod{};
}

kube::Node ServeFixture::GetNode(const std::string& name) {
  absl::StatusOr<std::string> json = store().Get(CoreResource("nodes"), "", name);
  absl::StatusOr<kube::Node> node = kube::DecodeNode(json.ok() ? *json : "{}");
  return node.ok() ? *node : kube::Node{};
}

void ServeFixture::DeletePod(const std::string& name) {
  absl::StatusOr<std::string> deleted =
      store().Delete(CoreResource("pods"), "default", name, R"({"gracePeriodSeconds":0})");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
}

nlohmann::json ServeFixture::Filter(const std::string& pod_json,
                                    const std::vector<std::string>& nodes) {
  nlohmann::json args = {
      {"Pod", nlohmann::json::parse(pod_json)}, {"Nodes", nullptr}, {"NodeNames", nodes}};
  auto res = client_->Post("/filter", args.dump(), "application/json");
  EXPECT_TRUE(res) << "no response";
  if (!res) {
    return {};
  }
  EXPECT_EQ(res->status, 200) << res->body;
  nlohmann::json reply = nlohmann::json::parse(res->body, nullptr, false);
  if (reply.is_object() && reply["NodeNames"].is_array() && reply["NodeNames"].size() == 1 &&
      reply.value("Error", "") == "") {
    const std::string name = nlohmann::json::parse(pod_json)["metadata"]["name"];
    const std::string node = reply["NodeNames"][0];
    EXPECT_TRUE(Eventually([&] {
      return GetPod(name).meta.annotations.Get("hami.io/vgpu-node") == node;
    })) << "the filter's patch of "
        << name << " did not land";
  }
  return reply;
}

nlohmann::json ServeFixture::Bind(const std::string& name, const std::string& uid,
                                  const std::string& node) {
  nlohmann::json args = {
      {"PodName", name}, {"PodNamespace", "default"}, {"PodUID", uid}, {"Node", node}};
  auto res = client_->Post("/bind", args.dump(), "application/json");
  EXPECT_TRUE(res) << "no response";
  if (!res) {
    return {};
  }
  EXPECT_EQ(res->status, 200) << res->body;
  return nlohmann::json::parse(res->body, nullptr, false);
}

httplib::Result ServeFixture::GetMetricsPort(const std::string& path) {
  httplib::Client metrics("127.0.0.1", service_->metrics_port());
  return metrics.Get(path);
}

}  // namespace tessera::testing
