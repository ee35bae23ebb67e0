#include "tessera/http/server.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "fmt/core.h"
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <zlib.h>

#include "tessera/base/logging.h"
#include "tessera/base/mutex.h"
#include "tessera/base/status_macros.h"
#include "tessera/http/server_internal.h"

namespace tessera::http {
namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(a[i])) !=
        absl::ascii_tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

bool StartsWithIgnoreCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && EqualsIgnoreCase(s.substr(0, prefix.size()), prefix);
}

std::string_view TrimBlanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

// Whether an Accept-Encoding value ("gzip, br", "deflate, gzip;q=0.5") accepts gzip: it lists
// gzip (or "*") with a weight other than zero.
bool AcceptsGzip(std::string_view value) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view item = value.substr(0, comma);
    const size_t semi = item.find(';');
    const std::string_view coding = TrimBlanks(item.substr(0, semi));
    if (EqualsIgnoreCase(coding, "gzip") || coding == "*") {
      std::string_view q = semi == std::string_view::npos ? "" : TrimBlanks(item.substr(semi + 1));
      const bool zero = StartsWithIgnoreCase(q, "q=") &&
                        q.substr(2).find_first_not_of("0.") == std::string_view::npos;
      return !zero;
    }
    if (comma == std::string_view::npos) {
      break;
    }
    value.remove_prefix(comma + 1);
  }
  return false;
}

// Whether the comma-separated list `value` holds `token` (case-insensitive).
bool HasToken(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    if (EqualsIgnoreCase(TrimBlanks(value.substr(0, comma)), token)) {
      return true;
    }
    if (comma == std::string_view::npos) {
      break;
    }
    value.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

bool IsLoopbackIp(std::string_view ip) {
  const std::string text(ip);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
      return v6.s6_addr[12] == 127;
    }
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 304:
      return "Not Modified";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 411:
      return "Length Required";
    case 412:
      return "Precondition Failed";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

bool GzipIfAccepted(const Request& request, Response* response, size_t min_bytes) {
  if (response->stream != nullptr || response->body.size() < min_bytes || response->body.empty()) {
    return false;
  }
  bool accepted = false;
  for (const Header& h : request.headers) {
    if (EqualsIgnoreCase(h.name, "Accept-Encoding") && AcceptsGzip(h.value)) {
      accepted = true;
    }
  }
  for (const Header& h : response->headers) {
    if (EqualsIgnoreCase(h.name, "Content-Encoding")) {
      return false;
    }
  }
  if (!accepted) {
    return false;
  }
  z_stream z{};
  // 15 + 16: a gzip wrapper around the deflate stream.
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return false;
  }
  const std::string& in = response->body;
  std::string out(deflateBound(&z, in.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) {
    return false;
  }
  response->body = std::move(out);
  response->headers.push_back({"Content-Encoding", "gzip"});
  response->headers.push_back({"Vary", "Accept-Encoding"});
  return true;
}

std::string_view Request::Get(std::string_view name) const {
  for (const Header& h : headers) {
    if (EqualsIgnoreCase(h.name, name)) {
      return h.value;
    }
  }
  return {};
}

bool Request::Has(std::string_view name) const {
  for (const Header& h : headers) {
    if (EqualsIgnoreCase(h.name, name)) {
      return true;
    }
  }
  return false;
}

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

// Calls fn(raw name, raw value, has '=') for each parameter of `query`; stops when fn returns
// true.
template <typename Fn>
void ForEachParam(std::string_view query, Fn fn) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view param = query.substr(0, amp);
    const size_t eq = param.find('=');
    if (!param.empty() &&
        fn(param.substr(0, eq),
           eq == std::string_view::npos ? std::string_view() : param.substr(eq + 1))) {
      return;
    }
    if (amp == std::string_view::npos) {
      return;
    }
    query.remove_prefix(amp + 1);
  }
}

}  // namespace

std::string PercentDecode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%' && i + 2 < text.size()) {
      const int hi = HexValue(text[i + 1]);
      const int lo = HexValue(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(plus_is_space && c == '+' ? ' ' : c);
  }
  return out;
}

std::string Request::Param(std::string_view name) const {
  std::string value;
  ForEachParam(query, [&](std::string_view k, std::string_view v) {
    if (PercentDecode(k, true) != name) {
      return false;
    }
    value = PercentDecode(v, true);
    return true;
  });
  return value;
}

bool Request::HasParam(std::string_view name) const {
  bool found = false;
  ForEachParam(query, [&](std::string_view k, std::string_view) {
    found = PercentDecode(k, true) == name;
    return found;
  });
  return found;
}

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

namespace {

using internal::Stream;

// The IP address of `fd`'s peer as text, an IPv4-mapped IPv6 address as IPv4; "" when unknown.
std::string PeerIp(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return "";
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&addr);
    return inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text)) != nullptr ? text : "";
  }
  if (addr.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
      return inet_ntop(AF_INET, &v6->sin6_addr.s6_addr[12], text, sizeof(text)) != nullptr ? text
                                                                                           : "";
    }
    return inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text)) != nullptr ? text : "";
  }
  return "";
}

// Whether the peer of `fd` has closed or reset the connection, without waiting.
bool SocketPeerGone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

class SocketStream : public Stream {
 public:
  explicit SocketStream(int fd) : fd_(fd) {}

  bool PeerGone() override { return SocketPeerGone(fd_); }

  long Read(char* buf, size_t n) override {
    while (true) {
      const ssize_t r = recv(fd_, buf, n, 0);
      if (r >= 0) {
        return static_cast<long>(r);
      }
      if (errno == EINTR) {
        continue;
      }
      return errno == EAGAIN || errno == EWOULDBLOCK ? kTimedOut : kFailed;
    }
  }

  bool Write(std::string_view a, std::string_view b) override {
    iovec iov[2] = {{const_cast<char*>(a.data()), a.size()},
                    {const_cast<char*>(b.data()), b.size()}};
    iovec* v = iov;
    int count = b.empty() ? 1 : 2;
    while (count > 0) {
      msghdr msg{};
      msg.msg_iov = v;
      msg.msg_iovlen = static_cast<size_t>(count);
      const ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        return false;  // includes EAGAIN: the write timeout passed
      }
      size_t left = static_cast<size_t>(n);
      while (count > 0 && left >= v->iov_len) {
        left -= v->iov_len;
        ++v;
        --count;
      }
      if (count > 0) {
        v->iov_base = static_cast<char*>(v->iov_base) + left;
        v->iov_len -= left;
      }
    }
    return true;
  }

 private:
  const int fd_;
};

// Waits until `fd` is readable (POLLIN) or writable (POLLOUT) or `deadline` passes; false on
// timeout or error.
bool WaitFor(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return false;
    }
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (r > 0) {
      return true;
    }
    if (r < 0 && errno != EINTR) {
      return false;
    }
  }
}

std::chrono::steady_clock::time_point DeadlineAfter(absl::Duration d) {
  return d <= absl::ZeroDuration()
             ? std::chrono::steady_clock::time_point::max()
             : std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(d);
}

// TLS over a non-blocking socket: a read returns kTimedOut after one tick without a whole
// record (so a record trickled in byte by byte cannot hold it longer); a write waits at most
// the write timeout for buffer space.
class TlsStream : public Stream {
 public:
  TlsStream(SSL* ssl, absl::Duration tick, absl::Duration write_timeout)
      : ssl_(ssl), tick_(tick), write_timeout_(write_timeout) {}

  bool PeerGone() override { return SocketPeerGone(SSL_get_fd(ssl_)); }

  long Read(char* buf, size_t n) override {
    std::chrono::steady_clock::time_point deadline{};
    bool have_deadline = false;
    while (true) {
      const int r = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 30)));
      if (r > 0) {
        return r;
      }
      const int err = SSL_get_error(ssl_, r);
      ERR_clear_error();
      if (err == SSL_ERROR_ZERO_RETURN) {
        return kClosed;
      }
      if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
        return kFailed;
      }
      if (!have_deadline) {
        deadline = DeadlineAfter(tick_);
        have_deadline = true;
      }
      if (!WaitFor(SSL_get_fd(ssl_), err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) {
        return kTimedOut;
      }
    }
  }

  bool Write(std::string_view a, std::string_view b) override { return WriteOne(a) && WriteOne(b); }

 private:
  bool WriteOne(std::string_view data) {
    if (data.empty()) {
      return true;
    }
    const auto deadline = DeadlineAfter(write_timeout_);
    while (true) {
      const int r = SSL_write(ssl_, data.data(), static_cast<int>(data.size()));
      if (r > 0) {
        return static_cast<size_t>(r) == data.size();
      }
      const int err = SSL_get_error(ssl_, r);
      ERR_clear_error();
      if ((err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) ||
          !WaitFor(SSL_get_fd(ssl_), err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) {
        return false;
      }
    }
  }

  SSL* const ssl_;
  const absl::Duration tick_;
  const absl::Duration write_timeout_;
};

void SetNonBlocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) {
    fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
  }
}

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What the server answers, without waiting, to a connection over the cap.
constexpr std::string_view kOverCapacity =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    "Content-Length: 29\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
    "too many connections; retry\r\n";

timeval SocketTimeout(absl::Duration d) {
  if (d <= absl::ZeroDuration()) {
    return timeval{0, 0};
  }
  const int64_t us = std::max<int64_t>(1000, absl::ToInt64Microseconds(d));
  return timeval{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
}

}  // namespace

class Server::Impl {
 public:
  Impl(Handler handler, ServerOptions options)
      : handler_(std::move(handler)), options_(std::move(options)) {
    options_.threads = std::max<size_t>(1, options_.threads);
    options_.max_threads = std::max(options_.threads, options_.max_threads);
    // The read tick: the shortest timeout, at most a second (so that deadlines hold to within
    // a second; an idle connection's worker then wakes once a second).
    tick_ = absl::Seconds(1);
    for (absl::Duration d : {options_.read_timeout, options_.keep_alive_timeout,
                             options_.header_timeout, options_.body_timeout}) {
      if (d > absl::ZeroDuration()) {
        tick_ = std::min(tick_, d);
      }
    }
  }

  ~Impl() { Stop(); }

  absl::Status Start(const std::string& host, int port) {
    if (started_) {
      return absl::FailedPreconditionError("http::Server::Start called twice");
    }
    started_ = true;
    const std::vector<std::string> hosts =
        host.empty() ? std::vector<std::string>{"::", "0.0.0.0"} : std::vector<std::string>{host};
    int err = 0;
    for (const std::string& h : hosts) {
      err = Bind(h, port);
      if (err == 0 || err == EADDRINUSE) {
        break;  // after EADDRINUSE, IPv4 would bind the same port on fewer interfaces
      }
    }
    if (listen_fd_ < 0) {
      return absl::UnavailableError(err > 0 ? ErrnoText(err) : gai_strerror(err));
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    {
      MutexLock l(&mu_);
      for (size_t i = 0; i < options_.threads; ++i) {
        AddWorker();
      }
    }
    acceptor_ = std::thread([this] { Accept(); });
    return absl::OkStatus();
  }

  void Stop() {
    {
      MutexLock l(&mu_);
      if (stopping_.load()) {
        return;
      }
      stopping_.store(true);
      for (auto& [fd, conn] : active_) {
        shutdown(fd, SHUT_RD);  // wakes a worker waiting for a request; replies still go out
      }
      cv_.SignalAll();
    }
    if (listen_fd_ >= 0) {
      shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    }
    if (acceptor_.joinable()) {
      acceptor_.join();
    }
    std::list<std::thread> workers;
    {
      MutexLock l(&mu_);  // only the acceptor adds workers, and it has ended
      workers.swap(workers_);
      retired_.clear();
    }
    for (std::thread& t : workers) {
      t.join();
    }
    MutexLock l(&mu_);
    for (const Queued& q : queue_) {
      close(q.fd);
    }
    queue_.clear();
    if (listen_fd_ >= 0) {
      close(listen_fd_);
      listen_fd_ = -1;
    }
  }

  int port() const { return port_; }

 private:
  // An open connection being served.
  struct Active {
    int fd = -1;
    internal::ConnectionState state;
    bool shed = false;  // guarded by mu_
  };
  struct Queued {
    int fd;
    int64_t accepted;  // steady-clock nanoseconds
  };

  // Binds and listens on host:port; 0 on success, else an errno (> 0) or a getaddrinfo error
  // (< 0).
  int Bind(const std::string& host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(port);
    if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
      return rc == EAI_SYSTEM ? errno : (rc < 0 ? rc : -rc);  // glibc's EAI_* are negative
    }
    int err = EADDRNOTAVAIL;
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        err = errno;
        continue;
      }
      // SO_REUSEADDR only (as Go sets; not SO_REUSEPORT, which would let a second server bind
      // a port in use), and dual-stack on an IPv6 socket.
      int yes = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      if (ai->ai_family == AF_INET6) {
        int no = 0;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
      }
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
        err = errno;
        close(fd);
        if (err == EADDRINUSE) {
          break;
        }
        continue;
      }
      listen_fd_ = fd;
      err = 0;
      break;
    }
    freeaddrinfo(found);
    return err;
  }

  void Accept() {
    pthread_setname_np(pthread_self(), (options_.thread_name.substr(0, 11) + "-acc").c_str());
    while (true) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (stopping_.load()) {
          return;
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          TESSERA_LOG(kWarning, "http: accept: {}; retrying", ErrnoText(errno));
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        continue;  // EINTR, ECONNABORTED, ...
      }
      int yes = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));  // else replies wait for ACKs
      const timeval rcv = SocketTimeout(tick_);
      const timeval snd = SocketTimeout(options_.write_timeout);
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof(rcv));
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof(snd));
      std::vector<std::thread> done;
      {
        MutexLock l(&mu_);
        if (stopping_.load()) {
          close(fd);
          return;
        }
        done = TakeRetired();
        const size_t capacity = options_.max_threads;
        const size_t cap = options_.max_connections;
        size_t open = queue_.size() + active_.size() - shed_pending_;
        // Shed idle connections, then stalled ones, while the new one would find no worker or
        // pass the cap.
        while ((open >= capacity || (cap > 0 && open >= cap)) &&
               (ShedOneIdle() || ShedOneStalled())) {
          --open;
        }
        if (cap > 0 && open >= cap) {
          TESSERA_VLOG(1, "http: {} connections open and none idle; refusing one with 503", open);
          send(fd, kOverCapacity.data(), kOverCapacity.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
          close(fd);
        } else {
          queue_.push_back(Queued{fd, SteadyNanos()});
          if (queue_.size() > idle_ && workers_.size() < options_.max_threads) {
            AddWorker();  // every waiting connection needs a worker
          } else {
            cv_.Signal();
          }
        }
      }
      for (std::thread& t : done) {
        t.join();
      }
    }
  }

  // Closes (shuts down, for its worker to close) the connection that has waited longest for a
  // request; false when none is idle. A connection whose next bytes have arrived but not yet
  // been read (its worker has not woken, or has not started) is not idle.
  bool ShedOneIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::flat_hash_set<const Active*> busy;
    while (true) {
      Active* oldest = nullptr;
      int64_t oldest_since = 0;
      for (auto& [fd, conn] : active_) {
        const int64_t since = conn->state.idle_since.load(std::memory_order_relaxed);
        if (since > 0 && (oldest == nullptr || since < oldest_since) && !conn->shed &&
            !busy.contains(conn)) {
          oldest = conn;
          oldest_since = since;
        }
      }
      if (oldest == nullptr) {
        return false;
      }
      int pending = 0;
      if (ioctl(oldest->fd, FIONREAD, &pending) == 0 && pending > 0) {
        busy.insert(oldest);
        continue;
      }
      int64_t expected = oldest_since;
      if (!oldest->state.idle_since.compare_exchange_strong(expected, -1)) {
        busy.insert(oldest);  // it has just begun a request
        continue;
      }
      Shed(oldest);
      return true;
    }
  }

  // Closes the connection whose request (head or body), begun at least stalled_request_after
  // ago, has been arriving longest; false when there is none. A request read whole (being
  // handled or answered) is not stalled.
  bool ShedOneStalled() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t cutoff = SteadyNanos() - absl::ToInt64Nanoseconds(options_.stalled_request_after);
    absl::flat_hash_set<const Active*> busy;
    while (true) {
      Active* oldest = nullptr;
      int64_t oldest_since = 0;
      for (auto& [fd, conn] : active_) {
        const int64_t since = conn->state.request_since.load(std::memory_order_relaxed);
        if (since > 0 && since <= cutoff && (oldest == nullptr || since < oldest_since) &&
            !conn->shed && !busy.contains(conn)) {
          oldest = conn;
          oldest_since = since;
        }
      }
      if (oldest == nullptr) {
        return false;
      }
      int64_t expected = oldest_since;
      if (!oldest->state.request_since.compare_exchange_strong(expected, -1)) {
        busy.insert(oldest);  // its request has just arrived whole
        continue;
      }
      Shed(oldest);
      TESSERA_VLOG(2, "http: closed a connection whose request stalled for {} ms",
                   (SteadyNanos() - oldest_since) / 1000000);
      return true;
    }
  }

  // Only the read side: its worker's next read ends the connection, and a request it read
  // just before (the moment between its read and marking itself busy) is still answered.
  void Shed(Active* oldest) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    shutdown(oldest->fd, SHUT_RD);
    ++shed_pending_;
    oldest->shed = true;
    TESSERA_VLOG(2, "http: closed a connection to make room for a new one");
  }

  void AddWorker() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    workers_.emplace_back();
    auto it = std::prev(workers_.end());
    *it = std::thread([this, it] { Work(it); });
  }

  // Threads of retired workers, to be joined without the lock.
  std::vector<std::thread> TakeRetired() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::thread> done;
    for (auto it : retired_) {
      done.push_back(std::move(*it));
      workers_.erase(it);
    }
    retired_.clear();
    return done;
  }

  void Work(std::list<std::thread>::iterator self) {
    pthread_setname_np(pthread_self(), options_.thread_name.substr(0, 15).c_str());
    // A write to a connection the peer has reset raises SIGPIPE in the writing thread; blocked
    // here, the write fails with EPIPE instead (OpenSSL writes without MSG_NOSIGNAL).
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    const auto idle_limit = absl::ToChronoNanoseconds(options_.idle_worker_timeout);
    while (true) {
      Active conn;
      {
        MutexLock l(&mu_);
        ++idle_;
        auto idle_until = std::chrono::steady_clock::now() + idle_limit;
        while (queue_.empty() && !stopping_.load()) {
          if (workers_.size() - retired_.size() <= options_.threads ||
              options_.idle_worker_timeout <= absl::ZeroDuration()) {
            cv_.Wait(&mu_);
            idle_until = std::chrono::steady_clock::now() + idle_limit;
          } else if (!cv_.WaitFor(&mu_, idle_until - std::chrono::steady_clock::now()) &&
                     queue_.empty() && std::chrono::steady_clock::now() >= idle_until) {
            --idle_;
            retired_.push_back(self);  // the acceptor or Stop joins this thread
            return;
          }
        }
        --idle_;
        if (stopping_.load()) {
          return;
        }
        conn.fd = queue_.front().fd;
        conn.state.idle_since.store(queue_.front().accepted, std::memory_order_relaxed);
        queue_.pop_front();
        active_.emplace(conn.fd, &conn);
      }
      Drain(conn.fd, Serve(conn));
      {
        MutexLock l(&mu_);
        active_.erase(conn.fd);
        if (conn.shed) {
          --shed_pending_;
        }
      }
      close(conn.fd);
      // Drop a SIGPIPE left pending by a failed write, so it never reaches another handler.
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe, nullptr, &zero) == SIGPIPE) {
      }
    }
  }

  // Closing a socket with unread input resets the connection, and a reset can destroy the reply
  // before the client reads it (e.g. a 413 while the client still sends its body). So after a
  // refusal, or when input is waiting, the write side is shut first and what the client still
  // sends is read and dropped, for at most about a second and 8 MiB, or until it closes. An
  // idle connection (a keep-alive timeout, the client's close) is closed at once: a client that
  // sends a request just then gets a reset, and its retry, at once.
  static void Drain(int fd, bool refused) {
    int pending = 0;
    if (!refused && (ioctl(fd, FIONREAD, &pending) != 0 || pending == 0)) {
      return;
    }
    shutdown(fd, SHUT_WR);
    const timeval wait{0, 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    char sink[16384];
    size_t total = 0;
    while (total < (8u << 20) && std::chrono::steady_clock::now() < deadline) {
      const ssize_t n = recv(fd, sink, sizeof(sink), 0);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
        return;
      }
      total += n > 0 ? static_cast<size_t>(n) : 0;
    }
  }

  // Serves the connection; true when it ended with a refusal (see Drain).
  bool Serve(Active& conn) {
    const int fd = conn.fd;
    // Every request of the connection carries its peer's address.
    const Handler handler = [this, ip = PeerIp(fd)](Request& request, Response* response) {
      request.remote_ip = ip;
      handler_(request, response);
    };
    if (options_.tls == nullptr) {
      SocketStream stream(fd);
      return internal::ServeConnection(stream, handler, options_, tick_, stopping_, &conn.state);
    }
    SSL* ssl = SSL_new(options_.tls);
    if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
      ERR_clear_error();
      SSL_free(ssl);
      return false;
    }
    SetNonBlocking(fd, true);
    // The handshake has an overall deadline from the connection's start.
    auto deadline = std::chrono::steady_clock::time_point::max();
    if (options_.tls_handshake_timeout > absl::ZeroDuration()) {
      deadline = std::chrono::steady_clock::time_point(
                     std::chrono::nanoseconds(conn.state.idle_since.load())) +
                 absl::ToChronoNanoseconds(options_.tls_handshake_timeout);
    }
    while (true) {
      const int r = SSL_accept(ssl);
      if (r == 1) {
        break;
      }
      const int err = SSL_get_error(ssl, r);
      ERR_clear_error();
      if ((err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) || stopping_.load() ||
          !WaitFor(fd, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) {
        TESSERA_VLOG(2, "http: TLS handshake failed or passed its deadline");
        SSL_free(ssl);
        SetNonBlocking(fd, false);
        return false;
      }
    }
    bool refused = false;
    {
      TlsStream stream(ssl, tick_, options_.write_timeout);
      refused = internal::ServeConnection(stream, handler, options_, tick_, stopping_, &conn.state);
    }
    SSL_shutdown(ssl);  // close_notify; the peer's answer is not awaited
    ERR_clear_error();
    SSL_free(ssl);
    SetNonBlocking(fd, false);  // Drain reads with a receive timeout
    return refused;
  }

  const Handler handler_;
  ServerOptions options_;
  absl::Duration tick_;
  bool started_ = false;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::list<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  // Workers that ended (idle too long), to be joined and erased from workers_.
  std::vector<std::list<std::thread>::iterator> retired_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;          // workers waiting for a connection
  size_t shed_pending_ ABSL_GUARDED_BY(mu_) = 0;  // shed, not yet closed by their worker
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  CondVar cv_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, Active*> active_ ABSL_GUARDED_BY(mu_);
};

Server::Server(Handler handler, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(handler), std::move(options))) {}

Server::~Server() { impl_->Stop(); }

absl::Status Server::Start(const std::string& host, int port) { return impl_->Start(host, port); }
void Server::Stop() { impl_->Stop(); }
int Server::port() const { return impl_->port(); }

}  // namespace tessera::http
