// Every umbrella, in the reverse of all.hpp's order (each area before the areas it builds on).
#if defined(HAVE_AUTOSHARD_EXEC)
#include <autoshard/exec/exec.hpp>
#endif
#if defined(HAVE_AUTOSHARD_GLOO)
#include <autoshard/gloo/gloo.hpp>
#endif
#if defined(HAVE_AUTOSHARD_COMM)
#include <autoshard/comm/comm.hpp>
#endif
#if defined(HAVE_AUTOSHARD_TENSOR)
#include <autoshard/tensor/tensor.hpp>
#endif
#if defined(HAVE_AUTOSHARD_PASS)
#include <autoshard/pass/pass.hpp>
#endif
#if defined(HAVE_AUTOSHARD_GLPK)
#include <autoshard/solve/solve.hpp>
#endif
#if defined(HAVE_AUTOSHARD_PLAN)
#include <autoshard/plan/plan.hpp>
#endif
#if defined(HAVE_AUTOSHARD_ONNX)
#include <autoshard/onnx/onnx.hpp>
#endif
#if defined(HAVE_AUTOSHARD_GRAPH)
#include <autoshard/graph/graph.hpp>
#endif
#if defined(HAVE_AUTOSHARD_IO)
#include <autoshard/io/io.hpp>
#endif
#include <autoshard/autoshard.hpp>
int odr_a() { return static_cast<int>(autoshard::parse_spec("S0R").tensor_rank); }
