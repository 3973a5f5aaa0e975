#include "kvevents/kv_event.h"

#include <cstring>
#include <msgpack.hpp>
#include <string_view>

namespace kvserve::kvevents {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackHashes(Packer& pk, const std::vector<uint64_t>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (const uint64_t h : hashes) pk.pack_uint64(h);
}

void PackString(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// Always a float64 (0xcb): msgpack-c's pack_double writes a whole number
// as an integer, and llm-d decodes ts as a float.
void PackFloat64(msgpack::sbuffer& buf, double d) {
  uint64_t bits = 0;
  std::memcpy(&bits, &d, sizeof(bits));
  char out[9];
  out[0] = static_cast<char>(0xcb);
  for (int i = 8; i >= 1; --i, bits >>= 8) {
    out[i] = static_cast<char>(bits & 0xff);
  }
  buf.write(out, sizeof(out));
}

struct PackEvent {
  Packer& pk;
  void operator()(const BlockStored& e) const {
    pk.pack_array(8);
    PackString(pk, "BlockStored");
    PackHashes(pk, e.hashes);
    if (e.parent.has_value()) {
      pk.pack_uint64(*e.parent);
    } else {
      pk.pack_nil();
    }
    pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
    for (const int32_t t : e.token_ids) pk.pack_int32(t);
    pk.pack_int32(e.block_size);
    pk.pack_nil();  // lora_id
    PackString(pk, MediumName(e.medium));
    if (e.lora_name.has_value()) {
      PackString(pk, *e.lora_name);
    } else {
      pk.pack_nil();
    }
  }
  void operator()(const BlockRemoved& e) const {
    pk.pack_array(3);
    PackString(pk, "BlockRemoved");
    PackHashes(pk, e.hashes);
    PackString(pk, MediumName(e.medium));
  }
  void operator()(const AllBlocksCleared&) const {
    pk.pack_array(1);
    PackString(pk, "AllBlocksCleared");
  }
};

}  // namespace

const char* MediumName(Medium medium) {
  switch (medium) {
    case Medium::kGpu:
      return "GPU";
    case Medium::kCpu:
      return "CPU";
    case Medium::kStorage:
      return "STORAGE";
  }
  return "GPU";
}

std::string EncodeBatch(const EventBatch& batch) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(3);
  PackFloat64(buf, batch.ts);
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const Event& e : batch.events) std::visit(PackEvent{pk}, e);
  pk.pack_int32(batch.dp_rank);
  return std::string(buf.data(), buf.size());
}

}  // namespace kvserve::kvevents
