// The small transformers the executor's tests run on real ranks.
#pragma once
#include <autoshard/graph/builders.hpp>

namespace autoshard_test {

/// `c` at 2 layers of width 32 (4 heads, MLP 64), vocabulary 96, sequence 8, batch 8, f32, in
/// training mode: small enough for 8 Gloo ranks in a unit test.
inline autoshard::transformer_config tiny(autoshard::transformer_config c) {
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.ffn = 64;
  c.vocab = 96;
  c.max_positions = 16;
  c.seq = 8;
  c.batch = 8;
  c.type = autoshard::dtype::f32;
  c.mode = autoshard::run_mode::training;
  return c;
}

}  // namespace autoshard_test
