// The connection loop of tessera::http::Server (server_internal.h): reads each request's
// head and body (Content-Length or chunked) within their deadlines, publishes the
// connection's idle and stalled state for shedding, runs the handler and writes the reply.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "fmt/core.h"

#include "tessera/base/logging.h"
#include "tessera/http/server_internal.h"

namespace tessera::http {
namespace internal {
namespace {

// Reads go into a buffer of at least this much free space, so that one read takes a whole
// request of ordinary size.
constexpr size_t kReadChunk = 64 << 10;
// A reply body up to this size is copied behind the head, so that both go out in one write.
constexpr size_t kCoalesceBytes = 64 << 10;
// The longest chunk-size line (with extensions) or trailer line accepted.
constexpr size_t kMaxChunkLine = 4096;

bool IsTchar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool IsToken(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), IsTchar); }

// Removes a trailing CR (lines may end in CRLF or LF).
std::string_view StripCr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') {
    line.remove_suffix(1);
  }
  return line;
}

// Where the head ends: the index just past the empty line that ends it, or npos.
size_t FindHeadEnd(std::string_view data) {
  size_t from = 0;
  while (true) {
    const size_t nl = data.find('\n', from);
    if (nl == std::string_view::npos) {
      return std::string_view::npos;
    }
    // The next line is empty when it is "\n" or "\r\n".
    if (nl + 1 < data.size() && data[nl + 1] == '\n') {
      return nl + 2;
    }
    if (nl + 2 < data.size() && data[nl + 1] == '\r' && data[nl + 2] == '\n') {
      return nl + 3;
    }
    if (nl + 2 >= data.size()) {
      return std::string_view::npos;  // the next line has not arrived yet
    }
    from = nl + 1;
  }
}

enum class Framing { kNone, kLength, kChunked };

// What the exception being handled says.
std::string CurrentExceptionText() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

// The body of a streamed reply: chunks, or raw bytes to an HTTP/1.0 client.
class ChunkWriter : public StreamWriter {
 public:
  ChunkWriter(Stream& stream, bool chunked) : stream_(stream), chunked_(chunked) {}

  bool Write(std::string_view data) override {
    if (!ok_ || data.empty()) {
      return ok_;
    }
    if (!chunked_) {
      ok_ = stream_.Write(data, {});
      return ok_;
    }
    scratch_ = fmt::format("{:x}\r\n", data.size());
    if (data.size() <= kCoalesceBytes) {
      scratch_ += data;
      scratch_ += "\r\n";
      ok_ = stream_.Write(scratch_, {});
    } else {
      ok_ = stream_.Write(scratch_, data) && stream_.Write("\r\n", {});
    }
    return ok_;
  }

  bool ClientGone() override { return !ok_ || stream_.PeerGone(); }

  bool ok() const { return ok_; }

 private:
  Stream& stream_;
  const bool chunked_;
  bool ok_ = true;
  std::string scratch_;
};

class Connection {
 public:
  Connection(Stream& stream, const Handler& handler, const ServerOptions& options,
             absl::Duration tick, const std::atomic<bool>& stopping, ConnectionState* state,
             const SteadyNow& now)
      : stream_(stream),
        handler_(handler),
        options_(options),
        tick_(tick),
        stopping_(stopping),
        idle_since_(state == nullptr ? nullptr : &state->idle_since),
        request_since_(state == nullptr ? nullptr : &state->request_since),
        now_(now),
        // Not zeroed: an idle connection's buffer costs memory only for the pages reads touch.
        buf_(std::max(kReadChunk, options.max_header_bytes + kReadChunk / 2)),
        start_(Now()) {}

  bool Serve() {
    while (true) {
      const bool keep = ServeOne();
      if (!keep || stopping_.load(std::memory_order_relaxed)) {
        return refused_;
      }
    }
  }

 private:
  enum class Fill { kOk, kClosed, kTimedOut, kFailed };

  std::string_view Buffered() const { return {buf_.data() + pos_, end_ - pos_}; }

  // Reads more bytes into the buffer, waiting at most `limit` for the first one (zero: no limit).
  Fill More(absl::Duration limit) {
    if (pos_ == end_) {
      pos_ = end_ = 0;
    } else if (buf_.size() - end_ < kReadChunk / 4 && pos_ > 0) {
      std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
      end_ -= pos_;
      pos_ = 0;
    }
    if (end_ == buf_.size()) {
      buf_.resize(buf_.size() * 2);
    }
    absl::Duration waited;
    while (true) {
      const long n = stream_.Read(buf_.data() + end_, buf_.size() - end_);
      if (n > 0) {
        end_ += static_cast<size_t>(n);
        return Fill::kOk;
      }
      if (n == Stream::kClosed) {
        return Fill::kClosed;
      }
      if (n != Stream::kTimedOut || tick_ <= absl::ZeroDuration()) {
        return Fill::kFailed;
      }
      waited += tick_;
      if (limit > absl::ZeroDuration() && waited >= limit) {
        return Fill::kTimedOut;
      }
    }
  }

  // Reads more bytes of a body into the buffer: waits at most the read timeout for the first,
  // and not past the body deadline.
  Fill MoreBody() {
    absl::Duration limit = options_.read_timeout;
    if (body_deadline_ != std::chrono::steady_clock::time_point::max()) {
      const auto now = Now();
      if (now >= body_deadline_) {
        TESSERA_VLOG(2, "http {} {}: the body passed its deadline; closing the connection",
                     request_.method, request_.path);
        return Fill::kTimedOut;
      }
      // More counts whole ticks, so it ends within one of the deadline.
      const absl::Duration left = absl::FromChrono(body_deadline_ - now);
      if (limit <= absl::ZeroDuration() || left < limit) {
        limit = left;
      }
    }
    return More(limit);
  }

  // Appends the next `n` bytes of the body to request_.body (buffered bytes first; the rest
  // read through the buffer), which grows with the bytes received, never past `final_size`
  // (what the body can reach); false when they do not arrive.
  bool AppendBody(size_t n, size_t final_size) {
    std::string& body = request_.body;
    while (true) {
      const size_t take = std::min(n, end_ - pos_);
      if (take > 0) {
        if (body.size() + take > body.capacity()) {
          // Doubling, as append would, but capped: a declared length costs nothing until
          // its bytes arrive, and the last step does not overshoot it.
          body.reserve(std::min(final_size, std::max(body.size() + take, 2 * body.capacity())));
        }
        body.append(buf_.data() + pos_, take);
        pos_ += take;
        n -= take;
      }
      if (n == 0) {
        return true;
      }
      if (MoreBody() != Fill::kOk) {
        return false;
      }
    }
  }

  // The next line of a chunked body (without its line end), reading as needed; false when it
  // cannot be read or is too long (*too_long then says so).
  bool ReadLine(std::string_view* line, bool* too_long) {
    while (true) {
      const std::string_view data = Buffered();
      const size_t nl = data.find('\n');
      if (nl != std::string_view::npos) {
        *line = StripCr(data.substr(0, nl));
        pos_ += nl + 1;
        return true;
      }
      if (data.size() > kMaxChunkLine) {
        *too_long = true;
        return false;
      }
      if (MoreBody() != Fill::kOk) {
        return false;
      }
    }
  }

  // Reads a chunked body into request_.body; 0 or the status to refuse the request with.
  int ReadChunked() {
    std::string& body = request_.body;
    while (true) {
      std::string_view line;
      bool too_long = false;
      if (!ReadLine(&line, &too_long)) {
        return too_long ? 400 : -1;
      }
      const std::string_view size_text = TrimBlanks(line.substr(0, line.find(';')));
      uint64_t size = 0;
      if (size_text.empty() || size_text.size() > 15) {
        return 400;
      }
      for (char c : size_text) {
        const int digit = HexValue(c);
        if (digit < 0) {
          return 400;
        }
        size = size * 16 + static_cast<uint64_t>(digit);
      }
      if (size == 0) {
        break;
      }
      if (size > options_.max_body_bytes - body.size()) {
        return 413;
      }
      if (!AppendBody(size, options_.max_body_bytes)) {
        return -1;
      }
      std::string_view end;
      if (!ReadLine(&end, &too_long)) {
        return too_long ? 400 : -1;
      }
      if (!end.empty()) {
        return 400;  // data longer than its size
      }
    }
    // Trailer fields (ignored) up to the empty line.
    for (size_t lines = 0;; ++lines) {
      std::string_view line;
      bool too_long = false;
      if (lines > 100 || !ReadLine(&line, &too_long)) {
        return lines > 100 || too_long ? 400 : -1;
      }
      if (line.empty()) {
        return 0;
      }
    }
  }

  // How the request's body is framed, from its headers; 0 or the status to refuse it with.
  int BodyFraming(Framing* framing, uint64_t* length, bool* close_after) const {
    *framing = Framing::kNone;
    *length = 0;
    *close_after = false;
    bool has_length = false;
    for (const Header& h : request_.headers) {
      if (EqualsIgnoreCase(h.name, "Transfer-Encoding")) {
        if (!EqualsIgnoreCase(h.value, "chunked") || *framing == Framing::kChunked) {
          return 501;
        }
        *framing = Framing::kChunked;
      } else if (EqualsIgnoreCase(h.name, "Content-Length")) {
        uint64_t n = 0;
        if (h.value.empty() || h.value.size() > 18 ||
            h.value.find_first_not_of("0123456789") != std::string::npos ||
            !absl::SimpleAtoi(h.value, &n) || (has_length && n != *length)) {
          return 400;
        }
        has_length = true;
        *length = n;
      }
    }
    if (*framing == Framing::kChunked) {
      if (request_.minor_version == 0) {
        return 400;  // HTTP/1.0 has no chunked encoding
      }
      // Chunked wins over Content-Length, and the connection closes after the reply: a
      // request with both may be an attempt at request smuggling (RFC 9112 §6.1, §6.3).
      *close_after = has_length;
      *length = 0;
    } else if (has_length && *length > 0) {
      *framing = Framing::kLength;
    }
    return 0;
  }

  bool WantsClose() const {
    for (const Header& h : request_.headers) {
      if (EqualsIgnoreCase(h.name, "Connection")) {
        if (HasToken(h.value, "close")) {
          return true;
        }
        if (request_.minor_version == 0 && HasToken(h.value, "keep-alive")) {
          return false;
        }
      }
    }
    return request_.minor_version == 0;
  }

  void ResetRequest() {
    request_.method.clear();
    request_.target.clear();
    request_.path.clear();
    request_.query.clear();
    request_.minor_version = 1;
    request_.headers.clear();
    request_.body.clear();
    response_.status = 200;
    response_.content_type.clear();
    response_.headers.clear();
    response_.body.clear();
    response_.close = false;
    response_.stream = nullptr;
  }

  // Answers with a status the server chose, and closes.
  void Refuse(int status, std::chrono::steady_clock::time_point start) {
    refused_ = true;
    response_.status = status;
    response_.content_type.clear();
    response_.headers.clear();
    response_.body.clear();
    response_.close = true;
    response_.stream = nullptr;
    if (options_.error_body) {
      options_.error_body(&response_);
    } else {
      response_.content_type = "text/plain; charset=utf-8";
      response_.body = std::string(ReasonPhrase(status));
    }
    Reply(start, /*head_only=*/false);
  }

  // Writes response_ (and streams its body); false when a write failed.
  bool Reply(std::chrono::steady_clock::time_point start, bool head_only) {
    Response& r = response_;
    const bool no_body = r.status < 200 || r.status == 204 || r.status == 304;
    const bool streamed = r.stream != nullptr && !head_only && !no_body;
    const bool chunked = streamed && request_.minor_version >= 1;
    if (streamed && !chunked) {
      r.close = true;  // an HTTP/1.0 client reads the body up to the close
    }
    std::string& out = out_;
    out.clear();
    out += "HTTP/1.1 ";
    out += std::to_string(r.status);
    out += ' ';
    out += ReasonPhrase(r.status);
    out += "\r\n";
    if (!r.content_type.empty()) {
      out += "Content-Type: ";
      out += r.content_type;
      out += "\r\n";
    }
    if (chunked) {
      out += "Transfer-Encoding: chunked\r\n";
    } else if (!no_body && r.stream == nullptr) {
      out += "Content-Length: ";
      out += std::to_string(r.body.size());
      out += "\r\n";
    }
    for (const Header& h : r.headers) {
      out += h.name;
      out += ": ";
      out += h.value;
      out += "\r\n";
    }
    if (r.close) {
      out += "Connection: close\r\n";
    } else {
      if (request_.minor_version == 0) {
        out += "Connection: keep-alive\r\n";
      }
      if (options_.keep_alive_timeout > absl::ZeroDuration()) {
        out += fmt::format("Keep-Alive: timeout={}\r\n",
                           std::max<int64_t>(1, absl::ToInt64Seconds(options_.keep_alive_timeout)));
      }
    }
    out += "\r\n";
    std::string_view body;
    if (!no_body && !head_only && !streamed) {
      if (r.body.size() <= kCoalesceBytes) {
        out += r.body;
      } else {
        body = r.body;
      }
    }
    bool ok = stream_.Write(out, body);
    if (ok && streamed) {
      ChunkWriter writer(stream_, chunked);
      bool finished = false;
      try {
        finished = r.stream(writer);
      } catch (...) {
        TESSERA_LOG(kError, "http {} {}: streaming the reply failed: {}", request_.method,
                    request_.path, CurrentExceptionText());
        finished = false;  // the body stays unfinished: the client sees the connection close
      }
      ok = writer.ok();
      if (ok && finished && chunked) {
        ok = stream_.Write("0\r\n\r\n", {});
      }
      if (!finished) {
        r.close = true;
      }
    }
    if (options_.on_response) {
      options_.on_response(request_, r, absl::FromChrono(Now() - start));
    }
    return ok;
  }

  // Serves one request; false when the connection is to be closed.
  bool ServeOne() {
    ResetRequest();
    // The head: wait for it (idle: the keep-alive timeout, or for a connection's first request
    // the header timeout; once it has begun, the read timeout), and all of it arrives by the
    // head deadline.
    auto start = Now();
    const bool first = first_;
    first_ = false;
    const bool head_limited = options_.header_timeout > absl::ZeroDuration();
    const auto header_timeout = absl::ToChronoNanoseconds(options_.header_timeout);
    auto head_deadline = first && head_limited ? start_ + header_timeout
                                               : std::chrono::steady_clock::time_point::max();
    size_t head_end = std::string_view::npos;
    if (pos_ < end_) {
      SetRequestSince(NowNanos());  // a pipelined request, or the rest of the last read
    }
    while (true) {
      // Empty lines before a request line are ignored (RFC 9112 §2.2).
      while (pos_ < end_ && (buf_[pos_] == '\r' || buf_[pos_] == '\n')) {
        ++pos_;
      }
      head_end = FindHeadEnd(Buffered());
      if (head_end != std::string_view::npos) {
        break;
      }
      if (end_ - pos_ > options_.max_header_bytes) {
        Refuse(431, start);
        return false;
      }
      const bool idle = pos_ == end_;
      absl::Duration limit = options_.read_timeout;
      if (idle) {
        SetRequestSince(0);  // only blank lines so far
        if (idle_since_ != nullptr && idle_since_->load(std::memory_order_relaxed) <= 0) {
          idle_since_->store(NowNanos(), std::memory_order_relaxed);
        }
        limit = first && head_limited ? options_.header_timeout : options_.keep_alive_timeout;
      }
      if ((!idle || first) && head_limited) {
        const auto now = Now();
        if (now >= head_deadline) {
          TESSERA_VLOG(2, "http: a request head passed its deadline; closing the connection");
          return false;
        }
        // Wait no longer than the deadline (More counts whole ticks, so it ends within one).
        const absl::Duration left = absl::FromChrono(head_deadline - now);
        if (limit <= absl::ZeroDuration() || left < limit) {
          limit = left;
        }
      }
      const Fill f = More(limit);
      if (f != Fill::kOk) {
        return false;  // closed, failed or timed out: nothing to answer
      }
      if (idle) {
        if (idle_since_ != nullptr) {
          idle_since_->store(0, std::memory_order_relaxed);
        }
        SetRequestSince(NowNanos());
        start = Now();
        if (!first && head_limited) {
          head_deadline = start + header_timeout;
        }
      }
    }
    if (head_end > options_.max_header_bytes) {
      Refuse(431, start);
      return false;
    }
    const std::string_view head = Buffered().substr(0, head_end);
    if (const int refuse = ParseRequestHead(head, &request_); refuse != 0) {
      Refuse(refuse, start);
      return false;
    }
    pos_ += head_end;

    Framing framing;
    uint64_t length = 0;
    bool close_after = false;
    if (const int refuse = BodyFraming(&framing, &length, &close_after); refuse != 0) {
      Refuse(refuse, start);
      return false;
    }
    if (framing == Framing::kLength && length > options_.max_body_bytes) {
      Refuse(413, start);
      return false;
    }
    if (framing != Framing::kNone && pos_ == end_ && request_.minor_version >= 1 &&
        EqualsIgnoreCase(request_.Get("Expect"), "100-continue")) {
      if (!stream_.Write("HTTP/1.1 100 Continue\r\n\r\n", {})) {
        return false;
      }
    }
    body_deadline_ = options_.body_timeout > absl::ZeroDuration()
                         ? Now() + absl::ToChronoNanoseconds(options_.body_timeout)
                         : std::chrono::steady_clock::time_point::max();
    if (framing == Framing::kLength) {
      if (!AppendBody(length, length)) {
        return false;
      }
    } else if (framing == Framing::kChunked) {
      if (const int refuse = ReadChunked(); refuse != 0) {
        if (refuse > 0) {
          Refuse(refuse, start);
        }
        return false;
      }
    }

    // Whole: from here the request is handled and answered, never shed as stalled.
    SetRequestSince(0);
    const bool head_only = request_.method == "HEAD";
    bool large = request_.body.size() >= options_.large_request_bytes;
    try {
      handler_(request_, &response_);
    } catch (...) {
      TESSERA_LOG(kError, "http {} {}: handler failed: {}", request_.method, request_.path,
                  CurrentExceptionText());
      response_ = Response{};
      response_.status = 500;
      response_.content_type = "text/plain; charset=utf-8";
      response_.body = std::string(ReasonPhrase(500));
    }
    if (close_after || WantsClose() || stopping_.load(std::memory_order_relaxed)) {
      response_.close = true;
    }
    large = large || response_.body.size() >= options_.large_request_bytes;
    const bool keep = Reply(start, head_only) && !response_.close;
    if (large) {
      std::string().swap(request_.body);
      std::string().swap(response_.body);
      std::string().swap(out_);
      if (options_.after_large_request) {
        options_.after_large_request();
      }
    }
    return keep;
  }

  Stream& stream_;
  const Handler& handler_;
  const ServerOptions& options_;
  const absl::Duration tick_;
  const std::atomic<bool>& stopping_;
  // A growable byte buffer whose new bytes are left uninitialized.
  class Buffer {
   public:
    explicit Buffer(size_t n) : data_(new char[n]), size_(n) {}
    char* data() { return data_.get(); }
    const char* data() const { return data_.get(); }
    size_t size() const { return size_; }
    char& operator[](size_t i) { return data_[i]; }
    void resize(size_t n) {
      std::unique_ptr<char[]> bigger(new char[n]);
      std::memcpy(bigger.get(), data_.get(), std::min(n, size_));
      data_ = std::move(bigger);
      size_ = n;
    }

   private:
    std::unique_ptr<char[]> data_;
    size_t size_;
  };

  std::chrono::steady_clock::time_point Now() const {
    return now_ ? now_() : std::chrono::steady_clock::now();
  }

  int64_t NowNanos() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Now().time_since_epoch()).count();
  }

  void SetRequestSince(int64_t nanos) {
    if (request_since_ != nullptr) {
      request_since_->store(nanos, std::memory_order_relaxed);
    }
  }

  std::atomic<int64_t>* const idle_since_;
  std::atomic<int64_t>* const request_since_;
  const SteadyNow& now_;
  Buffer buf_;
  const std::chrono::steady_clock::time_point start_;  // of the connection
  bool first_ = true;                                  // no request has been read yet
  // The body being read must arrive whole by then (max: no deadline).
  std::chrono::steady_clock::time_point body_deadline_ =
      std::chrono::steady_clock::time_point::max();
  size_t pos_ = 0;  // buffered bytes not yet consumed: [pos_, end_)
  size_t end_ = 0;
  Request request_;
  Response response_;
  std::string out_;
  bool refused_ = false;  // the loop ended with a refusal (Refuse)
};

}  // namespace

int ParseRequestHead(std::string_view head, Request* request) {
  size_t at = head.find('\n');
  const std::string_view line = StripCr(head.substr(0, at));
  // request-line = method SP request-target SP HTTP-version
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return 400;
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method) || target.empty()) {
    return 400;
  }
  for (char c : target) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) {
      return 400;
    }
  }
  if (version.substr(0, 5) != "HTTP/" || version.size() != 8 || version[6] != '.' ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[5])) ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[7]))) {
    return 400;
  }
  if (version[5] != '1') {
    return 505;
  }
  request->method.assign(method);
  request->target.assign(target);
  request->minor_version = version[7] - '0';
  std::string_view path = target;
  // absolute-form ("http://host/path?query"): the path starts after the authority, and is "/"
  // when the authority is followed by the query or nothing.
  bool root = false;
  if (StartsWithIgnoreCase(path, "http://") || StartsWithIgnoreCase(path, "https://")) {
    const size_t end = path.find_first_of("/?#", path.find("//") + 2);
    path = end == std::string_view::npos ? std::string_view() : path.substr(end);
    root = path.empty() || path.front() != '/';
  }
  const size_t q = path.find('?');
  request->path = root ? "/" : "";
  request->path += PercentDecode(path.substr(0, q), /*plus_is_space=*/false);
  request->query.assign(q == std::string_view::npos ? std::string_view() : path.substr(q + 1));
  request->headers.clear();

  while (at != std::string_view::npos && at + 1 < head.size()) {
    const size_t next = head.find('\n', at + 1);
    const std::string_view field = StripCr(head.substr(at + 1, next - at - 1));
    at = next;
    if (field.empty()) {
      break;  // the empty line that ends the head
    }
    if (field.front() == ' ' || field.front() == '\t') {
      return 400;  // obsolete line folding
    }
    const size_t colon = field.find(':');
    if (colon == std::string_view::npos || !IsToken(field.substr(0, colon))) {
      return 400;
    }
    const std::string_view value = TrimBlanks(field.substr(colon + 1));
    for (char c : value) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && u != '\t') || u == 0x7f) {
        return 400;
      }
    }
    request->headers.push_back(Header{std::string(field.substr(0, colon)), std::string(value)});
  }
  return 0;
}

bool ServeConnection(Stream& stream, const Handler& handler, const ServerOptions& options,
                     absl::Duration tick, const std::atomic<bool>& stopping, ConnectionState* state,
                     const SteadyNow& now) {
  return Connection(stream, handler, options, tick, stopping, state, now).Serve();
}

}  // namespace internal

}  // namespace tessera::http
