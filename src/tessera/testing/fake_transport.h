// File: tessera/testing/fake_transport.h
//
// FakeTransport: a Transport driven by the test, so code built on Transport (client, reflector)
// can be shown every outcome — any status code, transport error, partial stream, stall or close —
// at the moment the test chooses.
//
//   FakeTransport fake;
//   client.StartList();                                   // calls fake.Send(...)
//   ASSERT_TRUE(fake.WaitForPending(1));
//   EXPECT_EQ(fake.pending()[0].path, "/api/v1/pods?limit=500");
//   fake.Reply(response);                                    // callback runs here, now
//   StreamId w = fake.WaitForStream();
//   fake.StreamOpen(w); fake.StreamData(w, "{...}\n"); fake.StreamClose(w, absl::OkStatus());
//
// Sends are answered in order: by the handler if one is set (synchronously, on the caller of
// Send), else they queue until Reply()/ReplyAt(). Callbacks run on the thread that calls the
// driving method (Reply, StreamOpen, StreamData, StreamClose, DeliverCancellations), never while
// the fake's lock is held. Cancel() only records the cancellation, like the real transport's
// asynchronous cancel: the stream's on_end(kCancelled) runs at the next DeliverCancellations()
// (which every driving method calls first), and later data for it is dropped.
//
// Thread safety: every method may be called from any thread; drive any one stream from one
// thread at a time (its handlers are called outside the lock).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/base/mutex.h"
#include "tessera/kube/transport.h"

namespace tessera::kube {

class FakeTransport : public Transport {
 public:
  using Handler = std::function<absl::StatusOr<Response>(const Request&)>;

  FakeTransport() = default;
  ~FakeTransport() override;

  // Transport.
  void Send(Request request, ResponseCallback done) override;
  StreamId Stream(Request request, StreamHandlers handlers) override;
  void Cancel(StreamId id) override;

  // Answers every later Send() synchronously with handler(request). Pass nullptr to queue again.
  void SetHandler(Handler handler);

  // Every request seen (sends and streams), in arrival order.
  std::vector<Request> requests() const;
  // Sends waiting for a reply, oldest first.
  std::vector<Request> pending() const;
  // Waits (real time, at most `timeout`) until at least `n` sends are pending.
  bool WaitForPending(size_t n, absl::Duration timeout = absl::Seconds(5));
  // Completes the oldest pending send (false if none is pending).
  bool Reply(absl::StatusOr<Response> outcome);
  // Completes the pending send at `index` (false if there is none).
  bool ReplyAt(size_t index, absl::StatusOr<Response> outcome);

  // Streams that have not ended, oldest first.
  std::vector<StreamId> open_streams() const;
  // The request of stream `id` (any stream ever started).
  std::optional<Request> stream_request(StreamId id) const;
  // Waits (real time) for a stream started after the `seen`-th one; returns its id, or 0.
  StreamId WaitForStream(size_t seen = 0, absl::Duration timeout = absl::Seconds(5));
  // Number of streams ever started.
  size_t streams_started() const;
  // Whether Cancel(id) was called.
  bool cancel_requested(StreamId id) const;

  // Drive a stream. Each returns false (and does nothing) when the stream has ended or was
  // cancelled. StreamOpen must come before StreamData.
  bool StreamOpen(StreamId id, const Response& head = OkHead());
  static Response OkHead() {
    Response head;
    head.status_code = 200;
    return head;
  }
  bool StreamData(StreamId id, std::string_view bytes);
  // Ends the stream with `status` (OK = normal close; kUnavailable = broken/stalled, …).
  bool StreamClose(StreamId id, absl::Status status);
  // Ends the stream with a non-2xx response, as the real transport does for one.
  bool StreamFailHttp(StreamId id, Response response);
  // Runs on_end(kCancelled) for cancelled streams. Returns how many.
  int DeliverCancellations();

 private:
  struct FakeStream {
    Request request;
    StreamHandlers handlers;
    bool opened = false;
    bool cancel_requested = false;
    bool ended = false;
  };
  struct PendingSend {
    Request request;
    ResponseCallback done;
  };

  enum class Step { kOpen, kData };
  bool Drive(StreamId id, Step step, const Response* head, std::string_view bytes);
  bool End(StreamId id, StreamEnd end);

  mutable Mutex mu_;
  CondVar cv_;
  Handler handler_ ABSL_GUARDED_BY(mu_);
  std::vector<Request> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingSend> pending_ ABSL_GUARDED_BY(mu_);
  std::map<StreamId, FakeStream> streams_ ABSL_GUARDED_BY(mu_);
  StreamId next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tessera::kube
