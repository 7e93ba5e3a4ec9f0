// PeerServer and PeerClient over real loopback sockets (daemon/peer/): bit-exact fetches in
// many chunks, PUT into the holder's bounded store and back, refusals that keep the connection
// usable, and a server that survives malformed, oversized and hostile frames while serving
// others. Deadlines are short here (hundreds of ms) so that stalls are cheap to test.
#include "daemon/peer/peer_server.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <vector>

#include "common/checksum.h"
#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_store.h"
#include "tests/test_util.h"
#include "tests/unit/daemon/peer/peer_test_util.h"

namespace ckpt::peer {
namespace {

using namespace std::chrono_literals;
using testing::FakePeer;
using testing::MemorySource;
using testing::Pattern;
using testing::RawPeer;

const std::string kFile = "rank-00000.data";

class CountingObserver final : public PeerObserver {
 public:
  void OnPeerBytes(Direction d, uint64_t bytes) override {
    (d == Direction::kSent ? sent : received) += bytes;
  }
  void OnPeerFailure(std::string_view reason) override {
    MutexLock lock(mu);
    failures.emplace_back(reason);
  }
  std::vector<std::string> Failures() {
    MutexLock lock(mu);
    return failures;
  }
  std::atomic<uint64_t> sent{0}, received{0};
  Mutex mu;
  std::vector<std::string> failures GUARDED_BY(mu);
};

// A server on 127.0.0.1:0 over an in-memory source and a store of `budget` bytes.
struct Served {
  explicit Served(uint64_t budget = 1 << 20, PeerServer::Config config = {})
      : store(budget), server(WithListen(config), &source, &store, nullptr, &observer) {
    REQUIRE_OK(server.Start());
  }
  static PeerServer::Config WithListen(PeerServer::Config c) {
    c.listen = "127.0.0.1:0";
    return c;
  }
  PeerClient::Config ClientConfig() const {
    PeerClient::Config c;
    c.address = server.bound_address();
    c.timeout = 5s;
    return c;
  }
  // The store first, then the in-memory files: what DaemonPeerSource does with its store.
  class StoreThenFiles final : public PeerSource {
   public:
    StoreThenFiles(PeerStore* s, MemorySource* f) : store_(s), files_(f) {}
    Status Read(const Region& r, std::byte* out) override {
      return store_->Read(r, out) ? Status::Ok() : files_->Read(r, out);
    }

   private:
    PeerStore* store_;
    MemorySource* files_;
  };
  MemorySource files;
  PeerStore store;
  StoreThenFiles source{&store, &files};
  CountingObserver observer;
  PeerServer server;
};

std::string Fetched(PeerClient& client, const Region& r, Status* status) {
  std::string out(r.length, '\0');
  *status = client.Fetch(r, reinterpret_cast<std::byte*>(out.data()));
  return out;
}

TEST_CASE("peer data plane: a fetch in many chunks is bit-exact", "[peer]") {
  Served s;
  const std::string file = Pattern((1 << 20) + 12345, 7);
  s.files.Add("job", 5, kFile, file);
  PeerClient::Config config = s.ClientConfig();
  config.chunk_bytes = 64 << 10;
  CountingObserver client_observer;
  PeerClient client(config, nullptr, &client_observer);
  Status st;
  CHECK(Fetched(client, {"job", 5, kFile, 0, file.size()}, &st) == file);
  REQUIRE_OK(st);
  // An unaligned piece in the middle.
  CHECK(Fetched(client, {"job", 5, kFile, 4097, 300000}, &st) == file.substr(4097, 300000));
  REQUIRE_OK(st);
  CHECK(client_observer.received == file.size() + 300000);
  s.server.Stop();  // the server counts a reply once its write completed: let every one finish
  CHECK(s.observer.sent == file.size() + 300000);
}

TEST_CASE("peer data plane: a refused fetch names the region and the connection serves on",
          "[peer]") {
  Served s;
  s.files.Add("job", 1, kFile, Pattern(1000, 1));
  PeerClient client(s.ClientConfig());
  Status st;
  Fetched(client, {"job", 2, kFile, 0, 10}, &st);
  CHECK(st.code() == StatusCode::kNotFound);
  CHECK_THAT(st.message(), Catch::Contains("job 'job' step 2"));
  Fetched(client, {"job", 1, kFile, 900, 200}, &st);
  CHECK(st.code() == StatusCode::kOutOfRange);
  CHECK(Fetched(client, {"job", 1, kFile, 0, 1000}, &st) == Pattern(1000, 1));
  CHECK_OK(st);
  CHECK(s.server.connections() == 1);  // one connection did all three
}

TEST_CASE("peer data plane: PUT, FETCH back from the holder, DROP", "[peer]") {
  Served s(16 << 20);
  PeerClient client(s.ClientConfig());
  const std::string region = Pattern(3 << 20, 9);
  REQUIRE_OK(client.Put({"job", 4, kFile, 8 << 20, region.size()},
                        reinterpret_cast<const std::byte*>(region.data())));
  CHECK(s.store.held_bytes() == region.size());
  CHECK(s.observer.received == region.size());
  Status st;
  CHECK(Fetched(client, {"job", 4, kFile, (8 << 20) + 5, 1 << 20}, &st) ==
        region.substr(5, 1 << 20));
  REQUIRE_OK(st);
  REQUIRE_OK(client.Drop("job", 4));
  CHECK(s.store.held_bytes() == 0);
  Fetched(client, {"job", 4, kFile, 8 << 20, 10}, &st);
  CHECK(st.code() == StatusCode::kNotFound);
}

TEST_CASE("peer data plane: a full holder refuses clearly, evicts nothing, serves on", "[peer]") {
  Served s(4 << 20);
  PeerClient client(s.ClientConfig());
  const std::string a = Pattern(3 << 20, 1), b = Pattern(2 << 20, 2);
  REQUIRE_OK(
      client.Put({"job", 1, kFile, 0, a.size()}, reinterpret_cast<const std::byte*>(a.data())));
  const Status full =
      client.Put({"job", 2, kFile, 0, b.size()}, reinterpret_cast<const std::byte*>(b.data()));
  REQUIRE(full.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(full.message(), Catch::Contains("peer pool full"));
  CHECK_THAT(full.message(), Catch::Contains("job 'job' step 2"));
  // Step 1 is intact, and the same connection (its refused data drained) still works.
  Status st;
  CHECK(Fetched(client, {"job", 1, kFile, 0, a.size()}, &st) == a);
  REQUIRE_OK(st);
  CHECK(s.store.used() == a.size());
  CHECK(s.server.connections() == 1);
  const auto failures = s.observer.Failures();
  CHECK(std::count(failures.begin(), failures.end(), "full") == 1);
}

TEST_CASE("peer data plane: a holder without a peer pool refuses PUT and DROP", "[peer]") {
  MemorySource files;
  PeerServer server({"127.0.0.1:0"}, &files, nullptr, nullptr, nullptr);
  REQUIRE_OK(server.Start());
  PeerClient client({server.bound_address(), 5s});
  const std::string a = Pattern(100, 1);
  const Status put =
      client.Put({"job", 1, kFile, 0, a.size()}, reinterpret_cast<const std::byte*>(a.data()));
  CHECK(put.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(put.message(), Catch::Contains("--peer-pool 0"));
  CHECK(client.Drop("job", 1).code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("peer data plane: a corrupted chunk is rejected, never delivered as good", "[peer]") {
  const std::string data = Pattern(4096, 3);
  FakePeer fake([&](int fd) {
    const uint32_t id = testing::ReadRequest(fd);
    std::string frame = EncodeFrame(FrameType::kReply, id, EncodeReply(Status::Ok()), data);
    frame[frame.size() - 100] ^= 0x01;  // one bit flipped after the checksum was taken
    testing::SendAll(fd, frame);
    char c;
    ::recv(fd, &c, 1, 0);  // until the client hangs up
  });
  CountingObserver observer;
  PeerClient client({fake.address(), 5s}, nullptr, &observer);
  Status st;
  Fetched(client, {"job", 1, kFile, 0, data.size()}, &st);
  CHECK(st.code() == StatusCode::kDataLoss);
  CHECK_THAT(st.message(), Catch::Contains("checksum mismatch"));
  CHECK(observer.Failures() == std::vector<std::string>{"checksum"});
}

TEST_CASE("peer data plane: a PUT whose bytes do not match its checksum is not stored", "[peer]") {
  Served s;
  RawPeer raw(s.server.port());
  const std::string data = Pattern(10000, 4);
  std::string frame =
      EncodeFrame(FrameType::kPut, 7, EncodeRegion({"job", 1, kFile, 0, data.size()}), data);
  frame.back() ^= 0x40;
  raw.Send(frame);
  auto [status, bytes] = raw.ReadReply();
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK_THAT(status.message(), Catch::Contains("checksum mismatch"));
  CHECK(s.store.used() == 0);
  CHECK_FALSE(s.store.Holds({"job", 1, kFile, 0, 1}));
  // The same connection goes on: a good PUT is stored.
  raw.Send(EncodeFrame(FrameType::kPut, 8, EncodeRegion({"job", 1, kFile, 0, data.size()}), data));
  CHECK_OK(raw.ReadReply().first);
  CHECK(s.store.Holds({"job", 1, kFile, 0, data.size()}));
}

TEST_CASE("peer data plane: hostile names get an error reply and reach nothing", "[peer]") {
  Served s;
  s.files.Add("job", 1, kFile, Pattern(100, 1));
  RawPeer raw(s.server.port());
  for (const auto& [job, file] :
       std::vector<std::pair<std::string, std::string>>{{"../../etc", kFile},
                                                        {"job", "../../../etc/passwd"},
                                                        {"job", "MANIFEST"},
                                                        {"job", "/abs.data"},
                                                        {"", kFile},
                                                        {"job", std::string("a\0b.data", 8)}}) {
    INFO("job '" << job << "' file '" << file << "'");
    raw.Send(EncodeFrame(FrameType::kFetch, 1, EncodeRegion({job, 1, file, 0, 10})));
    auto [status, bytes] = raw.ReadReply();
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK(bytes.empty());
    // A PUT under such a name is refused too, its data drained.
    raw.Send(EncodeFrame(FrameType::kPut, 2, EncodeRegion({job, 1, file, 0, 3}), "abc"));
    CHECK(raw.ReadReply().first.code() == StatusCode::kInvalidArgument);
  }
  CHECK(s.store.used() == 0);
  // The connection still serves a good request.
  raw.Send(EncodeFrame(FrameType::kFetch, 3, EncodeRegion({"job", 1, kFile, 0, 100})));
  auto [status, bytes] = raw.ReadReply();
  CHECK_OK(status);
  CHECK(bytes == Pattern(100, 1));
}

TEST_CASE("peer data plane: malformed and oversized frames close that connection only", "[peer]") {
  Served s;
  s.files.Add("job", 1, kFile, Pattern(5000, 2));
  PeerClient good(s.ClientConfig());
  Status st;
  REQUIRE(Fetched(good, {"job", 1, kFile, 0, 5000}, &st) == Pattern(5000, 2));

  std::byte header[kHeaderBytes];
  FrameHeader h;
  std::string bad;
  SECTION("not the protocol at all") { bad = "GET / HTTP/1.1\r\nHost: peer.example\r\n\r\n"; }
  SECTION("a data length over the limit") {
    h.type = FrameType::kPut;
    h.data_length = kMaxChunkBytes + 1;
    EncodeHeader(h, header);
    bad.assign(reinterpret_cast<const char*>(header), kHeaderBytes);
  }
  SECTION("metadata over the limit") {
    h.type = FrameType::kFetch;
    h.meta_length = 1u << 30;
    EncodeHeader(h, header);
    bad.assign(reinterpret_cast<const char*>(header), kHeaderBytes);
  }
  SECTION("metadata that does not decode") {
    bad = EncodeFrame(FrameType::kFetch, 1, "\x05\x00short");
  }
  SECTION("a PUT whose region and data lengths disagree") {
    bad = EncodeFrame(FrameType::kPut, 1, EncodeRegion({"job", 1, kFile, 0, 10}), "abc");
  }
  SECTION("a REPLY sent to the server") {
    bad = EncodeFrame(FrameType::kReply, 1, EncodeReply(Status::Ok()));
  }
  RawPeer raw(s.server.port());
  raw.Send(bad);
  // A best-effort error reply naming the problem, then the close.
  const std::string h2 = raw.Receive(kHeaderBytes);
  if (h2.size() == kHeaderBytes) {
    auto reply = DecodeHeader(std::span<const std::byte, kHeaderBytes>(
        reinterpret_cast<const std::byte*>(h2.data()), kHeaderBytes));
    REQUIRE_OK(reply);
    auto status = DecodeReply(raw.Receive(reply->meta_length));
    REQUIRE(status.has_value());
    CHECK(status->code() == StatusCode::kInvalidArgument);
  }
  CHECK(raw.ClosedByPeer());
  // The server keeps serving the other connection, and new ones.
  CHECK(Fetched(good, {"job", 1, kFile, 0, 5000}, &st) == Pattern(5000, 2));
  CHECK_OK(st);
  PeerClient fresh(s.ClientConfig());
  CHECK(Fetched(fresh, {"job", 1, kFile, 100, 100}, &st) == Pattern(5000, 2).substr(100, 100));
  CHECK_OK(st);
  const auto failures = s.observer.Failures();
  CHECK(std::count(failures.begin(), failures.end(), "malformed") >= 1);
}

TEST_CASE("peer data plane: a stalled peer is an error at the deadline, not a hang", "[peer]") {
  FakePeer fake([&](int fd) {
    testing::ReadRequest(fd);
    // Half a reply, then nothing until the client gave up.
    const std::string frame =
        EncodeFrame(FrameType::kReply, 1, EncodeReply(Status::Ok()), Pattern(4096, 1));
    testing::SendAll(fd, frame.substr(0, frame.size() / 2));
    char c;
    ::recv(fd, &c, 1, 0);
  });
  PeerClient client({fake.address(), 300ms});
  const auto start = std::chrono::steady_clock::now();
  Status st;
  Fetched(client, {"job", 1, kFile, 0, 4096}, &st);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(st.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(st.message(), Catch::Contains("job 'job' step 1"));
  CHECK(took >= 300ms);
  CHECK(took < 5s);  // a bound that only matters if the deadline is ignored
}

TEST_CASE("peer data plane: a peer that dies mid-transfer fails the call at once", "[peer]") {
  FakePeer fake([&](int fd) {
    testing::ReadRequest(fd);
    const std::string frame =
        EncodeFrame(FrameType::kReply, 1, EncodeReply(Status::Ok()), Pattern(1 << 20, 1));
    testing::SendAll(fd, frame.substr(0, frame.size() / 3));
    // Returning closes the connection: what the kernel does for a killed process.
  });
  PeerClient client({fake.address(), std::chrono::milliseconds(60000)});
  const auto start = std::chrono::steady_clock::now();
  Status st;
  Fetched(client, {"job", 1, kFile, 0, 1 << 20}, &st);
  CHECK(st.code() == StatusCode::kUnavailable);
  CHECK(std::chrono::steady_clock::now() - start < 30s);  // far below the 60 s deadline
}

TEST_CASE("peer data plane: nothing listening is kUnavailable", "[peer]") {
  uint16_t port = 0;
  {
    Served s;  // bind a port, then free it
    port = s.server.port();
  }
  PeerClient client({"127.0.0.1:" + std::to_string(port), 2s});
  Status st;
  Fetched(client, {"job", 1, kFile, 0, 1}, &st);
  CHECK(st.code() == StatusCode::kUnavailable);
}

TEST_CASE("peer data plane: a connection silent past its deadline is closed by the server",
          "[peer]") {
  PeerServer::Config config;
  config.idle_timeout = 200ms;
  config.frame_timeout = 200ms;
  Served s(1 << 20, config);
  RawPeer raw(s.server.port());
  raw.Send(std::string(10, '\0').substr(0, 5));  // five bytes of a header, then silence
  CHECK(raw.ClosedByPeer());
  RawPeer idle(s.server.port());
  CHECK(idle.ClosedByPeer());
  const auto failures = s.observer.Failures();
  CHECK(std::count(failures.begin(), failures.end(), "timeout") == 2);
}

}  // namespace
}  // namespace ckpt::peer
