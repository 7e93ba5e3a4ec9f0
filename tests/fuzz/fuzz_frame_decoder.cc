// libFuzzer harness: the local protocol's frame decoder (common/frame_io.h) and the decoding of
// what it yields. The input is the byte stream a client would send: it is written into one end
// of a Unix socket pair (then that end is shut down) and the FrameReader reads frames from the
// other end until EOF or an error, parsing each payload as a ClientMessage the way a session
// does. Any crash, sanitizer report, or frame longer than kMaxFrameBytes accepted is a bug.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include <google/protobuf/stubs/logging.h>

#include "ckptd/v1/local.pb.h"
#include "common/frame_io.h"

// Protobuf logs every string field with invalid UTF-8 to stderr; a fuzzer makes millions.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  ckpt::UniqueFd reader_end(sv[0]);
  ckpt::UniqueFd writer_end(sv[1]);
  // A socket buffer holds far more than the inputs the fuzzer makes (-max_len); write what fits.
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::send(writer_end.get(), data + done, size - done, MSG_DONTWAIT);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::shutdown(writer_end.get(), SHUT_WR);

  ckpt::FrameReader reader;
  for (int frames = 0; frames < 100000; ++frames) {
    auto frame = reader.ReadSome(reader_end.get());
    if (!frame.ok()) break;             // EOF or a broken stream: the session would close
    if (!frame->has_value()) continue;  // a partial read
    if ((*frame)->payload.size() > ckpt::kMaxFrameBytes) std::abort();
    ckptd::v1::ClientMessage message;
    if (message.ParseFromString((*frame)->payload)) {
      // Touch what a session reads first.
      volatile size_t tensors = message.has_register_() ? message.register_().tensors_size() : 0;
      (void)tensors;
    }
  }
  return 0;
}
