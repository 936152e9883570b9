#pragma once
/// A pipelined plan executed on real ranks: each rank holds one stage's operators only (its
/// layers; the first stage also the embedding, the last the head), runs them with the sharded
/// executor on the stage's mesh (the plan's mesh, tensor x data parallel), and hands the
/// activations that cross a stage boundary to the same rank of the next stage point to point,
/// receiving their gradients back, in the order the schedule gives (pass/pipeline.hpp's
/// schedule_passes: 1F1B or GPipe, the orders the pricing simulates).
///   autoshard::pipeline_communicator<autoshard::gloo_communicator> pc(std::move(world), plan_mesh, stages);
///   const autoshard::stage_graph sg = autoshard::make_stage_graph(g, plan, stages_of_vertices(doc), stages, pc.stage_index);
///   autoshard::train_stage<double>(pc, sg, stage_sources, step, schedule, on_piece, on_param);
///
/// The world of pp x (the plan's mesh) ranks is stage-major: rank r is rank r % S of stage r / S
/// (S ranks a stage, Megatron-LM's order). Every transfer is charged to its site
/// (traffic_site::transfer / transfer_back, the tensor and the stage it leaves) on the
/// pipeline axis, numbered after the stage's own axes, in the stage mesh's ledger: the
/// communication audit compares them with pipeline_traffic_of (pass/pipelined.hpp). A
/// parameter two stages use (an embedding tied to the head) is finished after the step: its
/// gradient, reduced within each stage, is all-reduced over those stages, then updated on each.
#include <limits>   // std::numeric_limits
#include <map>      // std::map
#include <string>   // std::string
#include <utility>  // std::move
#include <vector>   // std::vector

#include "../comm/mesh_communicator.hpp"  // basic_mesh_communicator, splittable_communicator
#include "../pass/pipeline.hpp"           // schedule_passes
#include "../pass/pipelined.hpp"          // last_reading_stage
#include "../plan/pipeline.hpp"           // pipeline_schedule
#include "training.hpp"                   // detail::sharded_backward, detail::micro_batch_inputs

namespace autoshard {

/// The communicators of one rank of a pipelined run: its stage's mesh (the plan's), the
/// pipeline axis (the ranks of the same coordinate in every stage, rank k of it on stage k)
/// and the ranks of the first and last stages at that coordinate (a tied parameter's
/// all-reduce; this rank alone on the stages between). The last two note their traffic in the
/// stage mesh's ledger as mesh axis `pipeline_axis()`.
template <splittable_communicator Comm>
class pipeline_communicator {
 public:
  pipeline_communicator(Comm world, const device_mesh& stage_mesh, int stages)
      : stage_index_(world.rank() / stage_mesh.num_ranks()), stages_(stages),
        stage_(split_stage(world, stage_mesh), stage_mesh),
        pipeline_(split_pipeline(world, stage_mesh.num_ranks()), &stage_.ledger(), pipeline_axis()),
        tied_(split_tied(world, stage_mesh.num_ranks()), &stage_.ledger(), pipeline_axis()) {}

  basic_mesh_communicator<Comm>& stage() noexcept { return stage_; }
  counted_communicator<Comm>& pipeline() noexcept { return pipeline_; }
  counted_communicator<Comm>& tied() noexcept { return tied_; }
  int stage_index() const noexcept { return stage_index_; }
  int stages() const noexcept { return stages_; }
  int pipeline_axis() const noexcept { return static_cast<int>(stage_.mesh().ndim()); }

 private:
  Comm split_stage(Comm& world, const device_mesh& m) {
    if (world.size() != m.num_ranks() * stages_)
      throw comm_error(detail::who_of(world) + ": a world of " + std::to_string(world.size()) + " ranks cannot run " +
                       std::to_string(stages_) + " stages of " + to_string(m) + " (" + std::to_string(m.num_ranks() * stages_) +
                       " ranks)");
    std::vector<int> members;
    for (int q = 0; q < m.num_ranks(); ++q) members.push_back(stage_index_ * m.num_ranks() + q);
    return world.split(members, "stage");
  }
  Comm split_pipeline(Comm& world, int per_stage) {
    std::vector<int> members;
    for (int k = 0; k < stages_; ++k) members.push_back(k * per_stage + world.rank() % per_stage);
    return world.split(members, "pipeline");
  }
  Comm split_tied(Comm& world, int per_stage) {
    const int q = world.rank() % per_stage;
    const bool ends = stages_ > 1 && (stage_index_ == 0 || stage_index_ == stages_ - 1);
    return world.split(ends ? std::vector<int>{q, (stages_ - 1) * per_stage + q} : std::vector<int>{world.rank()}, "tied");
  }

  int stage_index_, stages_;
  basic_mesh_communicator<Comm> stage_;
  counted_communicator<Comm> pipeline_, tied_;
};

/// One stage of a pipelined plan as a graph of its own: its operators, the inputs and
/// parameters they read, and, as graph inputs, the activations that arrive from the stage
/// before (named and shaped as in the whole graph, in the spec their producer makes them).
struct stage_graph {
  /// An operator's output that crosses a stage boundary (a vertex of the whole graph).
  struct crossing {
    vertex_t vertex;
    sharding_spec spec;  ///< the spec its producer makes it in
    tensor_shape shape;
    dtype type;
  };
  int stage = 0, stages = 1;
  model_graph g;
  std::vector<strategy> plan;      ///< per vertex of g
  std::vector<vertex_t> whole;     ///< per vertex of g: the whole graph's
  std::vector<vertex_t> local;     ///< per vertex of the whole graph: g's, or `none`
  std::vector<crossing> receives;  ///< what arrives from the stage before, by ascending vertex
  std::vector<crossing> sends;     ///< what goes to the next stage, by ascending vertex
  std::vector<vertex_t> losses;    ///< g's losses (the last stage's)
  std::vector<vertex_t> tied;      ///< g's parameters another stage uses too
  /// Fault injection for tests of the checker (verify_pipeline::drop_transfer): this crossing
  /// (a whole-graph vertex) is neither sent nor received, forward or back; receivers take zeros.
  vertex_t dropped = none;

  static constexpr vertex_t none = std::numeric_limits<vertex_t>::max();
};

/// Stage `s` of `stages` of graph `g` run by `plan`, where `stage_of` gives every operator's
/// stage and the stages that read each source (pass/pipelined.hpp's stages_of_vertices).
inline stage_graph make_stage_graph(const model_graph& g, const std::vector<strategy>& plan,
                                    const std::vector<std::vector<int>>& stage_of, int stages, int s) {
  const std::size_t n = boost::num_vertices(g);
  stage_graph out;
  out.stage = s;
  out.stages = stages;
  out.local.assign(n, stage_graph::none);
  std::vector<char> read_here(n, 0);
  for (vertex_t v = 0; v < n; ++v)
    if (g[v].is_operator() && stage_of[v].front() == s)
      for (vertex_t u : operands(g, v)) read_here[u] = 1;
  for (vertex_t v = 0; v < n; ++v) {
    node nd = g[v];
    bool keep = read_here[v] != 0 && !nd.is_operator();
    if (nd.is_operator()) {
      const int from = stage_of[v].front(), to = last_reading_stage(g, stage_of, v);
      if (from < s && s <= to) out.receives.push_back({v, plan[v].output, nd.shape, nd.type});
      if (from <= s && s < to) out.sends.push_back({v, plan[v].output, nd.shape, nd.type});
      keep = from == s || (from < s && read_here[v]);
      if (from < s) nd.kind = op_kind::input;  // an activation from the stage before
    }
    if (!keep) continue;
    out.local[v] = boost::add_vertex(nd, out.g);
    out.whole.push_back(v);
    out.plan.push_back(plan[v]);
    if (g[v].is_parameter() && stage_of[v].size() > 1) out.tied.push_back(out.local[v]);
    if (detail::is_training_loss(g, v)) out.losses.push_back(out.local[v]);
  }
  for (vertex_t v = 0; v < n; ++v) {
    if (!g[v].is_operator() || stage_of[v].front() != s) continue;
    const std::vector<vertex_t> ops = operands(g, v);
    for (std::size_t i = 0; i < ops.size(); ++i) boost::add_edge(out.local[ops[i]], out.local[v], edge{static_cast<int>(i)}, out.g);
  }
  return out;
}

/// The values stage graph `sg` reads, from `sources` (the whole graph's, indexed by its
/// vertices): a copy of each input and parameter it holds (what a stage's ranks load), and a
/// shape-only stand-in for each activation that arrives.
inline std::vector<host_tensor> stage_sources(const stage_graph& sg, const std::vector<host_tensor>& sources) {
  std::vector<host_tensor> out;
  for (vertex_t v = 0; v < sg.whole.size(); ++v) {
    const host_tensor& t = sources[sg.whole[v]];
    out.push_back(t.data() != nullptr ? host_tensor::copy_of(t) : host_tensor::shape_only(t.type(), sg.g[v].shape));
  }
  return out;
}

/// The ledger entries of a stage's rank with their sites named in the whole graph's vertices
/// (the executor charged the stage graph's; transfers are charged by the whole graph's).
inline std::vector<issued_collective> whole_graph_sites(const stage_graph& sg, std::vector<issued_collective> entries) {
  for (issued_collective& e : entries) {
    traffic_site s = traffic_site::unpack(e.site);
    if (s.what == traffic_site::phase::transfer || s.what == traffic_site::phase::transfer_back) continue;
    s.vertex = sg.whole[s.vertex];
    e.site = s.pack();
  }
  return entries;
}

namespace detail {

/// One rank's part of a pipelined run of stage graph `sg`: the passes of its micro-steps, each
/// with the transfers at its stage's boundaries. A micro-step's forward values stay until its
/// backward (1F1B holds up to p of them on the first stage).
template <class T, splittable_communicator Comm>
class stage_run {
 public:
  using crossing = stage_graph::crossing;
  using backward_type = sharded_backward<T, basic_mesh_communicator<Comm>>;

  stage_run(pipeline_communicator<Comm>& pc, const stage_graph& sg, const std::vector<host_tensor>& sources)
      : pc_(pc), sg_(sg), sources_(sources) {}

  /// The forward alone (one micro-step, `sources` read whole): on_piece sees every operator's piece.
  void forward_only(const piece_callback& on_piece) {
    const liveness_schedule s = make_liveness_schedule(sg_.g, &sg_.plan, run_mode::inference);
    micro_step st;
    forward(st, s, nullptr, on_piece, false);
    pc_.pipeline().wait_sends();
  }

  /// The training step: o.micro_batches micro-steps in `schedule`'s order for this stage, then
  /// the tied parameters' synchronisation and update.
  training_record train(const training_step& o, pipeline_schedule schedule, const piece_callback& on_piece,
                        const parameter_callback& on_param) {
    const liveness_schedule s = make_liveness_schedule(sg_.g, &sg_.plan, run_mode::training);
    micro_batch_inputs batch(sg_.g, sources_, o.micro_batches, true);
    std::vector<micro_step> steps(static_cast<std::size_t>(o.micro_batches));
    backward_type backward(pc_.stage(), sg_.g, sg_.plan, o, on_param, s, steps[0].val, steps[0].saved, sg_.losses);
    for (const crossing& c : sg_.receives)
      if (sg_.local[c.vertex] != stage_graph::none) backward.keep_gradient(sg_.local[c.vertex]);
    for (vertex_t v : sg_.tied) backward.defer(v);
    for (const pipeline_pass& p : schedule_passes(schedule, sg_.stages, sg_.stage, o.micro_batches)) {
      micro_step& st = steps[static_cast<std::size_t>(p.micro_batch)];
      if (!p.backward) {
        const std::vector<host_tensor>* rows = batch.at(p.micro_batch);
        if (rows != nullptr)  // kept with the micro-step: the next one's rows reuse the buffer
          for (const host_tensor& t : *rows) st.rows.push_back(host_tensor::copy_of(t));
        forward(st, s, rows != nullptr ? &st.rows : nullptr, on_piece, true);
        continue;
      }
      receive_gradients(backward);
      backward.bind(st.val, st.saved);
      backward.run(p.micro_batch, o.micro_batches);
      send_gradients(backward);
      st = micro_step();
    }
    pc_.pipeline().wait_sends();
    backward.finish_deferred([this](vertex_t v, host_tensor& grad) {
      const auto site = charge(pc_.stage(), traffic_site::gradient(v));
      pc_.tied().all_reduce(grad.data(), static_cast<std::size_t>(grad.numel()), grad.type(), reduce_op::sum);
    });
    return std::move(backward).record();
  }

 private:
  /// One micro-step's forward values, what its backward reads, the activations that arrived
  /// and its rows of the global batch.
  struct micro_step {
    std::vector<held_value> val;
    std::vector<saved_forward> saved;
    std::vector<host_tensor> received, rows;
  };

  /// The buffer of c's piece on this rank (`gradient`: of its gradient, Partial settled).
  host_tensor buffer(const crossing& c, bool gradient) {
    const dtype t = is_integer(c.type) ? dtype::i64 : compute_dtype<T>();
    return host_tensor(t, local_box(pc_.stage().mesh(), gradient ? settled_spec(c.spec) : c.spec, c.shape, pc_.stage().rank()).shape);
  }
  static std::size_t elements(const host_tensor& t) { return static_cast<std::size_t>(t.numel()); }

  void forward(micro_step& st, const liveness_schedule& s, const std::vector<host_tensor>* rows, const piece_callback& on_piece,
               bool keep) {
    st.received.clear();
    st.received.resize(sg_.whole.size());
    std::map<vertex_t, host_tensor> through, out;  // pieces this stage only hands on; its own for the next stage
    for (const crossing& c : sg_.receives) {
      host_tensor p = buffer(c, false);
      const auto site = charge(pc_.stage(), traffic_site::transfer(c.vertex, sg_.stage - 1));
      if (c.vertex != sg_.dropped) pc_.pipeline().recv(p.data(), elements(p), p.type(), sg_.stage - 1);
      (sg_.local[c.vertex] != stage_graph::none ? st.received[sg_.local[c.vertex]] : through[c.vertex]) = std::move(p);
    }
    const piece_callback hand_on = [&](vertex_t v, const host_tensor& piece, const sharding_spec& spec) {
      if (sg_.g[v].is_operator())
        for (const crossing& c : sg_.sends)
          if (c.vertex == sg_.whole[v]) out[c.vertex] = host_tensor::copy_of(piece);
      if (on_piece && sg_.g[v].is_operator()) on_piece(v, piece, spec);
    };
    forward_sharded<T>(pc_.stage(), sg_.g, sg_.plan, sources_, hand_on, st.val, keep ? &st.saved : nullptr, s, rows, &st.received);
    for (const crossing& c : sg_.sends) {
      const vertex_t l = sg_.local[c.vertex];
      const host_tensor& p = out.count(c.vertex) ? out[c.vertex] : l != stage_graph::none ? st.received[l] : through[c.vertex];
      const auto site = charge(pc_.stage(), traffic_site::transfer(c.vertex, sg_.stage));
      if (c.vertex != sg_.dropped) pc_.pipeline().send(p.data(), elements(p), p.type(), sg_.stage + 1);
    }
  }

  void receive_gradients(backward_type& backward) {
    through_grad_.clear();
    for (const crossing& c : sg_.sends) {
      if (is_integer(c.type)) continue;
      host_tensor d = buffer(c, true);
      const auto site = charge(pc_.stage(), traffic_site::transfer_back(c.vertex, sg_.stage));
      if (c.vertex != sg_.dropped) pc_.pipeline().recv(d.data(), elements(d), d.type(), sg_.stage + 1);
      if (sg_.local[c.vertex] != stage_graph::none) backward.seed(sg_.local[c.vertex], settled_spec(c.spec), std::move(d));
      else through_grad_[c.vertex] = std::move(d);
    }
  }

  void send_gradients(backward_type& backward) {
    for (const crossing& c : sg_.receives) {
      if (is_integer(c.type)) continue;
      const vertex_t l = sg_.local[c.vertex];
      const host_tensor d = l != stage_graph::none ? backward.take_gradient(l, settled_spec(c.spec)) : std::move(through_grad_[c.vertex]);
      const auto site = charge(pc_.stage(), traffic_site::transfer_back(c.vertex, sg_.stage - 1));
      if (c.vertex != sg_.dropped) pc_.pipeline().send(d.data(), elements(d), d.type(), sg_.stage - 1);
    }
  }

  pipeline_communicator<Comm>& pc_;
  const stage_graph& sg_;
  const std::vector<host_tensor>& sources_;
  std::map<vertex_t, host_tensor> through_grad_;  // gradients this stage only hands back
};

}  // namespace detail

/// This rank's stage of a pipelined forward (every rank of `pc`'s world calls it with its own
/// stage graph): the activations from the stage before, the stage's operators on the sharded
/// executor (on_piece sees each operator's piece, by vertex of sg.g), the activations to the next.
template <class T, splittable_communicator Comm>
void run_stage(pipeline_communicator<Comm>& pc, const stage_graph& sg, const std::vector<host_tensor>& sources,
               const piece_callback& on_piece = {}) {
  detail::stage_run<T, Comm>(pc, sg, sources).forward_only(on_piece);
}

/// This rank's stage of a pipelined training step: o.micro_batches micro-steps (`sources`' batch
/// inputs hold the global batch) in `schedule`'s order, their transfers, and the optimizer step
/// on the stage's parameters (on_param sees each gradient and update, by vertex of sg.g).
template <class T, splittable_communicator Comm>
training_record train_stage(pipeline_communicator<Comm>& pc, const stage_graph& sg, const std::vector<host_tensor>& sources,
                            const training_step& o, pipeline_schedule schedule, const piece_callback& on_piece,
                            const parameter_callback& on_param) {
  return detail::stage_run<T, Comm>(pc, sg, sources).train(o, schedule, on_piece, on_param);
}

}  // namespace autoshard
