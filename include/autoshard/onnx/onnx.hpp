#pragma once
/// ONNX models -> the model graph, through Debian's libonnx (protobuf, ONNX's shape inference):
///   autoshard::onnx_options o;
///   o.batch = 8;                                    // symbolic dim 0 of the graph inputs
///   o.seq = 1024;                                   // symbolic dim 1
///   autoshard::onnx_import m = autoshard::read_onnx_file("model.onnx", o);
///   autoshard::parameter_count(m.graph);            // the initializers' elements
///   for (const auto& op : m.opaque) std::cout << op.node << " " << op.op_type << "\n";
///
/// Initializers become parameters with their exact names and shapes (non-floating ones,
/// Constant nodes, and those torch's exporter marks as buffers or tensor constants in their
/// value_info's metadata, become inputs: data, not weights). Operators map to the graph's kinds:
/// MatMul by a 2-D initializer (or its Transpose) and Gemm -> linear (a following Add of a
/// 1-D initializer is its bias), MatMul -> matmul, Add/Sub/Mul/Div, Softmax,
/// LayerNormalization and the decomposed ReduceMean/Sub/Pow/Add/Sqrt/Div(/Mul/Add) pattern ->
/// layer_norm, the decomposed RMSNorm (Pow/ReduceMean/Add/Sqrt, then Reciprocal+Mul or Div,
/// then Mul by the weight) -> rms_norm, the Erf pattern (x * 0.5 * (1 + erf(x / sqrt 2))) and
/// Gelu -> gelu_erf, the tanh pattern (GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x +
/// 0.044715 x^3)))) and Gelu(approximate="tanh") -> gelu, x * Sigmoid(x) -> silu, Relu, Tanh,
/// Exp, Identity/Dropout, Reshape/Flatten/Squeeze/Unsqueeze -> reshape, Transpose, Gather of
/// a 2-D table -> embedding, Concat, Split and unit-step Slice -> split, a floating Cast -> reshape,
/// ReduceMean/ReduceSum, Where (floating values) -> where, Expand (floating) -> expand.
/// Softmax over QK^T / sqrt(hd) with heads split by Reshape+Transpose is attention; an
/// additive causal mask or GPT-2's Where(bool causal buffer, scores, finfo.min) before the
/// Softmax makes it causal. A decoder exported with its key/value cache (graph inputs
/// past_key_values.<i>.key/.value [B, kv_heads, P, D] concatenated in front of the new keys and
/// values on axis 2) is the decode step: the attention reads them as its kv_cache operands 3 and
/// 4 ([B, P, kv_heads*D]), its mask and rotaries counted from position P, and the present.<i>.*
/// outputs (the cache written back) are no outputs (onnx_import::cache_outputs); o.past sizes a
/// symbolic P. Any other operator (and one whose attributes the kinds cannot
/// express: a Gemm with alpha != 1, a strided Slice, a Where on integers) becomes an opaque
/// vertex that offers only Replicate; `opaque` lists each with the reason, so every model
/// gets a plan. Values computed only for shapes (Shape -> Gather -> Concat -> Reshape) are
/// not vertices: they are folded into constants on the inferred shapes, and ONNX's shape
/// inference runs again (its own data propagation stays off: in ONNX 1.12 it reads through
/// a null pointer on malformed models, which fuzz_onnx found in its first 20,000 inputs).
///
/// The file is input: its size is bounded before it is read, and node counts, ranks, dims,
/// element counts and initializer payloads are checked before anything is allocated for
/// them; a cycle, a value nobody produces, a truncated protobuf are io_error / graph_error
/// naming the node, the value and the numbers.
#include <sys/stat.h>   // stat

#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::move

#include "../core/machine.hpp"  // machine_limits
#include "../io/json.hpp"       // read_regular_file
#include "emit.hpp"             // detail::onnx_in::reader and its phases (reader.hpp, read.hpp, shapes.hpp, constants.hpp, fusions.hpp, attention.hpp, emit.hpp)

namespace autoshard {

/// Reads an ONNX model held in memory (`source` names it in messages).
inline onnx_import read_onnx(std::string_view bytes, const std::string& source = "ONNX model", const onnx_options& o = {}) {
  detail::onnx_in::reader r(o, source);
  r.parse(bytes);
  r.mark_buffers();  // before shape inference rewrites value_info
  r.sort_nodes();
  r.fix_input_dims();
  r.infer_shapes();
  r.fold_shape_computations();
  r.collect_values();
  r.build();
  return std::move(r.out);
}

/// Reads an ONNX file; its size is checked against o.max_file_bytes before it is read, and
/// against the memory left: the file is held while it is parsed, and the parse copies at least
/// its weights (a 1.9 GiB file was read whole, then failed to parse, under a smaller limit).
inline onnx_import read_onnx_file(const std::string& path, const onnx_options& o = {}) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > (std::int64_t{32} << 20)) {
    const std::uint64_t need = 2 * static_cast<std::uint64_t>(st.st_size);
    const machine_limits m = machine_limits::memory_here();
    if (need > m.memory())
      throw resource_error("ONNX model " + quoted_path(path) + " has " + human_bytes(static_cast<double>(st.st_size)) +
                           ", and reading and parsing it takes at least twice that, " + human_bytes(static_cast<double>(need)) +
                           "; this process can allocate " + human_bytes(static_cast<double>(m.memory())) + " more (" +
                           m.memory_source() + (m.memory_limited() ? "): free memory or raise the limit" : "): free memory"));
  }
  const std::string bytes = read_regular_file(path, "ONNX model", o.max_file_bytes);
  return read_onnx(bytes, "ONNX model " + quoted_path(path), o);
}

}  // namespace autoshard
