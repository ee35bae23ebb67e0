#include "tessera/kube/transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "tessera/testing/fake_transport.h"
#include "tessera/testing/wait.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
// Debian ships cpp-httplib as an uninstrumented shared library: TSan cannot see the locks of its
// thread pool and reports races between two of its own worker threads. Reports with a frame in
// that library (the test servers) are suppressed; the transport's threads never run its code.
extern "C" const char* __tsan_default_suppressions() { return "race:libcpp-httplib.so\n"; }
#endif
#endif

namespace tessera::kube {
namespace {

using ::tessera::testing::Eventually;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteAll(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
}

// An httplib server on 127.0.0.1, port 0, listening on its own thread until destroyed.
class TestServer {
 public:
  explicit TestServer(std::unique_ptr<httplib::Server> server = nullptr)
      : server_(server ? std::move(server) : std::make_unique<httplib::Server>()) {
    server_->set_tcp_nodelay(true);
  }
  ~TestServer() { Stop(); }

  httplib::Server& http() { return *server_; }

  void Start() {
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    ASSERT_TRUE(Eventually([&] { return server_->is_running(); }, absl::Seconds(10),
                           absl::Milliseconds(2)));
  }
  void Stop() {
    if (thread_.joinable()) {
      server_->stop();
      thread_.join();
    }
  }
  int port() const { return port_; }
  std::string url(const std::string& scheme = "http") const {
    return scheme + "://127.0.0.1:" + std::to_string(port_);
  }

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// Chunks a test hands to a streaming handler; the handler ends the body on Close() and gives up
// on Stop() (teardown) or when the client has gone.
class Channel {
 public:
  void Push(std::string chunk) {
    MutexLock lock(&mu_);
    chunks_.push_back(std::move(chunk));
    cv_.SignalAll();
  }
  void Close() {
    MutexLock lock(&mu_);
    closed_ = true;
    cv_.SignalAll();
  }
  void Stop() {
    MutexLock lock(&mu_);
    stopped_ = true;
    cv_.SignalAll();
  }
  // The body of set_chunked_content_provider.
  bool Provide(httplib::DataSink& sink) {
    while (true) {
      std::string chunk;
      {
        MutexLock lock(&mu_);
        if (stopped_) {
          return false;
        }
        if (!chunks_.empty()) {
          chunk = std::move(chunks_.front());
          chunks_.pop_front();
        } else if (closed_) {
          sink.done();
          return true;
        } else {
          cv_.WaitFor(&mu_, std::chrono::milliseconds(20));
          continue;
        }
      }
      const bool written = sink.is_writable() && sink.write(chunk.data(), chunk.size());
      MutexLock lock(&mu_);
      ++taken_;
      cv_.SignalAll();
      return written;
    }
  }
  // Chunks the server has handed to its connection (or failed to).
  size_t taken() {
    MutexLock lock(&mu_);
    return taken_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::deque<std::string> chunks_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  size_t taken_ ABSL_GUARDED_BY(mu_) = 0;
};

// Declared after a test's server and channel, so it is destroyed first: it stops the channel and
// then joins the server, so no handler can run on a channel that has gone, even when an ASSERT
// returns early.
class StopInOrder {
 public:
  StopInOrder(Channel* channel, TestServer* server) : channel_(channel), server_(server) {}
  StopInOrder(const StopInOrder&) = delete;
  StopInOrder& operator=(const StopInOrder&) = delete;
  ~StopInOrder() {
    channel_->Stop();
    server_->Stop();
  }

 private:
  Channel* channel_;
  TestServer* server_;
};

// Records what a stream delivers; waits for conditions in real time.
class StreamRecorder {
 public:
  StreamHandlers Handlers() {
    StreamHandlers h;
    h.on_open = [this](const Response& head) {
      MutexLock lock(&mu_);
      opened_ = true;
      open_code_ = head.status_code;
    };
    h.on_data = [this](std::string_view bytes) {
      MutexLock lock(&mu_);
      EXPECT_FALSE(ended_) << "data after on_end";
      data_.append(bytes);
    };
    h.on_end = [this](StreamEnd end) {
      MutexLock lock(&mu_);
      EXPECT_FALSE(ended_) << "on_end twice";
      ended_ = true;
      end_ = std::move(end);
    };
    return h;
  }
  bool WaitForData(const std::string& needle, absl::Duration timeout = absl::Seconds(10)) {
    return Eventually([&] { return data().find(needle) != std::string::npos; }, timeout);
  }
  bool WaitForEnd(absl::Duration timeout = absl::Seconds(10)) {
    return Eventually([&] { return ended(); }, timeout);
  }
  std::string data() {
    MutexLock lock(&mu_);
    return data_;
  }
  bool ended() {
    MutexLock lock(&mu_);
    return ended_;
  }
  bool opened() {
    MutexLock lock(&mu_);
    return opened_;
  }
  int open_code() {
    MutexLock lock(&mu_);
    return open_code_;
  }
  StreamEnd end() {
    MutexLock lock(&mu_);
    return end_;
  }

 private:
  Mutex mu_;
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  int open_code_ ABSL_GUARDED_BY(mu_) = 0;
  std::string data_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  StreamEnd end_ ABSL_GUARDED_BY(mu_);
};

// A waitable result of Send().
class SendResult {
 public:
  ResponseCallback Callback() {
    return [this](absl::StatusOr<Response> r) {
      MutexLock lock(&mu_);
      result_ = std::move(r);
    };
  }
  absl::StatusOr<Response> Wait(absl::Duration timeout = absl::Seconds(10)) {
    if (!Eventually([&] { return Has(); }, timeout)) {
      return absl::DeadlineExceededError("test: no result");
    }
    MutexLock lock(&mu_);
    return *result_;
  }

 private:
  bool Has() {
    MutexLock lock(&mu_);
    return result_.has_value();
  }

  Mutex mu_;
  std::optional<absl::StatusOr<Response>> result_ ABSL_GUARDED_BY(mu_);
};

Request Get(std::string path) {
  Request r;
  r.path = std::move(path);
  return r;
}

Request WithBody(std::string method, std::string path, std::string body, std::string type) {
  Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.body = std::move(body);
  r.content_type = std::move(type);
  return r;
}

RestConfig ConfigFor(const std::string& server) {
  RestConfig config;
  config.server = server;
  config.qps = 0;  // Unlimited unless a test is about the limiter.
  config.connect_timeout = absl::Seconds(5);
  config.request_timeout = absl::Seconds(20);
  return config;
}

std::unique_ptr<CurlTransport> MakeTransport(RestConfig config,
                                             std::shared_ptr<TokenSource> tokens = nullptr) {
  absl::StatusOr<std::unique_ptr<CurlTransport>> t =
      CurlTransport::Create(std::move(config), std::move(tokens));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// A TCP listener on 127.0.0.1, port chosen by the kernel (written to *addr), that nobody
// accepts from; -1 on failure.
int ListenOnLoopback(int backlog, sockaddr_in* addr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return -1;
  }
  *addr = sockaddr_in{};
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr->sin_port = 0;
  socklen_t len = sizeof(*addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(addr), sizeof(*addr)) != 0 || listen(fd, backlog) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(addr), &len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// DoOptions whose sleep records the delays instead of sleeping.
DoOptions RecordingSleeps(std::vector<absl::Duration>* delays, int max_attempts = 5) {
  DoOptions options;
  options.retry.max_attempts = max_attempts;
  options.sleep = [delays](absl::Duration d) { delays->push_back(d); };
  return options;
}

// --------------------------------------------------------------------------------------------

TEST(CurlTransport, GetPostPatchRoundTrips) {
  TestServer server;
  Mutex mu;
  std::vector<std::string> seen;  // "METHOD path accept|encoding|content-type|body"
  auto record = [&](const httplib::Request& req) {
    MutexLock lock(&mu);
    EXPECT_EQ(req.version, "HTTP/1.1");  // plain http never tries HTTP/2
    seen.push_back(req.method + " " + req.path + " " + req.get_header_value("Accept") + "|" +
                   req.get_header_value("Content-Type") + "|" + req.body);
  };
  server.http().Get("/api/v1/nodes", [&](const httplib::Request& req, httplib::Response& res) {
    record(req);
    EXPECT_THAT(req.get_header_value("Accept-Encoding"), HasSubstr("gzip"));
    EXPECT_EQ(req.get_param_value("limit"), "500");
    res.set_header("X-Test", "yes");
    res.set_content(R"({"kind":"NodeList","items":[]})", "application/json");
  });
  server.http().Post("/api/v1/namespaces/ns/pods/p/binding", [&](const httplib::Request& req,
                                                                 httplib::Response& res) {
    record(req);
    res.status = 201;
    res.set_content(R"({"kind":"Status","status":"Success"})", "application/json");
  });
  server.http().Patch("/api/v1/namespaces/ns/pods/p",
                      [&](const httplib::Request& req, httplib::Response& res) {
                        record(req);
                        res.set_content(req.body, "application/json");
                      });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  ASSERT_NE(transport, nullptr);

  absl::StatusOr<Response> list = Do(*transport, Get("/api/v1/nodes?limit=500"));
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->status_code, 200);
  EXPECT_EQ(list->body, R"({"kind":"NodeList","items":[]})");
  EXPECT_EQ(list->Header("content-type"), "application/json");
  EXPECT_EQ(list->Header("X-TEST"), "yes");

  absl::StatusOr<Response> bind =
      Do(*transport, WithBody("POST", "/api/v1/namespaces/ns/pods/p/binding",
                              R"({"target":{"name":"n1"}})", "application/json"));
  ASSERT_TRUE(bind.ok()) << bind.status();
  EXPECT_EQ(bind->status_code, 201);

  const std::string patch = R"({"metadata":{"annotations":{"hami.io/vgpu-node":"n1"}}})";
  absl::StatusOr<Response> patched =
      Do(*transport,
         WithBody("PATCH", "/api/v1/namespaces/ns/pods/p", patch, "application/merge-patch+json"));
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ(patched->body, patch);

  MutexLock lock(&mu);
  EXPECT_THAT(seen, ElementsAre("GET /api/v1/nodes application/json||",
                                "POST /api/v1/namespaces/ns/pods/p/binding "
                                "application/json|application/json|{\"target\":{\"name\":\"n1\"}}",
                                "PATCH /api/v1/namespaces/ns/pods/p "
                                "application/json|application/merge-patch+json|" +
                                    patch));
}

TEST(CurlTransport, GzipBodiesAreDecoded) {
  TestServer server;
  const std::string big(64 * 1024, 'x');
  server.http().Get("/big", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(big, "text/plain");  // httplib compresses text/* for gzip-accepting clients
  });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  absl::StatusOr<Response> r = Do(*transport, Get("/big"));
  ASSERT_TRUE(r.ok()) << r.status();
  // libcurl offers every encoding it can decode (gzip, deflate, br); httplib picks one.
  EXPECT_THAT(r->Header("content-encoding"), Optional(AnyOf("gzip", "br")));
  EXPECT_EQ(r->body, big);
}

TEST(CurlTransport, StreamDeliversChunksIncrementallyWhileOtherRequestsComplete) {
  TestServer server;
  Channel channel;
  StopInOrder stop_in_order(&channel, &server);
  server.http().Get("/api/v1/pods", [&](const httplib::Request& req, httplib::Response& res) {
    if (req.get_param_value("watch") != "true") {
      res.set_content(R"({"kind":"PodList"})", "application/json");
      return;
    }
    res.set_chunked_content_provider(
        "application/json", [&](size_t, httplib::DataSink& sink) { return channel.Provide(sink); });
  });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  StreamRecorder watch;
  transport->Stream(Get("/api/v1/pods?watch=true"), watch.Handlers());

  channel.Push("{\"type\":\"ADDED\"}\n");
  ASSERT_TRUE(watch.WaitForData("ADDED"));
  EXPECT_TRUE(watch.opened());
  EXPECT_EQ(watch.open_code(), 200);
  EXPECT_FALSE(watch.ended());

  // A LIST completes on the same I/O thread while the watch is open and idle.
  absl::StatusOr<Response> list = Do(*transport, Get("/api/v1/pods"));
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->body, R"({"kind":"PodList"})");
  EXPECT_EQ(watch.data(), "{\"type\":\"ADDED\"}\n");  // nothing more arrived meanwhile

  channel.Push("{\"type\":\"MODIFIED\"}\n");
  ASSERT_TRUE(watch.WaitForData("MODIFIED"));
  channel.Close();
  ASSERT_TRUE(watch.WaitForEnd());
  EXPECT_TRUE(watch.end().status.ok()) << watch.end().status;
  EXPECT_EQ(watch.data(), "{\"type\":\"ADDED\"}\n{\"type\":\"MODIFIED\"}\n");
}

TEST(CurlTransport, CancelEndsAStreamFromAnotherThread) {
  TestServer server;
  Channel channel;
  StopInOrder stop_in_order(&channel, &server);
  std::atomic<bool> released{false};
  server.http().Get("/watch", [&](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider(
        "application/json", [&](size_t, httplib::DataSink& sink) { return channel.Provide(sink); },
        [&](bool) { released.store(true); });
  });
  server.http().Get("/x", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  StreamRecorder watch;
  const StreamId id = transport->Stream(Get("/watch"), watch.Handlers());
  channel.Push("first\n");
  ASSERT_TRUE(watch.WaitForData("first"));
  std::thread canceller([&] { transport->Cancel(id); });
  canceller.join();
  ASSERT_TRUE(watch.WaitForEnd());
  EXPECT_EQ(watch.end().status.code(), absl::StatusCode::kCancelled) << watch.end().status;
  // Later bytes are not delivered, and cancelling again is harmless.
  channel.Push("second\n");
  transport->Cancel(id);
  // The server has written the bytes (or seen the stream gone), and the I/O thread has since
  // completed a request: bytes it could deliver would have been.
  ASSERT_TRUE(Eventually([&] { return released.load() || channel.taken() >= 2; }));
  ASSERT_TRUE(Do(*transport, Get("/x")).ok());
  EXPECT_EQ(watch.data(), "first\n");
}

TEST(CurlTransport, CancelFromInsideOnData) {
  TestServer server;
  Channel channel;
  StopInOrder stop_in_order(&channel, &server);
  server.http().Get("/watch", [&](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider(
        "application/json", [&](size_t, httplib::DataSink& sink) { return channel.Provide(sink); });
  });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  StreamRecorder watch;
  StreamHandlers handlers = watch.Handlers();
  std::atomic<StreamId> id{0};
  std::atomic<int> chunks{0};
  auto record = std::move(handlers.on_data);
  handlers.on_data = [&, record = std::move(record)](std::string_view bytes) mutable {
    record(bytes);
    if (chunks.fetch_add(1) == 0) {
      transport->Cancel(id.load());
    }
  };
  id = transport->Stream(Get("/watch"), std::move(handlers));
  channel.Push("one\n");
  ASSERT_TRUE(watch.WaitForEnd());
  EXPECT_EQ(watch.end().status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(watch.data(), "one\n");
}

TEST(CurlTransport, LowSpeedWatchdogEndsAStalledStream) {
  TestServer server;
  Channel channel;
  StopInOrder stop_in_order(&channel, &server);
  server.http().Get("/watch", [&](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider(
        "application/json", [&](size_t, httplib::DataSink& sink) { return channel.Provide(sink); });
  });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  StreamRecorder watch;
  Request request = Get("/watch");
  request.stall_timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  transport->Stream(request, watch.Handlers());
  channel.Push("hello\n");  // then silence
  ASSERT_TRUE(watch.WaitForEnd(absl::Seconds(10)));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(watch.end().status.code(), absl::StatusCode::kUnavailable) << watch.end().status;
  EXPECT_THAT(watch.end().status.message(), HasSubstr("stalled"));
  EXPECT_EQ(watch.data(), "hello\n");
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(CurlTransport, StreamWithErrorStatusEndsWithTheResponse) {
  TestServer server;
  server.http().Get("/watch", [&](const httplib::Request&, httplib::Response& res) {
    res.status = 410;
    res.set_content(R"({"kind":"Status","reason":"Expired","code":410})", "application/json");
  });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  StreamRecorder watch;
  transport->Stream(Get("/watch"), watch.Handlers());
  ASSERT_TRUE(watch.WaitForEnd());
  const StreamEnd end = watch.end();
  EXPECT_FALSE(watch.opened());
  EXPECT_EQ(end.status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(HttpStatusCodeOf(end.status), 410);
  ASSERT_TRUE(end.error_response.has_value());
  EXPECT_THAT(end.error_response->body, HasSubstr("Expired"));
  EXPECT_EQ(watch.data(), "");
}

TEST(CurlTransport, TooManyRequestsHonoursRetryAfter) {
  TestServer server;
  std::atomic<int> calls{0};
  server.http().Get("/api/v1/nodes", [&](const httplib::Request&, httplib::Response& res) {
    if (calls.fetch_add(1) == 0) {
      res.status = 429;
      res.set_header("Retry-After", "3");
      res.set_content("Too many requests, please try again later.\n", "text/plain");
      return;
    }
    res.set_content("{}", "application/json");
  });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  std::vector<absl::Duration> delays;
  absl::StatusOr<Response> r = Do(*transport, Get("/api/v1/nodes"), RecordingSleeps(&delays));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls.load(), 2);
  EXPECT_THAT(delays, ElementsAre(absl::Seconds(3)));

  // A POST is retried on 429 too: the server did not process it.
  calls = 0;
  delays.clear();
  server.http().Post("/api/v1/nodes", [&](const httplib::Request&, httplib::Response& res) {
    if (calls.fetch_add(1) == 0) {
      res.status = 429;
      res.set_header("Retry-After", "1");
      return;
    }
    res.status = 201;
  });
  r = Do(*transport, WithBody("POST", "/api/v1/nodes", "{}", "application/json"),
         RecordingSleeps(&delays));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status_code, 201);
  EXPECT_THAT(delays, ElementsAre(absl::Seconds(1)));
}

TEST(CurlTransport, ServerErrorsAreRetriedWithBackoffForIdempotentVerbs) {
  TestServer server;
  std::atomic<int> gets{0};
  std::atomic<int> posts{0};
  server.http().Get("/flaky", [&](const httplib::Request&, httplib::Response& res) {
    if (gets.fetch_add(1) < 2) {
      res.status = 500;
      res.set_content("boom", "text/plain");
      return;
    }
    res.set_content("ok", "text/plain");
  });
  server.http().Post("/flaky", [&](const httplib::Request&, httplib::Response& res) {
    posts.fetch_add(1);
    res.status = 503;
    res.set_content("unavailable", "text/plain");
  });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  std::vector<absl::Duration> delays;
  absl::StatusOr<Response> r = Do(*transport, Get("/flaky"), RecordingSleeps(&delays));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "ok");
  EXPECT_EQ(gets.load(), 3);
  ASSERT_EQ(delays.size(), 2u);
  for (absl::Duration d : delays) {
    EXPECT_GT(d, absl::ZeroDuration());
    EXPECT_LE(d, absl::Seconds(10));
  }

  delays.clear();
  r = Do(*transport, WithBody("POST", "/flaky", "{}", "application/json"),
         RecordingSleeps(&delays));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(HttpStatusCodeOf(r.status()), 503);
  EXPECT_THAT(r.status().message(), HasSubstr("HTTP 503 POST /flaky: unavailable"));
  EXPECT_EQ(posts.load(), 1);  // not retried: POST is not idempotent
  EXPECT_TRUE(delays.empty());

  // Attempts are bounded.
  gets = -100;
  delays.clear();
  r = Do(*transport, Get("/flaky"), RecordingSleeps(&delays, 3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(delays.size(), 2u);
}

TEST(CurlTransport, ConnectionRefusedIsUnavailable) {
  // A bound socket that never listens refuses connections.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  auto transport = MakeTransport(ConfigFor("http://127.0.0.1:" + std::to_string(port)));
  SendResult result;
  transport->Send(Get("/healthz"), result.Callback());
  absl::StatusOr<Response> r = result.Wait();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();

  std::vector<absl::Duration> delays;
  r = Do(*transport, Get("/healthz"), RecordingSleeps(&delays, 3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(delays.size(), 2u);  // a GET is retried on transport errors
  close(fd);
}

TEST(CurlTransport, RequestTimeoutEndsARequestTheServerNeverAnswers) {
  // A listening socket that is never accepted from: the kernel completes the handshake, the
  // request is sent, and no answer ever comes.
  sockaddr_in addr{};
  const int fd = ListenOnLoopback(4, &addr);
  ASSERT_GE(fd, 0);
  RestConfig config = ConfigFor("http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  config.request_timeout = absl::Milliseconds(300);
  auto transport = MakeTransport(config);
  SendResult result;
  transport->Send(Get("/healthz"), result.Callback());
  absl::StatusOr<Response> r = result.Wait();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("timed out"));
  close(fd);
}

TEST(CurlTransport, ConnectTimeoutEndsAConnectTheServerNeverCompletes) {
  // A listener whose accept queue is full: the kernel drops further SYNs, so a connect never
  // completes and only the connect timeout (not the much longer request timeout) can end it.
  sockaddr_in addr{};
  const int fd = ListenOnLoopback(0, &addr);
  ASSERT_GE(fd, 0);
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {  // fill the queue; the later connects stay in SYN_SENT
    const int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(c, 0);
    (void)connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    fillers.push_back(c);
  }
  // The queue is full once the first connect completed (the socket turns writable).
  pollfd first{.fd = fillers[0], .events = POLLOUT, .revents = 0};
  ASSERT_EQ(poll(&first, 1, 10000), 1) << "the first connect did not complete";
  RestConfig config = ConfigFor("http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  config.connect_timeout = absl::Milliseconds(300);
  config.request_timeout = absl::Seconds(10);
  auto transport = MakeTransport(config);
  const absl::Time start = absl::Now();
  SendResult result;
  transport->Send(Get("/healthz"), result.Callback());
  absl::StatusOr<Response> r = result.Wait();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("onnect")) << r.status();  // "Connection timed out"
  // The request timeout would end it after 10 s.
  EXPECT_LT(took, absl::Seconds(5)) << "not ended by the connect timeout";
  for (int c : fillers) {
    close(c);
  }
  close(fd);
}

TEST(CurlTransport, BearerTokenIsSentAndA401IsUnauthenticated) {
  TestServer server;
  Mutex mu;
  std::vector<std::string> auth;
  server.http().Get("/api", [&](const httplib::Request& req, httplib::Response& res) {
    const std::string header = req.get_header_value("Authorization");
    {
      MutexLock lock(&mu);
      auth.push_back(header);
    }
    if (header != "Bearer good-token") {
      res.status = 401;
      res.set_content(R"({"kind":"Status","reason":"Unauthorized","code":401})",
                      "application/json");
      return;
    }
    res.set_content("{}", "application/json");
  });
  server.Start();
  {
    auto good =
        MakeTransport(ConfigFor(server.url()), std::make_shared<StaticTokenSource>("good-token"));
    EXPECT_TRUE(Do(*good, Get("/api")).ok());
  }
  auto bad =
      MakeTransport(ConfigFor(server.url()), std::make_shared<StaticTokenSource>("wrong-token"));
  absl::StatusOr<Response> r = Do(*bad, Get("/api"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << r.status();
  EXPECT_EQ(HttpStatusCodeOf(r.status()), 401);
  EXPECT_THAT(r.status().message(), Not(HasSubstr("wrong-token")));
  MutexLock lock(&mu);
  EXPECT_THAT(auth, ElementsAre("Bearer good-token", "Bearer wrong-token"));
}

TEST(CurlTransport, RotatedTokenFileIsPickedUp) {
  TestServer server;
  Mutex mu;
  std::vector<std::string> auth;
  server.http().Get("/api", [&](const httplib::Request& req, httplib::Response& res) {
    MutexLock lock(&mu);
    auth.push_back(req.get_header_value("Authorization"));
    res.set_content("{}", "application/json");
  });
  server.Start();
  char dir_template[] = "/tmp/tessera-token-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string path = std::string(dir_template) + "/token";
  WriteAll(path, "token-one\n");
  FakeClock clock;
  auto transport =
      MakeTransport(ConfigFor(server.url()), std::make_shared<FileTokenSource>(path, &clock));
  ASSERT_TRUE(Do(*transport, Get("/api")).ok());
  WriteAll(path, "token-two\n");  // the kubelet rotates the projected token
  ASSERT_TRUE(Do(*transport, Get("/api")).ok());
  clock.Advance(absl::Seconds(61));
  ASSERT_TRUE(Do(*transport, Get("/api")).ok());
  std::filesystem::remove_all(dir_template);
  MutexLock lock(&mu);
  EXPECT_THAT(auth, ElementsAre("Bearer token-one", "Bearer token-one", "Bearer token-two"));
}

TEST(CurlTransport, ClientRateLimitSpacesRequests) {
  TestServer server;
  server.http().Get("/x", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  server.Start();
  RestConfig config = ConfigFor(server.url());
  config.qps = 20;
  config.burst = 2;
  auto transport = MakeTransport(config);
  const absl::Time start = absl::Now();
  std::vector<std::unique_ptr<SendResult>> results;
  for (int i = 0; i < 6; ++i) {
    results.push_back(std::make_unique<SendResult>());
    transport->Send(Get("/x"), results.back()->Callback());
  }
  for (auto& r : results) {
    EXPECT_TRUE(r->Wait().ok());
  }
  // Two immediately, then four at 20 per second: at least 200 ms.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
}

TEST(CurlTransport, DestructionCancelsOutstandingWork) {
  TestServer server;
  Channel channel;
  StopInOrder stop_in_order(&channel, &server);
  server.http().Get("/watch", [&](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider(
        "application/json", [&](size_t, httplib::DataSink& sink) { return channel.Provide(sink); });
  });
  server.Start();
  StreamRecorder watch;
  {
    auto transport = MakeTransport(ConfigFor(server.url()));
    transport->Stream(Get("/watch"), watch.Handlers());
    channel.Push("x");
    ASSERT_TRUE(watch.WaitForData("x"));
  }
  EXPECT_TRUE(watch.ended());  // on_end ran before the destructor returned
  EXPECT_EQ(watch.end().status.code(), absl::StatusCode::kCancelled);
}

// Perform (under Do) runs on the caller's thread with a pooled handle: sequential calls reuse
// one keep-alive connection, calls at the same time get one each, and the rate limit holds.
TEST(CurlTransport, PerformReusesPooledConnectionsAndKeepsTheRateLimit) {
  TestServer server;
  std::atomic<int> waiting{0};
  server.http().Get("/x", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  server.http().Get("/pair", [&](const httplib::Request&, httplib::Response& res) {
    ++waiting;
    Eventually([&] { return waiting.load() >= 2; });
    res.set_content("{}", "application/json");
  });
  server.http().set_keep_alive_max_count(100);  // httplib closes after 5 by default
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  int opened = 0;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<Response> r = transport->Perform(Get("/x"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status_code, 200);
    EXPECT_EQ(r->body, "{}");
    EXPECT_EQ(r->http_version, 11);
    opened += r->connections_opened;
  }
  EXPECT_EQ(opened, 1);
  // Two at once (the handler holds each until both arrived): two connections.
  absl::StatusOr<Response> other;
  std::thread second([&] { other = transport->Perform(Get("/pair")); });
  absl::StatusOr<Response> mine = transport->Perform(Get("/pair"));
  second.join();
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(mine->connections_opened + other->connections_opened, 1);  // one idle was pooled
  // A non-2xx answer is a response, as Send gives it; an invalid request is refused.
  absl::StatusOr<Response> missing = transport->Perform(Get("/missing"));
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status_code, 404);
  EXPECT_EQ(transport->Perform(Get("no-slash")).status().code(),
            absl::StatusCode::kInvalidArgument);

  RestConfig limited = ConfigFor(server.url());
  limited.qps = 20;
  limited.burst = 2;
  auto slow = MakeTransport(limited);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(slow->Perform(Get("/x")).ok());
  }
  // Two immediately, then four at 20 per second: at least 200 ms.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
}

// With max_host_connections set, a blocking call takes its connection from the I/O thread's
// bounded pool: while a stream holds the only connection, it waits.
TEST(CurlTransport, PerformKeepsTheConnectionBound) {
  TestServer server;
  Channel channel;
  StopInOrder stop_in_order(&channel, &server);
  server.http().Get("/watch", [&](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider(
        "application/json", [&](size_t, httplib::DataSink& sink) { return channel.Provide(sink); });
  });
  server.http().Get("/x", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  server.Start();
  CurlTransport::Options bounded;
  bounded.max_host_connections = 1;
  absl::StatusOr<std::unique_ptr<CurlTransport>> created =
      CurlTransport::Create(ConfigFor(server.url()), nullptr, bounded);
  ASSERT_TRUE(created.ok()) << created.status();
  CurlTransport& transport = **created;
  StreamRecorder watch;
  transport.Stream(Get("/watch"), watch.Handlers());
  channel.Push("x");
  ASSERT_TRUE(watch.WaitForData("x"));  // the stream holds the one connection
  std::atomic<bool> returned{false};
  absl::StatusOr<Response> outcome = absl::UnknownError("unset");
  std::thread caller([&] {
    outcome = transport.Perform(Get("/x"));
    returned.store(true);
  });
  // A real wait: nothing marks a transfer parked in curl's queue for a connection, so this is
  // the time in which a Perform that bypassed the bound would have come back.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(returned.load()) << "Perform bypassed max_host_connections";
  channel.Close();  // the stream ends and frees the connection
  caller.join();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->body, "{}");
}

TEST(CurlTransport, DestructionCancelsAPerformInFlight) {
  TestServer server;
  Channel channel;
  StopInOrder stop_in_order(&channel, &server);
  std::atomic<bool> arrived{false};
  server.http().Get("/hang", [&](const httplib::Request&, httplib::Response& res) {
    arrived.store(true);
    res.set_chunked_content_provider(
        "application/json", [&](size_t, httplib::DataSink& sink) { return channel.Provide(sink); });
  });
  server.Start();
  auto transport = MakeTransport(ConfigFor(server.url()));
  absl::StatusOr<Response> outcome = absl::UnknownError("unset");
  std::atomic<bool> returned{false};
  CurlTransport* raw = transport.get();
  std::thread caller([&] {
    outcome = raw->Perform(Get("/hang"));
    returned.store(true);
  });
  channel.Push("partial");  // the exchange is under way: a body has begun
  // The Perform is inside its exchange, not about to start.
  ASSERT_TRUE(Eventually([&] { return arrived.load(); }));
  // "partial" is on its way to the Perform.
  ASSERT_TRUE(Eventually([&] { return channel.taken() >= 1; }));
  EXPECT_FALSE(returned.load());
  const absl::Time destroying = absl::Now();
  transport.reset();  // ends the Perform (within its progress callback's second) and waits for it
  caller.join();
  EXPECT_LT(absl::Now() - destroying, absl::Seconds(5));  // not the 20 s request timeout
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kCancelled) << outcome.status();
}

TEST(CurlTransport, RejectsBadRequestsAndConfigs) {
  EXPECT_EQ(CurlTransport::Create(ConfigFor("ftp://h"), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  RestConfig half = ConfigFor("https://h");
  half.client_cert_pem = "cert";
  EXPECT_EQ(CurlTransport::Create(half, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto transport = MakeTransport(ConfigFor("http://127.0.0.1:1"));
  SendResult result;
  transport->Send(Get("no-slash"), result.Callback());
  EXPECT_EQ(result.Wait().status().code(), absl::StatusCode::kInvalidArgument);
}

// --------------------------------------------------------------------------------------------
// TLS

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/tessera-tls-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    const std::string d = *dir_;
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    WriteAll(d + "/server.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    WriteAll(d + "/named.ext", "subjectAltName=DNS:kubernetes.default.svc\n");
    WriteAll(d + "/client.ext", "extendedKeyUsage=clientAuth\n");
    const std::vector<std::string> commands = {
        "openssl req -x509 " + ec + " -keyout ca.key -out ca.crt -days 2 -subj /CN=tessera-test-ca",
        "openssl req -x509 " + ec + " -keyout other.key -out other.crt -days 2 -subj /CN=other-ca",
        "openssl req " + ec + " -keyout server.key -out server.csr -subj /CN=127.0.0.1",
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile server.ext -out server.crt",
        "openssl req " + ec + " -keyout named.key -out named.csr -subj /CN=kubernetes",
        "openssl x509 -req -in named.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile named.ext -out named.crt",
        "openssl req " + ec + " -keyout client.key -out client.csr -subj /CN=tessera",
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile client.ext -out client.crt",
    };
    for (const std::string& c : commands) {
      const std::string full = "cd " + d + " && " + c + " >/dev/null 2>&1";
      ASSERT_EQ(std::system(full.c_str()), 0) << c;
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }

  static std::unique_ptr<httplib::Server> Ssl(const std::string& cert, const std::string& key,
                                              const char* client_ca = nullptr) {
    auto server =
        std::make_unique<httplib::SSLServer>(Path(cert).c_str(), Path(key).c_str(), client_ca);
    EXPECT_TRUE(server->is_valid());
    server->Get("/version", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"major":"1","minor":"32"})", "application/json");
    });
    return server;
  }

  static std::string* dir_;
};

std::string* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, TrustedCertificateIsAcceptedAndUntrustedRefused) {
  TestServer server(Ssl("server.crt", "server.key"));
  server.Start();
  RestConfig config = ConfigFor(server.url("https"));
  config.ca_pem = ReadAll(Path("ca.crt"));
  auto trusted = MakeTransport(config);
  absl::StatusOr<Response> r = Do(*trusted, Get("/version"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->body, HasSubstr("\"minor\":\"32\""));

  config.ca_pem = ReadAll(Path("other.crt"));
  auto untrusted = MakeTransport(config);
  r = Do(*untrusted, Get("/version"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("not trusted"));

  // Verification is on by default: the system store does not know the test CA either.
  config.ca_pem.clear();
  auto system = MakeTransport(config);
  EXPECT_EQ(Do(*system, Get("/version")).status().code(), absl::StatusCode::kFailedPrecondition);

  config.insecure_skip_tls_verify = true;
  auto insecure = MakeTransport(config);
  EXPECT_TRUE(Do(*insecure, Get("/version")).ok());
}

TEST_F(TlsTest, TlsServerNameVerifiesAnotherName) {
  TestServer server(Ssl("named.crt", "named.key"));
  server.Start();
  RestConfig config = ConfigFor(server.url("https"));
  config.ca_pem = ReadAll(Path("ca.crt"));
  auto by_ip = MakeTransport(config);
  EXPECT_EQ(Do(*by_ip, Get("/version")).status().code(), absl::StatusCode::kFailedPrecondition);
  config.tls_server_name = "kubernetes.default.svc";
  auto by_name = MakeTransport(config);
  absl::StatusOr<Response> r = Do(*by_name, Get("/version"));
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST_F(TlsTest, ClientCertificateFromMemory) {
  const std::string ca = Path("ca.crt");
  TestServer server(Ssl("server.crt", "server.key", ca.c_str()));
  server.Start();
  RestConfig config = ConfigFor(server.url("https"));
  config.ca_pem = ReadAll(ca);
  auto anonymous = MakeTransport(config);
  std::vector<absl::Duration> delays;
  absl::StatusOr<Response> r = Do(*anonymous, Get("/version"), RecordingSleeps(&delays, 1));
  EXPECT_FALSE(r.ok());

  config.client_cert_pem = ReadAll(Path("client.crt"));
  config.client_key_pem = ReadAll(Path("client.key"));
  auto mtls = MakeTransport(config);
  r = Do(*mtls, Get("/version"));
  EXPECT_TRUE(r.ok()) << r.status();

  // A key that is not a key is a configuration error whose message does not echo the blob.
  config.client_key_pem =
      "-----BEGIN PRIVATE KEY-----\nbm90LWEta2V5LXNlY3JldA==\n"
      "-----END PRIVATE KEY-----\n";
  auto broken = MakeTransport(config);
  r = Do(*broken, Get("/version"), RecordingSleeps(&delays, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), Not(HasSubstr("bm90LWEta2V5LXNlY3JldA")));
  EXPECT_THAT(r.status().message(), Not(HasSubstr("BEGIN")));
}

// --------------------------------------------------------------------------------------------
// HTTP/2

// The path of an executable called `name` on PATH (or in /usr/sbin), or "" when there is none.
std::string FindExecutable(const std::string& name) {
  std::string dirs = "/usr/sbin:/usr/local/sbin";
  if (const char* path = std::getenv("PATH")) {
    dirs = std::string(path) + ":" + dirs;
  }
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) {
      end = dirs.size();
    }
    const std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (end > start && access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  return "";
}

// A port that was free a moment ago on 127.0.0.1 (bind to port 0, read it back, close).
int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return 0;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Whether process `pid` holds a socket listening on 127.0.0.1:`port` (from /proc: the
// listener's inode in /proc/net/tcp among the process's descriptors).
bool ListensOn(pid_t pid, int port) {
  std::ifstream tcp("/proc/net/tcp");
  const std::string local = fmt::format("0100007F:{:04X}", port);
  std::string line;
  std::vector<std::string> inodes;
  std::getline(tcp, line);  // the header
  while (std::getline(tcp, line)) {
    std::istringstream fields(line);
    std::string slot, local_address, remote_address, state, queues, timer, retransmits, uid,
        timeout, inode;
    fields >> slot >> local_address >> remote_address >> state >> queues >> timer >> retransmits >>
        uid >> timeout >> inode;
    if (local_address == local && state == "0A") {  // TCP_LISTEN
      inodes.push_back("socket:[" + inode + "]");
    }
  }
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid), ec)) {
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (std::find(inodes.begin(), inodes.end(), target) != inodes.end()) {
      return true;
    }
  }
  return false;
}

// nghttpd (Debian package nghttp2-server): an HTTP/2-only server over TLS (ALPN h2) serving the
// files of a directory, run as a child process on 127.0.0.1. nghttpd cannot listen on port 0,
// so a free port is picked and the start retried when another process took it meanwhile.
class Nghttpd {
 public:
  Nghttpd() = default;
  Nghttpd(const Nghttpd&) = delete;
  Nghttpd& operator=(const Nghttpd&) = delete;
  ~Nghttpd() { Stop(); }

  // Serves `docroot` with the PEM key and certificate files given. False (with a test failure)
  // when it could not be started.
  bool Start(const std::string& binary, const std::string& docroot, const std::string& key,
             const std::string& cert) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      const int port = PickFreePort();
      if (port <= 0) {
        continue;
      }
      const std::string port_arg = std::to_string(port);
      const pid_t pid = fork();
      if (pid < 0) {
        ADD_FAILURE() << "fork failed";
        return false;
      }
      if (pid == 0) {
        // Child: silence nghttpd and exec it.
        const int null_fd = open("/dev/null", O_WRONLY);
        if (null_fd >= 0) {
          dup2(null_fd, STDOUT_FILENO);
          dup2(null_fd, STDERR_FILENO);
        }
        execl(binary.c_str(), binary.c_str(), "-a", "127.0.0.1", "-d", docroot.c_str(),
              port_arg.c_str(), key.c_str(), cert.c_str(), static_cast<char*>(nullptr));
        _exit(127);
      }
      pid_ = pid;
      // Wait until it listens, or notice that it exited (the port was taken, most likely).
      bool listening = false;
      Eventually([&] {
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          return true;
        }
        // nghttpd's own listening socket, not another process's that took the port first.
        listening = ListensOn(pid_, port);
        return listening;
      });
      if (listening) {
        port_ = port;
        return true;
      }
      Stop();
    }
    ADD_FAILURE() << "nghttpd did not start";
    return false;
  }

  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

  std::string url() const { return "https://127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

class Http2Test : public TlsTest {
 protected:
  void SetUp() override {
    binary_ = FindExecutable("nghttpd");
    if (binary_.empty()) {
      GTEST_SKIP() << "nghttpd not installed (Debian package nghttp2-server): HTTP/2 untested";
    }
    docroot_ = Path("htdocs");
    std::filesystem::create_directories(docroot_);
    for (int i = 0; i < kFiles; ++i) {
      WriteAll(docroot_ + "/pods-" + std::to_string(i) + ".json", Body(i));
    }
    ASSERT_TRUE(server_.Start(binary_, docroot_, Path("server.key"), Path("server.crt")));
  }

  static std::string Body(int i) {
    return R"({"kind":"PodList","items":[],"n":)" + std::to_string(i) + "," + R"("pad":")" +
           std::string(static_cast<size_t>(1000 * (i + 1)), 'x') + R"("})";
  }

  static constexpr int kFiles = 8;
  std::string binary_;
  std::string docroot_;
  Nghttpd server_;
};

TEST_F(Http2Test, HttpsNegotiatesHttp2WithAVerifiedCertificate) {
  RestConfig config = ConfigFor(server_.url());
  config.ca_pem = ReadAll(Path("ca.crt"));
  auto transport = MakeTransport(config);
  absl::StatusOr<Response> r = Do(*transport, Get("/pods-0.json"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status_code, 200);
  EXPECT_EQ(r->http_version, 20);
  EXPECT_EQ(r->body, Body(0));
  EXPECT_EQ(r->connections_opened, 1);

  // The same server with a CA that did not sign its certificate is refused over HTTP/2 too.
  config.ca_pem = ReadAll(Path("other.crt"));
  auto untrusted = MakeTransport(config);
  EXPECT_EQ(Do(*untrusted, Get("/pods-0.json")).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(Http2Test, ConcurrentRequestsAndAStreamShareOneConnection) {
  RestConfig config = ConfigFor(server_.url());
  config.ca_pem = ReadAll(Path("ca.crt"));
  auto transport = MakeTransport(config);

  // A watch-style stream and kFiles GETs, all submitted before the first connection is up.
  Mutex mu;
  int stream_version = 0;
  int stream_connections = -1;
  StreamRecorder recorder;
  StreamHandlers handlers = recorder.Handlers();
  auto record_open = std::move(handlers.on_open);
  handlers.on_open = [&, record_open = std::move(record_open)](const Response& head) mutable {
    {
      MutexLock lock(&mu);
      stream_version = head.http_version;
      stream_connections = head.connections_opened;
    }
    record_open(head);
  };
  transport->Stream(Get("/pods-7.json"), std::move(handlers));
  std::vector<std::unique_ptr<SendResult>> results;
  for (int i = 0; i < kFiles; ++i) {
    results.push_back(std::make_unique<SendResult>());
    transport->Send(Get("/pods-" + std::to_string(i) + ".json"), results.back()->Callback());
  }
  int opened = 0;
  for (int i = 0; i < kFiles; ++i) {
    absl::StatusOr<Response> r = results[static_cast<size_t>(i)]->Wait();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->http_version, 20) << i;
    EXPECT_EQ(r->body, Body(i)) << i;
    opened += r->connections_opened;
  }
  ASSERT_TRUE(recorder.WaitForEnd());
  EXPECT_TRUE(recorder.end().status.ok()) << recorder.end().status;
  EXPECT_EQ(recorder.data(), Body(7));
  MutexLock lock(&mu);
  EXPECT_EQ(stream_version, 20);
  opened += stream_connections;
  // Nine exchanges in flight together, one TCP+TLS connection between them.
  EXPECT_EQ(opened, 1);
}

TEST_F(Http2Test, Http11OnlyServerStillWorksOverTls) {
  // httplib's SSLServer offers no ALPN, so the offer of h2 falls back to HTTP/1.1. Every handler
  // waits until all requests have arrived: they are in flight together, so without
  // multiplexing each needs a connection of its own.
  constexpr int kRequests = 4;
  std::atomic<int> arrived{0};
  std::unique_ptr<httplib::Server> ssl = Ssl("server.crt", "server.key");
  ssl->Get("/slow", [&](const httplib::Request& req, httplib::Response& res) {
    EXPECT_EQ(req.version, "HTTP/1.1");
    ++arrived;
    Eventually([&] { return arrived.load() >= kRequests; });
    res.set_content("{}", "application/json");
  });
  TestServer server(std::move(ssl));
  server.Start();
  RestConfig config = ConfigFor(server.url("https"));
  config.ca_pem = ReadAll(Path("ca.crt"));
  auto transport = MakeTransport(config);

  // Through the I/O thread (Send), whose connections the requests below share; Do would run on
  // a pooled connection of its own.
  SendResult first;
  transport->Send(Get("/version"), first.Callback());
  absl::StatusOr<Response> version = first.Wait();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(version->http_version, 11);
  std::vector<std::unique_ptr<SendResult>> results;
  for (int i = 0; i < kRequests; ++i) {
    results.push_back(std::make_unique<SendResult>());
    transport->Send(Get("/slow"), results.back()->Callback());
  }
  int opened = 0;
  for (auto& result : results) {
    absl::StatusOr<Response> r = result->Wait(absl::Seconds(20));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->http_version, 11);
    EXPECT_EQ(r->body, "{}");
    opened += r->connections_opened;
  }
  // The idle connection of /version is reused by one of them; the others open their own.
  EXPECT_EQ(opened, kRequests - 1);
  EXPECT_EQ(arrived.load(), kRequests);
}

}  // namespace
}  // namespace tessera::kube
