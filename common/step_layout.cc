#include "common/step_layout.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace ckpt {

std::string StepDirName(uint64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%010llu", static_cast<unsigned long long>(step));
  return buf;
}

std::optional<uint64_t> ParseStepDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step-";
  if (!name.starts_with(kPrefix) || name.size() < kPrefix.size() + 10) return std::nullopt;
  std::string_view digits = name.substr(kPrefix.size());
  uint64_t step = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || ptr != digits.data() + digits.size()) return std::nullopt;
  if (StepDirName(step) != name) return std::nullopt;  // canonical spelling only
  return step;
}

std::string JobDir(const std::string& root, std::string_view job) {
  return JoinPath(root, std::string(job));
}

std::string StepDir(const std::string& root, std::string_view job, uint64_t step) {
  return JoinPath(JobDir(root, job), StepDirName(step));
}

std::string DataFileName(uint32_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05u.data", rank);
  return buf;
}

std::string NodeManifestFileName(std::string_view node_id) {
  return "node-" + std::string(node_id) + ".nmf";
}

namespace {

Result<std::vector<uint64_t>> ListSteps(FileSystem* fs, const std::string& job_dir,
                                        bool committed) {
  auto names = fs->ListDir(job_dir);
  if (!names.ok()) {
    if (names.status().code() == StatusCode::kNotFound) return std::vector<uint64_t>{};
    return names.status();
  }
  std::vector<uint64_t> steps;
  for (const auto& name : *names) {
    auto step = ParseStepDirName(name);
    if (!step) continue;
    ASSIGN_OR_RETURN(bool has_manifest,
                     fs->Exists(JoinPath(JoinPath(job_dir, name), std::string(kManifestFileName))));
    if (has_manifest == committed) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

Result<std::vector<uint64_t>> ListCommittedSteps(FileSystem* fs, const std::string& job_dir) {
  return ListSteps(fs, job_dir, true);
}

Result<bool> IsPinnedStep(FileSystem* fs, const std::string& step_dir) {
  return fs->Exists(JoinPath(step_dir, std::string(kPinnedFileName)));
}

Result<std::vector<uint64_t>> ListUncommittedSteps(FileSystem* fs, const std::string& job_dir) {
  return ListSteps(fs, job_dir, false);
}

Result<std::optional<uint64_t>> ResolveLatest(FileSystem* fs, const std::string& job_dir) {
  ASSIGN_OR_RETURN(auto committed, ListCommittedSteps(fs, job_dir));
  auto latest = fs->ReadFile(JoinPath(job_dir, std::string(kLatestFileName)));
  if (latest.ok()) {
    std::string text = *latest;
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    uint64_t step = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
    if (ec == std::errc() && ptr == text.data() + text.size() &&
        std::binary_search(committed.begin(), committed.end(), step)) {
      return std::optional<uint64_t>(step);
    }
  } else if (latest.status().code() != StatusCode::kNotFound) {
    return latest.status();
  }
  if (committed.empty()) return std::optional<uint64_t>();
  return std::optional<uint64_t>(committed.back());
}

}  // namespace ckpt
