// Job, node and tensor name validation and EscapeForLog (common/names.h).
#include "common/names.h"

#include <string>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

using namespace std::string_literals;

void RequireInvalid(const Status& s, const std::string& must_contain) {
  INFO(s.ToString());
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Contains(must_contain));
}

TEST_CASE("ValidateJobName accepts safe path components", "[names]") {
  for (std::string_view ok :
       {"a", "job-1", "llama_70b.run3", "A.B-C_D", "...", "..a", ".hidden", "0"}) {
    INFO("job \"" << ok << "\"");
    CHECK_OK(ValidateJobName(ok));
  }
  CHECK_OK(ValidateJobName(std::string(kMaxJobNameLength, 'j')));
}

TEST_CASE("ValidateJobName rejects what could escape the storage root", "[names]") {
  RequireInvalid(ValidateJobName("../etc"), "'../etc'");
  RequireInvalid(ValidateJobName("."), "'.'");
  RequireInvalid(ValidateJobName(".."), "'..'");
  RequireInvalid(ValidateJobName("a/b"), "'a/b'");
  RequireInvalid(ValidateJobName("/abs"), "'/abs'");
  RequireInvalid(ValidateJobName("a\\b"), "job name");
  RequireInvalid(ValidateJobName(""), "empty");
  RequireInvalid(ValidateJobName("with space"), "may only contain");
  RequireInvalid(ValidateJobName("caf\xc3\xa9"), "may only contain");
}

TEST_CASE("ValidateJobName rejects NUL and control characters, quoting them escaped", "[names]") {
  const std::string with_nul("ab\0cd", 5);
  RequireInvalid(ValidateJobName(with_nul), "'ab\\x00cd'");
  RequireInvalid(ValidateJobName("a\nb"), "'a\\x0ab'");
  RequireInvalid(ValidateJobName("\x1b[31mred"), "'\\x1b[31mred'");
  RequireInvalid(ValidateJobName("tab\there"), "\\x09");
  RequireInvalid(ValidateJobName("del\x7f"), "\\x7f");
  // No raw control byte reaches the message.
  const Status s = ValidateJobName(with_nul);
  for (char c : s.message()) CHECK(static_cast<unsigned char>(c) >= 0x20);
}

TEST_CASE("ValidateJobName: 128 bytes pass, 129 fail with both lengths in the message", "[names]") {
  CHECK_OK(ValidateJobName(std::string(128, 'x')));
  const Status s = ValidateJobName(std::string(129, 'x'));
  RequireInvalid(s, "129 bytes");
  CHECK_THAT(s.message(), Contains("128"));
}

TEST_CASE("ValidateNodeId follows the job name rules", "[names]") {
  CHECK_OK(ValidateNodeId("gpu-node-017"));
  CHECK_OK(ValidateNodeId(std::string(kMaxNodeIdLength, 'n')));
  RequireInvalid(ValidateNodeId(std::string(kMaxNodeIdLength + 1, 'n')), "node id");
  RequireInvalid(ValidateNodeId(".."), "node id '..'");
  RequireInvalid(ValidateNodeId("a/b"), "node id 'a/b'");
  RequireInvalid(ValidateNodeId(""), "node id is empty");
}

TEST_CASE("ValidateTensorName accepts printable names including UTF-8 and slashes", "[names]") {
  for (std::string_view ok :
       {"layers.0.attn.wq.weight", "a", "model/encoder/w", "..", "../etc", "with space",
        "\xe5\xb1\xa4.weight" /* 層 */, "emoji\xf0\x9f\x98\x80", "quote'and\"back\\slash"}) {
    INFO("tensor \"" << ok << "\"");
    CHECK_OK(ValidateTensorName(ok));
  }
}

TEST_CASE("ValidateTensorName rejects empty names and control characters", "[names]") {
  RequireInvalid(ValidateTensorName(""), "tensor name is empty");
  RequireInvalid(ValidateTensorName(std::string("w\0x", 3)), "'w\\x00x'");
  RequireInvalid(ValidateTensorName("w\n"), "control character");
  RequireInvalid(ValidateTensorName("\tw"), "control character");
  RequireInvalid(ValidateTensorName("w\x7f"), "control character");
  RequireInvalid(ValidateTensorName("w\x1f"), "'w\\x1f'");
}

TEST_CASE("ValidateTensorName: 1024 bytes pass, 1025 fail", "[names]") {
  CHECK_OK(ValidateTensorName(std::string(kMaxTensorNameLength, 't')));
  const Status s = ValidateTensorName(std::string(kMaxTensorNameLength + 1, 't'));
  RequireInvalid(s, "1025 bytes");
  CHECK_THAT(s.message(), Contains("1024"));
  // The quoted name is cut for the log, not the whole 1 KiB.
  CHECK(s.message().size() < 300);
}

// The contract admits "printable UTF-8"; bytes that are not UTF-8 at all are accepted today.
// Regression: ValidateTensorName checks only for ASCII control bytes, so names that
// are not valid UTF-8 ("\xff") and C1 control characters (U+0085, "\xc2\x85") pass.
TEST_CASE("ValidateTensorName rejects bytes that are not printable UTF-8", "[names]") {
  CHECK_FALSE(ValidateTensorName("w\xff").ok());
  CHECK_FALSE(ValidateTensorName("w\xc3").ok());      // truncated sequence
  CHECK_FALSE(ValidateTensorName("w\xc2\x85").ok());  // NEL, a C1 control character
}

TEST_CASE("EscapeForLog leaves printable ASCII alone", "[names]") {
  CHECK(EscapeForLog("") == "");
  CHECK(EscapeForLog("layers.0.weight") == "layers.0.weight");
  CHECK(EscapeForLog("a b/c'd\"e") == "a b/c'd\"e");
}

TEST_CASE("EscapeForLog escapes control and non-ASCII bytes as \\xNN", "[names]") {
  CHECK(EscapeForLog(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(EscapeForLog("a\nb") == "a\\x0ab");
  CHECK(EscapeForLog("\x1b") == "\\x1b");
  CHECK(EscapeForLog("\x7f") == "\\x7f");
  CHECK(EscapeForLog("\xff\x80") == "\\xff\\x80");
  CHECK(EscapeForLog("caf\xc3\xa9") == "caf\\xc3\\xa9");
  // A literal backslash cannot be confused with an escape.
  CHECK(EscapeForLog("\\x41") != EscapeForLog("A"));
  for (int c = 0; c < 256; ++c) {
    const std::string out = EscapeForLog(std::string(1, static_cast<char>(c)));
    for (char o : out) {
      INFO("byte " << c << " -> " << out);
      CHECK(static_cast<unsigned char>(o) >= 0x20);
      CHECK(static_cast<unsigned char>(o) < 0x7f);
    }
  }
}

TEST_CASE("EscapeForLog cuts long names to about 80 bytes and marks the cut", "[names]") {
  CHECK(EscapeForLog(std::string(80, 'a')) == std::string(80, 'a'));
  const std::string long_out = EscapeForLog(std::string(1000, 'a'));
  CHECK_THAT(long_out, StartsWith(std::string(80, 'a')));
  CHECK_THAT(long_out, EndsWith("..."));
  CHECK(long_out.size() <= 80 + 3);
  const std::string escaped_out = EscapeForLog(std::string(1000, '\x01'));
  CHECK_THAT(escaped_out, StartsWith("\\x01\\x01"));
  CHECK_THAT(escaped_out, EndsWith("..."));
  CHECK(escaped_out.size() <= 80 + 3 + 3);
}

// Regression: the "..." marker is only added when the *input* is longer than 80 bytes. A
// short input whose escaped form passes 80 bytes (e.g. 30 control bytes → 120 bytes escaped) is
// cut after 20 input bytes with no marker, so the log shows a wrong, complete-looking name.
TEST_CASE("EscapeForLog marks a cut even when the input is short but escapes long", "[names]") {
  const std::string input(30, '\x01');
  const std::string out = EscapeForLog(input);
  std::string full;
  for (int i = 0; i < 30; ++i) full += "\\x01";
  INFO("out = " << out);
  CHECK((out == full || out.ends_with("...")));
}

}  // namespace
}  // namespace ckpt
