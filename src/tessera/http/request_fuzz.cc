// Fuzzes tessera::http's connection loop: the input is split into reads (its first bytes choose
// the split points, timeouts between reads and how the stream ends) and served by
// internal::ServeConnection through a memory stream, with small limits and a handler that
// echoes the body (as a Content-Length body, or streamed when the path starts with "/s"; it
// throws for "/throw"). Aborts unless:
//   - the bytes written parse as a sequence of replies, each "HTTP/1.1 " and a 3-digit status;
//   - apart from 100 Continue, there is one reply per on_response call, with its status, and
//     its body framing matches what was answered: a Content-Length equal to the body's length
//     followed by exactly that body (no body after the head for HEAD), or, for a streamed body,
//     chunks that de-chunk to what was streamed (raw up to the end for HTTP/1.0);
//   - the handler never sees a body longer than max_body_bytes, and runs only while the
//     connection's state says it is neither idle nor stalled in a request (so never shed);
//   - the loop ends (does not read on forever after the input ran out).
// It also runs ParseRequestHead on the raw input, which must return 0, 400 or 505.
//
// Input layout: byte 0 is flags (bits 0-2: the number of split lengths that follow; bit 3: the
// stream ends in timeouts rather than a close; bits 4-5: how many timeouts come before each read
// after the first; bit 6: the server is stopping; bit 7: ServerOptions::error_body is set), then
// one byte per split length, then the bytes the client sends. The connection's clock advances
// a second per read, so that the head and body deadlines fire.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/time.h"

#include "tessera/base/logging.h"
#include "tessera/http/server.h"
#include "tessera/http/server_internal.h"

namespace {

using tessera::http::Request;
using tessera::http::Response;
using tessera::http::ServerOptions;
using tessera::http::StreamWriter;
using tessera::http::internal::Stream;

constexpr size_t kMaxBody = 4096;
constexpr size_t kMaxHeader = 2048;

void Check(bool ok) {
  if (!ok) {
    std::abort();
  }
}

// Reads return the scripted results one per call (data split further when a read asks for
// less), then `end` forever; writes are appended to `out`.
class MemoryStream : public Stream {
 public:
  MemoryStream(std::deque<std::pair<long, std::string>> script, long end)
      : script_(std::move(script)), end_(end) {}

  long Read(char* buf, size_t n) override {
    Check(n > 0);
    ++reads;
    if (script_.empty()) {
      Check(++reads_after_end_ < 1000);  // the loop must end once the input ran out
      return end_;
    }
    auto& [result, data] = script_.front();
    if (result != 1) {
      const long r = result;
      script_.pop_front();
      return r;
    }
    const size_t k = std::min(n, data.size());
    std::memcpy(buf, data.data(), k);
    data.erase(0, k);
    if (data.empty()) {
      script_.pop_front();
    }
    return static_cast<long>(k);
  }

  bool Write(std::string_view a, std::string_view b) override {
    out.append(a);
    out.append(b);
    return true;
  }

  std::string out;
  int64_t reads = 0;

 private:
  std::deque<std::pair<long, std::string>> script_;
  const long end_;
  int reads_after_end_ = 0;
};

// What a reply was to carry, from on_response.
struct Answer {
  int status;
  bool head_only;  // a HEAD the handler answered: no body after the head
  bool streamed;
  std::string body;  // the body (as streamed, for a streamed reply)
};

struct Run {
  bool handler_called = false;
  std::string streamed;
  std::vector<Answer> answers;
};

// De-chunks the chunked body at out[*at...]; false when it is not well-formed.
bool Dechunk(std::string_view out, size_t* at, std::string* body) {
  while (true) {
    const size_t line_end = out.find("\r\n", *at);
    if (line_end == std::string_view::npos || line_end == *at || line_end - *at > 8) {
      return false;
    }
    size_t size = 0;
    for (char c : out.substr(*at, line_end - *at)) {
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (digit < 0) {
        return false;
      }
      size = size * 16 + static_cast<size_t>(digit);
    }
    *at = line_end + 2;
    if (size == 0) {
      if (out.substr(*at, 2) != "\r\n") {
        return false;
      }
      *at += 2;
      return true;
    }
    if (out.size() - *at < size + 2 || out.substr(*at + size, 2) != "\r\n") {
      return false;
    }
    body->append(out.substr(*at, size));
    *at += size + 2;
  }
}

// Checks that `out` is the replies `answers` describe (see the top of the file).
void CheckReplies(std::string_view out, const std::vector<Answer>& answers) {
  size_t at = 0;
  size_t next = 0;
  while (at < out.size()) {
    Check(out.substr(at, 9) == "HTTP/1.1 " && out.size() - at >= 13);
    int status = 0;
    for (size_t i = at + 9; i < at + 12; ++i) {
      Check(out[i] >= '0' && out[i] <= '9');
      status = status * 10 + (out[i] - '0');
    }
    Check(out[at + 12] == ' ');
    const size_t head_end = out.find("\r\n\r\n", at);
    Check(head_end != std::string_view::npos);
    const std::string_view head = out.substr(at, head_end + 2 - at);  // ends in its last CRLF
    at = head_end + 4;
    if (status == 100) {
      Check(head == "HTTP/1.1 100 Continue\r\n");
      continue;
    }
    Check(next < answers.size());
    const Answer& answer = answers[next++];
    Check(answer.status == status);
    const size_t cl_at = head.find("\r\nContent-Length: ");
    const bool chunked = head.find("\r\nTransfer-Encoding: chunked\r\n") != std::string_view::npos;
    size_t length = 0;
    if (cl_at != std::string_view::npos) {
      const size_t from = cl_at + 18;
      const size_t to = head.find("\r\n", from);
      Check(to > from && to - from <= 10);
      for (char c : head.substr(from, to - from)) {
        Check(c >= '0' && c <= '9');
        length = length * 10 + static_cast<size_t>(c - '0');
      }
    }
    if (answer.head_only) {
      Check(!chunked);
      Check(answer.streamed ? cl_at == std::string_view::npos
                            : cl_at != std::string_view::npos && length == answer.body.size());
      continue;
    }
    if (answer.streamed) {
      Check(cl_at == std::string_view::npos);
      std::string body;
      if (chunked) {
        Check(Dechunk(out, &at, &body));
      } else {  // to an HTTP/1.0 client: raw up to the close, so the last reply
        Check(head.find("\r\nConnection: close\r\n") != std::string_view::npos);
        body = out.substr(at);
        at = out.size();
        Check(next == answers.size());
      }
      Check(body == answer.body);
      continue;
    }
    Check(!chunked && cl_at != std::string_view::npos);
    Check(length == answer.body.size() && out.size() - at >= length);
    Check(out.substr(at, length) == answer.body);
    at += length;
  }
  Check(next == answers.size());
}

}  // namespace

// The handler's exceptions are logged; a line per run would slow fuzzing down.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  tessera::SetLogSink([](tessera::LogSeverity, std::string_view) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  const uint8_t flags = data[0];
  size_t splits = std::min<size_t>(flags & 7, size - 1);
  std::vector<size_t> lengths;
  for (size_t i = 0; i < splits; ++i) {
    lengths.push_back(static_cast<size_t>(data[1 + i]) + 1);
  }
  const std::string_view input(reinterpret_cast<const char*>(data) + 1 + splits, size - 1 - splits);

  {
    Request r;
    const int status = tessera::http::internal::ParseRequestHead(input, &r);
    Check(status == 0 || status == 400 || status == 505);
  }

  // The reads: the input cut at the chosen lengths (the rest in one read), with timeouts.
  std::deque<std::pair<long, std::string>> script;
  const int timeouts = (flags >> 4) & 3;
  size_t at = 0;
  for (size_t i = 0; at < input.size(); ++i) {
    if (at > 0) {
      for (int t = 0; t < timeouts; ++t) {
        script.emplace_back(Stream::kTimedOut, "");
      }
    }
    const size_t n =
        i < lengths.size() ? std::min(lengths[i], input.size() - at) : input.size() - at;
    script.emplace_back(1, std::string(input.substr(at, n)));
    at += n;
  }
  MemoryStream stream(std::move(script), (flags & 8) != 0 ? Stream::kTimedOut : Stream::kClosed);

  Run run;
  ServerOptions options;
  options.max_body_bytes = kMaxBody;
  options.max_header_bytes = kMaxHeader;
  options.keep_alive_timeout = absl::Seconds(2);
  options.read_timeout = absl::Seconds(3);
  options.header_timeout = absl::Seconds(12);
  options.body_timeout = absl::Seconds(6);
  tessera::http::internal::ConnectionState state;
  state.idle_since.store(1);
  const tessera::http::internal::SteadyNow now = [&stream] {
    return std::chrono::steady_clock::time_point(std::chrono::hours(1)) +
           std::chrono::seconds(stream.reads);
  };
  if ((flags & 128) != 0) {
    options.error_body = [](Response* response) {
      response->content_type = "application/json";
      response->body = "{\"status\":" + std::to_string(response->status) + "}";
    };
  }
  options.on_response = [&run](const Request& request, const Response& response, absl::Duration) {
    Answer answer;
    answer.status = response.status;
    answer.head_only = run.handler_called && request.method == "HEAD";
    answer.streamed = response.stream != nullptr;
    answer.body = answer.streamed ? run.streamed : response.body;
    run.answers.push_back(std::move(answer));
    run.handler_called = false;
    run.streamed.clear();
  };
  const tessera::http::Handler handler = [&run, &state](Request& request, Response* response) {
    Check(request.body.size() <= kMaxBody);
    Check(state.idle_since.load() == 0 && state.request_since.load() == 0);
    run.handler_called = true;
    if (request.path == "/throw") {
      throw std::runtime_error("fuzz");
    }
    response->content_type = "text/plain";
    if (request.path.compare(0, 2, "/s") == 0) {
      response->stream = [&run, body = std::move(request.body)](StreamWriter& writer) {
        const size_t half = body.size() / 2;
        for (std::string_view piece :
             {std::string_view(body).substr(0, half), std::string_view(body).substr(half)}) {
          Check(writer.Write(piece));
          run.streamed.append(piece);
        }
        return true;
      };
      return;
    }
    response->body = std::move(request.body);
    response->close = request.path == "/close";
  };
  const std::atomic<bool> stopping{(flags & 64) != 0};
  tessera::http::internal::ServeConnection(stream, handler, options, absl::Seconds(1), stopping,
                                           &state, now);
  CheckReplies(stream.out, run.answers);
  return 0;
}
