// autoshard show: which rank holds which block of a tensor, as a block map in the
// terminal (like DTensor's visualize_sharding) and optionally as SVG.
#include "common.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

namespace autoshard::tool {
namespace {

struct show_options {
  mesh_options mesh;
  std::string shape = "8,8";
  std::string spec;
  std::string svg;
  bool json = false;
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

struct block_map {
  std::vector<std::int64_t> rows, cols;              // cut points on the shown dims
  std::vector<std::vector<std::vector<int>>> owners;  // [row][col] -> ranks
};

/// The block map of the last two dims (or the only dim); leading dims must be unsharded
/// for the picture to be complete, otherwise only the block at index 0 of them is drawn.
block_map build_map(const device_mesh& m, const sharding_spec& s, const tensor_shape& shape) {
  std::vector<shard_box> boxes;
  for (int r = 0; r < m.num_ranks(); ++r) boxes.push_back(local_box(m, s, shape, r));
  const std::size_t rd = shape.rank >= 2 ? shape.rank - 2u : 0u;
  const std::size_t cd = shape.rank >= 2 ? shape.rank - 1u : 0u;
  const bool one_d = shape.rank == 1;
  block_map bm;
  bm.rows = one_d ? std::vector<std::int64_t>{0, 1} : cuts(boxes, rd, shape[rd]);
  bm.cols = cuts(boxes, cd, shape[cd]);
  bm.owners.assign(bm.rows.size() - 1, std::vector<std::vector<int>>(bm.cols.size() - 1));
  for (std::size_t i = 0; i + 1 < bm.rows.size(); ++i)
    for (std::size_t j = 0; j + 1 < bm.cols.size(); ++j)
      for (int r = 0; r < m.num_ranks(); ++r) {
        const auto& b = boxes[static_cast<std::size_t>(r)];
        bool leading_ok = true;  // holds index 0 of every leading dim
        for (std::size_t d = 0; d + 2 < shape.rank; ++d) leading_ok = leading_ok && b.offset[d] == 0 && b.shape[d] > 0;
        const bool in_row = one_d || (b.offset[rd] <= bm.rows[i] && bm.rows[i + 1] <= b.offset[rd] + b.shape[rd]);
        const bool in_col = b.offset[cd] <= bm.cols[j] && bm.cols[j + 1] <= b.offset[cd] + b.shape[cd];
        if (leading_ok && in_row && in_col && !b.empty()) bm.owners[i][j].push_back(r);
      }
  return bm;
}

std::string ranks_label(const std::vector<int>& rs) {
  std::string s;
  for (std::size_t k = 0; k < rs.size(); ++k) s += (k ? "," : "") + std::to_string(rs[k]);
  return s.empty() ? "-" : s;
}

void print_map(const block_map& bm, std::ostream& os) {
  std::vector<std::size_t> width(bm.cols.size() - 1, 0);
  for (std::size_t j = 0; j + 1 < bm.cols.size(); ++j) {
    width[j] = std::to_string(bm.cols[j]).size() + std::to_string(bm.cols[j + 1]).size() + 1;
    for (const auto& row : bm.owners) width[j] = std::max(width[j], ranks_label(row[j]).size());
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
    for (std::size_t j = 0; j + 1 < bm.cols.size(); ++j) os << pad(ranks_label(bm.owners[i][j]), width[j]) << "|";
    os << "\n";
    rule();
  }
}

void write_svg(const block_map& bm, const std::string& title, const std::string& path) {
  const double W = 640, H = 400, x0 = 70, y0 = 50;
  const double total_c = static_cast<double>(bm.cols.back() - bm.cols.front());
  const double total_r = static_cast<double>(bm.rows.back() - bm.rows.front());
  static const char* palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw io_error("cannot write '" + path + "'");
    f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W + x0 + 20 << "\" height=\"" << H + y0 + 20
      << "\" font-family=\"monospace\" font-size=\"12\">\n"
      << "<text x=\"" << x0 << "\" y=\"24\" font-size=\"14\">" << title << "</text>\n";
    for (std::size_t i = 0; i + 1 < bm.rows.size(); ++i)
      for (std::size_t j = 0; j + 1 < bm.cols.size(); ++j) {
        const double x = x0 + W * static_cast<double>(bm.cols[j] - bm.cols.front()) / total_c;
        const double w = W * static_cast<double>(bm.cols[j + 1] - bm.cols[j]) / total_c;
        const double y = y0 + H * static_cast<double>(bm.rows[i] - bm.rows.front()) / total_r;
        const double h = H * static_cast<double>(bm.rows[i + 1] - bm.rows[i]) / total_r;
        const auto& own = bm.owners[i][j];
        const char* fill = own.empty() ? "#ffffff" : palette[static_cast<std::size_t>(own.front()) % 10];
        f << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << h << "\" fill=\""
          << fill << "\" fill-opacity=\"0.75\" stroke=\"#222\"/>\n"
          << "<text x=\"" << x + w / 2 << "\" y=\"" << y + h / 2 << "\" text-anchor=\"middle\">"
          << "ranks " << ranks_label(own) << "</text>\n";
      }
    f << "</svg>\n";
    if (!f.flush()) throw io_error("cannot write '" + path + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw io_error("cannot rename '" + tmp + "' to '" + path + "'");
}

int run_show(const show_options& o) {
  const device_mesh m = o.mesh.build();
  const tensor_shape shape = parse_shape_list(o.shape);
  if (shape.rank == 0) throw shape_error("show needs a tensor of rank 1 or more");
  const sharding_spec s = parse_spec(o.spec, static_cast<int>(m.ndim()), static_cast<int>(shape.rank));
  check_spec(s, m, shape, "--spec");
  const block_map bm = build_map(m, s, shape);
  std::string partial;
  for (std::size_t i = 0; i < s.mesh_rank; ++i)
    if (s[i].is_partial())
      partial += " mesh axis " + std::to_string(i) + " holds Partial(" + std::string(to_string(s[i].op)) + ") values;";
  if (o.json) {
    nlohmann::json j{{"mesh", to_json(m)}, {"shape", to_json(shape)}, {"spec", to_string(s)},
                     {"alpa", to_alpa_string(s)}, {"row_cuts", bm.rows}, {"col_cuts", bm.cols},
                     {"owners", bm.owners}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << to_string(s) << " (" << to_alpa_string(s) << ") of " << shape << " on " << m << "\n";
    if (shape.rank > 2) std::cout << "(showing the last two dims at index 0 of the leading dims)\n";
    if (!partial.empty()) std::cout << "note:" << partial << " the map shows where each block lives\n";
    print_map(bm, std::cout);
  }
  if (!o.svg.empty()) {
    write_svg(bm, to_string(s) + " of " + to_string(shape) + " on " + to_string(m), o.svg);
    if (!o.json) std::cout << "wrote " << o.svg << "\n";
  }
  return exit_ok;
}

}  // namespace

void register_show(CLI::App& app, action& run) {
  auto o = std::make_shared<show_options>();
  CLI::App* cmd = app.add_subcommand("show", "draw which rank holds which block of a tensor");
  o->mesh.add_to(*cmd);
  cmd->add_option("--shape", o->shape, "global tensor shape, e.g. 8,8")->capture_default_str();
  cmd->add_option("--spec", o->spec, "sharding spec, \"[S(0),S(1)]\" or \"S0S1\"")->required();
  cmd->add_option("--svg", o->svg, "also write the block map as SVG to this file");
  cmd->add_flag("--json", o->json, "write one JSON document to stdout");
  cmd->callback([o, &run] { run = [o] { return run_show(*o); }; });
}

}  // namespace autoshard::tool
