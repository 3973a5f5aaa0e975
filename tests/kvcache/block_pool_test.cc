#include "kvcache/block_pool.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::kvcache {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
using ::testing::Optional;

#define ASSERT_INVARIANTS(pool)                            \
  do {                                                     \
    const absl::Status kv_inv_ = (pool).CheckInvariants(); \
    ASSERT_TRUE(kv_inv_.ok()) << kv_inv_;                  \
  } while (0)

std::vector<BlockId> Range(BlockId begin, BlockId end) {
  std::vector<BlockId> out;
  for (BlockId b = begin; b < end; ++b) out.push_back(b);
  return out;
}

std::vector<BlockId> Concat(std::vector<BlockId> a,
                            const std::vector<BlockId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(BlockPoolTest, StartsAllFreeInIdOrder) {
  BlockPool pool(11);
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.num_blocks(), 11);
  EXPECT_EQ(pool.num_free(), 11);
  EXPECT_EQ(pool.num_active(), 0);
  EXPECT_EQ(pool.num_cached_evictable(), 0);
  EXPECT_THAT(pool.FreeQueue(), ElementsAreArray(Range(0, 11)));
}

TEST(BlockPoolTest, AllocatePopsFromHead) {
  BlockPool pool(11);
  EXPECT_THAT(pool.Allocate(3), ElementsAre(0, 1, 2));
  ASSERT_INVARIANTS(pool);
  EXPECT_THAT(pool.Allocate(0), IsEmpty());
  ASSERT_INVARIANTS(pool);
  EXPECT_THAT(pool.Allocate(2), ElementsAre(3, 4));
  ASSERT_INVARIANTS(pool);
  for (BlockId b : Range(0, 5)) EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.ref_count(5), 0);
  EXPECT_EQ(pool.num_free(), 6);
  EXPECT_EQ(pool.num_active(), 5);
  EXPECT_THAT(pool.FreeQueue(), ElementsAreArray(Range(5, 11)));
}

TEST(BlockPoolTest, FreeAppendsToTailInGivenOrder) {
  BlockPool pool(11);
  ASSERT_THAT(pool.Allocate(4), ElementsAre(0, 1, 2, 3));
  const std::vector<BlockId> tail_first = {3, 2, 1, 0};
  pool.Free(tail_first);
  ASSERT_INVARIANTS(pool);
  EXPECT_THAT(pool.FreeQueue(),
              ElementsAreArray(Concat(Range(4, 11), {3, 2, 1, 0})));
  // Eviction order is the queue order: the old tail 3 goes before 0.
  EXPECT_THAT(pool.Allocate(9), ElementsAreArray(Concat(Range(4, 11), {3, 2})));
  ASSERT_INVARIANTS(pool);
  EXPECT_THAT(pool.FreeQueue(), ElementsAre(1, 0));
}

TEST(BlockPoolTest, AllocateAllThenFreeOneByOne) {
  BlockPool pool(11);
  ASSERT_THAT(pool.Allocate(11), ElementsAreArray(Range(0, 11)));
  ASSERT_INVARIANTS(pool);
  EXPECT_THAT(pool.FreeQueue(), IsEmpty());
  EXPECT_EQ(pool.num_free(), 0);
  for (BlockId b : {7, 2, 9}) {
    pool.Free({b});
    ASSERT_INVARIANTS(pool);
  }
  EXPECT_THAT(pool.FreeQueue(), ElementsAre(7, 2, 9));
  EXPECT_EQ(pool.num_active(), 8);
}

TEST(BlockPoolTest, TouchSharesActiveBlock) {
  BlockPool pool(11);
  ASSERT_THAT(pool.Allocate(2), ElementsAre(0, 1));
  pool.Touch({0});
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.ref_count(0), 2);
  pool.Free({0});
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.ref_count(0), 1);
  EXPECT_THAT(pool.FreeQueue(), ElementsAreArray(Range(2, 11)));
  pool.Free({0});
  ASSERT_INVARIANTS(pool);
  EXPECT_THAT(pool.FreeQueue(), ElementsAreArray(Concat(Range(2, 11), {0})));
}

TEST(BlockPoolTest, CachedBlockStaysFindableUntilEvicted) {
  BlockPool pool(11);
  ASSERT_THAT(pool.Allocate(2), ElementsAre(0, 1));
  EXPECT_TRUE(pool.CacheBlock(0, 0xA));
  ASSERT_INVARIANTS(pool);
  EXPECT_THAT(pool.GetCachedBlock(0xA), Optional(0));
  EXPECT_THAT(pool.block_hash(0), Optional(0xAu));
  EXPECT_EQ(pool.num_cached_evictable(), 0);  // still active

  pool.Free({1, 0});  // active -> free, active -> cached
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.num_cached_evictable(), 1);
  EXPECT_EQ(pool.num_free(), 11);
  EXPECT_THAT(pool.FreeQueue(), ElementsAreArray(Concat(Range(2, 11), {1, 0})));
  EXPECT_THAT(pool.GetCachedBlock(0xA), Optional(0));

  pool.Touch({0});  // cached -> active: leaves the queue from its tail
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.ref_count(0), 1);
  EXPECT_EQ(pool.num_cached_evictable(), 0);
  EXPECT_THAT(pool.FreeQueue(), ElementsAreArray(Concat(Range(2, 11), {1})));

  pool.Free({0});  // active -> cached
  ASSERT_INVARIANTS(pool);
  // Allocating everything evicts it last (cached -> free -> active).
  EXPECT_THAT(pool.Allocate(11),
              ElementsAreArray(Concat(Range(2, 11), {1, 0})));
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.GetCachedBlock(0xA), std::nullopt);
  EXPECT_EQ(pool.block_hash(0), std::nullopt);
  EXPECT_EQ(pool.num_cached_evictable(), 0);
}

TEST(BlockPoolTest, TouchRemovesCachedBlockFromMiddleOfQueue) {
  BlockPool pool(11);
  ASSERT_THAT(pool.Allocate(3), ElementsAre(0, 1, 2));
  for (BlockId b : {0, 1, 2}) ASSERT_TRUE(pool.CacheBlock(b, 100 + b));
  pool.Free({2, 1, 0});
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.num_cached_evictable(), 3);
  pool.Touch({1});
  ASSERT_INVARIANTS(pool);
  EXPECT_THAT(pool.FreeQueue(), ElementsAreArray(Concat(Range(3, 11), {2, 0})));
  pool.Touch({1});  // a second owner of a cached block now active
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.ref_count(1), 2);
  EXPECT_EQ(pool.num_cached_evictable(), 2);
  // Evicting the first cached block (2) forgets its hash only.
  EXPECT_THAT(pool.Allocate(9), ElementsAreArray(Concat(Range(3, 11), {2})));
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.GetCachedBlock(102), std::nullopt);
  EXPECT_THAT(pool.GetCachedBlock(100), Optional(0));
  EXPECT_THAT(pool.GetCachedBlock(101), Optional(1));
}

TEST(BlockPoolTest, DuplicateHashStaysUncached) {
  BlockPool pool(11);
  ASSERT_THAT(pool.Allocate(2), ElementsAre(0, 1));
  EXPECT_TRUE(pool.CacheBlock(0, 7));
  EXPECT_FALSE(pool.CacheBlock(1, 7));
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.block_hash(1), std::nullopt);
  EXPECT_THAT(pool.GetCachedBlock(7), Optional(0));
  pool.Free({1});  // active -> free (no hash)
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.num_cached_evictable(), 0);
}

TEST(BlockPoolDeathTest, MisuseAborts) {
  BlockPool pool(3);
  EXPECT_DEATH(pool.Free({0}), "freed at ref 0");
  EXPECT_DEATH((void)pool.Allocate(4), "num_free=3");
  EXPECT_DEATH(pool.Touch({1}), "touched while plain free");
  EXPECT_DEATH(pool.Free({3}), "outside");
}

// Random allocate / share / cache / hit / free against a reference model of
// who holds which references.
TEST(BlockPoolTest, RandomSoakKeepsInvariants) {
  constexpr int32_t kBlocks = 37;
  BlockPool pool(kBlocks);
  std::mt19937 rng(20240611);
  std::vector<BlockId> refs;  // one entry per reference held
  uint64_t next_hash = 1;
  int hits = 0, evictions = 0;
  auto pick = [&](size_t n) {
    return std::uniform_int_distribution<size_t>(0, n - 1)(rng);
  };
  for (int op = 0; op < 20000; ++op) {
    switch (pick(5)) {
      case 0: {  // allocate
        const int32_t n = static_cast<int32_t>(pick(pool.num_free() + 1));
        const int32_t evictable = pool.num_cached_evictable();
        for (BlockId b : pool.Allocate(n)) refs.push_back(b);
        evictions += evictable - pool.num_cached_evictable();
        break;
      }
      case 1:  // free a few references
        for (size_t k = pick(4); k > 0 && !refs.empty(); --k) {
          const size_t i = pick(refs.size());
          pool.Free({refs[i]});
          refs[i] = refs.back();
          refs.pop_back();
        }
        break;
      case 2:  // share an active block
        if (!refs.empty()) {
          const BlockId b = refs[pick(refs.size())];
          pool.Touch({b});
          refs.push_back(b);
        }
        break;
      case 3:  // cache an active block
        if (!refs.empty()) {
          const BlockId b = refs[pick(refs.size())];
          if (!pool.block_hash(b).has_value()) {
            // Mostly new hashes; sometimes an earlier one, which may be
            // live (refused), stale after eviction (overwritten) or unused.
            const BlockHash h = pick(4) == 0 ? BlockHash{1 + pick(next_hash)}
                                             : BlockHash{next_hash++};
            const bool taken = pool.GetCachedBlock(h).has_value();
            ASSERT_EQ(pool.CacheBlock(b, h), !taken);
            if (!taken) {
              EXPECT_THAT(pool.GetCachedBlock(h), Optional(b));
            }
          }
        }
        break;
      case 4: {  // prefix hit on some earlier hash
        const auto b = pool.GetCachedBlock(1 + pick(next_hash));
        if (b.has_value()) {
          pool.Touch({*b});
          refs.push_back(*b);
          ++hits;
        }
        break;
      }
    }
    ASSERT_INVARIANTS(pool);
    if (op % 97 == 0) {
      for (BlockId b = 0; b < kBlocks; ++b) {
        ASSERT_EQ(pool.ref_count(b), std::count(refs.begin(), refs.end(), b))
            << "block " << b << " op " << op;
      }
    }
  }
  EXPECT_GT(hits, 500);
  EXPECT_GT(evictions, 500);
  pool.Free(refs);
  ASSERT_INVARIANTS(pool);
  EXPECT_EQ(pool.num_free(), kBlocks);
  EXPECT_EQ(pool.num_active(), 0);
}

// Lazy deletion: eviction leaves a stale map entry; lookups treat it as a
// miss and caching the same hash again overwrites it.
TEST(BlockPoolTest, StaleEntryMissesAndIsOverwritten) {
  BlockPool pool(2);
  const std::vector<BlockId> both = pool.Allocate(2);
  ASSERT_TRUE(pool.CacheBlock(0, 5));
  pool.Free(both);  // 1 free, 0 cached; queue 0, 1
  ASSERT_INVARIANTS(pool);
  // Evict 0 and give it a different hash: the entry 5 -> 0 is stale.
  EXPECT_THAT(pool.Allocate(1), ElementsAre(0));
  EXPECT_EQ(pool.GetCachedBlock(5), std::nullopt);
  ASSERT_INVARIANTS(pool);
  ASSERT_TRUE(pool.CacheBlock(0, 6));
  EXPECT_EQ(pool.GetCachedBlock(5), std::nullopt);
  EXPECT_THAT(pool.GetCachedBlock(6), Optional(0));
  ASSERT_INVARIANTS(pool);
  // Caching 5 again (on block 1) overwrites the stale entry, not a duplicate.
  EXPECT_THAT(pool.Allocate(1), ElementsAre(1));
  EXPECT_TRUE(pool.CacheBlock(1, 5));
  EXPECT_THAT(pool.GetCachedBlock(5), Optional(1));
  EXPECT_THAT(pool.GetCachedBlock(6), Optional(0));
  EXPECT_LE(pool.hash_map_size(), 2);
  ASSERT_INVARIANTS(pool);
  // A live duplicate is still refused.
  pool.Free({0});
  EXPECT_THAT(pool.Allocate(1), ElementsAre(0));  // evicts 6
  EXPECT_FALSE(pool.CacheBlock(0, 5));
  EXPECT_TRUE(pool.CacheBlock(0, 6));  // its own stale entry, overwritten
  ASSERT_INVARIANTS(pool);
}

// Fill the cache, evict everything with new hashes, many times over: the
// map stays within num_blocks entries (a block's stale entry goes when it is
// cached again) and every evicted hash misses, while the current generation
// hits. Every third round caches only half the blocks, so the other half
// keep stale entries across rounds.
TEST(BlockPoolTest, RepeatedFullEvictionKeepsMapBounded) {
  constexpr int32_t kBlocks = 64;
  constexpr int kRounds = 200;
  BlockPool pool(kBlocks);
  auto hash = [](int round, int32_t i) { return uint64_t{1000} * round + i; };
  for (int round = 0; round < kRounds; ++round) {
    const std::vector<BlockId> blocks = pool.Allocate(kBlocks);  // evicts all
    ASSERT_EQ(pool.num_cached_evictable(), 0);
    ASSERT_INVARIANTS(pool);
    const int32_t cached = round % 3 == 2 ? kBlocks / 2 : kBlocks;
    for (int32_t i = 0; i < kBlocks; ++i) {
      for (int back = 1; back <= 3 && back <= round; ++back) {
        ASSERT_EQ(pool.GetCachedBlock(hash(round - back, i)), std::nullopt)
            << "round " << round << " i " << i;
      }
      if (i < cached) ASSERT_TRUE(pool.CacheBlock(blocks[i], hash(round, i)));
      ASSERT_LE(pool.hash_map_size(), kBlocks);
    }
    pool.Free(blocks);
    ASSERT_EQ(pool.num_cached_evictable(), cached);
    for (int32_t i = 0; i < cached; ++i) {
      ASSERT_THAT(pool.GetCachedBlock(hash(round, i)), Optional(blocks[i]));
    }
    ASSERT_LE(pool.hash_map_size(), kBlocks) << "round " << round;
    ASSERT_INVARIANTS(pool);
  }
  // No hash of any earlier generation is findable.
  for (int round = 0; round + 1 < kRounds; ++round) {
    for (int32_t i = 0; i < kBlocks; ++i) {
      ASSERT_EQ(pool.GetCachedBlock(hash(round, i)), std::nullopt);
    }
  }
}

// Each eviction is reported with its reason, how long the block sat
// evictable, and the hits it served; a plain free block is no eviction.
TEST(BlockPoolTest, EvictionsReportReasonAgeAndReuses) {
  BlockPool pool(3);
  std::vector<Eviction> seen;
  pool.set_eviction_observer([&seen](const Eviction& e) { seen.push_back(e); });
  const std::vector<BlockId> a = pool.Allocate(2);
  ASSERT_TRUE(pool.CacheBlock(a[0], 11));
  ASSERT_TRUE(pool.CacheBlock(a[1], 12));
  pool.RecordHits({a[0]});
  pool.RecordHits({a[0]});
  pool.Free(a);  // both cached; block 2 is plain free at the head
  EXPECT_THAT(pool.FreeQueue(), ElementsAre(2, a[0], a[1]));
  const std::vector<BlockId> b = pool.Allocate(2, EvictReason::kSwapIn);
  EXPECT_THAT(b, ElementsAre(2, a[0]));
  ASSERT_EQ(seen.size(), 1u);  // block 2 was free, not cached
  EXPECT_EQ(seen[0].reason, EvictReason::kSwapIn);
  EXPECT_EQ(seen[0].reuses, 2);
  EXPECT_GE(seen[0].age_seconds, 0.0);
  EXPECT_LT(seen[0].age_seconds, 60.0);
  EXPECT_EQ(pool.evictions(EvictReason::kSwapIn), 1);
  const std::vector<BlockId> c = pool.Allocate(1, EvictReason::kCopyOnWrite);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].reason, EvictReason::kCopyOnWrite);
  EXPECT_EQ(seen[1].reuses, 0);
  EXPECT_EQ(pool.evictions(EvictReason::kCopyOnWrite), 1);
  EXPECT_EQ(
      pool.evictions(EvictReason::kAdmit) + pool.evictions(EvictReason::kGrow),
      0);
  // A reused block starts counting hits again from zero.
  pool.Free(b);
  pool.Free(c);
  ASSERT_INVARIANTS(pool);
}

}  // namespace
}  // namespace kvserve::kvcache
