// Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>/) from messages a
// well-behaved client sends, so each harness starts from inputs that reach deep into the code.
// The corpora are checked in; rerun after a protocol change:
//   build-fuzz/bin/make_fuzz_seeds tests/fuzz/corpus
// (manifest seeds are real MANIFEST / node manifest files copied from a checkpoint, see
// tests/README.md).
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "ckptd/v1/local.pb.h"
#include "common/frame_io.h"

namespace {

namespace pb = ::ckptd::v1;

void Write(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

pb::ClientMessage Register(bool flat) {
  pb::ClientMessage m;
  m.set_request_id(2);
  auto* t = m.mutable_register_()->add_tensors();
  t->set_name("layers.0.weight");
  t->set_dtype("float32");
  t->add_global_shape(64);
  t->add_global_shape(1024);
  if (flat) {
    t->mutable_geometry()->mutable_flat()->set_flat_offset(0);
    t->mutable_geometry()->mutable_flat()->set_numel(65536);
  } else {
    auto* box = t->mutable_geometry()->mutable_box();
    box->add_offsets(0);
    box->add_offsets(0);
    box->add_lengths(64);
    box->add_lengths(256);
  }
  auto* host = t->mutable_host();
  host->set_fd_index(0);
  host->set_offset(0);
  host->set_length(flat ? 262144 : 65536);
  return m;
}

// [flags u8][length u16 LE][payload] (fuzz_session's input format).
std::string SessionFrame(const pb::ClientMessage& m, bool with_fd) {
  const std::string payload = m.SerializeAsString();
  std::string out;
  out.push_back(with_fd ? 1 : 0);
  out.push_back(static_cast<char>(payload.size() & 0xFF));
  out.push_back(static_cast<char>((payload.size() >> 8) & 0xFF));
  return out + payload;
}

std::vector<pb::ClientMessage> Conversation(bool flat) {
  std::vector<pb::ClientMessage> out = {Register(flat)};
  pb::ClientMessage save;
  save.set_request_id(3);
  save.mutable_save()->set_step(1);
  save.mutable_save()->set_extra("extra");
  out.push_back(save);
  pb::ClientMessage snap;
  snap.set_request_id(4);
  snap.mutable_wait_snapshot();
  out.push_back(snap);
  pb::ClientMessage wait;
  wait.set_request_id(5);
  wait.mutable_wait()->set_step(1);
  wait.mutable_wait()->set_state(pb::STEP_STATE_COMMITTED);
  out.push_back(wait);
  pb::ClientMessage latest;
  latest.set_request_id(6);
  latest.mutable_latest();
  out.push_back(latest);
  pb::ClientMessage load;
  load.set_request_id(7);
  load.mutable_load()->set_strict(true);
  out.push_back(load);
  return out;
}

// fuzz_geometry's input: [rank][dims as numbers][shards...] with small numbers (tag < 0x40).
std::string GeometrySeed(std::vector<uint8_t> bytes) {
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_fuzz_seeds CORPUS_DIR\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  pb::ClientMessage hello;
  hello.set_request_id(1);
  hello.mutable_hello()->set_protocol_version(1);
  hello.mutable_hello()->set_job("seed");
  hello.mutable_hello()->set_world_size(1);

  for (bool flat : {false, true}) {
    const std::string tag = flat ? "flat" : "box";
    std::string stream = ckpt::EncodeFrame(hello.SerializeAsString());
    std::string session;
    for (const auto& m : Conversation(flat)) {
      stream += ckpt::EncodeFrame(m.SerializeAsString());
      session += SessionFrame(m, m.has_register_());
    }
    Write(dir / "fuzz_frame_decoder" / ("conversation-" + tag), stream);
    Write(dir / "fuzz_session" / ("conversation-" + tag), session);
    Write(dir / "fuzz_session" / ("register-" + tag), SessionFrame(Register(flat), true));
  }
  Write(dir / "fuzz_frame_decoder" / "hello", ckpt::EncodeFrame(hello.SerializeAsString()));

  // rank 2, shape [8, 16]; request box [0:8, 0:16]; stored: two row halves.
  Write(dir / "fuzz_geometry" / "box-rows",
        GeometrySeed({2, 8, 16, 0, 1, 0, 8, 0, 16, 0, 1, 0, 4, 0, 16, 0, 1, 4, 4, 0, 16}));
  // rank 1, shape [60]; request flat [10, 60); stored: flat [0, 30), flat [30, 60).
  Write(dir / "fuzz_geometry" / "flat-ranges",
        GeometrySeed({1, 60, 1, 10, 50, 1, 0, 30, 1, 30, 30}));
  // rank 3, shape [4, 4, 4]; request a column box; stored: the full tensor.
  Write(dir / "fuzz_geometry" / "box-3d",
        GeometrySeed({3, 4, 4, 4, 0, 1, 0, 4, 1, 2, 0, 4, 0, 1, 0, 4, 0, 4, 0, 4}));
  std::cout << "seeds written under " << dir << "\n";
  return 0;
}
