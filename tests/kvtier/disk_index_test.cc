// The disk index: LRU order, the byte limit, touches, purges by predicate.
#include "kvtier/disk_index.h"

#include "gtest/gtest.h"

namespace kvserve::kvtier {
namespace {

BlockName N(uint64_t i, uint64_t scope = 0) {
  return {absl::MakeUint128(i, i), scope, 0};
}

TEST(DiskIndexTest, EvictsLeastRecentlyUsedFirst) {
  DiskIndex idx(100);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_TRUE(idx.Insert(N(i)));
  EXPECT_FALSE(idx.Insert(N(2)));
  EXPECT_EQ(idx.bytes(), 500u);
  EXPECT_TRUE(idx.Touch(N(0).key));
  EXPECT_FALSE(idx.Touch(N(9).key));
  const std::vector<BlockName> v = idx.TakeVictims(250);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].key, N(1).key);
  EXPECT_EQ(v[1].key, N(2).key);
  EXPECT_EQ(v[2].key, N(3).key);
  EXPECT_TRUE(idx.Contains(N(0).key));
  EXPECT_TRUE(idx.Contains(N(4).key));
  EXPECT_EQ(idx.size(), 2u);
}

TEST(DiskIndexTest, TakeIfAndErase) {
  DiskIndex idx(1);
  for (uint64_t i = 0; i < 6; ++i) idx.Insert(N(i, i % 2));
  EXPECT_TRUE(idx.Erase(N(0).key));
  EXPECT_FALSE(idx.Erase(N(0).key));
  const std::vector<BlockName> odd =
      idx.TakeIf([](const BlockName& n) { return n.scope_tag == 1; });
  EXPECT_EQ(odd.size(), 3u);
  EXPECT_EQ(idx.size(), 2u);
  EXPECT_EQ(idx.Find(N(2).key)->scope_tag, 0u);
  EXPECT_FALSE(idx.Find(N(3).key).has_value());
  idx.Clear();
  EXPECT_EQ(idx.bytes(), 0u);
}

}  // namespace
}  // namespace kvserve::kvtier
