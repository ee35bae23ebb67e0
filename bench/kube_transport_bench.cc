// CurlTransport over loopback HTTP/1.1 against an in-process cpp-httplib server:
//   BM_DoGet          one blocking Do() at a time (latency of a small GET)
//   BM_HttplibClientGet  the same with cpp-httplib's blocking client, as a baseline
//   BM_PipelinedGets  `range(0)` Sends in flight at once (requests per second of the I/O thread)
//   BM_StreamIngest   a chunked stream of 1 KiB lines (bytes per second through on_data)
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <benchmark/benchmark.h>
#include <httplib.h>

#include "tessera/base/mutex.h"
#include "tessera/kube/transport.h"

namespace tessera::kube {
namespace {

class Server {
 public:
  Server() {
    http_.set_tcp_nodelay(true);
    // httplib serves a connection per worker; keep-alive connections pin workers, so give it
    // more workers than the client opens connections.
    http_.new_task_queue = [] { return new httplib::ThreadPool(96); };
    http_.Get("/small", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"kind":"Pod","metadata":{"name":"p"}})", "application/json");
    });
    http_.Get("/stream", [this](const httplib::Request& req, httplib::Response& res) {
      const size_t total = std::stoul(req.get_param_value("bytes"));
      res.set_chunked_content_provider(
          "application/json",
          [this, total, sent = size_t{0}](size_t, httplib::DataSink& sink) mutable {
            if (sent >= total) {
              sink.done();
              return true;
            }
            sent += line_.size();
            return sink.write(line_.data(), line_.size());
          });
    });
    line_ = std::string(1023, 'e') + "\n";
    port_ = http_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { http_.listen_after_bind(); });
    while (!http_.is_running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~Server() {
    http_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  httplib::Server http_;
  std::string line_;
  std::thread thread_;
  int port_ = 0;
};

// httplib listens with a backlog of 5: more simultaneous connects than that lose SYNs and wait
// for TCP's one-second retransmit, so the client is bounded to 4 connections here.
std::unique_ptr<CurlTransport> MakeTransport(const Server& server, bool compression = true) {
  RestConfig config;
  config.server = server.url();
  config.qps = 0;
  config.disable_compression = !compression;
  CurlTransport::Options options;
  options.max_host_connections = 4;
  return *CurlTransport::Create(config, nullptr, options);
}

Request Get(std::string path) {
  Request r;
  r.path = std::move(path);
  return r;
}

void BM_DoGet(benchmark::State& state) {
  Server server;
  auto transport = MakeTransport(server, state.range(0) != 0);
  for (auto _ : state) {
    absl::StatusOr<Response> r = Do(*transport, Get("/small"));
    if (!r.ok()) {
      state.SkipWithError("request failed");
      break;
    }
    benchmark::DoNotOptimize(r->body.size());
  }
  state.SetItemsProcessed(state.iterations());
}
// Arg: 1 = Accept-Encoding offered (httplib then compresses even this small body), 0 = not.
BENCHMARK(BM_DoGet)->Arg(1)->Arg(0)->UseRealTime();

// Baseline for BM_DoGet: cpp-httplib's blocking client on the same server.
void BM_HttplibClientGet(benchmark::State& state) {
  Server server;
  httplib::Client client(server.url());
  client.set_tcp_nodelay(true);
  for (auto _ : state) {
    httplib::Result r = client.Get("/small");
    if (!r) {
      state.SkipWithError("request failed");
      break;
    }
    benchmark::DoNotOptimize(r->body.size());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HttplibClientGet)->UseRealTime();

void BM_PipelinedGets(benchmark::State& state) {
  Server server;
  auto transport = MakeTransport(server);
  const int in_flight = static_cast<int>(state.range(0));
  for (auto _ : state) {
    Mutex mu;
    CondVar cv;
    int left = in_flight;
    for (int i = 0; i < in_flight; ++i) {
      transport->Send(Get("/small"), [&](absl::StatusOr<Response>) {
        MutexLock lock(&mu);
        --left;
        cv.SignalAll();
      });
    }
    MutexLock lock(&mu);
    while (left > 0) {
      cv.Wait(&mu);
    }
  }
  state.SetItemsProcessed(state.iterations() * in_flight);
}
BENCHMARK(BM_PipelinedGets)->Arg(16)->Arg(64)->UseRealTime();

void BM_StreamIngest(benchmark::State& state) {
  Server server;
  auto transport = MakeTransport(server);
  const int64_t bytes = state.range(0);
  for (auto _ : state) {
    Mutex mu;
    CondVar cv;
    bool done = false;
    std::atomic<int64_t> received{0};
    StreamHandlers h;
    h.on_data = [&](std::string_view b) { received.fetch_add(static_cast<int64_t>(b.size())); };
    h.on_end = [&](StreamEnd) {
      MutexLock lock(&mu);
      done = true;
      cv.SignalAll();
    };
    transport->Stream(Get("/stream?bytes=" + std::to_string(bytes)), std::move(h));
    MutexLock lock(&mu);
    while (!done) {
      cv.Wait(&mu);
    }
    benchmark::DoNotOptimize(received.load());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}
BENCHMARK(BM_StreamIngest)->Arg(64 << 20)->UseRealTime();

}  // namespace
}  // namespace tessera::kube
