#include "server/kv_blocks.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvserve::server {

std::string KvBlocksJson(const engine::ResidentBlocks& blocks) {
  std::vector<std::string> hashes;
  hashes.reserve(blocks.hashes.size());
  for (const uint64_t h : blocks.hashes) hashes.push_back(absl::StrCat(h));
  return nlohmann::json{{"block_size", blocks.block_size},
                        {"medium", "GPU"},
                        {"hashes", hashes},
                        {"unannounced_blocks", blocks.unannounced}}
      .dump();
}

}  // namespace kvserve::server
