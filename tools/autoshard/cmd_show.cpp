// autoshard show: which rank holds which block of a tensor, as a block map in the
// terminal (like DTensor's visualize_sharding) and optionally as SVG. With --plan, the
// tensors of a plan file (written by `autoshard plan --out`) with their specs and local
// shapes, and, with --tensor, the block map of one of them.
#include "common.hpp"
#include "paths.hpp"
#include "tensor_names.hpp"
#if defined(AUTOSHARD_TOOL_HAVE_PLAN)
#include <autoshard/graph/fused.hpp>  // fused_dim_of: tensors cut per part
#include <autoshard/pass/pipelined.hpp>  // stages_of_parameters: a pipelined plan's stages against its graph
#include <autoshard/pass/loaded_plan.hpp>  // check_micro_batch: the micro-batch the pricing line states
#include <autoshard/plan/plan.hpp>
#endif

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace autoshard::tool {
namespace {

struct show_options {
  mesh_options mesh;
  std::string shape = "8,8";
  std::string spec;
  std::string plan;
  std::string tensor;
  std::string svg;
  std::string slice;  ///< for tensors of rank > 2: one index per leading dim ("0,3"); empty: every block
  bool json = false;
  bool follow_symlinks = false;
};

/// Cut points of one dim: every shard boundary of every rank.
std::vector<std::int64_t> cuts(const std::vector<shard_box>& boxes, std::size_t dim, std::int64_t n) {
  std::set<std::int64_t> c{0, n};
  for (const auto& b : boxes) {
    c.insert(std::min(b.offset[dim], n));
    c.insert(std::min(b.offset[dim] + b.shape[dim], n));
  }
  return {c.begin(), c.end()};
}

std::string join_ranks(const std::vector<int>& rs) {
  std::string s;
  for (std::size_t k = 0; k < rs.size(); ++k) s += (k ? "," : "") + std::to_string(rs[k]);
  return s;
}

/// The ranks holding a block, grouped by the partial value they hold: ranks with equal
/// coordinates on the spec's Partial axes hold the same one. Without Partial axes, one group.
std::vector<std::vector<int>> partial_groups(const device_mesh& m, const sharding_spec& s, const std::vector<int>& ranks) {
  std::map<std::vector<int>, std::vector<int>> groups;
  for (int r : ranks) {
    const auto c = m.coordinate(r);
    std::vector<int> key;
    for (std::size_t a = 0; a < s.mesh_rank; ++a)
      if (s[a].is_partial()) key.push_back(c[a]);
    groups[key].push_back(r);
  }
  std::vector<std::vector<int>> out;
  for (auto& [k, rs] : groups) out.push_back(std::move(rs));
  return out;
}

/// A block's label: its ranks, or its partial groups joined by '+' (sum) or '|' (max, min):
/// "0,1+2,3" under [P,R] on a 2x2 mesh (ranks 0 and 1 hold one partial value, 2 and 3 another).
std::string block_label(const sharding_spec& s, const std::vector<std::vector<int>>& groups, const char* sep_sum = "+",
                        const char* sep_other = "|") {
  if (groups.empty()) return "-";
  bool all_sum = true;
  for (std::size_t a = 0; a < s.mesh_rank; ++a)
    if (s[a].is_partial()) all_sum = all_sum && s[a].op == reduce_op::sum;
  std::string out;
  for (const auto& g : groups) out += (out.empty() ? "" : all_sum ? sep_sum : sep_other) + join_ranks(g);
  return out;
}

struct block_map {
  std::vector<std::int64_t> rows, cols;              // cut points on the shown dims
  std::vector<std::vector<std::vector<int>>> owners;  // [row][col] -> ranks
  std::vector<std::vector<std::vector<std::vector<int>>>> groups;  // [row][col] -> partial_groups
  std::vector<std::vector<std::string>> labels;                     // [row][col] -> block_label
  std::vector<std::vector<std::string>> svg_labels;                 // the same, spaced for SVG
};

/// One block of the leading dims (all but the last two): [lo, hi) per dim.
using leading_block = std::vector<std::pair<std::int64_t, std::int64_t>>;

/// The block map of the last two dims (or the only dim) within one block of the leading dims
/// (`lead`, empty for rank <= 2): the ranks that hold that block of the leading dims. Each
/// rank is added to the blocks its box covers, found by binary search in the cut points: the
/// work is the ranks plus the map's size (comparing every block with every rank took 90 s for
/// `show --mesh 32768 --shape 32768,8 --spec "[S(0)]"`).
block_map build_map(const device_mesh& m, const sharding_spec& s, const tensor_shape& shape, const leading_block& lead = {}) {
  std::vector<shard_box> boxes;
  for (int r = 0; r < m.num_ranks(); ++r) boxes.push_back(local_box(m, s, shape, r));
  const std::size_t rd = shape.rank >= 2 ? shape.rank - 2u : 0u;
  const std::size_t cd = shape.rank >= 2 ? shape.rank - 1u : 0u;
  const bool one_d = shape.rank == 1;
  block_map bm;
  bm.rows = one_d ? std::vector<std::int64_t>{0, 1} : cuts(boxes, rd, shape[rd]);
  bm.cols = cuts(boxes, cd, shape[cd]);
  bm.owners.assign(bm.rows.size() - 1, std::vector<std::vector<int>>(bm.cols.size() - 1));
  bm.groups.assign(bm.rows.size() - 1, std::vector<std::vector<std::vector<int>>>(bm.cols.size() - 1));
  bm.labels.assign(bm.rows.size() - 1, std::vector<std::string>(bm.cols.size() - 1));
  bm.svg_labels = bm.labels;
  // The blocks [lo, hi) covers: the cut points are every box's ends, so both are cut points.
  const auto span = [](const std::vector<std::int64_t>& c, std::int64_t lo, std::int64_t hi) {
    const auto at = [&c](std::int64_t x) {
      return static_cast<std::size_t>(std::lower_bound(c.begin(), c.end(), std::min(x, c.back())) - c.begin());
    };
    return std::pair{at(lo), at(hi)};
  };
  for (int r = 0; r < m.num_ranks(); ++r) {
    const auto& b = boxes[static_cast<std::size_t>(r)];
    if (b.empty()) continue;
    bool leading_ok = true;  // holds this block of every leading dim
    for (std::size_t d = 0; d + 2 < shape.rank; ++d) {
      const std::int64_t lo = d < lead.size() ? lead[d].first : 0, hi = d < lead.size() ? lead[d].second : 1;
      leading_ok = leading_ok && b.offset[d] <= lo && hi <= b.offset[d] + b.shape[d] && b.shape[d] > 0;
    }
    if (!leading_ok) continue;
    const auto [i0, i1] = one_d ? std::pair<std::size_t, std::size_t>{0, 1} : span(bm.rows, b.offset[rd], b.offset[rd] + b.shape[rd]);
    const auto [j0, j1] = span(bm.cols, b.offset[cd], b.offset[cd] + b.shape[cd]);
    for (std::size_t i = i0; i < i1; ++i)
      for (std::size_t j = j0; j < j1; ++j) bm.owners[i][j].push_back(r);
  }
  for (std::size_t i = 0; i + 1 < bm.rows.size(); ++i)
    for (std::size_t j = 0; j + 1 < bm.cols.size(); ++j) {
      bm.groups[i][j] = partial_groups(m, s, bm.owners[i][j]);
      bm.labels[i][j] = block_label(s, bm.groups[i][j]);
      bm.svg_labels[i][j] = block_label(s, bm.groups[i][j], " + ", " | ");
    }
  return bm;
}

void print_map(const block_map& bm, std::ostream& os) {
  std::vector<std::size_t> width(bm.cols.size() - 1, 0);
  for (std::size_t j = 0; j + 1 < bm.cols.size(); ++j) {
    width[j] = std::to_string(bm.cols[j]).size() + std::to_string(bm.cols[j + 1]).size() + 1;
    for (const auto& row : bm.labels) width[j] = std::max(width[j], row[j].size());
    width[j] += 2;
  }
  std::size_t rw = 0;
  for (std::size_t i = 0; i + 1 < bm.rows.size(); ++i)
    rw = std::max(rw, std::to_string(bm.rows[i]).size() + std::to_string(bm.rows[i + 1]).size() + 1);
  auto pad = [](std::string s, std::size_t w) {
    std::size_t l = (w - s.size()) / 2;
    return std::string(l, ' ') + s + std::string(w - s.size() - l, ' ');
  };
  auto rule = [&] {
    os << std::string(rw + 1, ' ') << "+";
    for (std::size_t w : width) os << std::string(w, '-') << "+";
    os << "\n";
  };
  os << std::string(rw + 1, ' ') << " ";
  for (std::size_t j = 0; j + 1 < bm.cols.size(); ++j)
    os << pad(std::to_string(bm.cols[j]) + ":" + std::to_string(bm.cols[j + 1]), width[j]) << " ";
  os << "\n";
  rule();
  for (std::size_t i = 0; i + 1 < bm.rows.size(); ++i) {
    std::string rl = std::to_string(bm.rows[i]) + ":" + std::to_string(bm.rows[i + 1]);
    os << std::string(rw - rl.size(), ' ') << rl << " |";
    for (std::size_t j = 0; j + 1 < bm.cols.size(); ++j) os << pad(bm.labels[i][j], width[j]) << "|";
    os << "\n";
    rule();
  }
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// The block map as SVG: blocks in proportion to the index ranges they cover (the drawing's
/// aspect follows the tensor's, within limits), coloured by their first rank, labelled with
/// block_label, cut points along the top and left, and `notes` under the title.
void write_svg(const block_map& bm, const std::string& title, const std::vector<std::string>& notes,
               const std::string& path) {
  const double total_c = static_cast<double>(bm.cols.back() - bm.cols.front());
  const double total_r = static_cast<double>(bm.rows.back() - bm.rows.front());
  const bool one_d = bm.rows.size() == 2 && bm.rows.back() == 1 && total_c > 1;
  const double W = 560;
  const double H = one_d ? 80 : std::clamp(W * total_r / total_c, 120.0, 400.0);
  const double x0 = 80, y0 = 50 + 16 * static_cast<double>(notes.size()) + 20;
  static const char* palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  std::ostringstream f;
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W + x0 + 30 << "\" height=\"" << H + y0 + 20
    << "\" font-family=\"monospace\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
    << "<text x=\"10\" y=\"24\" font-size=\"14\">" << xml_escape(title) << "</text>\n";
  for (std::size_t k = 0; k < notes.size(); ++k)
    f << "<text x=\"10\" y=\"" << 44 + 16 * static_cast<double>(k) << "\" fill=\"#444\">" << xml_escape(notes[k])
      << "</text>\n";
  auto xs = [&](std::int64_t c) { return x0 + W * static_cast<double>(c - bm.cols.front()) / total_c; };
  auto ys = [&](std::int64_t r) { return y0 + H * static_cast<double>(r - bm.rows.front()) / total_r; };
  for (std::size_t i = 0; i + 1 < bm.rows.size(); ++i)
    for (std::size_t j = 0; j + 1 < bm.cols.size(); ++j) {
      const double x = xs(bm.cols[j]), w = xs(bm.cols[j + 1]) - x;
      const double y = ys(bm.rows[i]), h = ys(bm.rows[i + 1]) - y;
      // One sheet per partial group, stacked down and right, the last in front: a [P,R]
      // block is two sheets whose sum is the tensor.
      const auto& groups = bm.groups[i][j];
      const std::size_t k = std::max<std::size_t>(groups.size(), 1);
      const double step = std::min({12.0, w / 4 / static_cast<double>(k), h / 4 / static_cast<double>(k)});
      const double sw = w - step * static_cast<double>(k - 1), sh = h - step * static_cast<double>(k - 1);
      for (std::size_t g = 0; g < k; ++g) {
        const char* fill =
            groups.empty() ? "#ffffff" : palette[static_cast<std::size_t>(groups[g].front()) % 10];
        f << "<rect x=\"" << x + step * static_cast<double>(g) << "\" y=\"" << y + step * static_cast<double>(g)
          << "\" width=\"" << sw << "\" height=\"" << sh << "\" fill=\"" << fill
          << "\" fill-opacity=\"" << (k == 1 ? 0.75 : 1.0) << "\" stroke=\"#222\"/>\n";
      }
      const auto& own = bm.owners[i][j];
      const double front = step * static_cast<double>(k - 1);  // label the front sheet
      f << "<text x=\"" << x + front + sw / 2 << "\" y=\"" << y + front + sh / 2 + 4 << "\" text-anchor=\"middle\">"
        << (own.size() == 1 ? "rank " : own.empty() ? "" : "ranks ") << xml_escape(bm.svg_labels[i][j]) << "</text>\n";
    }
  // Cut points: column cuts above the blocks, row cuts left of them.
  for (std::int64_t c : bm.cols)
    f << "<text x=\"" << xs(c) << "\" y=\"" << y0 - 6 << "\" text-anchor=\"middle\" font-size=\"10\" fill=\"#444\">"
      << c << "</text>\n";
  if (!one_d)
    for (std::int64_t r : bm.rows)
      f << "<text x=\"" << x0 - 6 << "\" y=\"" << ys(r) + 4
        << "\" text-anchor=\"end\" font-size=\"10\" fill=\"#444\">" << r << "</text>\n";
  f << "</svg>\n";

  write_file_atomically(path, f.str());
}

/// Refuses, before anything is computed or written, a drawing (the terminal's map, or --svg) of
/// a mesh of more than max_drawn_ranks ranks (common.hpp). The largest mesh a file or flag may
/// give, 2^20 ranks, drew a 194 MB SVG and 33 MB of text in 4 s (`show --mesh 1024x1024 --shape
/// 1048576,1048576 --spec S0S1 --svg`). --json (for programs) lists every block's owners at
/// any mesh size the mesh reader takes.
void check_drawable(const device_mesh& m, const std::string& svg, bool json) {
  if (m.num_ranks() <= max_drawn_ranks || (json && svg.empty())) return;
  throw spec_error(std::string(svg.empty() ? "show" : "--svg") + ": the block map of " + to_string(m) + " would name its " +
                   std::to_string(m.num_ranks()) + " ranks, but a drawing holds at most " + std::to_string(max_drawn_ranks) +
                   " (max_drawn_ranks): nothing drawn; --json" + (svg.empty() ? "" : " without --svg") +
                   " lists every block's owners");
}

/// One line per Partial mesh axis: what its values mean.
std::vector<std::string> partial_notes(const device_mesh& m, const sharding_spec& s) {
  std::vector<std::string> notes;
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    if (s[i].is_partial())
      notes.push_back(m.axis_label(i) + " is Partial(" + std::string(to_string(s[i].op)) +
                      "): ranks apart on it hold partial values, the tensor is their " + std::string(to_string(s[i].op)));
  return notes;
}

/// Draws `s` of `shape` on `m`: terminal or JSON, and SVG. `extra` is added to the JSON
/// document and `heading` printed before the map.
/// The blocks of the leading dims to draw: every block the shards cut them into, or the one
/// holding the indices of `slice` ("0,3": one index per leading dim).
std::vector<leading_block> leading_blocks(const device_mesh& m, const sharding_spec& s, const tensor_shape& shape,
                                          const std::string& slice) {
  const std::size_t nlead = shape.rank > 2 ? shape.rank - 2 : 0;
  std::vector<shard_box> boxes;
  for (int r = 0; r < m.num_ranks(); ++r) boxes.push_back(local_box(m, s, shape, r));
  std::vector<std::vector<std::int64_t>> cut(nlead);
  for (std::size_t d = 0; d < nlead; ++d) cut[d] = cuts(boxes, d, shape[d]);
  if (!slice.empty()) {
    if (nlead == 0) throw shape_error("--slice picks indices of the leading dims; a tensor of rank " + std::to_string(shape.rank) + " has none");
    const tensor_shape idx = parse_shape_list(slice, {"--slice", "an index", "indices", "0,3"});
    if (idx.rank != nlead)
      throw shape_error("--slice " + quoted_text(slice) + " gives " + count_noun(idx.rank, "index", "indices") + "; the tensor " +
                        to_string(shape) + " has " + count_noun(nlead, "leading dim") + " (all but the last two)");
    leading_block one;
    for (std::size_t d = 0; d < nlead; ++d) {
      if (idx[d] >= shape[d])
        throw shape_error("--slice: index " + std::to_string(idx[d]) + " of dim " + std::to_string(d) + " is outside its size " +
                          std::to_string(shape[d]));
      const auto hi = std::upper_bound(cut[d].begin(), cut[d].end(), idx[d]);
      one.push_back({*(hi - 1), *hi});
    }
    return {one};
  }
  std::vector<leading_block> out{{}};
  for (std::size_t d = 0; d < nlead; ++d) {
    std::vector<leading_block> next;
    for (const leading_block& b : out)
      for (std::size_t k = 0; k + 1 < cut[d].size(); ++k) {
        leading_block nb = b;
        nb.push_back({cut[d][k], cut[d][k + 1]});
        next.push_back(nb);
      }
    out = std::move(next);
    if (out.size() > 64)
      throw shape_error("the shards cut the leading dims of " + to_string(shape) + " into more than 64 blocks; pick one with --slice");
  }
  return out;
}

std::string leading_text(const leading_block& b) {
  std::string t;
  for (std::size_t d = 0; d < b.size(); ++d)
    t += (d ? ", " : "") + std::string("dim ") + std::to_string(d) + " [" + std::to_string(b[d].first) + "," +
         std::to_string(b[d].second) + ")";
  return t;
}

void draw(const device_mesh& m, const sharding_spec& s, const tensor_shape& shape, const std::string& svg, bool json,
          const nlohmann::json& extra, const std::string& heading, const std::string& slice = "") {
  if (shape.rank == 0) throw shape_error("show needs a tensor of rank 1 or more");
  // A dim of 0 leaves no block to draw: the map was an empty frame (a "+" and the row labels),
  // under a note that blamed an uneven split ("ranks 0,1 hold nothing: the split is uneven").
  for (std::size_t d = 0; d < shape.rank; ++d)
    if (shape[d] == 0 && (!json || !svg.empty()))
      throw shape_error(std::string(svg.empty() ? "show" : "--svg") + ": " + to_string(shape) + " has no elements (dim " + std::to_string(d) +
                        " is 0): no rank holds any of it, there is no block map to draw; --json" + (svg.empty() ? "" : " without --svg") +
                        " lists the empty blocks");
  const std::vector<leading_block> blocks = leading_blocks(m, s, shape, slice);
  std::vector<block_map> maps;
  for (const leading_block& b : blocks) maps.push_back(build_map(m, s, shape, b));
  const block_map& bm = maps.front();
  std::vector<std::string> notes = partial_notes(m, s);
  if (shape.rank > 2)
    notes.insert(notes.begin(), blocks.size() == 1 ? "the last two dims at " + leading_text(blocks.front())
                                                   : "the last two dims, one map per block of the leading dims (" +
                                                         std::to_string(blocks.size()) + " blocks; --slice picks one)");
  std::vector<int> empty;  // uneven splits can leave ranks with nothing
  for (int r = 0; r < m.num_ranks(); ++r)
    if (local_box(m, s, shape, r).empty()) empty.push_back(r);
  if (!empty.empty())
    notes.push_back((empty.size() == 1 ? "rank " : "ranks ") + join_ranks(empty) + (empty.size() == 1 ? " holds" : " hold") +
                    " nothing: the split is uneven (ceil rule)");
  if (json) {
    nlohmann::json partial = nlohmann::json::array();
    for (std::size_t i = 0; i < s.mesh_rank; ++i)
      if (s[i].is_partial()) partial.push_back({{"mesh_axis", i}, {"op", std::string(to_string(s[i].op))}});
    nlohmann::json j{{"mesh", to_json(m)}, {"shape", to_json(shape)}, {"spec", to_string(s)},
                     {"alpa", to_alpa_string(s)}, {"row_cuts", bm.rows}, {"col_cuts", bm.cols},
                     {"owners", bm.owners}, {"labels", bm.labels}, {"partial", partial},
                     {"local_shape", to_json(max_local_shape(m, s, shape))}, {"even", divides_evenly(m, s, shape)},
                     {"empty_ranks", empty}};
    if (shape.rank > 2) {
      nlohmann::json ms = nlohmann::json::array();
      for (std::size_t k = 0; k < maps.size(); ++k) {
        nlohmann::json lead = nlohmann::json::array();
        for (const auto& [lo, hi] : blocks[k]) lead.push_back({lo, hi});
        ms.push_back({{"leading", lead}, {"row_cuts", maps[k].rows}, {"col_cuts", maps[k].cols},
                      {"owners", maps[k].owners}, {"labels", maps[k].labels}});
      }
      j["maps"] = ms;
    }
    j.update(extra);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << heading << to_string(s) << " (" << to_alpa_string(s) << ") of " << shape << " on " << m << "\n";
    for (const auto& n : notes) std::cout << "note: " << n << "\n";
    for (std::size_t k = 0; k < maps.size(); ++k) {
      if (maps.size() > 1) std::cout << (k ? "\n" : "") << leading_text(blocks[k]) << ":\n";
      print_map(maps[k], std::cout);
    }
  }
  if (!svg.empty()) {
    std::string sub = heading;  // the heading is the SVG's first note line
    while (!sub.empty() && (sub.back() == '\n' || sub.back() == ' ')) sub.pop_back();
    if (!sub.empty()) notes.insert(notes.begin(), sub);
    if (maps.size() > 1) notes.push_back("this picture: " + leading_text(blocks.front()) + " (--slice picks another block)");
    write_svg(bm, to_string(s) + " (" + to_alpa_string(s) + ") of " + to_string(shape) + " on " + to_string(m), notes,
              svg);
    if (!json) std::cout << "wrote " << escaped_text(svg) << "\n";
  }
}

int run_show_spec(show_options o) {
  command_paths paths(o.follow_symlinks);
  o.svg = paths.output_path("--svg", o.svg).string();
  paths.check();
  const device_mesh m = o.mesh.build();
  check_drawable(m, o.svg, o.json);
  const tensor_shape shape = parse_shape_list(o.shape);
  if (shape.rank == 0) throw shape_error("show needs a tensor of rank 1 or more");
  const sharding_spec s = parse_spec(o.spec, static_cast<int>(m.ndim()), static_cast<int>(shape.rank));
  check_spec(s, m, shape, "--spec");
  draw(m, s, shape, o.svg, o.json, nlohmann::json::object(), "", o.slice);
  return exit_ok;
}

#if defined(AUTOSHARD_TOOL_HAVE_PLAN)
// ---- plan files -------------------------------------------------------------------------------

// The plan document as the one plan reader gives it (plan/document.hpp), read whole: the
// functions below look at its graph and tensors directly.

/// Training plans: the settings they were priced with, and the parameters' ZeRO stages ("" for
/// an inference plan).
std::string training_line(const plan_document& d) {
  if (d.pricing.mode != run_mode::training) return {};
  std::size_t zero1 = 0, zero2 = 0;
  for (const plan_tensor& t : d.tensors) {
    zero1 += t.strategy.ends_with(" zero-1");
    zero2 += t.strategy.ends_with(" zero-2");
  }
  return describe_training(d.pricing) + "; parameters stored ZeRO-1: " + std::to_string(zero1) +
         ", ZeRO-2: " + std::to_string(zero2);
}

/// Tensor v's operand specs in Alpa notation.
std::vector<std::string> input_specs(const plan_document& d, vertex_t v) {
  std::vector<std::string> out;
  for (const sharding_spec& in : d.tensors[v].inputs) out.push_back(to_alpa_string(in));
  return out;
}

/// The fused dim of tensor v (c_attn's q | k | v) when its spec cuts it: a cut of it is per part.
std::optional<fused_dim> cut_per_part(const plan_document& d, vertex_t v) {
  const fused_dim f = fused_dim_of(d.graph, v);
  if (f.any() && d.tensors[v].output.is_sharded(f.dim)) return f;
  return std::nullopt;
}

/// The vertex `want` names, as users write tensor names (tensor_names.hpp: the graph's name,
/// the checkpoint spelling, a tied weight's state-dict name; `tied` says which it is then).
vertex_t find_plan_tensor(const plan_document& d, const std::string& want, const std::string& file, std::string* tied = nullptr) {
  if (const std::optional<vertex_t> v = find_tensor(d.graph, want, tied)) return *v;
  throw graph_error("plan file " + quoted_path(file) + " has no tensor " + quoted_text(want) + did_you_mean(d.graph, want) +
                    " (`autoshard show --plan " + file + "` lists all " + std::to_string(d.tensors.size()) + ")");
}

/// --plan --tensor NAME: the block map of one tensor's output spec.
void show_plan_tensor(const plan_document& d, const show_options& o) {
  check_drawable(d.mesh, o.svg, o.json);
  std::string tied;
  const vertex_t v = find_plan_tensor(d, o.tensor, o.plan, &tied);
  if (!tied.empty() && !o.json) std::cout << "note: " << tied << "\n";
  const node& nd = d.graph[v];
  const plan_tensor& t = d.tensors[v];
  if (nd.shape.rank == 0)
    throw shape_error("tensor " + quoted_text(nd.name) + " is a scalar: every rank holds all of it, there is no block map");
  const std::string kind(to_string(nd.kind));
  nlohmann::json extra{{"plan", o.plan}, {"tensor", nd.name}, {"kind", kind}, {"strategy", t.strategy},
                       {"inputs", input_specs(d, v)}};
  // The plan file's name and strategy escaped (a hostile file's ESC or newline), not quoted: the
  // heading reads "h.0.mlp.c_fc.weight: parameter, strategy ..." as before.
  std::string heading = escaped_name(nd.name) + ": " + kind + (t.strategy.empty() ? "" : ", strategy " + escaped_name(t.strategy)) + "\n";
  tensor_shape shape = nd.shape;
  if (const std::optional<fused_dim> f = cut_per_part(d, v)) {
    // Every part is cut alike and each rank holds its block of every part: the map of one part.
    shape[static_cast<std::size_t>(f->dim)] /= f->parts;
    heading += "dim " + std::to_string(f->dim) + " is " + std::to_string(f->parts) + " fused parts of " +
               std::to_string(shape[static_cast<std::size_t>(f->dim)]) +
               ", cut alike: the map shows one part, and each rank holds its block of every part\n";
    extra["fused"] = nlohmann::json{{"dim", f->dim}, {"parts", f->parts}};
    extra["global_shape"] = to_json(nd.shape);  // "shape" is the part drawn
    extra["local_shape"] = to_json(max_local_shape(d.mesh, t.output, nd.shape));
  }
  draw(d.mesh, t.output, shape, o.svg, o.json, extra, heading, o.slice);
}

/// --plan --json: every tensor with its specs and local shape, and the mesh with its links.
void show_plan_json(const plan_document& d, const std::string& file, const std::optional<plan_pipeline>& priced,
                    const std::vector<std::string>& recorded_differs) {
  const device_mesh& m = d.mesh;
  nlohmann::json ts = nlohmann::json::array();
  for (vertex_t v = 0; v < d.tensors.size(); ++v) {
    const node& nd = d.graph[v];
    const sharding_spec& spec = d.tensors[v].output;
    ts.push_back({{"name", nd.name},
                  {"kind", std::string(to_string(nd.kind))},
                  {"shape", to_json(nd.shape)},
                  {"strategy", d.tensors[v].strategy},
                  {"inputs", input_specs(d, v)},
                  {"spec", to_string(spec)},
                  {"alpa", to_alpa_string(spec)},
                  {"local_shape", to_json(max_local_shape(m, spec, nd.shape))},
                  {"even", divides_evenly(m, spec, nd.shape)}});
    if (const std::optional<fused_dim> f = cut_per_part(d, v)) ts.back()["fused"] = nlohmann::json{{"dim", f->dim}, {"parts", f->parts}};
  }
  nlohmann::json j{{"plan", file},
                   {"algo", std::string(to_string(d.options.algo))},
                   {"mode", std::string(to_string(d.pricing.mode))},
                   {"mesh", to_json(m)},
                   {"tensors", ts}};
  if (const std::string training = training_line(d); !training.empty()) j["training"] = training;
  if (priced) {  // the figures priced again (reprice_pipeline), never the file's own
    nlohmann::json stages = nlohmann::json::array();
    for (std::size_t k = 0; k < priced->stages.size(); ++k) {
      const plan_stage& s = priced->stages[k];
      stages.push_back({{"holds", describe_stage(*priced, k)}, {"first_layer", s.first_layer}, {"layers", s.layers},
                        {"seconds", s.seconds}, {"memory_bytes", s.memory_bytes}, {"in_flight", s.in_flight}});
    }
    j["pipeline"] = {{"schedule", std::string(to_string(priced->schedule))}, {"stages", stages},
                     {"step_seconds", priced->step_seconds}, {"bubble_fraction", priced->bubble_fraction}};
    if (!recorded_differs.empty()) j["pipeline"]["recorded_differs"] = recorded_differs;
  }
  std::cout << j.dump(2) << "\n";
}

/// A pipelined plan's stages, before its tensors (which every stage's mesh holds for its layers).
void show_plan_stages(const plan_pipeline& p, const device_mesh& m) {
  std::cout << "pipeline of " << describe(p) << "; each stage on its own " << to_string(m) << ", step "
            << human_seconds(p.step_seconds) << " (bubble " << std::fixed << std::setprecision(1) << 100 * p.bubble_fraction
            << " %)" << std::defaultfloat << "\n";
  for (std::size_t k = 0; k < p.stages.size(); ++k)
    std::cout << "  stage " << k << ": " << describe_stage(p, k) << ", " << human_seconds(p.stages[k].seconds) << " per micro-batch, "
              << human_bytes(static_cast<double>(p.stages[k].memory_bytes)) << " per device (" << p.stages[k].in_flight
              << " in flight)\n";
}

/// --plan: one row per tensor, columns as wide as their widest cell.
void show_plan_table(const plan_document& d, const std::string& file, const std::optional<plan_pipeline>& priced,
                     const std::vector<std::string>& recorded_differs) {
  const device_mesh& m = d.mesh;
  const std::size_t n = d.tensors.size();
  std::size_t wn = 6, wk = 4, ws = 5, wd = 4, wa = 4;
  for (vertex_t v = 0; v < n; ++v) {
    const node& nd = d.graph[v];
    wn = std::max(wn, escaped_name(nd.name).size());
    wk = std::max(wk, to_string(nd.kind).size());
    ws = std::max(ws, to_string(nd.shape).size());
    wd = std::max(wd, to_string(d.tensors[v].output).size());
    wa = std::max(wa, to_alpa_string(d.tensors[v].output).size());
  }
  const auto cell = [](std::size_t w) { return std::setw(static_cast<int>(w)); };
  const std::string training = training_line(d);
  std::cout << "plan " << escaped_text(file) << ": " << to_string(d.options.algo) << ", " << to_string(d.pricing.mode) << ", "
            << to_string(m) << ", " << n << " tensors (output specs; local shape = the largest shard, rank 0's)\n";
  if (!training.empty()) std::cout << "priced for training with " << training << "\n";
  if (priced) {
    show_plan_stages(*priced, m);
    if (!recorded_differs.empty()) {
      std::cout << "  (priced again: the file records ";
      for (std::size_t k = 0; k < recorded_differs.size(); ++k) std::cout << (k ? ", " : "") << recorded_differs[k];
      std::cout << "; another pricing wrote it, or an edit)\n";
    }
  }
  std::cout << std::left << "  " << cell(wn) << "tensor" << "  " << cell(wk) << "kind" << "  " << cell(ws) << "shape" << "  "
            << cell(wd) << "spec" << "  " << cell(wa) << "alpa" << "  local shape\n";
  bool any_uneven = false;
  for (vertex_t v = 0; v < n; ++v) {
    const node& nd = d.graph[v];
    const sharding_spec& spec = d.tensors[v].output;
    const bool even = divides_evenly(m, spec, nd.shape);
    any_uneven = any_uneven || !even;
    const std::string alpa = to_alpa_string(spec);
    const std::optional<fused_dim> f = cut_per_part(d, v);
    std::cout << "  " << cell(wn) << escaped_name(nd.name) << "  " << cell(wk) << to_string(nd.kind) << "  " << cell(ws) << to_string(nd.shape)
              << "  " << cell(wd) << to_string(spec) << "  " << cell(wa) << (alpa.empty() ? "-" : alpa) << "  "
              << to_string(max_local_shape(m, spec, nd.shape)) << (even ? "" : " *")
              << (f ? " (dim " + std::to_string(f->dim) + ": " + std::to_string(f->parts) + " fused parts, each cut)" : "")
              << "\n";
  }
  std::cout << std::right;
  if (any_uneven) std::cout << "* uneven: some ranks hold less than the shape shown, or nothing\n";
  std::cout << "draw one: autoshard show --plan " << escaped_text(file) << " --tensor NAME [--svg FILE]\n";
}

int run_show_plan(show_options o) {
  command_paths paths(o.follow_symlinks);  // `show --plan P --svg P` replaced the plan with a picture
  paths.input("--plan", o.plan);
  o.svg = paths.output_path("--svg", o.svg).string();
  paths.check();
  const plan_document d = read_plan_file(o.plan);
  check_micro_batch(d, document_parallelism(d), o.plan);  // the pricing line states the micro-batch: never one the specs do not make
  if (d.pipeline) stages_of_parameters(d);  // stages that do not hold the graph's layers are refused, as shard and export refuse them
  if (!o.tensor.empty()) {
    show_plan_tensor(d, o);
    return exit_ok;
  }
  // A pipelined plan's stage times, memory and step are priced again from its strategies and
  // stages: what the file records is shown only as a difference (a hand edit, another pricing).
  std::optional<plan_pipeline> priced;
  std::vector<std::string> differs;
  if (d.pipeline) {
    priced = reprice_pipeline(d);
    differs = pipeline_differences(*d.pipeline, *priced);
  }
  if (o.json) show_plan_json(d, o.plan, priced, differs);
  else show_plan_table(d, o.plan, priced, differs);
  return exit_ok;
}
#else
int run_show_plan(show_options) { throw io_error("show --plan needs a build with the plan area (Boost.Graph)"); }
#endif

}  // namespace

void register_show(CLI::App& app, action& run) {
  auto o = std::make_shared<show_options>();
  CLI::App* cmd = app.add_subcommand(
      "show", "draw which rank holds which block of a tensor, or list a plan file's tensors and draw one");
  cmd->footer(
      "Examples:\n"
      "  autoshard show --mesh 2x4 --shape 768,2304 --spec \"[R,S(1)]\" --svg c_attn.svg\n"
      "  autoshard show --plan plan.json --tensor transformer.h.0.attn.c_attn.weight");
  o->mesh.add_to(*cmd, false);  // a block map depends on the mesh's shape, not on its links
  CLI::Option* shape = cmd->add_option("--shape", o->shape, "global tensor shape, e.g. 8,8")->capture_default_str();
  CLI::Option* spec = cmd->add_option("--spec", o->spec, "sharding spec, \"[S(0),S(1)]\" or \"S0S1\"");
  CLI::Option* plan =
      cmd->add_option("--plan", o->plan, "a plan file (autoshard plan --out): list its tensors, or draw --tensor");
  CLI::Option* tensor = cmd->add_option("--tensor", o->tensor, "with --plan: the tensor whose output spec to draw");
  cmd->add_option("--svg", o->svg, "also write the block map as SVG to this file");
  add_follow_symlinks(*cmd, o->follow_symlinks);
  cmd->add_option("--slice", o->slice, "tensors of rank > 2: one index per leading dim, e.g. 0,3 (default: a map per block)");
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  tensor->needs(plan);
  plan->excludes(spec)->excludes(shape)->excludes(cmd->get_option("--mesh"));
  cmd->callback([=, &run] {
    if (o->spec.empty() && o->plan.empty()) throw CLI::RequiredError("--spec or --plan");
    if (!o->plan.empty() && o->tensor.empty() && !o->svg.empty())
      throw CLI::ValidationError("--svg", "with --plan, --svg draws one tensor: give --tensor NAME");
    // A plan's list draws nothing: `--plan P --slice 0` listed the tensors, the slice dropped.
    if (!o->plan.empty() && o->tensor.empty())
      refuse_given(*cmd, {"--slice"}, "picks the block of one tensor's map to draw; with --plan, give --tensor NAME");
    run = [o] { return o->plan.empty() ? run_show_spec(*o) : run_show_plan(*o); };
  });
}

}  // namespace autoshard::tool
