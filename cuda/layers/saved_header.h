// The header every saved-activation buffer begins with, so a backward given another plan's buffer (or a buffer
// no forward filled) is rejected with INVALID_VALUE instead of reading garbage.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moekit {
inline namespace v0 {

struct SavedHeader {
  uint64_t magic;    // kSavedMagic
  uint64_t plan_id;  // moekit_plan::id of the plan whose forward wrote the buffer
  int64_t tokens;    // T of that forward (rows for the experts-only layer)
  uint64_t reserved;
};

constexpr uint64_t kSavedMagic = 0x3130'5645'5341'534dull;  // "MSAVE01" read little-endian, roughly
// What a backward that overwrote the saved h (backward_overwrites_saved) leaves, so a second backward is refused.
constexpr uint64_t kSavedSpentMagic = 0x3130'544e'4550'534dull;  // "MSPENT01", roughly
// The payload starts here, so it keeps the buffer's 256-byte alignment.
constexpr size_t kSavedHeaderBytes = 256;

}  // namespace v0
}  // namespace moekit
