// Copy-on-write forks and swap in KvCacheManager: exact block ids, slots and
// moves, ref counts through forks, eviction order after swap-out, and a
// seeded soak of allocate / append / fork / free / evict / swap that models
// the KV bytes (a fake array keyed by block id and swap slot) to prove every
// request always reads back its own tokens.
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/block_hash.h"
#include "kvcache/kv_cache_manager.h"
#include "kvcache/swap_space.h"

namespace kvserve::kvcache {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Optional;

#define ASSERT_INVARIANTS(kv)                            \
  do {                                                   \
    const absl::Status kv_inv_ = (kv).CheckInvariants(); \
    ASSERT_TRUE(kv_inv_.ok()) << kv_inv_;                \
  } while (0)

const BlockHash kNs = NamespaceHash("model", "");

TEST(SwapSpaceTest, HandsOutLowestFirstAndReusesFreedSlots) {
  SwapSpace swap(5);
  EXPECT_THAT(swap.Allocate(2), ElementsAre(0, 1));
  EXPECT_THAT(swap.Allocate(2), ElementsAre(2, 3));
  EXPECT_EQ(swap.num_used(), 4);
  swap.Free(std::vector<SwapSlot>{0, 1});
  EXPECT_TRUE(swap.is_free(0));
  EXPECT_FALSE(swap.is_free(2));
  EXPECT_THAT(swap.Allocate(3), ElementsAre(0, 1, 4));
  EXPECT_EQ(swap.num_free(), 0);
  EXPECT_TRUE(swap.CheckInvariants().ok());
  EXPECT_DEATH(swap.Free(std::vector<SwapSlot>{0, 0}), "freed while free");
  EXPECT_DEATH((void)swap.Allocate(1), "free slots=0");
}

// 8 blocks of 4 tokens, 4 swap slots.
class CowSwapTest : public ::testing::Test {
 protected:
  KvCacheManager kv_{8, 4, &HashBlockTokens, 4};
};

TEST_F(CowSwapTest, ForkedPartialBlockIsCopiedOnFirstWrite) {
  ASSERT_THAT(kv_.Allocate(1, 6), Optional(ElementsAre(0, 1)));
  kv_.Fork(1, 2);  // child shares [0 1]; block 1 holds 2 of 4 tokens
  ASSERT_INVARIANTS(kv_);
  EXPECT_EQ(kv_.pool().ref_count(0), 2);
  EXPECT_EQ(kv_.pool().ref_count(1), 2);
  // The child writes position 6 (block 1, shared): copy 1 -> 2 first.
  int32_t free = kv_.num_free_blocks();
  std::vector<BlockMove> copies;
  ASSERT_TRUE(kv_.AllocateForWrite(2, 6, 7, &copies));
  EXPECT_EQ(free - kv_.num_free_blocks(), 1);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(copies, ElementsAre(BlockMove{1, 2}));
  EXPECT_THAT(kv_.GetBlockTable(2), ElementsAre(0, 2));
  EXPECT_THAT(kv_.GetBlockTable(1), ElementsAre(0, 1));  // source intact
  EXPECT_EQ(kv_.pool().ref_count(0), 2);  // full shared block: never copied
  EXPECT_EQ(kv_.pool().ref_count(1), 1);
  EXPECT_EQ(kv_.pool().ref_count(2), 1);
  // The parent now owns block 1 alone: it writes in place.
  free = kv_.num_free_blocks();
  ASSERT_TRUE(kv_.AllocateForWrite(1, 6, 7, &copies));
  EXPECT_EQ(free, kv_.num_free_blocks());
  EXPECT_EQ(copies.size(), 1u);
  // Growth past the block plus a copy in one call.
  kv_.Fork(1, 3);
  free = kv_.num_free_blocks();
  ASSERT_TRUE(kv_.AllocateForWrite(3, 7, 12, &copies));
  EXPECT_EQ(free - kv_.num_free_blocks(), 2);  // copy + 1 fresh
  EXPECT_THAT(copies, ElementsAre(BlockMove{1, 2}, BlockMove{1, 3}));
  EXPECT_THAT(kv_.GetBlockTable(3), ElementsAre(0, 3, 4));
  ASSERT_INVARIANTS(kv_);
}

TEST_F(CowSwapTest, ForkAtBlockBoundaryCopiesNothing) {
  ASSERT_TRUE(kv_.Allocate(1, 8).has_value());
  kv_.Fork(1, 2);
  std::vector<BlockMove> copies;
  ASSERT_TRUE(kv_.AllocateForWrite(2, 8, 9, &copies));
  EXPECT_THAT(copies, IsEmpty());
  EXPECT_THAT(kv_.GetBlockTable(2), ElementsAre(0, 1, 2));
  ASSERT_INVARIANTS(kv_);
}

TEST_F(CowSwapTest, CopyThatDoesNotFitChangesNothing) {
  ASSERT_TRUE(kv_.Allocate(1, 30).has_value());  // 8 blocks: pool full
  kv_.Fork(1, 2);
  std::vector<BlockMove> copies;
  EXPECT_EQ(kv_.num_free_blocks(), 0);  // the copy needs one block
  EXPECT_FALSE(kv_.AllocateForWrite(2, 30, 31, &copies));
  EXPECT_THAT(copies, IsEmpty());
  EXPECT_EQ(kv_.pool().ref_count(7), 2);
  ASSERT_INVARIANTS(kv_);
}

TEST_F(CowSwapTest, RefCountsThroughForksAndFrees) {
  ASSERT_TRUE(kv_.Allocate(1, 10).has_value());  // [0 1 2]
  kv_.Fork(1, 2);
  kv_.Fork(2, 3, 2);  // only the first 2 blocks
  EXPECT_THAT(kv_.GetBlockTable(3), ElementsAre(0, 1));
  EXPECT_EQ(kv_.pool().ref_count(0), 3);
  EXPECT_EQ(kv_.pool().ref_count(2), 2);
  ASSERT_INVARIANTS(kv_);
  EXPECT_EQ(kv_.Free(1), 3);
  EXPECT_EQ(kv_.pool().ref_count(0), 2);
  EXPECT_EQ(kv_.num_free_blocks(), 5);  // nothing reached ref 0
  EXPECT_EQ(kv_.Free(2), 3);
  EXPECT_EQ(kv_.pool().ref_count(2), 0);
  EXPECT_EQ(kv_.Free(3), 2);
  ASSERT_INVARIANTS(kv_);
  // Released tail-first: 2 (by request 2), then 1, 0 (by request 3).
  EXPECT_THAT(kv_.pool().FreeQueue(), ElementsAre(3, 4, 5, 6, 7, 2, 1, 0));
}

TEST_F(CowSwapTest, SwapOutAndInWithExactIdsSlotsAndEvictionOrder) {
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const TokenSequence seq{prompt, {}};
  ASSERT_TRUE(kv_.Allocate(1, 10).has_value());  // [0 1 2]
  ASSERT_TRUE(kv_.Allocate(2, 4).has_value());   // [3]
  kv_.CacheComputedBlocks(1, seq, 10, kNs);      // blocks 0, 1 hashed
  // Swap out 3 blocks (blocks allocated beyond them would just be freed).
  ASSERT_TRUE(kv_.CanSwapOut(1, 3));
  EXPECT_FALSE(kv_.CanSwapOut(1, 5));  // the table has 3 blocks only
  std::vector<BlockMove> out;
  kv_.SwapOut(1, 3, &out);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(out,
              ElementsAre(BlockMove{0, 0}, BlockMove{1, 1}, BlockMove{2, 2}));
  EXPECT_THAT(kv_.GetBlockTable(1), IsEmpty());
  EXPECT_EQ(kv_.num_swapped_blocks(1), 3);
  EXPECT_EQ(kv_.Usage().swap_slots_used, 3);
  EXPECT_EQ(kv_.Usage().swap_slots_total, 4);
  EXPECT_FALSE(kv_.CanSwapOut(2, 2));  // 1 slot left
  // Freed tail-first; the hashed blocks stay findable (contents intact).
  EXPECT_THAT(kv_.pool().FreeQueue(), ElementsAre(4, 5, 6, 7, 2, 1, 0));
  EXPECT_EQ(kv_.pool().num_cached_evictable(), 2);
  EXPECT_EQ(kv_.FindCachedPrefix(seq, kNs).num_tokens, 8);
  // Swap in: fresh blocks from the free-queue head, slot order kept.
  std::vector<BlockMove> in;
  ASSERT_TRUE(kv_.SwapIn(1, &in));
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(in,
              ElementsAre(BlockMove{0, 4}, BlockMove{1, 5}, BlockMove{2, 6}));
  EXPECT_THAT(kv_.GetBlockTable(1), ElementsAre(4, 5, 6));
  EXPECT_EQ(kv_.num_swapped_blocks(1), 0);
  EXPECT_EQ(kv_.Usage().swap_slots_used, 0);
  // Re-registering finds the old copies cached: the new blocks stay unhashed.
  kv_.CacheComputedBlocks(1, seq, 10, kNs);
  EXPECT_FALSE(kv_.pool().block_hash(4).has_value());
  ASSERT_INVARIANTS(kv_);
}

TEST_F(CowSwapTest, SwapInThatDoesNotFitChangesNothingAndFreeReleasesSlots) {
  ASSERT_TRUE(kv_.Allocate(1, 12).has_value());
  std::vector<BlockMove> moves;
  kv_.SwapOut(1, 3, &moves);
  ASSERT_TRUE(kv_.Allocate(2, 24).has_value());  // 6 of 8 blocks
  moves.clear();
  EXPECT_FALSE(kv_.SwapIn(1, &moves));
  EXPECT_THAT(moves, IsEmpty());
  EXPECT_EQ(kv_.num_swapped_blocks(1), 3);
  ASSERT_INVARIANTS(kv_);
  EXPECT_EQ(kv_.Free(1), 0);                  // no table, but the slots go back
  EXPECT_EQ(kv_.Usage().swap_slots_used, 0);  // all 4 slots back
  ASSERT_INVARIANTS(kv_);
}

TEST_F(CowSwapTest, SharedBlocksSwapOutWithoutDisturbingOtherHolders) {
  ASSERT_TRUE(kv_.Allocate(1, 6).has_value());  // [0 1]
  kv_.Fork(1, 2);
  std::vector<BlockMove> moves;
  kv_.SwapOut(2, 2, &moves);
  EXPECT_THAT(moves, ElementsAre(BlockMove{0, 0}, BlockMove{1, 1}));
  EXPECT_THAT(kv_.GetBlockTable(1), ElementsAre(0, 1));
  EXPECT_EQ(kv_.pool().ref_count(0), 1);
  EXPECT_EQ(kv_.pool().ref_count(1), 1);
  ASSERT_INVARIANTS(kv_);
  moves.clear();
  ASSERT_TRUE(kv_.SwapIn(2, &moves));
  EXPECT_THAT(moves, ElementsAre(BlockMove{0, 2}, BlockMove{1, 3}));
  ASSERT_INVARIANTS(kv_);
}

TEST_F(CowSwapTest, MisuseAborts) {
  ASSERT_TRUE(kv_.Allocate(1, 4).has_value());
  std::vector<BlockMove> moves;
  EXPECT_DEATH(kv_.SwapOut(1, 2, &moves), "cannot swap out");
  EXPECT_DEATH((void)kv_.SwapIn(1, &moves), "not swapped out");
  EXPECT_DEATH(kv_.Fork(1, 2, 2), "fork of 2 blocks");
}

// The soak's model of one request: its tokens and how many are written.
struct Model {
  std::vector<int32_t> tokens;
  int32_t written = 0;
  bool swapped = false;
};

// Seeded random allocate / append / fork / free / swap out / swap in on a
// tight pool with prefix caching (so cached blocks get evicted), moving fake
// KV contents exactly as the engine would. After every operation the
// invariants hold and every request reads its own tokens back.
TEST(CowSwapSoakTest, RandomOpsKeepContentsAndInvariants) {
  constexpr int32_t kBlocks = 40, kB = 4, kSlots = 24;
  constexpr RequestId kIds = 16;
  KvCacheManager kv(kBlocks, kB, &HashBlockTokens, kSlots);
  std::vector<int32_t> kv_bytes(kBlocks * kB, -1), swap_bytes(kSlots * kB, -1);
  std::map<RequestId, Model> live;
  std::mt19937 rng(11);
  auto pick = [&](int64_t n) {
    return static_cast<int32_t>(
        std::uniform_int_distribution<int64_t>(0, n - 1)(rng));
  };
  auto copy = [&](const std::vector<int32_t>& from, int32_t src,
                  std::vector<int32_t>& to, int32_t dst) {
    std::copy_n(from.begin() + src * kB, kB, to.begin() + dst * kB);
  };
  auto check = [&](RequestId id, const Model& m) {
    if (m.swapped) return;
    const std::vector<BlockId>& table = kv.GetBlockTable(id);
    for (int32_t p = 0; p < m.written; ++p) {
      ASSERT_EQ(kv_bytes[table[p / kB] * kB + p % kB], m.tokens[p])
          << "request " << id << " position " << p;
    }
  };
  std::map<std::string, int> counts;
  for (int op = 0; op < 10000; ++op) {
    const RequestId id = pick(kIds);
    const int kind = pick(12);
    auto it = live.find(id);
    if (it == live.end() && kind < 8) {  // new request, maybe a shared prompt
      Model m;
      const int32_t len = 1 + pick(20);
      for (int32_t i = 0; i < len; ++i) {
        m.tokens.push_back(i < 8 ? pick(2) * 100 + i : pick(1000));
      }
      const TokenSequence seq{m.tokens, {}};
      const PrefixMatch match = kv.FindCachedPrefix(seq, kNs);
      std::vector<BlockMove> copies;  // a cached tail arrives by copy
      if (!kv.AllocateWithPrefix(id, match, match.num_tokens + 1, &copies)) {
        ++counts["refused"];
        continue;
      }
      for (const BlockMove& c : copies) copy(kv_bytes, c.src, kv_bytes, c.dst);
      kv.ReleasePinned();
      counts["tail_hits"] += static_cast<int>(copies.size());
      m.written = match.num_tokens;
      counts["hit_tokens"] += match.num_tokens;
      it = live.emplace(id, std::move(m)).first;
      ++counts["new"];
    } else if (it == live.end()) {
      continue;
    } else if (kind < 6 && !it->second.swapped) {  // append 1..6 tokens
      Model& m = it->second;
      const int32_t n = 1 + pick(6);
      while (static_cast<int32_t>(m.tokens.size()) < m.written + n) {
        m.tokens.push_back(pick(1000));
      }
      std::vector<BlockMove> copies;
      if (!kv.AllocateForWrite(id, m.written, m.written + n, &copies)) {
        ++counts["refused"];
        continue;
      }
      for (const BlockMove& c : copies) copy(kv_bytes, c.src, kv_bytes, c.dst);
      counts["copies"] += static_cast<int>(copies.size());
      const std::vector<BlockId>& table = kv.GetBlockTable(id);
      for (int32_t p = m.written; p < m.written + n; ++p) {
        ASSERT_EQ(kv.pool().ref_count(table[p / kB]), 1) << "shared write";
        kv_bytes[table[p / kB] * kB + p % kB] = m.tokens[p];
      }
      m.written += n;
      kv.CacheComputedBlocks(id, TokenSequence{m.tokens, {}}, m.written, kNs);
      ++counts["append"];
    } else if (kind < 8 && !it->second.swapped) {  // fork onto a free id
      const RequestId child = pick(kIds);
      if (live.contains(child) || it->second.written == 0) continue;
      Model c = it->second;
      c.tokens.resize(c.written);
      kv.Fork(id, child, (c.written + kB - 1) / kB);
      live.emplace(child, std::move(c));
      ++counts["fork"];
    } else if (kind == 8) {  // free, leaving its partial block as a tail
      kv.CachePartialBlock(id, TokenSequence{it->second.tokens, {}},
                           it->second.written, kNs);
      kv.Free(id);
      live.erase(it);
      ++counts["free"];
    } else if (!it->second.swapped) {  // swap out its written blocks
      Model& m = it->second;
      const int32_t blocks = (m.written + kB - 1) / kB;
      if (blocks == 0 || !kv.CanSwapOut(id, blocks)) {
        ++counts["swap_refused"];
        continue;
      }
      std::vector<BlockMove> moves;
      kv.SwapOut(id, blocks, &moves);
      for (const BlockMove& mv : moves) {
        copy(kv_bytes, mv.src, swap_bytes, mv.dst);
      }
      m.swapped = true;
      ++counts["swap_out"];
    } else {  // swap in
      std::vector<BlockMove> moves;
      if (!kv.SwapIn(id, &moves)) {
        ++counts["swap_in_refused"];
        continue;
      }
      for (const BlockMove& mv : moves) {
        copy(swap_bytes, mv.src, kv_bytes, mv.dst);
      }
      it->second.swapped = false;
      ++counts["swap_in"];
    }
    ASSERT_INVARIANTS(kv);
    for (const auto& [rid, m] : live) {
      check(rid, m);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  for (const char* k : {"new", "append", "fork", "free", "swap_out", "swap_in",
                        "copies", "refused"}) {
    EXPECT_GT(counts[k], 30) << k;
  }
  for (const auto& [k, v] : counts) {
    std::printf("%s=%d\n", k.c_str(), v);
  }
  EXPECT_GT(counts["hit_tokens"], 200);
  for (const auto& [rid, m] : live) kv.Free(rid);
  ASSERT_INVARIANTS(kv);
  EXPECT_EQ(kv.num_free_blocks(), kBlocks);
  EXPECT_EQ(kv.Usage().swap_slots_used, 0);
}

}  // namespace
}  // namespace kvserve::kvcache
