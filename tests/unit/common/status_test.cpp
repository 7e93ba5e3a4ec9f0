// Status, Result<T>, ErrnoStatus and the propagation macros (common/status.h).
#include "common/status.h"

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

TEST_CASE("a default Status is OK", "[status]") {
  Status s;
  CHECK(s.ok());
  CHECK(s.code() == StatusCode::kOk);
  CHECK(s.message().empty());
  CHECK(s.sys_errno() == 0);
  CHECK(s.ToString() == "OK");
  CHECK(Status::Ok().ok());
}

TEST_CASE("Status keeps code, message and errno, ToString starts with the code name", "[status]") {
  Status s(StatusCode::kNotFound, "job 'j' step 7: no MANIFEST", ENOENT);
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.message() == "job 'j' step 7: no MANIFEST");
  CHECK(s.sys_errno() == ENOENT);
  CHECK_THAT(s.ToString(), StartsWith("NOT_FOUND: job 'j' step 7: no MANIFEST"));
  CHECK(InvalidArgument("bad").ToString() == "INVALID_ARGUMENT: bad");
}

TEST_CASE("the helper constructors give their codes", "[status]") {
  CHECK(InvalidArgument("m").code() == StatusCode::kInvalidArgument);
  CHECK(NotFound("m").code() == StatusCode::kNotFound);
  CHECK(FailedPrecondition("m").code() == StatusCode::kFailedPrecondition);
  CHECK(Internal("m").code() == StatusCode::kInternal);
  CHECK(DataLoss("m").code() == StatusCode::kDataLoss);
  CHECK(Unavailable("m").code() == StatusCode::kUnavailable);
  CHECK(Aborted("m").code() == StatusCode::kAborted);
  CHECK(ResourceExhausted("m").code() == StatusCode::kResourceExhausted);
  CHECK(DeadlineExceeded("m").code() == StatusCode::kDeadlineExceeded);
  CHECK(PermissionDenied("m").code() == StatusCode::kPermissionDenied);
  CHECK(OutOfRange("m").code() == StatusCode::kOutOfRange);
  CHECK(Unimplemented("m").code() == StatusCode::kUnimplemented);
  CHECK(Unimplemented("m").message() == "m");
}

TEST_CASE("StatusCodeName: gRPC spellings, one per code", "[status]") {
  CHECK(StatusCodeName(StatusCode::kOk) == "OK");
  CHECK(StatusCodeName(StatusCode::kResourceExhausted) == "RESOURCE_EXHAUSTED");
  CHECK(StatusCodeName(StatusCode::kDataLoss) == "DATA_LOSS");
  CHECK(StatusCodeName(StatusCode::kFailedPrecondition) == "FAILED_PRECONDITION");
  std::set<std::string_view> names;
  for (uint32_t c = 0; c <= 15; ++c) {
    INFO("code " << c);
    CHECK(names.insert(StatusCodeName(static_cast<StatusCode>(c))).second);
  }
}

// Regression (was a doc/behaviour mismatch): status.h documents ToString as
// "INVALID_ARGUMENT: message (errno 28, No space left on device)", but ToString ignores
// sys_errno; only ErrnoStatus puts the errno into the message text itself.
TEST_CASE("ToString shows the errno of a Status that carries one", "[status]") {
  Status s(StatusCode::kInvalidArgument, "message", ENOSPC);
  CHECK_THAT(s.ToString(), Contains("28"));
  CHECK_THAT(s.ToString(), Contains(std::strerror(ENOSPC)));
}

TEST_CASE("WithContext prepends 'context: ' and keeps code and errno", "[status]") {
  const Status inner(StatusCode::kDataLoss, "checksum mismatch", EIO);
  const Status outer = inner.WithContext("step 42");  // const& overload
  CHECK(outer.code() == StatusCode::kDataLoss);
  CHECK(outer.message() == "step 42: checksum mismatch");
  CHECK(outer.sys_errno() == EIO);
  CHECK(inner.message() == "checksum mismatch");  // the original is untouched

  Status moved = Status(inner).WithContext("job 'j'").WithContext("save");  // && overload
  CHECK(moved.message() == "save: job 'j': checksum mismatch");
  CHECK(moved.code() == StatusCode::kDataLoss);
  CHECK(moved.sys_errno() == EIO);
}

TEST_CASE("WithContext leaves OK alone and ignores an empty context", "[status]") {
  const Status ok;
  CHECK(ok.WithContext("anything").ok());
  CHECK(ok.WithContext("anything").message().empty());
  CHECK(Status().WithContext("anything").ok());
  const Status err = NotFound("x");
  CHECK(err.WithContext("").message() == "x");
  CHECK(NotFound("x").WithContext("").message() == "x");
}

TEST_CASE("ErrnoStatus maps errno to a code", "[status]") {
  struct Case {
    int err;
    StatusCode code;
  };
  for (const Case& c :
       {Case{ENOSPC, StatusCode::kResourceExhausted}, Case{EDQUOT, StatusCode::kResourceExhausted},
        Case{EMFILE, StatusCode::kResourceExhausted}, Case{ENOENT, StatusCode::kNotFound},
        Case{EACCES, StatusCode::kPermissionDenied}, Case{EPERM, StatusCode::kPermissionDenied},
        Case{EIO, StatusCode::kInternal}, Case{EBADF, StatusCode::kInternal},
        Case{EPIPE, StatusCode::kInternal}}) {
    INFO("errno " << c.err << " (" << std::strerror(c.err) << ")");
    const Status s = ErrnoStatus(c.err, "write /x");
    CHECK(s.code() == c.code);
    CHECK(s.sys_errno() == c.err);
  }
}

TEST_CASE("ErrnoStatus message: 'what: strerror', with errno and the caller's file:line",
          "[status]") {
  const int line = __LINE__ + 1;
  const Status s = ErrnoStatus(ENOSPC, "pwrite /pfs/job/step-0000000001/rank-00000.data");
  CHECK_THAT(s.message(), StartsWith("pwrite /pfs/job/step-0000000001/rank-00000.data: " +
                                     std::string(std::strerror(ENOSPC))));
  CHECK_THAT(s.message(), Contains("28"));
  CHECK_THAT(s.message(), Contains("status_test.cpp:" + std::to_string(line)));
  CHECK_THAT(s.ToString(), StartsWith("RESOURCE_EXHAUSTED: "));
}

// ---- Result<T> ----

TEST_CASE("Result holds a value or a status", "[status]") {
  Result<int> v(7);
  REQUIRE(v.ok());
  CHECK(*v == 7);
  CHECK(v.value() == 7);
  CHECK(v.status().ok());

  Result<int> e(NotFound("nothing"));
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().code() == StatusCode::kNotFound);
  CHECK(e.status().message() == "nothing");

  Result<std::string> s(std::string("abc"));
  CHECK(s->size() == 3);
}

TEST_CASE("a Result built from an OK status is an internal error, not a value", "[status]") {
  Result<int> r(Status::Ok());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInternal);
}

TEST_CASE("Result moves a move-only value out", "[status]") {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(5));
  REQUIRE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  REQUIRE(p != nullptr);
  CHECK(*p == 5);
}

// ---- RETURN_IF_ERROR / ASSIGN_OR_RETURN ----

int g_calls = 0;

Status Fail(StatusCode code, std::string message) {
  ++g_calls;
  return Status(code, std::move(message), EIO);
}
Status Succeed() {
  ++g_calls;
  return Status::Ok();
}
Result<int> Value(int v) {
  ++g_calls;
  return v;
}
Result<int> NoValue() {
  ++g_calls;
  return NotFound("no value");
}
Result<std::unique_ptr<int>> Owned(int v) { return std::make_unique<int>(v); }

Status ReturnIfErrorPlain(Status (*f)(), int* reached) {
  RETURN_IF_ERROR(f());
  *reached = 1;
  return Status::Ok();
}
Status ReturnIfErrorWithContext(bool fail, int* reached) {
  RETURN_IF_ERROR(fail ? Fail(StatusCode::kDataLoss, "bad chunk") : Succeed(),
                  "tensor 'w' step " + std::to_string(3));
  *reached = 1;
  return Status::Ok();
}
Status ReturnIfErrorOnResult(bool fail) {
  RETURN_IF_ERROR(fail ? NoValue() : Value(1), "lookup");
  return Status::Ok();
}
Result<int> ReturnIfErrorIntoResult() {
  RETURN_IF_ERROR(Fail(StatusCode::kAborted, "rank died"));
  return 1;
}

Result<int> AssignPlain(bool fail) {
  ASSIGN_OR_RETURN(int v, fail ? NoValue() : Value(20));
  ASSIGN_OR_RETURN(auto w, Value(1));  // a second use in one scope
  return v + w;
}
Result<int> AssignWithContext(bool fail) {
  int v = 0;
  ASSIGN_OR_RETURN(v, fail ? NoValue() : Value(20), "reading MANIFEST of step 9");
  return v + 1;
}
Status AssignMoveOnly(int* out) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> p, Owned(11));
  *out = *p;
  return Status::Ok();
}

TEST_CASE("RETURN_IF_ERROR without context passes OK through and returns errors unchanged",
          "[status]") {
  int reached = 0;
  g_calls = 0;
  CHECK_OK(ReturnIfErrorPlain(&Succeed, &reached));
  CHECK(reached == 1);
  CHECK(g_calls == 1);  // the expression is evaluated once

  reached = 0;
  const Status s =
      ReturnIfErrorPlain([] { return Fail(StatusCode::kUnavailable, "gone"); }, &reached);
  CHECK(reached == 0);
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(s.message() == "gone");
  CHECK(s.sys_errno() == EIO);
}

TEST_CASE("RETURN_IF_ERROR with context prepends it", "[status]") {
  int reached = 0;
  g_calls = 0;
  CHECK_OK(ReturnIfErrorWithContext(false, &reached));
  CHECK(reached == 1);
  CHECK(g_calls == 1);

  reached = 0;
  g_calls = 0;
  const Status s = ReturnIfErrorWithContext(true, &reached);
  CHECK(reached == 0);
  CHECK(g_calls == 1);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(s.message() == "tensor 'w' step 3: bad chunk");
  CHECK(s.sys_errno() == EIO);
}

TEST_CASE("RETURN_IF_ERROR takes a Result and returns into a Result", "[status]") {
  CHECK_OK(ReturnIfErrorOnResult(false));
  const Status s = ReturnIfErrorOnResult(true);
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.message() == "lookup: no value");

  const Result<int> r = ReturnIfErrorIntoResult();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kAborted);
  CHECK(r.status().message() == "rank died");
}

TEST_CASE("ASSIGN_OR_RETURN without context", "[status]") {
  g_calls = 0;
  auto ok = AssignPlain(false);
  REQUIRE_OK(ok);
  CHECK(*ok == 21);
  CHECK(g_calls == 2);  // each expression evaluated once

  auto err = AssignPlain(true);
  REQUIRE_FALSE(err.ok());
  CHECK(err.status().code() == StatusCode::kNotFound);
  CHECK(err.status().message() == "no value");  // no stray ": " prefix
}

TEST_CASE("ASSIGN_OR_RETURN with context, into an existing variable", "[status]") {
  auto ok = AssignWithContext(false);
  REQUIRE_OK(ok);
  CHECK(*ok == 21);
  auto err = AssignWithContext(true);
  REQUIRE_FALSE(err.ok());
  CHECK(err.status().code() == StatusCode::kNotFound);
  CHECK(err.status().message() == "reading MANIFEST of step 9: no value");
}

TEST_CASE("ASSIGN_OR_RETURN moves a move-only value", "[status]") {
  int out = 0;
  CHECK_OK(AssignMoveOnly(&out));
  CHECK(out == 11);
}

}  // namespace
}  // namespace ckpt
