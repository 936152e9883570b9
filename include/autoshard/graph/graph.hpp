#pragma once
/// autoshard::graph: the model graph (Boost.Graph), operator strategies and their costs,
/// model builders (GPT-2, BERT, LLaMA), validation, JSON and Graphviz I/O.
///   #include <autoshard/graph/graph.hpp>
///   auto g = autoshard::build_gpt2(autoshard::gpt2_config::small());
///   auto s = autoshard::enumerate_strategies(g, v, autoshard::device_mesh{2, 4});
#include "model.hpp"     // model_graph, node, edge, op_kind, add_op
#include "strategy.hpp"  // strategy, enumerate_strategies, resharding_costs
