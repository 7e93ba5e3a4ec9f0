// A trainer built outside the tree against an installed ckptd (cmake --install): only
// <ckpt/client.h> and -lckpt_client, started as a launcher would (RANK, WORLD_SIZE, CKPTD_JOB in
// its environment). Saves one tensor, waits for the commit, overwrites the
// memory, restores it and checks every byte. Exit 0 and "restored" on success.
//   use_installed_client SOCKET
#include <ckpt/client.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
    return 2;
  }
  constexpr size_t kBytes = 1 << 20;
  const int fd = ::memfd_create("installed-client", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, kBytes) != 0) return 1;
  auto* bytes = static_cast<unsigned char*>(
      ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (bytes == MAP_FAILED) return 1;
  for (size_t i = 0; i < kBytes; ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 3);
  const std::vector<unsigned char> saved(bytes, bytes + kBytes);

  auto options = ckpt::ClientOptionsFromEnvironment(argv[1]);  // job and rank from the launcher
  if (!options.ok()) {
    std::fprintf(stderr, "environment: %s\n", options.status().ToString().c_str());
    return 1;
  }
  auto client = ckpt::Client::Connect(*options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  ckpt::HostTensor t;
  t.name = "weights";
  t.dtype = "float32";
  t.global_shape = {kBytes / 4};
  t.fd = fd;
  t.nbytes = kBytes;
  const ckpt::HostTensor tensors[] = {t};
  ckpt::Status st = (*client)->Register(tensors);
  if (st.ok()) st = (*client)->Save(1);
  if (st.ok()) st = (*client)->Wait(1, ckpt::WaitState::kCommitted);
  if (!st.ok()) {
    std::fprintf(stderr, "save: %s\n", st.ToString().c_str());
    return 1;
  }
  std::memset(bytes, 0, kBytes);
  auto loaded = (*client)->Load(1);
  if (!loaded.ok()) {
    std::fprintf(stderr, "load: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  if (std::memcmp(bytes, saved.data(), kBytes) != 0) {
    std::fprintf(stderr, "restored bytes differ from the saved ones\n");
    return 1;
  }
  std::printf("restored step %llu\n", static_cast<unsigned long long>(loaded->step));
  return 0;
}
