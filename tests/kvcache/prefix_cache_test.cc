// Prefix caching in KvCacheManager: exact block ids on hits, LRU eviction of
// cached blocks (tails first), token/namespace comparison on hash hits, and
// salts that never share.
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/block_hash.h"
#include "kvcache/kv_cache_manager.h"

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

std::vector<int32_t> Iota(int32_t begin, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = begin + i;
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a,
                            const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TokenSequence Seq(const std::vector<int32_t>& prompt) { return {prompt, {}}; }

// Every block collides with every other block at the same depth: only the
// stored tokens and namespace tell them apart.
BlockHash CollidingHash(BlockHash parent, BlockHash /*ns*/,
                        absl::Span<const int32_t> /*tokens*/) {
  return parent + 1;
}

const BlockHash kNs = NamespaceHash("model", "");

// 11 blocks of 4 tokens.
class PrefixCacheTest : public ::testing::Test {
 protected:
  // Allocates `id` for all of `prompt` (after its cached prefix), marks it
  // computed and registers its full blocks. Returns the cached tokens.
  int32_t Prefill(KvCacheManager& kv, RequestId id,
                  const std::vector<int32_t>& prompt, BlockHash ns = kNs) {
    const PrefixMatch match = kv.FindCachedPrefix(Seq(prompt), ns);
    EXPECT_TRUE(kv.AllocateWithPrefix(id, match, prompt.size()).has_value());
    kv.CacheComputedBlocks(id, Seq(prompt), prompt.size(), ns);
    return match.num_tokens;
  }

  KvCacheManager kv_{11, 4};
};

TEST_F(PrefixCacheTest, HitReusesExactBlockIds) {
  const std::vector<int32_t> a = Iota(0, 10);  // 2 full blocks + 2 tokens
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(a), kNs).num_tokens, 0);
  const PrefixMatch none = kv_.FindCachedPrefix(Seq(a), kNs);
  EXPECT_THAT(kv_.AllocateWithPrefix(1, none, 10),
              Optional(ElementsAre(0, 1, 2)));
  ASSERT_INVARIANTS(kv_);
  kv_.CacheComputedBlocks(1, Seq(a), 6, kNs);  // only block 0 is computed
  ASSERT_INVARIANTS(kv_);
  EXPECT_TRUE(kv_.pool().block_hash(0).has_value());
  EXPECT_FALSE(kv_.pool().block_hash(1).has_value());
  kv_.CacheComputedBlocks(1, Seq(a), 10, kNs);
  ASSERT_INVARIANTS(kv_);
  EXPECT_TRUE(kv_.pool().block_hash(1).has_value());
  EXPECT_FALSE(kv_.pool().block_hash(2).has_value());  // partial

  // A live hit shares the blocks.
  const std::vector<int32_t> b = Concat(Iota(0, 8), {50, 51, 52});
  const PrefixMatch live = kv_.FindCachedPrefix(Seq(b), kNs);
  EXPECT_EQ(live.num_tokens, 8);
  EXPECT_THAT(live.blocks, ElementsAre(0, 1));
  EXPECT_EQ(live.num_evictable, 0);
  EXPECT_THAT(kv_.AllocateWithPrefix(2, live, 11), Optional(ElementsAre(3)));
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.GetBlockTable(2), ElementsAre(0, 1, 3));
  EXPECT_EQ(kv_.pool().ref_count(0), 2);

  // Tail-first frees: 2, then 3; 1 and 0 (hashed) become evictable last.
  EXPECT_EQ(kv_.Free(1), 3);
  ASSERT_INVARIANTS(kv_);
  EXPECT_EQ(kv_.Free(2), 3);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.pool().FreeQueue(),
              ElementsAre(4, 5, 6, 7, 8, 9, 10, 2, 3, 1, 0));
  EXPECT_EQ(kv_.pool().num_cached_evictable(), 2);

  // An evictable hit: cached -> active, out of the middle of the queue.
  const PrefixMatch cached = kv_.FindCachedPrefix(Seq(a), kNs);
  EXPECT_THAT(cached.blocks, ElementsAre(0, 1));
  EXPECT_EQ(cached.num_evictable, 2);
  EXPECT_THAT(kv_.AllocateWithPrefix(3, cached, 10), Optional(ElementsAre(4)));
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.GetBlockTable(3), ElementsAre(0, 1, 4));
  EXPECT_THAT(kv_.pool().FreeQueue(), ElementsAre(5, 6, 7, 8, 9, 10, 2, 3));
}

TEST_F(PrefixCacheTest, LastTokenIsNeverCached) {
  const std::vector<int32_t> a = Iota(0, 8);  // exactly 2 blocks
  EXPECT_EQ(Prefill(kv_, 1, a), 0);
  ASSERT_INVARIANTS(kv_);
  EXPECT_TRUE(kv_.pool().block_hash(1).has_value());
  // Full blocks, then the first tokens of block 1 as a tail.
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(a), kNs).num_tokens, 7);
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(Iota(0, 9)), kNs).num_tokens, 8);
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(Iota(0, 5)), kNs).num_tokens, 4);
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(Iota(0, 4)), kNs).num_tokens, 3);
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(Iota(0, 1)), kNs).num_tokens, 0);
  ASSERT_INVARIANTS(kv_);
}

TEST_F(PrefixCacheTest, OutputTokensHashLikePromptTokens) {
  const std::vector<int32_t> prompt = Iota(0, 6);
  const std::vector<int32_t> output = Iota(6, 4);
  const TokenSequence seq{prompt, output};
  ASSERT_TRUE(kv_.AllocateWithPrefix(1, {}, 10).has_value());
  kv_.CacheComputedBlocks(1, seq, 9, kNs);  // tokens 0..8 computed
  ASSERT_INVARIANTS(kv_);
  const PrefixMatch m = kv_.FindCachedPrefix(Seq(Iota(0, 10)), kNs);
  EXPECT_THAT(m.blocks, ElementsAre(0, 1));
}

TEST_F(PrefixCacheTest, EvictionIsLruTailFirst) {
  KvCacheManager kv(6, 4);
  EXPECT_EQ(Prefill(kv, 1, Iota(0, 12)), 0);  // blocks 0 1 2, all hashed
  EXPECT_EQ(kv.Free(1), 3);
  ASSERT_INVARIANTS(kv);
  EXPECT_THAT(kv.pool().FreeQueue(), ElementsAre(3, 4, 5, 2, 1, 0));
  EXPECT_EQ(kv.pool().num_cached_evictable(), 3);
  const std::vector<int32_t> probe = Iota(0, 13);
  EXPECT_EQ(kv.FindCachedPrefix(Seq(probe), kNs).num_tokens, 12);

  // Four fresh blocks: never-cached ones first, then the tail block 2.
  EXPECT_THAT(kv.Allocate(2, 16), Optional(ElementsAre(3, 4, 5, 2)));
  ASSERT_INVARIANTS(kv);
  EXPECT_FALSE(kv.pool().block_hash(2).has_value());
  EXPECT_EQ(kv.pool().num_cached_evictable(), 2);
  EXPECT_THAT(kv.FindCachedPrefix(Seq(probe), kNs).blocks, ElementsAre(0, 1));

  EXPECT_THAT(kv.Allocate(3, 4), Optional(ElementsAre(1)));  // then 1
  ASSERT_INVARIANTS(kv);
  EXPECT_THAT(kv.FindCachedPrefix(Seq(probe), kNs).blocks, ElementsAre(0));
  EXPECT_THAT(kv.Allocate(4, 4), Optional(ElementsAre(0)));  // then the head
  ASSERT_INVARIANTS(kv);
  EXPECT_THAT(kv.FindCachedPrefix(Seq(probe), kNs).blocks, IsEmpty());
  EXPECT_EQ(kv.pool().num_cached_evictable(), 0);
}

TEST_F(PrefixCacheTest, AdmissionCountsEvictableMatchedBlocks) {
  KvCacheManager kv(4, 4);
  EXPECT_EQ(Prefill(kv, 1, Iota(0, 12)), 0);
  kv.Free(1);
  ASSERT_INVARIANTS(kv);
  const PrefixMatch m = kv.FindCachedPrefix(Seq(Iota(0, 13)), kNs);
  EXPECT_EQ(m.num_evictable, 3);
  // 3 evictable matched + 1 fresh = 4 = every free block.
  EXPECT_TRUE(kv.CanAllocateWithPrefix(m, 13, 0));
  EXPECT_FALSE(kv.CanAllocateWithPrefix(m, 13, 1));
  EXPECT_FALSE(kv.CanAllocateWithPrefix(m, 17, 0));
  EXPECT_EQ(kv.AllocateWithPrefix(2, m, 17), std::nullopt);
  ASSERT_INVARIANTS(kv);
  EXPECT_EQ(kv.num_requests(), 0);
  EXPECT_THAT(kv.AllocateWithPrefix(2, m, 13), Optional(ElementsAre(3)));
  ASSERT_INVARIANTS(kv);
  EXPECT_THAT(kv.GetBlockTable(2), ElementsAre(0, 1, 2, 3));
}

TEST_F(PrefixCacheTest, TokenComparisonPreventsFalseHit) {
  KvCacheManager kv(11, 4, &CollidingHash);
  EXPECT_EQ(Prefill(kv, 1, Iota(0, 9)), 0);
  ASSERT_INVARIANTS(kv);
  // Same hashes, other tokens: the stored tokens say no.
  const std::vector<int32_t> other = Iota(50, 9);
  ASSERT_TRUE(
      kv.pool().GetCachedBlock(CollidingHash(0, kNs, other)).has_value());
  EXPECT_EQ(kv.FindCachedPrefix(Seq(other), kNs).num_tokens, 0);
  // The second block differs: the first still matches.
  const std::vector<int32_t> half = Concat(Iota(0, 4), Iota(60, 5));
  EXPECT_THAT(kv.FindCachedPrefix(Seq(half), kNs).blocks, ElementsAre(0));
  // Equal tokens still hit.
  EXPECT_THAT(kv.FindCachedPrefix(Seq(Iota(0, 9)), kNs).blocks,
              ElementsAre(0, 1));
  // Another namespace under the same hashes: the stored namespace says no.
  EXPECT_EQ(kv.FindCachedPrefix(Seq(Iota(0, 9)), NamespaceHash("model", "b"))
                .num_tokens,
            0);
  // Colliding content computed by another request stays unhashed.
  EXPECT_EQ(Prefill(kv, 2, other), 0);
  ASSERT_INVARIANTS(kv);
  EXPECT_THAT(kv.GetBlockTable(2), ElementsAre(3, 4, 5));
  EXPECT_FALSE(kv.pool().block_hash(3).has_value());
}

TEST_F(PrefixCacheTest, DifferentSaltsNeverShareBlocks) {
  const BlockHash a = NamespaceHash("model", "tenant-a");
  const BlockHash b = NamespaceHash("model", "tenant-b");
  EXPECT_NE(a, b);
  EXPECT_NE(NamespaceHash("ab", "c"), NamespaceHash("a", "bc"));
  EXPECT_NE(NamespaceHash("m1", ""), NamespaceHash("m2", ""));
  const std::vector<int32_t> prompt = Iota(0, 9);
  EXPECT_EQ(Prefill(kv_, 1, prompt, a), 0);
  EXPECT_EQ(Prefill(kv_, 2, prompt, b), 0);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.GetBlockTable(1), ElementsAre(0, 1, 2));
  EXPECT_THAT(kv_.GetBlockTable(2), ElementsAre(3, 4, 5));
  EXPECT_TRUE(kv_.pool().block_hash(3).has_value());
  kv_.Free(1);
  kv_.Free(2);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.FindCachedPrefix(Seq(prompt), a).blocks, ElementsAre(0, 1));
  EXPECT_THAT(kv_.FindCachedPrefix(Seq(prompt), b).blocks, ElementsAre(3, 4));
  EXPECT_THAT(kv_.FindCachedPrefix(Seq(prompt), kNs).blocks, IsEmpty());
}

TEST_F(PrefixCacheTest, ConcurrentDuplicateStaysUncached) {
  const std::vector<int32_t> prompt = Iota(0, 9);
  ASSERT_TRUE(kv_.AllocateWithPrefix(1, {}, 9).has_value());
  ASSERT_TRUE(kv_.AllocateWithPrefix(2, {}, 9).has_value());
  kv_.CacheComputedBlocks(1, Seq(prompt), 9, kNs);
  kv_.CacheComputedBlocks(2, Seq(prompt), 9, kNs);
  ASSERT_INVARIANTS(kv_);
  EXPECT_FALSE(kv_.pool().block_hash(3).has_value());
  EXPECT_FALSE(kv_.pool().block_hash(4).has_value());
  kv_.Free(1);
  kv_.Free(2);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.FindCachedPrefix(Seq(prompt), kNs).blocks, ElementsAre(0, 1));
  EXPECT_EQ(kv_.pool().num_cached_evictable(), 2);
}

TEST_F(PrefixCacheTest, ForkedChildKeepsHashingFromParent) {
  EXPECT_EQ(Prefill(kv_, 1, Iota(0, 8)), 0);  // blocks 0 1, both hashed
  kv_.Fork(1, 2);
  ASSERT_INVARIANTS(kv_);
  const std::vector<int32_t> longer = Iota(0, 13);
  EXPECT_THAT(kv_.Allocate(2, 12), Optional(ElementsAre(2)));
  kv_.CacheComputedBlocks(2, Seq(longer), 12, kNs);
  ASSERT_INVARIANTS(kv_);
  EXPECT_THAT(kv_.FindCachedPrefix(Seq(longer), kNs).blocks,
              ElementsAre(0, 1, 2));
}

// Request 1 computes all of `prompt`, registers its full blocks and its
// partial last block, and ends.
void ServeAndEnd(KvCacheManager& kv, RequestId id,
                 const std::vector<int32_t>& prompt, BlockHash ns = kNs) {
  const PrefixMatch m = kv.FindCachedPrefix(Seq(prompt), ns);
  std::vector<BlockMove> copies;
  ASSERT_TRUE(kv.AllocateWithPrefix(id, m, prompt.size(), &copies));
  kv.CacheComputedBlocks(id, Seq(prompt), prompt.size(), ns);
  kv.CachePartialBlock(id, Seq(prompt), prompt.size(), ns);
  kv.Free(id);
  kv.ReleasePinned();
}

TEST_F(PrefixCacheTest, ExactRepeatTakesThePartialTailByCopy) {
  const std::vector<int32_t> a = Iota(0, 10);  // blocks 0, 1 full; 2 partial
  ServeAndEnd(kv_, 1, a);
  ASSERT_INVARIANTS(kv_);
  const PrefixMatch m = kv_.FindCachedPrefix(Seq(a), kNs);
  EXPECT_THAT(m.blocks, ElementsAre(0, 1));
  EXPECT_EQ(m.tail_block, 2);
  EXPECT_EQ(m.tail_tokens, 1);  // token 9 is recomputed for its logits
  EXPECT_EQ(m.num_tokens, 9);
  EXPECT_EQ(m.num_evictable, 3);
  EXPECT_TRUE(kv_.CanAllocateWithPrefix(m, 10, 0));
  std::vector<BlockMove> copies;
  const auto fresh = kv_.AllocateWithPrefix(2, m, 10, &copies);
  ASSERT_TRUE(fresh.has_value());
  ASSERT_EQ(fresh->size(), 1u);
  EXPECT_THAT(copies, ElementsAre(BlockMove{2, fresh->front()}));
  EXPECT_THAT(kv_.GetBlockTable(2), ElementsAre(0, 1, fresh->front()));
  EXPECT_EQ(kv_.pool().ref_count(2), 1);  // pinned until the copy has run
  ASSERT_INVARIANTS(kv_);
  kv_.ReleasePinned();
  EXPECT_EQ(kv_.pool().ref_count(2), 0);
  ASSERT_INVARIANTS(kv_);
  // The source is intact and still a tail for the next repeat.
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(a), kNs).tail_block, 2);
}

TEST_F(PrefixCacheTest, NextTurnTakesTheLongestCommonTail) {
  ServeAndEnd(kv_, 1, Iota(0, 10));
  // The next turn resends tokens 0..9 and adds its own.
  const PrefixMatch next =
      kv_.FindCachedPrefix(Seq(Concat(Iota(0, 10), {70, 71})), kNs);
  EXPECT_EQ(next.tail_tokens, 2);
  EXPECT_EQ(next.num_tokens, 10);
  // Diverging after token 8: one tail token.
  const PrefixMatch diverged =
      kv_.FindCachedPrefix(Seq(Concat(Iota(0, 9), {70, 71})), kNs);
  EXPECT_EQ(diverged.tail_tokens, 1);
  EXPECT_EQ(diverged.num_tokens, 9);
  // Diverging at the block boundary: no tail.
  const PrefixMatch none =
      kv_.FindCachedPrefix(Seq(Concat(Iota(0, 8), {70, 71})), kNs);
  EXPECT_EQ(none.tail_block, kNoBlock);
  EXPECT_EQ(none.num_tokens, 8);
  // Another namespace sees nothing.
  EXPECT_EQ(
      kv_.FindCachedPrefix(Seq(Iota(0, 10)), NamespaceHash("model", "salt"))
          .num_tokens,
      0);
}

TEST_F(PrefixCacheTest, AFullBlockServesAsATail) {
  ServeAndEnd(kv_, 1, Iota(0, 12));  // three full blocks
  const PrefixMatch m = kv_.FindCachedPrefix(Seq(Iota(0, 11)), kNs);
  EXPECT_THAT(m.blocks, ElementsAre(0, 1));
  EXPECT_EQ(m.tail_block, 2);
  EXPECT_EQ(m.tail_tokens, 2);
  EXPECT_EQ(m.num_tokens, 10);
}

TEST_F(PrefixCacheTest, AReallocatedTailIsNoLongerHit) {
  ServeAndEnd(kv_, 1, Iota(0, 10));
  ASSERT_EQ(kv_.FindCachedPrefix(Seq(Iota(0, 10)), kNs).tail_block, 2);
  // Take every free block: the tail (a plain free block) is reused.
  ASSERT_TRUE(kv_.Allocate(9, 11 * 4).has_value());
  kv_.Free(9);
  const PrefixMatch m = kv_.FindCachedPrefix(Seq(Iota(0, 10)), kNs);
  EXPECT_EQ(m.tail_block, kNoBlock);
  EXPECT_EQ(m.num_tokens, 0);  // the full blocks were evicted too
  ASSERT_INVARIANTS(kv_);
}

TEST_F(PrefixCacheTest, APurgeDropsOneNamespacesUnreferencedBlocks) {
  const BlockHash salted = NamespaceHash("model", "salt");
  ServeAndEnd(kv_, 1, Iota(0, 10), kNs);     // 2 full blocks and a tail
  ServeAndEnd(kv_, 2, Iota(0, 10), salted);  // the same under a salt
  const std::vector<int32_t> live = Iota(100, 8);
  Prefill(kv_, 3, live, kNs);  // held by a running request
  ASSERT_EQ(kv_.FindCachedPrefix(Seq(Iota(0, 10)), kNs).num_tokens, 9);
  const int32_t dropped =
      kv_.PurgeCached([&](BlockHash ns) { return ns == kNs; });
  EXPECT_EQ(dropped, 3);
  ASSERT_INVARIANTS(kv_);
  const PrefixMatch gone = kv_.FindCachedPrefix(Seq(Iota(0, 10)), kNs);
  EXPECT_EQ(gone.num_tokens, 0);
  EXPECT_EQ(gone.tail_block, kNoBlock);
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(Iota(0, 10)), salted).num_tokens, 9);
  // Blocks in use stay (and stay findable for their namespace).
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(Concat(live, {1})), kNs).num_tokens, 8);
  EXPECT_EQ(kv_.PurgeCached([](BlockHash) { return true; }), 3);
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(Iota(0, 10)), salted).num_tokens, 0);
  EXPECT_EQ(kv_.pool().num_cached_evictable(), 0);
  ASSERT_INVARIANTS(kv_);
}

TEST_F(PrefixCacheTest, ASharedPartialBlockIsNotATail) {
  const std::vector<int32_t> a = Iota(0, 10);
  ASSERT_TRUE(kv_.AllocateWithPrefix(1, {}, 10).has_value());
  kv_.CacheComputedBlocks(1, Seq(a), 10, kNs);
  kv_.Fork(1, 2);  // block 2 is shared: the child may still write it
  kv_.CachePartialBlock(1, Seq(a), 10, kNs);
  kv_.Free(1);
  EXPECT_EQ(kv_.FindCachedPrefix(Seq(a), kNs).tail_block, kNoBlock);
  ASSERT_INVARIANTS(kv_);
}

TEST_F(PrefixCacheTest, APopularBlocksChildrenStayFoundThroughChurn) {
  // Every request shares block [0, 4) and leaves a one-token tail after it:
  // all tails are children of one block. Past the pool's size each new tail
  // reuses the oldest, so the child list erases and compacts as it grows.
  KvCacheManager kv(16, 4);
  constexpr int kRequests = 200;
  for (int i = 0; i < kRequests; ++i) {
    ServeAndEnd(kv, i, {0, 1, 2, 3, 100 + i, 1});
    ASSERT_INVARIANTS(kv);
  }
  int found = 0;
  for (int i = 0; i < kRequests; ++i) {
    const PrefixMatch m =
        kv.FindCachedPrefix(Seq({0, 1, 2, 3, 100 + i, 1}), kNs);
    ASSERT_EQ(m.num_tokens, m.tail_block == kNoBlock ? 4 : 5) << i;
    if (m.tail_block == kNoBlock) {
      EXPECT_EQ(found, 0) << "an older tail outlived request " << i;
      continue;
    }
    ++found;
  }
  EXPECT_EQ(found, 15);  // every block but the shared one holds a newest tail
}

}  // namespace
}  // namespace kvserve::kvcache

namespace kvserve::kvcache {
namespace {

// A tier load: the matched prefix is held (loading cannot evict it),
// verified blocks become cached under their chain keys, the rest is freed,
// and a request admitted afterwards matches pool + loaded blocks.
TEST_F(PrefixCacheTest, TierLoadRegistersVerifiedBlocksAsCached) {
  kv_.set_record_newly_cached(true);
  const std::vector<int32_t> prompt = Iota(100, 21);  // 5 full blocks
  // Request 1 computes the first 2 blocks, then ends: they stay cached.
  EXPECT_EQ(Prefill(kv_, 1, Iota(100, 9)), 0);
  const std::vector<CachedBlockRecord> rec = kv_.TakeNewlyCached();
  ASSERT_EQ(rec.size(), 2u);
  EXPECT_EQ(rec[1].parent, rec[0].key);
  EXPECT_EQ(rec[1].tokens, Iota(104, 4));
  kv_.Free(1);
  const PrefixMatch m = kv_.FindCachedPrefix(Seq(prompt), kNs, false);
  ASSERT_EQ(m.blocks.size(), 2u);
  // A load of blocks 2..4 (3 fresh), of which 2 verify.
  const std::optional<std::vector<BlockId>> fresh =
      kv_.ReserveForLoad(7, m.blocks, 3, /*keep_free=*/1);
  ASSERT_TRUE(fresh.has_value());
  EXPECT_EQ(kv_.num_loads(), 1);
  ASSERT_INVARIANTS(kv_);
  // Too big a load changes nothing.
  EXPECT_FALSE(kv_.ReserveForLoad(8, {}, 20, 0).has_value());
  EXPECT_EQ(kv_.num_loads(), 1);
  const std::vector<BlockHash> keys = ChainBlockHashes(prompt, kNs, 4, 5);
  EXPECT_EQ(kv_.FinishLoad(7, 2, keys[1], kNs,
                           absl::MakeConstSpan(prompt).subspan(8)),
            2);
  // Held until released: the matched 2 and the verified 2; the third is
  // free again.
  EXPECT_EQ(kv_.num_loads(), 1);
  ASSERT_INVARIANTS(kv_);
  EXPECT_EQ(kv_.pool().ref_count((*fresh)[0]), 1);
  EXPECT_EQ(kv_.pool().ref_count((*fresh)[2]), 0);
  kv_.ReleaseLoad(7);
  EXPECT_EQ(kv_.num_loads(), 0);
  ASSERT_INVARIANTS(kv_);
  // Loaded blocks are not recorded for a store.
  EXPECT_THAT(kv_.TakeNewlyCached(), IsEmpty());
  const PrefixMatch after = kv_.FindCachedPrefix(Seq(prompt), kNs);
  EXPECT_EQ(after.blocks.size(), 4u);
  EXPECT_EQ(after.blocks[2], (*fresh)[0]);
  EXPECT_EQ(after.blocks[3], (*fresh)[1]);
  EXPECT_EQ(kv_.pool().block_hash((*fresh)[0]), keys[2]);
  EXPECT_FALSE(kv_.pool().block_hash((*fresh)[2]).has_value());
  EXPECT_EQ(kv_.num_free_blocks(), 11);
  // An unknown load is a no-op.
  EXPECT_EQ(kv_.FinishLoad(99, 1, 0, kNs, prompt), 0);
}

TEST(ChainBlockHashesTest, EqualsTheChainOfHashBlockTokens) {
  std::vector<int32_t> tokens(70);
  for (int i = 0; i < 70; ++i) tokens[i] = i * 3;
  const BlockHash ns = NamespaceHash("m", "salt");
  const std::vector<BlockHash> keys =
      ChainBlockHashes(tokens, ns, 16, /*max_blocks=*/100);
  ASSERT_EQ(keys.size(), 4u);  // full blocks only
  BlockHash parent = kNoParentHash;
  for (int i = 0; i < 4; ++i) {
    parent = HashBlockTokens(parent, ns,
                             absl::MakeConstSpan(tokens).subspan(i * 16, 16));
    EXPECT_EQ(keys[i], parent) << i;
  }
  EXPECT_EQ(ChainBlockHashes(tokens, ns, 16, 2).size(), 2u);
  EXPECT_TRUE(ChainBlockHashes(tokens, ns, 16, 0).empty());
  // Continued from a parent: the tail of the same chain.
  const std::vector<BlockHash> tail = ChainBlockHashes(
      absl::MakeConstSpan(tokens).subspan(32), ns, 16, 100, keys[1]);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0], keys[2]);
  EXPECT_EQ(tail[1], keys[3]);
}

}  // namespace
}  // namespace kvserve::kvcache

namespace kvserve::kvcache {
namespace {

// KV events: each key that becomes findable is recorded once with its
// parent and tokens, each one lost (eviction, purge) once, in order; and
// FindableBlocks lists exactly the full blocks a prefix match could use.
TEST_F(PrefixCacheTest, EventsRecordEveryFindableKeyGainedAndLost) {
  kv_.set_record_events(true);
  int evictions_seen = 0;
  kv_.set_eviction_observer([&](const Eviction&) { ++evictions_seen; });
  const std::vector<int32_t> a = Iota(0, 10);  // 2 full blocks + a tail
  EXPECT_EQ(Prefill(kv_, 1, a), 0);
  std::vector<KvEvent> ev = kv_.TakeEvents();
  ASSERT_EQ(ev.size(), 2u);
  const std::vector<BlockHash> keys = ChainBlockHashes(a, kNs, 4, 2);
  EXPECT_EQ(ev[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(ev[0].key, keys[0]);
  EXPECT_EQ(ev[0].parent, kNoParentHash);
  EXPECT_EQ(ev[0].tokens, Iota(0, 4));
  EXPECT_EQ(ev[1].parent, keys[0]);
  EXPECT_EQ(ev[1].ns, kNs);
  EXPECT_TRUE(kv_.TakeEvents().empty()) << "taken once";
  // A hit registers nothing new.
  EXPECT_EQ(Prefill(kv_, 2, Concat(Iota(0, 8), {70, 71})), 8);
  EXPECT_TRUE(kv_.TakeEvents().empty());
  kv_.Free(2);
  kv_.Free(1);
  EXPECT_EQ(kv_.FindableBlocks().size(), 2u);
  EXPECT_EQ(kv_.FindableBlocks()[0].second, kNs);
  // 11 blocks, 2 cached + 2 tails: a 44-token request evicts them all.
  EXPECT_EQ(Prefill(kv_, 3, Iota(500, 44)), 0);
  ev = kv_.TakeEvents();
  int removed = 0, stored = 0;
  for (const KvEvent& e : ev) {
    if (e.kind == KvEvent::Kind::kRemoved) {
      ++removed;
      EXPECT_TRUE(e.key == keys[0] || e.key == keys[1]);
      EXPECT_EQ(stored, 0) << "evictions come before the new registrations";
    } else {
      ++stored;
    }
  }
  EXPECT_EQ(removed, 2) << "the tails had no key to lose";
  EXPECT_EQ(stored, 11);
  EXPECT_GE(evictions_seen, 2) << "the caller's observer still runs";
  kv_.Free(3);
  // A purge loses the keys it drops.
  EXPECT_EQ(kv_.PurgeCached([](BlockHash) { return true; }), 11);
  ev = kv_.TakeEvents();
  EXPECT_EQ(ev.size(), 11u);
  for (const KvEvent& e : ev) EXPECT_EQ(e.kind, KvEvent::Kind::kRemoved);
  EXPECT_TRUE(kv_.FindableBlocks().empty());
  kv_.set_record_events(false);
  EXPECT_EQ(Prefill(kv_, 4, a), 0);
  EXPECT_TRUE(kv_.TakeEvents().empty()) << "off: nothing recorded";
  ASSERT_INVARIANTS(kv_);
}

}  // namespace
}  // namespace kvserve::kvcache
