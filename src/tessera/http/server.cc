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
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>

#include "tessera/base/logging.h"
#include "tessera/base/mutex.h"
#include "tessera/base/status_macros.h"
#include "tessera/http/server_internal.h"

namespace tessera::http {

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

  size_t IdleConnections() {
    MutexLock l(&mu_);
    return static_cast<size_t>(std::count_if(active_.begin(), active_.end(), [](const auto& e) {
      return e.second->state.idle_since.load(std::memory_order_relaxed) > 0 && !e.second->shed;
    }));
  }

  size_t StalledRequests() {
    MutexLock l(&mu_);
    return static_cast<size_t>(std::count_if(active_.begin(), active_.end(), [](const auto& e) {
      return e.second->state.request_since.load(std::memory_order_relaxed) > 0 && !e.second->shed;
    }));
  }

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
  // Not a WorkQueue: this pool grows to max_threads and retires idle workers; WorkQueue's is fixed.
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, Active*> active_ ABSL_GUARDED_BY(mu_);
};

Server::Server(Handler handler, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(handler), std::move(options))) {}

Server::~Server() { impl_->Stop(); }

absl::Status Server::Start(const std::string& host, int port) { return impl_->Start(host, port); }
void Server::Stop() { impl_->Stop(); }
int Server::port() const { return impl_->port(); }

size_t internal::ServerPeer::IdleConnections(Server& server) {
  return server.impl_->IdleConnections();
}

size_t internal::ServerPeer::StalledRequests(Server& server) {
  return server.impl_->StalledRequests();
}

}  // namespace tessera::http
