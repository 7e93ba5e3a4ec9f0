// Helpers for tests that speak ckptd.v1.Admin through the generated stubs (to a daemon or to
// ckpt-coordinator). Include after daemon_harness.h (it configures Catch).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "ckptd/v1/admin.grpc.pb.h"

namespace ckpt::itest {

// A client context that gives up after 30 s, so a hung server fails the test instead of hanging.
inline std::unique_ptr<grpc::ClientContext> Deadline() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return ctx;
}

// GetStatus, which must succeed.
inline ckptd::v1::GetStatusResponse GetStatus(ckptd::v1::Admin::Stub& admin) {
  ckptd::v1::GetStatusResponse s;
  auto ctx = Deadline();
  const grpc::Status st = admin.GetStatus(ctx.get(), {}, &s);
  INFO("GetStatus: " << st.error_message());
  REQUIRE(st.ok());
  return s;
}

// The value of `key` in the status' effective configuration, or "" (e.g. "metrics-bound",
// "peer-bound": the addresses a server bound).
inline std::string ConfigValue(const ckptd::v1::GetStatusResponse& s, const std::string& key) {
  for (const auto& e : s.config()) {
    if (e.key() == key) return e.value();
  }
  return "";
}

}  // namespace ckpt::itest
