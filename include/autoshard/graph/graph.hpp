#pragma once
/// autoshard::graph: the model graph (Boost.Graph), operator strategies and their costs,
/// model builders (GPT-2, BERT, LLaMA), validation, JSON and Graphviz I/O.
///   #include <autoshard/graph/graph.hpp>
///   auto g = autoshard::build_gpt2(autoshard::transformer_config::gpt2_124m());
///   autoshard::validate(g);
///   auto s = autoshard::enumerate_strategies(g, *autoshard::find_vertex(g, "lm_head"),
///                                            autoshard::device_mesh{2, 4});
#include "device.hpp"     // device_model, device_presets, find_device_preset
#include "builders.hpp"   // transformer_config, build_gpt2, build_bert, build_llama, ..., parameter_names
#include "dot.hpp"        // write_dot
#include "elementwise.hpp"  // onnx_elementwise_function: ONNX's elementwise operators as element functions
#include "fused.hpp"      // fused_dim_of: tensors laid out per part (fused QKV)
#include "hf_config.hpp"  // read_hf_config_file, build_hf
#include "io.hpp"        // to_json, from_json, read_json, write_json
#include "model.hpp"     // model_graph, node, edge, op_kind, op_attrs, add_op, infer_shape
#include "pricing.hpp"   // step_pricing, run_mode, optimizer_kind: how a step is priced
#include "resize.hpp"    // with_batch_seq
#include "rope.hpp"      // rope_rule: a rotary's sequence-dependent rope (dynamic, longrope)
#include "rules.hpp"     // constexpr output-spec rules: matmul_output_spec, ...
#include "strategy.hpp"  // strategy, device_model, enumerate_strategies, resharding_costs
#include "traffic.hpp"   // traffic_site
#include "validate.hpp"  // validate, topological_order
