#pragma once
/// autoshard's tensor area: host tensors, slicing, tensor-parallel policies, safetensors
/// checkpoints. Needs Eigen and nlohmann-json (target autoshard::tensor).
///   #include <autoshard/tensor/tensor.hpp>
#include "host_tensor.hpp"  // host_tensor, tensor_view, convert
#include "slice.hpp"        // copy_block, shard_of, gather, shard_layout
#include "safetensors.hpp"  // safetensors_file, save_safetensors, checkpoint
#include "policy.hpp"            // tp_policy, policies::gpt2() ..., plan_policy, shards_of
#include "shard_checkpoint.hpp"  // shard_checkpoint, sharded_checkpoint
