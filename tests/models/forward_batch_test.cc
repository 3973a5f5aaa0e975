// ForwardBatch::Validate: a consistent batch passes; each inconsistency is
// refused with an error naming the field and the offending entry.
#include "models/forward_batch.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::models {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kBlocks = 64, kBlockSize = 4, kVocab = 100;

// Sequence 0: a 10-token prefill on blocks {5, 9, 2}; sequence 1: a decode
// at position 20 (21 tokens, six blocks 10..15, padded to kMaxBlocks).
ForwardBatch Valid() {
  constexpr int32_t kMaxBlocks = 9;
  ForwardBatch b;
  b.max_blocks_per_seq = kMaxBlocks;
  b.block_tables.assign(2 * kMaxBlocks, -1);  // unused tails are ignored
  const int32_t s0[] = {5, 9, 2};
  for (int i = 0; i < 3; ++i) b.block_tables[i] = s0[i];
  for (int i = 0; i < 6; ++i) b.block_tables[kMaxBlocks + i] = 10 + i;
  for (int32_t p = 0; p < 10; ++p) {
    b.token_ids.push_back(p + 1);
    b.positions.push_back(p);
    b.slot_mapping.push_back(s0[p / kBlockSize] * kBlockSize + p % kBlockSize);
  }
  b.token_ids.push_back(7);
  b.positions.push_back(20);
  b.slot_mapping.push_back(15 * kBlockSize + 0);
  b.seq_starts = {0, 10, 11};
  b.context_lens = {10, 21};
  b.logits_rows = {9, 10};
  return b;
}

std::string Error(const ForwardBatch& b) {
  const absl::Status s = b.Validate(kBlocks, kBlockSize, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(ForwardBatchTest, AConsistentBatchPasses) {
  EXPECT_TRUE(Valid().Validate(kBlocks, kBlockSize, kVocab).ok());
}

TEST(ForwardBatchTest, BlockIdsOutsideThePoolAreNamed) {
  ForwardBatch b = Valid();
  b.block_tables[9 + 4] = kBlocks;  // sequence 1, entry 4
  EXPECT_THAT(Error(b), HasSubstr("sequence 1 block_tables[4] = 64 outside "
                                  "[0, 64)"));
  b = Valid();
  b.block_tables[1] = -3;
  EXPECT_THAT(Error(b), HasSubstr("sequence 0 block_tables[1] = -3"));
  // Past the blocks the context needs, entries are not read.
  b = Valid();
  b.block_tables[9 + 7] = kBlocks + 100;
  EXPECT_TRUE(b.Validate(kBlocks, kBlockSize, kVocab).ok());
}

TEST(ForwardBatchTest, EveryBlockOfALongTableIsChecked) {
  // More blocks than the vectorized pass takes at once, the bad one last.
  ForwardBatch b;
  constexpr int32_t kLen = 37 * kBlockSize;
  b.max_blocks_per_seq = 37;
  for (int32_t i = 0; i < 37; ++i) b.block_tables.push_back(i);
  b.token_ids = {1};
  b.positions = {kLen - 1};
  b.slot_mapping = {36 * kBlockSize + 3};
  b.seq_starts = {0, 1};
  b.context_lens = {kLen};
  EXPECT_TRUE(b.Validate(kBlocks, kBlockSize, kVocab).ok());
  b.block_tables[35] = kBlocks + 1;
  EXPECT_THAT(Error(b), HasSubstr("block_tables[35] = 65"));
  b.block_tables[35] = 35;
  b.block_tables[36] = -1;  // in the scalar remainder after 4 x 8
  EXPECT_THAT(Error(b), HasSubstr("block_tables[36] = -1"));
}

TEST(ForwardBatchTest, PositionsSlotsAndTokensAreChecked) {
  ForwardBatch b = Valid();
  b.positions[3] = 4;
  EXPECT_THAT(Error(b), HasSubstr("token 3 position 4, expected 3"));
  b = Valid();
  b.slot_mapping[10] = 1;
  EXPECT_THAT(Error(b), HasSubstr("token 10 slot 1, block table says 60"));
  b = Valid();
  b.token_ids[0] = kVocab;
  EXPECT_THAT(Error(b), HasSubstr("token id 100 outside [0, 100)"));
}

}  // namespace
}  // namespace kvserve::models
