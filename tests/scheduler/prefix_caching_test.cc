// The scheduler with prefix caching on: admission matches the longest cached
// prefix and schedules only the rest; the last prompt token is always
// recomputed; salts scope sharing; counters; a soak with a fake KV that
// checks every position of a producing request holds its token.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace kvserve::scheduler {
namespace {

using ::testing::ElementsAre;

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

SchedulerConfig CachingConfig() {
  SchedulerConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 100;
  c.block_size = 4;
  c.num_blocks = 16;
  c.watermark = 0.0;
  c.max_model_len = 64;
  c.enable_prefix_caching = true;
  return c;
}

void Add(Scheduler& sched, RequestId id, std::vector<int32_t> prompt,
         int32_t max_tokens, const std::string& salt = "") {
  auto r = std::make_unique<Request>(id, std::move(prompt), max_tokens);
  r->set_cache_salt(salt);
  const absl::Status s = sched.AddRequest(std::move(r));
  ASSERT_TRUE(s.ok()) << s;
}

void ExpectInvariants(const Scheduler& sched) {
  const absl::Status s = sched.CheckInvariants();
  ASSERT_TRUE(s.ok()) << s;
}

// One step; every producing request samples 7.
SchedulerOutput Step(Scheduler& sched) {
  ExpectInvariants(sched);
  SchedulerOutput out = sched.Schedule();
  ExpectInvariants(sched);
  const std::vector<int32_t> sampled(out.num_producing(), 7);
  (void)sched.UpdateFromOutput(out, sampled);
  ExpectInvariants(sched);
  return out;
}

TEST(PrefixCachingTest, SecondRequestComputesOnlyUncachedTail) {
  Scheduler sched(CachingConfig());
  Add(sched, 1, Iota(0, 10), 1);
  SchedulerOutput out = Step(sched);  // 1 computes all 10 and finishes
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].start_position, 0);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 10);
  EXPECT_THAT(out.BlockTable(out.scheduled[0]), ElementsAre(0, 1, 2));
  EXPECT_EQ(sched.GetRequest(1), nullptr);
  EXPECT_EQ(sched.kv_usage().cached_evictable_blocks, 2);  // 0 and 1

  Add(sched, 2, Concat(Iota(0, 8), {50, 51, 52}), 2);
  out = Step(sched);
  ASSERT_EQ(out.scheduled.size(), 1u);
  const ScheduledRequest& s = out.scheduled[0];
  EXPECT_EQ(s.start_position, 8);
  EXPECT_EQ(s.num_new_tokens, 3);
  EXPECT_THAT(out.TokenIds(s), ElementsAre(50, 51, 52));
  EXPECT_TRUE(s.produces_token);
  // Free queue was 3..15 2 1 0: the hit takes 0 1, the tail the head 3.
  EXPECT_THAT(out.BlockTable(s), ElementsAre(0, 1, 3));
  EXPECT_EQ(sched.GetRequest(2)->num_cached_tokens(), 8);
  const SchedulerStats st = sched.stats();
  EXPECT_EQ(st.prefix_cache_queries_tokens, 10 + 11);
  EXPECT_EQ(st.prefix_cache_hit_tokens, 8);
  EXPECT_EQ(st.num_scheduled_tokens_total, 10 + 3);
}

TEST(PrefixCachingTest, LastPromptTokenIsAlwaysRecomputed) {
  Scheduler sched(CachingConfig());
  Add(sched, 1, Iota(0, 8), 1);  // exactly two blocks
  (void)Step(sched);
  Add(sched, 2, Iota(0, 8), 1);  // same prompt: one block and a 3-token tail
  SchedulerOutput out = Step(sched);
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].start_position, 7);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 1);
  EXPECT_TRUE(out.scheduled[0].produces_token);
  // The tail (block 1, still held by request 1) arrives by copy.
  ASSERT_EQ(out.blocks_to_copy.size(), 1u);
  EXPECT_EQ(out.blocks_to_copy[0].src, out.BlockTable(out.scheduled[0])[0] + 1);
  EXPECT_EQ(sched.stats().num_tail_hits_total, 1);
  Add(sched, 3, Iota(0, 9), 1);  // one more token: both blocks reused
  out = Step(sched);
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].start_position, 8);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 1);
  EXPECT_EQ(sched.stats().prefix_cache_hit_tokens, 7 + 8);
}

TEST(PrefixCachingTest, LiveRequestSharesItsComputedBlocks) {
  Scheduler sched(CachingConfig());
  Add(sched, 1, Iota(0, 9), 5);
  (void)Step(sched);  // 1 runs on: its blocks 0 1 are active and hashed
  Add(sched, 2, Iota(0, 9), 3);
  const SchedulerOutput out = Step(sched);
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[1].id, 2);
  EXPECT_EQ(out.scheduled[1].start_position, 8);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 1);
  EXPECT_THAT(out.BlockTable(out.scheduled[1]), ElementsAre(0, 1, 3));
  EXPECT_EQ(sched.kv_cache().pool().ref_count(0), 2);
}

TEST(PrefixCachingTest, DifferentSaltsShareNothing) {
  Scheduler sched(CachingConfig());
  Add(sched, 1, Iota(0, 9), 1, "tenant-a");
  (void)Step(sched);
  Add(sched, 2, Iota(0, 9), 1, "tenant-b");
  SchedulerOutput out = Step(sched);
  EXPECT_EQ(out.scheduled[0].start_position, 0);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 9);
  EXPECT_EQ(sched.stats().prefix_cache_hit_tokens, 0);
  Add(sched, 3, Iota(0, 9), 1, "tenant-a");
  out = Step(sched);
  EXPECT_EQ(out.scheduled[0].start_position, 8);
  EXPECT_THAT(out.BlockTable(out.scheduled[0]).subspan(0, 2),
              ElementsAre(0, 1));
}

TEST(PrefixCachingTest, CachingOffComputesEverything) {
  SchedulerConfig c = CachingConfig();
  c.enable_prefix_caching = false;
  Scheduler sched(c);
  Add(sched, 1, Iota(0, 10), 1);
  (void)Step(sched);
  Add(sched, 2, Iota(0, 10), 1);
  const SchedulerOutput out = Step(sched);
  EXPECT_EQ(out.scheduled[0].start_position, 0);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 10);
  EXPECT_EQ(sched.stats().prefix_cache_queries_tokens, 0);
  EXPECT_EQ(sched.stats().kv.cached_evictable_blocks, 0);
}

// Max-length slabs share nothing, caching on or off: the same prompt again
// computes every token into a whole slab of its own.
TEST(PrefixCachingTest, MaxLengthSlabsMatchNoPrefix) {
  SchedulerConfig c = CachingConfig();
  c.max_model_len = 16;  // a slab: 4 blocks of the 16
  c.kv_reservation = KvReservation::kMaxLength;
  Scheduler sched(c);
  Add(sched, 1, Iota(0, 10), 1);
  (void)Step(sched);
  Add(sched, 2, Iota(0, 10), 1);
  const SchedulerOutput out = Step(sched);
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].start_position, 0);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 10);
  EXPECT_EQ(out.scheduled[0].num_blocks, 4);
  EXPECT_EQ(sched.stats().prefix_cache_hit_tokens, 0);
}

TEST(PrefixCachingTest, ChunkedPrefillCachesBlocksAsTheyComplete) {
  SchedulerConfig c = CachingConfig();
  c.max_num_batched_tokens = 6;
  Scheduler sched(c);
  Add(sched, 1, Iota(0, 13), 1);
  (void)Step(sched);  // tokens 0..5: block 0 full
  EXPECT_TRUE(sched.kv_cache().pool().block_hash(0).has_value());
  EXPECT_FALSE(sched.kv_cache().pool().block_hash(1).has_value());
  (void)Step(sched);  // tokens 6..11: blocks 1 and 2 full
  EXPECT_TRUE(sched.kv_cache().pool().block_hash(2).has_value());
}

// Shared system prompts, two salts, a small pool (preemptions): a fake KV
// records (token, position, salt) per slot; a producing request must read
// back its own tokens and salt at every position.
TEST(PrefixCachingSoakTest, SharedPrefixesReadBackTheirTokens) {
  SchedulerConfig c;
  c.max_num_seqs = 6;
  c.max_num_batched_tokens = 48;
  c.block_size = 4;
  c.num_blocks = 40;
  c.watermark = 0.0;
  c.max_model_len = 96;
  Scheduler sched(c);
  struct Slot {
    int32_t token = -1, position = -1;
    std::string salt;
  };
  std::vector<Slot> slots(c.num_blocks * c.block_size);
  std::mt19937 rng(11);
  auto pick = [&](int n) {
    return std::uniform_int_distribution<int>(0, n - 1)(rng);
  };
  const std::vector<std::string> salts = {"", "b"};
  RequestId next_id = 1;
  for (int step = 0; step < 2000; ++step) {
    if (pick(2) == 0) {
      std::vector<int32_t> prompt = Iota(1000 * pick(3), 8 + pick(20));
      for (int i = pick(8); i > 0; --i) prompt.push_back(pick(50));
      auto r = std::make_unique<Request>(next_id++, prompt, 1 + pick(20));
      r->set_cache_salt(salts[pick(2)]);
      (void)sched.AddRequest(std::move(r));
    }
    const SchedulerOutput out = sched.Schedule();
    ExpectInvariants(sched);
    for (const kvcache::BlockMove& m : out.blocks_to_copy) {  // cached tails
      std::copy_n(slots.begin() + m.src * c.block_size, c.block_size,
                  slots.begin() + m.dst * c.block_size);
    }
    for (const ScheduledRequest& s : out.scheduled) {
      const Request* r = sched.GetRequest(s.id);
      auto slot = [&](int32_t pos) -> Slot& {
        const int32_t b = out.BlockTable(s)[pos / c.block_size];
        return slots[b * c.block_size + pos % c.block_size];
      };
      for (int32_t k = 0; k < s.num_new_tokens; ++k) {
        slot(s.start_position + k) = {out.TokenIds(s)[k], s.start_position + k,
                                      r->cache_salt()};
      }
      if (!s.produces_token) continue;
      for (int32_t pos = 0; pos < r->num_tokens(); ++pos) {
        const Slot& got = slot(pos);
        ASSERT_TRUE(got.token == r->token(pos) && got.position == pos &&
                    got.salt == r->cache_salt())
            << "request " << s.id << " position " << pos << " step " << step;
      }
    }
    std::vector<int32_t> sampled;
    for (const ScheduledRequest& s : out.scheduled) {
      if (s.produces_token) sampled.push_back(pick(50));
    }
    (void)sched.UpdateFromOutput(out, sampled);
    ExpectInvariants(sched);
  }
  const SchedulerStats st = sched.stats();
  EXPECT_GT(st.prefix_cache_hit_tokens, st.prefix_cache_queries_tokens / 4);
  EXPECT_GT(st.num_preemptions_total, 0);
}

}  // namespace
}  // namespace kvserve::scheduler
