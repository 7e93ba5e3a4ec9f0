// GrpcServer (daemon/rpc/grpc_server.h): the one rule for every endpoint's transport — plaintext
// only on loopback or a Unix socket unless explicitly allowed, errors that name the options the
// endpoint was configured with — and one process per port.
#include "daemon/rpc/grpc_server.h"

#include <string>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;

GrpcServer::Options Endpoint(const std::string& address) {
  GrpcServer::Options o;
  o.what = "test";
  o.address = address;
  return o;
}

TEST_CASE("grpc server: plaintext off loopback is refused unless allowed, naming the options",
          "[rpc]") {
  SECTION("the coordinator's flags") {
    auto refused = GrpcServer::Start(Endpoint("0.0.0.0:0"), {});
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(refused.status().message(), Contains("--listen 0.0.0.0:0") &&
                                               Contains("--tls-cert") &&
                                               Contains("--allow-plaintext"));
  }
  SECTION("the daemon's admin keys") {
    GrpcServer::Options admin = Endpoint("0.0.0.0:0");
    admin.option_names = AdminTlsOptions();
    auto refused = GrpcServer::Start(admin, {});
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(refused.status().message(),
               Contains("admin-tls-cert") && Contains("admin-allow-plaintext"));
  }
  SECTION("explicitly allowed") {
    GrpcServer::Options allowed = Endpoint("0.0.0.0:0");
    allowed.allow_plaintext = true;
    auto server = GrpcServer::Start(allowed, {});
    REQUIRE(server.ok());
    CHECK((*server)->bound_address().rfind("0.0.0.0:", 0) == 0);
    CHECK((*server)->bound_address() != "0.0.0.0:0");
  }
}

TEST_CASE("grpc server: loopback serves plaintext, and a second server cannot share its port",
          "[rpc]") {
  auto first = GrpcServer::Start(Endpoint("127.0.0.1:0"), {});
  REQUIRE(first.ok());
  const std::string bound = (*first)->bound_address();
  auto second = GrpcServer::Start(Endpoint(bound), {});
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(second.status().message(), Contains("cannot serve gRPC on " + bound));
  (*first)->Stop(std::chrono::milliseconds(0));
  (*first)->Stop(std::chrono::milliseconds(0));  // idempotent
}

TEST_CASE("grpc server: TLS settings are checked before binding", "[rpc]") {
  GrpcServer::Options o = Endpoint("127.0.0.1:0");
  o.tls.ca = "/nonexistent/ca.pem";  // a client CA without a certificate and key
  auto no_pair = GrpcServer::Start(o, {});
  REQUIRE_FALSE(no_pair.ok());
  CHECK_THAT(no_pair.status().message(), Contains("--tls-client-ca needs both --tls-cert"));
  o.tls = TlsFiles{"/nonexistent/cert.pem", "/nonexistent/key.pem", {}, {}};
  auto unreadable = GrpcServer::Start(o, {});
  REQUIRE_FALSE(unreadable.ok());
  CHECK_THAT(unreadable.status().message(), Contains("--tls-cert /nonexistent/cert.pem"));
}

}  // namespace
}  // namespace ckpt
