#pragma once
namespace ckpt {
inline constexpr const char* kVersion = "0.1.0";
}  // namespace ckpt
