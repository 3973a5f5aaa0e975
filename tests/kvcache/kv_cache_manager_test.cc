#include "kvcache/kv_cache_manager.h"

#include <map>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

// 11 blocks of 16 tokens.
class KvCacheManagerTest : public ::testing::Test {
 protected:
  KvCacheManager kv_{11, 16};
};

TEST_F(KvCacheManagerTest, AllocateGrowsTableWithExactIds) {
  EXPECT_EQ(kv_.NumBlocksNeeded(1, 17), 2);
  EXPECT_THAT(kv_.Allocate(1, 17), Optional(ElementsAre(0, 1)));
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.Allocate(1, 32), Optional(IsEmpty()));  // still covered
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.Allocate(1, 33), Optional(ElementsAre(2)));
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.Allocate(2, 16), Optional(ElementsAre(3)));
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.Allocate(1, 49), Optional(ElementsAre(4)));
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.GetBlockTable(1), ElementsAre(0, 1, 2, 4));
  EXPECT_THAT(kv_.GetBlockTable(2), ElementsAre(3));
  EXPECT_EQ(kv_.NumBlocksNeeded(1, 64), 0);
  EXPECT_EQ(kv_.NumBlocksNeeded(1, 65), 1);
  EXPECT_EQ(kv_.NumBlocksNeeded(1, 10), 0);
  EXPECT_EQ(kv_.NumBlocksNeeded(3, 0), 0);
  EXPECT_EQ(kv_.num_requests(), 2);
}

TEST_F(KvCacheManagerTest, AllocateThatDoesNotFitChangesNothing) {
  ASSERT_THAT(kv_.Allocate(1, 160), Optional(testing::SizeIs(10)));
  EXPECT_EQ(kv_.Allocate(2, 17), std::nullopt);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.GetBlockTable(2), IsEmpty());
  EXPECT_EQ(kv_.num_requests(), 1);
  EXPECT_EQ(kv_.Allocate(1, 193), std::nullopt);  // needs 2, 1 free
  ASSERT_INVARIANTS(kv_);
  EXPECT_EQ(kv_.GetBlockTable(1).size(), 10u);
  EXPECT_THAT(kv_.pool().FreeQueue(), ElementsAre(10));
  EXPECT_THAT(kv_.Allocate(2, 16), Optional(ElementsAre(10)));
  ASSERT_INVARIANTS(kv_);
  EXPECT_EQ(kv_.num_free_blocks(), 0);
}

TEST_F(KvCacheManagerTest, FreeReleasesTailFirst) {
  ASSERT_THAT(kv_.Allocate(1, 48), Optional(ElementsAre(0, 1, 2)));
  ASSERT_THAT(kv_.Allocate(2, 20), Optional(ElementsAre(3, 4)));
  EXPECT_EQ(kv_.Free(1), 3);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.pool().FreeQueue(), ElementsAre(5, 6, 7, 8, 9, 10, 2, 1, 0));
  EXPECT_EQ(kv_.Free(2), 2);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.pool().FreeQueue(),
              ElementsAre(5, 6, 7, 8, 9, 10, 2, 1, 0, 4, 3));
  EXPECT_THAT(kv_.GetBlockTable(1), IsEmpty());
  EXPECT_EQ(kv_.Free(1), 0);  // unknown request: nothing to do
  // Reuse follows the queue: never-used blocks, then request 1's tail.
  EXPECT_THAT(kv_.Allocate(3, 16 * 8),
              Optional(ElementsAre(5, 6, 7, 8, 9, 10, 2, 1)));
  ASSERT_INVARIANTS(kv_);
}

TEST_F(KvCacheManagerTest, ForkSharesBlocksByRefCount) {
  ASSERT_THAT(kv_.Allocate(1, 20), Optional(ElementsAre(0, 1)));
  kv_.Fork(1, 2);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.GetBlockTable(2), ElementsAre(0, 1));
  EXPECT_EQ(kv_.pool().ref_count(0), 2);
  EXPECT_EQ(kv_.pool().ref_count(1), 2);
  EXPECT_EQ(kv_.num_free_blocks(), 9);
  EXPECT_THAT(kv_.Allocate(2, 33), Optional(ElementsAre(2)));
  EXPECT_THAT(kv_.Allocate(1, 33), Optional(ElementsAre(3)));
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.GetBlockTable(1), ElementsAre(0, 1, 3));
  EXPECT_THAT(kv_.GetBlockTable(2), ElementsAre(0, 1, 2));

  EXPECT_EQ(kv_.Free(1), 3);  // 3 freed; 0 and 1 drop to ref 1
  ASSERT_INVARIANTS(kv_);
  EXPECT_EQ(kv_.pool().ref_count(0), 1);
  EXPECT_THAT(kv_.pool().FreeQueue(), ElementsAre(4, 5, 6, 7, 8, 9, 10, 3));
  EXPECT_EQ(kv_.Free(2), 3);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.pool().FreeQueue(),
              ElementsAre(4, 5, 6, 7, 8, 9, 10, 3, 2, 1, 0));
}

TEST_F(KvCacheManagerTest, UsageCountsBlocksByState) {
  KvUsage u = kv_.Usage();
  EXPECT_EQ(u.total_blocks, 11);
  EXPECT_EQ(u.free_blocks, 11);
  EXPECT_EQ(u.active_blocks, 0);
  EXPECT_DOUBLE_EQ(u.usage, 0.0);
  ASSERT_TRUE(kv_.Allocate(1, 16 * 4).has_value());
  kv_.Fork(1, 2);  // sharing does not use more blocks
  u = kv_.Usage();
  EXPECT_EQ(u.free_blocks, 7);
  EXPECT_EQ(u.active_blocks, 4);
  EXPECT_EQ(u.cached_evictable_blocks, 0);
  EXPECT_EQ(u.active_blocks + u.free_blocks, u.total_blocks);
  EXPECT_DOUBLE_EQ(u.usage, 4.0 / 11.0);
}

TEST_F(KvCacheManagerTest, ForkMisuseAborts) {
  ASSERT_TRUE(kv_.Allocate(1, 16).has_value());
  ASSERT_TRUE(kv_.Allocate(2, 16).has_value());
  EXPECT_DEATH(kv_.Fork(3, 4), "without blocks");
  EXPECT_DEATH(kv_.Fork(1, 2), "has blocks");
}

// Seeded random grow / fork / free against a model of each request's length.
// Written slots count each block once: a block shared by a fork counts what
// its furthest holder wrote, not the sum.
TEST_F(KvCacheManagerTest, WrittenSlotsCountSharedBlocksOnce) {
  ASSERT_THAT(kv_.Allocate(1, 20), Optional(ElementsAre(0, 1)));
  std::map<RequestId, int32_t> computed = {{1, 20}};
  auto of = [&computed](RequestId id) { return computed[id]; };
  EXPECT_EQ(kv_.WrittenSlots(of), 20);
  kv_.Fork(1, 2);  // block 1 (4 tokens written) is shared
  computed[2] = 20;
  EXPECT_EQ(kv_.WrittenSlots(of), 20);
  // The child copies block 1 before writing token 20 of its own.
  std::vector<BlockMove> copies;
  ASSERT_TRUE(kv_.AllocateForWrite(2, 20, 21, &copies));
  ASSERT_THAT(copies, ElementsAre(BlockMove{1, 2}));
  computed[2] = 21;
  EXPECT_EQ(kv_.WrittenSlots(of), 16 + 4 + 5);
  // Allocated but unwritten slots do not count.
  ASSERT_TRUE(kv_.Allocate(1, 40).has_value());
  EXPECT_EQ(kv_.WrittenSlots(of), 16 + 4 + 5);
  computed[1] = 40;
  EXPECT_EQ(kv_.WrittenSlots(of), 16 + 16 + 8 + 5);
}

// Evictions count under the reason the caller gives.
TEST_F(KvCacheManagerTest, DropBlocksReleasesAMiddleRangeAndStopsCaching) {
  std::vector<int32_t> prompt(80);
  for (int32_t i = 0; i < 80; ++i) prompt[i] = 500 + i;
  const TokenSequence tokens{prompt, {}};
  ASSERT_THAT(kv_.Allocate(1, 80), Optional(ElementsAre(0, 1, 2, 3, 4)));
  kv_.CacheComputedBlocks(1, tokens, 32, /*ns=*/0);  // blocks 0, 1 hashed
  kv_.Fork(1, 2);  // block 2 is shared: the drop only loses 1's reference
  kv_.DropBlocks(1, 1, 2);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.GetBlockTable(1), ElementsAre(0, 3, 4));
  EXPECT_EQ(kv_.pool().ref_count(1), 1);  // the child's
  EXPECT_EQ(kv_.pool().ref_count(2), 1);
  kv_.Free(2);
  // Hashed block 1 is cached-evictable (its content is still what its key
  // says), unhashed block 2 is free.
  EXPECT_EQ(kv_.Usage().cached_evictable_blocks, 1);
  // Nothing registers after a drop, whatever is computed.
  kv_.CacheComputedBlocks(1, tokens, 80, 0);
  EXPECT_EQ(kv_.Usage().cached_evictable_blocks, 1);
  // Blocks 0 and 1, computed before the drop, are still found.
  EXPECT_EQ(kv_.FindCachedPrefix(tokens, 0).blocks.size(), 2u);
  ASSERT_INVARIANTS(kv_);
  EXPECT_EQ(kv_.Free(1), 3);
  ASSERT_INVARIANTS(kv_);
}

TEST_F(KvCacheManagerTest, DropBlocksMisuseAborts) {
  ASSERT_TRUE(kv_.Allocate(1, 48).has_value());
  EXPECT_DEATH(kv_.DropBlocks(1, 1, 2), "drop of 2 blocks at 1");
  EXPECT_DEATH(kv_.DropBlocks(7, 0, 1), "without blocks");
}

TEST(KvCacheManagerEvictionTest, EvictionsCountByReason) {
  KvCacheManager kv(2, 4);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(kv.Allocate(1, 8).has_value());
  kv.CacheComputedBlocks(1, TokenSequence{tokens, {}}, 8, 0);
  kv.Free(1);  // both blocks cached, evictable
  std::vector<Eviction> seen;
  kv.set_eviction_observer([&seen](const Eviction& e) { seen.push_back(e); });
  ASSERT_TRUE(kv.Allocate(2, 4, EvictReason::kAdmit).has_value());
  ASSERT_TRUE(kv.Allocate(2, 8).has_value());  // grow by default
  EXPECT_EQ(kv.pool().evictions(EvictReason::kAdmit), 1);
  EXPECT_EQ(kv.pool().evictions(EvictReason::kGrow), 1);
  EXPECT_EQ(kv.pool().evictions(EvictReason::kSwapIn), 0);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].reason, EvictReason::kAdmit);
  EXPECT_EQ(seen[1].reason, EvictReason::kGrow);
  EXPECT_GE(seen[0].age_seconds, 0);
}

TEST(KvCacheManagerSoakTest, RandomOpsKeepInvariantsAndEndAllFree) {
  constexpr int32_t kBlocks = 64;
  constexpr int32_t kBlockSize = 4;
  constexpr RequestId kIds = 20;
  KvCacheManager kv(kBlocks, kBlockSize);
  std::mt19937 rng(7);
  std::map<RequestId, int64_t> tokens;  // requests holding blocks
  auto pick = [&](int64_t n) {
    return std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
  };
  int grown = 0, refused = 0, forks = 0, frees = 0;
  for (int op = 0; op < 10000; ++op) {
    const RequestId id = pick(kIds);
    const int kind = static_cast<int>(pick(10));
    if (kind < 6) {  // grow (or create) by 1..24 tokens
      const int64_t total =
          (tokens.contains(id) ? tokens[id] : 0) + 1 + pick(24);
      const int32_t needed = kv.NumBlocksNeeded(id, total);
      const bool fits = needed <= kv.num_free_blocks();
      const auto fresh = kv.Allocate(id, total);
      ASSERT_EQ(fresh.has_value(), fits);
      if (fresh.has_value()) {
        ASSERT_EQ(static_cast<int32_t>(fresh->size()), needed);
        tokens[id] = total;
        ++grown;
      } else {
        ++refused;
      }
    } else if (kind < 8) {  // fork onto an id without blocks
      const RequestId child = pick(kIds);
      if (tokens.contains(id) && !tokens.contains(child)) {
        kv.Fork(id, child);
        tokens[child] = tokens[id];
        ++forks;
      }
    } else {  // free
      const int32_t expected =
          tokens.contains(id)
              ? static_cast<int32_t>((tokens[id] + kBlockSize - 1) / kBlockSize)
              : 0;
      ASSERT_EQ(kv.Free(id), expected);
      tokens.erase(id);
      ++frees;
    }
    ASSERT_INVARIANTS(kv);
    for (const auto& [rid, n] : tokens) {
      ASSERT_EQ(static_cast<int64_t>(kv.GetBlockTable(rid).size()),
                (n + kBlockSize - 1) / kBlockSize)
          << "request " << rid << " op " << op;
    }
  }
  EXPECT_GT(grown, 1000);
  EXPECT_GT(refused, 100);
  EXPECT_GT(forks, 100);
  EXPECT_GT(frees, 1000);
  for (const auto& [rid, n] : tokens) kv.Free(rid);
  ASSERT_INVARIANTS(kv);
  EXPECT_EQ(kv.num_free_blocks(), kBlocks);
  EXPECT_EQ(kv.num_requests(), 0);
  EXPECT_EQ(kv.pool().FreeQueue().size(), static_cast<size_t>(kBlocks));
}

}  // namespace
}  // namespace kvserve::kvcache
