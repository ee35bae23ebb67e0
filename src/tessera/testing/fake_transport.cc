#include "tessera/testing/fake_transport.h"

#include <chrono>
#include <utility>

#include "tessera/base/clock.h"

namespace tessera::kube {

FakeTransport::~FakeTransport() = default;

void FakeTransport::Send(Request request, ResponseCallback done) {
  Handler handler;
  {
    MutexLock lock(&mu_);
    requests_.push_back(request);
    handler = handler_;
    if (!handler) {
      pending_.push_back(PendingSend{std::move(request), std::move(done)});
      cv_.SignalAll();
      return;
    }
  }
  done(handler(request));
}

StreamId FakeTransport::Stream(Request request, StreamHandlers handlers) {
  MutexLock lock(&mu_);
  requests_.push_back(request);
  const StreamId id = next_id_++;
  streams_.emplace(id, FakeStream{std::move(request), std::move(handlers)});
  cv_.SignalAll();
  return id;
}

void FakeTransport::Cancel(StreamId id) {
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it != streams_.end() && !it->second.ended) {
    it->second.cancel_requested = true;
  }
}

void FakeTransport::SetHandler(Handler handler) {
  MutexLock lock(&mu_);
  handler_ = std::move(handler);
}

std::vector<Request> FakeTransport::requests() const {
  MutexLock lock(&mu_);
  return requests_;
}

std::vector<Request> FakeTransport::pending() const {
  MutexLock lock(&mu_);
  std::vector<Request> out;
  out.reserve(pending_.size());
  for (const PendingSend& p : pending_) {
    out.push_back(p.request);
  }
  return out;
}

bool FakeTransport::WaitForPending(size_t n, absl::Duration timeout) {
  Clock* const clock = Clock::Real();  // the test's threads answer in real time
  const absl::Time deadline = clock->Now() + timeout;
  MutexLock lock(&mu_);
  while (pending_.size() < n) {
    const absl::Duration left = deadline - clock->Now();
    if (left <= absl::ZeroDuration()) {
      return false;
    }
    cv_.WaitFor(&mu_, absl::ToChronoMilliseconds(left) + std::chrono::milliseconds(1));
  }
  return true;
}

bool FakeTransport::Reply(absl::StatusOr<Response> outcome) {
  return ReplyAt(0, std::move(outcome));
}

bool FakeTransport::ReplyAt(size_t index, absl::StatusOr<Response> outcome) {
  DeliverCancellations();
  ResponseCallback done;
  {
    MutexLock lock(&mu_);
    if (index >= pending_.size()) {
      return false;
    }
    done = std::move(pending_[index].done);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(index));
  }
  done(std::move(outcome));
  return true;
}

std::vector<StreamId> FakeTransport::open_streams() const {
  MutexLock lock(&mu_);
  std::vector<StreamId> out;
  for (const auto& [id, s] : streams_) {
    if (!s.ended) {
      out.push_back(id);
    }
  }
  return out;
}

std::optional<Request> FakeTransport::stream_request(StreamId id) const {
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) {
    return std::nullopt;
  }
  return it->second.request;
}

StreamId FakeTransport::WaitForStream(size_t seen, absl::Duration timeout) {
  Clock* const clock = Clock::Real();  // the test's threads answer in real time
  const absl::Time deadline = clock->Now() + timeout;
  MutexLock lock(&mu_);
  while (streams_.size() <= seen) {
    const absl::Duration left = deadline - clock->Now();
    if (left <= absl::ZeroDuration()) {
      return 0;
    }
    cv_.WaitFor(&mu_, absl::ToChronoMilliseconds(left) + std::chrono::milliseconds(1));
  }
  auto it = streams_.begin();
  std::advance(it, static_cast<std::ptrdiff_t>(seen));
  return it->first;
}

size_t FakeTransport::streams_started() const {
  MutexLock lock(&mu_);
  return streams_.size();
}

bool FakeTransport::cancel_requested(StreamId id) const {
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  return it != streams_.end() && it->second.cancel_requested;
}

bool FakeTransport::Drive(StreamId id, Step step, const Response* head, std::string_view bytes) {
  DeliverCancellations();
  StreamHandlers handlers;
  {
    MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end() || it->second.ended || it->second.cancel_requested) {
      return false;
    }
    if (step == Step::kData && !it->second.opened) {
      return false;
    }
    if (step == Step::kOpen) {
      if (it->second.opened) {
        return false;
      }
      it->second.opened = true;
    }
    handlers = std::move(it->second.handlers);
  }
  if (step == Step::kOpen && handlers.on_open) {
    handlers.on_open(*head);
  }
  if (step == Step::kData && handlers.on_data) {
    handlers.on_data(bytes);
  }
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it != streams_.end()) {
    it->second.handlers = std::move(handlers);
  }
  return true;
}

bool FakeTransport::StreamOpen(StreamId id, const Response& head) {
  return Drive(id, Step::kOpen, &head, {});
}

bool FakeTransport::StreamData(StreamId id, std::string_view bytes) {
  return Drive(id, Step::kData, nullptr, bytes);
}

bool FakeTransport::End(StreamId id, StreamEnd end) {
  DeliverCancellations();
  absl::AnyInvocable<void(StreamEnd)> on_end;
  {
    MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end() || it->second.ended || it->second.cancel_requested) {
      return false;
    }
    it->second.ended = true;
    on_end = std::move(it->second.handlers.on_end);
  }
  if (on_end) {
    on_end(std::move(end));
  }
  return true;
}

bool FakeTransport::StreamClose(StreamId id, absl::Status status) {
  return End(id, ::tessera::kube::StreamEnd{std::move(status), std::nullopt});
}

bool FakeTransport::StreamFailHttp(StreamId id, Response response) {
  std::optional<Request> request = stream_request(id);
  if (!request.has_value()) {
    return false;
  }
  absl::Status status = HttpStatusToStatus(*request, response);
  return End(id, ::tessera::kube::StreamEnd{std::move(status), std::move(response)});
}

int FakeTransport::DeliverCancellations() {
  std::vector<std::pair<StreamId, absl::AnyInvocable<void(::tessera::kube::StreamEnd)>>> ends;
  {
    MutexLock lock(&mu_);
    for (auto& [id, s] : streams_) {
      if (s.cancel_requested && !s.ended) {
        s.ended = true;
        ends.emplace_back(id, std::move(s.handlers.on_end));
      }
    }
  }
  for (auto& [id, on_end] : ends) {
    if (on_end) {
      on_end(::tessera::kube::StreamEnd{absl::CancelledError("stream cancelled"), std::nullopt});
    }
  }
  return static_cast<int>(ends.size());
}

}  // namespace tessera::kube
