// The host cache's index: reserve, commit, probe with verification, LRU
// eviction that skips pinned slots, purges, and the slot accounting.
#include "kvtier/host_tier.h"

#include <vector>

#include "gtest/gtest.h"
#include "kvtier/block_key.h"

namespace kvserve::kvtier {
namespace {

constexpr int32_t kBlock = 2;

Key K(uint64_t i) { return absl::MakeUint128(i, i + 1); }

HostTier::Entry E(uint64_t i, uint64_t scope = 7) {
  // Block i of the chain 1, 2, 3...: parent i - 1, tokens {i, i}.
  return {K(i),
          i == 1 ? Key{0} : K(i - 1),
          Key{99},
          scope,
          {static_cast<int32_t>(i), static_cast<int32_t>(i)}};
}

std::vector<int32_t> Tokens(uint64_t first, uint64_t n) {
  std::vector<int32_t> t;
  for (uint64_t i = first; i < first + n; ++i) {
    t.insert(t.end(), kBlock, static_cast<int32_t>(i));
  }
  return t;
}

std::vector<Key> Keys(uint64_t first, uint64_t n) {
  std::vector<Key> k;
  for (uint64_t i = first; i < first + n; ++i) k.push_back(K(i));
  return k;
}

TEST(HostTierTest, PendingIsNotAHitCommittedIs) {
  HostTier t(4, 100);
  const auto s1 = t.Reserve(E(1), true);
  ASSERT_TRUE(s1.has_value());
  EXPECT_FALSE(t.Reserve(E(1), true).has_value());  // held already
  EXPECT_TRUE(t.Probe(Keys(1, 1), 0, 99, Tokens(1, 1), kBlock).empty());
  t.Commit(*s1);
  const auto s2 = t.Reserve(E(2), true);
  t.Commit(*s2);
  const std::vector<int32_t> run =
      t.Probe(Keys(1, 3), 0, 99, Tokens(1, 3), kBlock);
  ASSERT_EQ(run.size(), 2u);
  EXPECT_EQ(run[0], *s1);
  EXPECT_EQ(run[1], *s2);
  for (int32_t s : run) t.Unpin(s);
  const TierStats st = t.stats();
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses[static_cast<int>(MissReason::kAbsent)], 2u);
  EXPECT_EQ(st.blocks, 2u);
  EXPECT_EQ(st.bytes, 200u);
  EXPECT_EQ(st.capacity_bytes, 400u);
  EXPECT_TRUE(t.CheckInvariants().ok());
}

TEST(HostTierTest, OtherTokensOrNamespaceAreAMissThatFrees) {
  HostTier t(4, 100);
  t.Commit(*t.Reserve(E(1), true));
  std::vector<int32_t> wrong = Tokens(1, 1);
  wrong[1] = 12345;
  EXPECT_TRUE(t.Probe(Keys(1, 1), 0, 99, wrong, kBlock).empty());
  EXPECT_EQ(t.stats().misses[static_cast<int>(MissReason::kTokens)], 1u);
  EXPECT_FALSE(t.Contains(K(1)));
  t.Commit(*t.Reserve(E(1), true));
  EXPECT_TRUE(t.Probe(Keys(1, 1), 0, /*ns=*/98, Tokens(1, 1), kBlock).empty());
  EXPECT_FALSE(t.Contains(K(1)));
  EXPECT_TRUE(t.CheckInvariants().ok());
}

TEST(HostTierTest, EvictsLeastRecentlyUsedUnpinned) {
  HostTier t(2, 100);
  const int32_t a = *t.Reserve(E(1), true);
  t.Commit(a);
  const int32_t b = *t.Reserve(E(2), true);
  t.Commit(b);
  // A hit on block 1 makes block 2 the least recently used.
  const std::vector<int32_t> hit =
      t.Probe(Keys(1, 1), 0, 99, Tokens(1, 1), kBlock);
  ASSERT_EQ(hit.size(), 1u);
  t.Unpin(a);
  const auto c = t.Reserve(E(3), true);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, b);
  EXPECT_TRUE(t.Contains(K(1)));
  EXPECT_FALSE(t.Contains(K(2)));
  EXPECT_EQ(t.stats().evictions, 1u);
  // Block 1 pinned, block 3 pending: nothing to evict; without eviction
  // nothing is taken either.
  t.Pin(a);
  EXPECT_FALSE(t.Reserve(E(4), true).has_value());
  EXPECT_EQ(t.stats().stores_dropped[0], 1u);
  EXPECT_FALSE(t.Reserve(E(5), false).has_value());
  t.Unpin(a);
  EXPECT_FALSE(t.Reserve(E(5), false).has_value());  // no free slot
  EXPECT_TRUE(t.Reserve(E(5), true).has_value());    // evicts block 1
  EXPECT_FALSE(t.Contains(K(1)));
  t.Abandon(*c);
  EXPECT_FALSE(t.Contains(K(3)));
  EXPECT_TRUE(t.CheckInvariants().ok());
}

// What KV events announce as CPU: blocks that became ready (with their
// chain and tokens) and ready blocks freed, once asked; pending slots never.
TEST(HostTierTest, LogsResidencyChangesOnceAsked) {
  HostTier t(2, 100);
  t.Commit(*t.Reserve(E(1), true));
  EXPECT_TRUE(t.TakeChanges().empty());  // not asked yet
  t.RecordChanges();
  const int32_t b = *t.Reserve(E(2), true);
  EXPECT_TRUE(t.TakeChanges().empty());  // pending: not a block yet
  t.Commit(b);
  t.Abandon(*t.Reserve(E(3), true));  // evicts block 1; 3 never ready
  std::vector<TierChange> log = t.TakeChanges();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_TRUE(log[0].stored);
  EXPECT_EQ(log[0].header.key, K(2));
  EXPECT_EQ(log[0].header.parent, K(1));
  EXPECT_EQ(log[0].header.ns, Key{99});
  EXPECT_EQ(log[0].header.tokens, Tokens(2, 1));
  EXPECT_FALSE(log[1].stored);
  EXPECT_EQ(log[1].header.key, K(1));
  EXPECT_EQ(t.Purge(std::nullopt, std::nullopt), 1);
  log = t.TakeChanges();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_FALSE(log[0].stored);
  EXPECT_EQ(log[0].header.key, K(2));
  EXPECT_TRUE(t.CheckInvariants().ok());
}

TEST(HostTierTest, PurgesByScopeAndSaltSkippingPinned) {
  HostTier t(4, 100);
  for (uint64_t i = 1; i <= 3; ++i) t.Commit(*t.Reserve(E(i, i % 2), true));
  const std::vector<int32_t> pinned =
      t.Probe(Keys(1, 1), 0, 99, Tokens(1, 1), kBlock);
  ASSERT_EQ(pinned.size(), 1u);
  EXPECT_EQ(t.Purge(1, std::nullopt), 1);  // block 3 (block 1 is pinned)
  EXPECT_TRUE(t.Contains(K(1)));
  EXPECT_FALSE(t.Contains(K(3)));
  EXPECT_EQ(t.Purge(std::nullopt, SaltTag(Key{98})), 0);
  EXPECT_EQ(t.Purge(std::nullopt, SaltTag(Key{99})), 1);  // block 2
  t.Unpin(pinned[0]);
  EXPECT_EQ(t.Purge(std::nullopt, std::nullopt), 1);
  EXPECT_EQ(t.stats().blocks, 0u);
  EXPECT_TRUE(t.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvserve::kvtier
