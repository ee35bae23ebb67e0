// The request and reply vocabulary of tessera::http: header and query lookup, percent
// decoding, reason phrases, gzip of replies, and the header-value helpers the connection
// loop shares (server_internal.h).
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include <zlib.h>

#include "tessera/http/server.h"
#include "tessera/http/server_internal.h"

namespace tessera::http {
namespace internal {

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

}  // namespace internal

using internal::EqualsIgnoreCase;
using internal::HexValue;
using internal::StartsWithIgnoreCase;
using internal::TrimBlanks;

namespace {

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

}  // namespace tessera::http
