// Block-sparse layouts (context/sparsity.hpp) against DeepSpeed's own sparsity configs: every layout
// in tests/golden/sparsity_layouts.txt (made by tests/golden/make_sparsity_layouts.py, which runs
// deepspeed/ops/sparse_attention/sparsity_config.py after random.seed(s)) equals make_layout's for
// the same arguments and seed, key block by key block: Dense, Fixed (both directions, short last
// windows, per-head global patterns, horizontal globals), Variable (random blocks through both of
// random.sample's strategies, window lists, global ranges), BigBird (random, both directions),
// BSLongformer and LocalSlidingWindow. What DeepSpeed refuses is refused naming the key.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "zerotk/context/sparsity.hpp"

namespace test_sparsity {

using namespace zerotk;
using context::SparsityConfig;
using context::SparsityMode;

namespace {

std::vector<int> int_list(const std::string& v) {  // "[1,2]"
  std::vector<int> out;
  std::stringstream s(v.substr(1, v.size() - 2));
  std::string item;
  while (std::getline(s, item, ',')) out.push_back(std::stoi(item));
  return out;
}

// "layout <id> <Class> seq_len=N seed=s key=value ..." -> the config and the sequence length.
SparsityConfig config_of(const std::string& line, std::size_t& seq_len) {
  std::stringstream in(line);
  std::string word, id, cls;
  in >> word >> id >> cls;
  SparsityConfig c;
  if (cls == "DenseSparsityConfig") c.mode = SparsityMode::dense;
  if (cls == "FixedSparsityConfig") c.mode = SparsityMode::fixed;
  if (cls == "VariableSparsityConfig") c.mode = SparsityMode::variable, c.num_random_blocks = 0;
  if (cls == "BigBirdSparsityConfig") c.mode = SparsityMode::bigbird, c.num_random_blocks = 1;
  if (cls == "BSLongformerSparsityConfig") c.mode = SparsityMode::bslongformer;
  if (cls == "LocalSlidingWindowSparsityConfig") c.mode = SparsityMode::local_sliding_window, c.unidirectional = true;
  while (in >> word) {
    const auto eq = word.find('=');
    const std::string key = word.substr(0, eq), v = word.substr(eq + 1);
    if (key == "seq_len") seq_len = std::stoul(v);
    else if (key == "seed") c.seed = std::stoull(v);
    else if (key == "num_heads") c.heads = std::stoi(v);
    else if (key == "block") c.block = std::stoi(v);
    else if (key == "different_layout_per_head") c.different_layout_per_head = v == "true";
    else if (key == "num_local_blocks") c.num_local_blocks = std::stoi(v);
    else if (key == "num_global_blocks") c.num_global_blocks = std::stoi(v);
    else if (key == "attention") c.unidirectional = v == "\"unidirectional\"";
    else if (key == "horizontal_global_attention") c.horizontal_global_attention = v == "true";
    else if (key == "num_different_global_patterns") c.num_different_global_patterns = std::stoi(v);
    else if (key == "num_random_blocks") c.num_random_blocks = std::stoi(v);
    else if (key == "local_window_blocks") c.local_window_blocks = int_list(v);
    else if (key == "global_block_indices") c.global_block_indices = int_list(v);
    else if (key == "global_block_end_indices") c.global_block_end_indices = int_list(v);
    else if (key == "num_sliding_window_blocks") c.num_sliding_window_blocks = std::stoi(v);
    else FAIL("unknown key in the golden file: ", key);
  }
  return c;
}

}  // namespace

TEST_CASE("sparsity layouts: make_layout gives DeepSpeed's layout for every golden config and seed") {
  std::ifstream f(std::string(ZEROTK_TEST_SOURCE_DIR) + "/golden/sparsity_layouts.txt");
  REQUIRE(f.good());
  std::string line;
  int layouts = 0;
  std::size_t rows = 0;
  context::BlockLayout got;
  std::string current;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("layout ", 0) == 0) {
      std::size_t seq_len = 0;
      const SparsityConfig c = config_of(line, seq_len);
      got = context::make_layout(c, seq_len);
      current = line;
      ++layouts;
      continue;
    }
    CAPTURE(current);
    CAPTURE(line);
    std::stringstream in(line);
    int h = 0, q = 0;
    char colon = 0;
    in >> h >> q >> colon;
    std::vector<int> want;
    for (int k = 0; in >> k;) want.push_back(k);
    REQUIRE(h < got.heads());
    REQUIRE(q < got.blocks());
    CHECK(got.keys(h, q) == want);
    ++rows;
  }
  CHECK(layouts == 17);
  CHECK(rows > 400);
}

TEST_CASE("sparsity layouts: Python's random as DeepSpeed draws with it, and the refusals name the key") {
  // random.seed(42); [random.getrandbits(32) for _ in range(3)] in CPython.
  context::detail::PythonRandom r(42);
  CHECK(r.getrandbits(32) == 2746317213u);
  CHECK(r.getrandbits(32) == 478163327u);
  CHECK(r.getrandbits(32) == 107420369u);

  SparsityConfig c{.mode = SparsityMode::fixed, .heads = 2, .num_local_blocks = 4, .num_global_blocks = 3};
  CHECK_THROWS_WITH_AS(context::make_layout(c, 160), doctest::Contains("sparse_attention (fixed): num_local_blocks"), config_error);
  c.num_global_blocks = 1;
  c.num_different_global_patterns = 2;
  CHECK_THROWS_WITH_AS(context::make_layout(c, 160), doctest::Contains("needs different_layout_per_head"), config_error);
  CHECK_THROWS_WITH_AS(context::make_layout(SparsityConfig{.block = 16}, 100), doctest::Contains("divide by the block size"),
                       config_error);
  SparsityConfig bird{.mode = SparsityMode::bigbird, .heads = 1, .unidirectional = true, .num_random_blocks = 2};
  CHECK_THROWS_WITH_AS(context::make_layout(bird, 160), doctest::Contains("row 0 has only 1 blocks"), config_error);
  SparsityConfig horizontal{.mode = SparsityMode::variable, .unidirectional = true, .horizontal_global_attention = true};
  CHECK_THROWS_WITH_AS(context::make_layout(horizontal, 160), doctest::Contains("horizontal_global_attention"), config_error);
  SparsityConfig ends{.mode = SparsityMode::bslongformer, .global_block_indices = {0, 4}, .global_block_end_indices = std::vector<int>{2}};
  CHECK_THROWS_WITH_AS(context::make_layout(ends, 160), doctest::Contains("global_block_end_indices"), config_error);
}

TEST_CASE("sparsity layouts: ring_needs lists, per rank pair, the key blocks some query token of the receiver attends to") {
  // Against a token-level count: rank `to` needs key block kb of rank `from` iff some query token t of
  // `to` attends (in some head) to some key token of kb, causally at or before t. (Between two ranks
  // the block test is the token test; within one it is because the layouts keep the diagonal block.)
  const SparsityConfig bird{.mode = SparsityMode::bigbird, .heads = 2, .block = 4, .different_layout_per_head = true,
                            .num_random_blocks = 1, .seed = 3};
  const context::BlockLayout l = context::make_layout(bird, 64);  // 16 blocks
  for (const bool causal : {false, true}) {
    for (const int ranks : {1, 2, 4, 8}) {
      const auto needs = context::ring_needs(l, ranks, causal);
      REQUIRE(needs.size() == static_cast<std::size_t>(ranks * ranks));
      const int per = l.blocks() / ranks, b = l.block_size();
      for (int from = 0; from < ranks; ++from) {
        for (int to = 0; to < ranks; ++to) {
          std::vector<int> want;
          for (int kb = from * per; kb < (from + 1) * per; ++kb) {
            bool any = false;
            for (int t = to * per * b; t < (to + 1) * per * b && !any; ++t) {
              for (int h = 0; h < l.heads() && !any; ++h) {
                any = l.has(h, t / b, kb) && (!causal || kb * b <= t);
              }
            }
            if (any) want.push_back(kb);
          }
          CHECK(needs[static_cast<std::size_t>(from * ranks + to)] == want);
        }
      }
    }
  }
  CHECK_THROWS_WITH_AS(context::ring_needs(l, 3, false), doctest::Contains("16 blocks over 3 ranks"), usage_error);
}

}  // namespace test_sparsity
