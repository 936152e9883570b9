// The backend-free mesh communicator and split checks (comm/mesh_communicator.hpp), which
// the Gloo and the NCCL backends share: the checks on their own, a mesh built over a
// recording communicator written here (no backend at all), and the Gloo backend's split
// reporting the same errors.
#include <doctest/doctest.h>

#include <autoshard/comm/comm.hpp>
#include <autoshard/gloo/gloo.hpp>

#include <string>
#include <utility>
#include <vector>

using namespace autoshard;

namespace {

// A communicator that only records the groups it was split into: rank r of a world of n.
struct recording_comm {
  int r = 0, n = 1;
  std::vector<int> world;  // world ranks of the members
  std::string label;
  int rank() const { return r; }
  int size() const { return n; }
  void all_reduce(void*, std::size_t, dtype, reduce_op) {}
  void all_gather(const void*, void*, std::size_t, dtype) {}
  void reduce_scatter(const void*, void*, std::size_t, dtype, reduce_op) {}
  void all_to_all(const void*, void*, std::size_t, dtype) {}
  void broadcast(void*, std::size_t, dtype, int) {}
  void barrier() {}
  recording_comm split(const std::vector<int>& members, const std::string& name) {
    detail::split_group g = detail::check_split(members, r, world, "rank " + std::to_string(r), name);
    return recording_comm{g.index, static_cast<int>(members.size()), std::move(g.world_ranks), name};
  }
};

std::vector<int> iota(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

}  // namespace

static_assert(splittable_communicator<recording_comm>);
static_assert(mesh_communicator_like<basic_mesh_communicator<recording_comm>>);

TEST_CASE("split checks: this rank's index and the world ranks, or an error naming the split") {
  const std::vector<int> parent{4, 5, 6, 7};  // a group of world ranks 4..7
  const detail::split_group g = detail::check_split({3, 1}, 1, parent, "rank 5", "axis0");
  CHECK(g.index == 1);
  CHECK(g.world_ranks == std::vector<int>{7, 5});
  CHECK_THROWS_WITH_AS(detail::check_split({0, 4}, 0, parent, "rank 4", "axis1"),
                       doctest::Contains("rank 4: split 'axis1' names rank 4 outside the group of 4"), comm_error);
  CHECK_THROWS_WITH_AS(detail::check_split({0, -1}, 0, parent, "rank 4", "axis1"),
                       doctest::Contains("rank 4: split 'axis1' names rank -1 outside the group of 4"), comm_error);
  CHECK_THROWS_WITH_AS(detail::check_split({1, 2, 1}, 1, parent, "rank 5", "tp"),
                       doctest::Contains("rank 5: split 'tp' names rank 1 twice"), comm_error);
  CHECK_THROWS_WITH_AS(detail::check_split({0, 2}, 1, parent, "rank 5", "dp"),
                       doctest::Contains("rank 5: split 'dp' of [0,2] leaves this rank out"), comm_error);
}

TEST_CASE("a mesh communicator over any backend: axis groups are device_mesh::group, in order") {
  const device_mesh mesh{2, 3};
  for (int r = 0; r < mesh.num_ranks(); ++r) {
    basic_mesh_communicator<recording_comm> mc(recording_comm{r, 6, iota(6), "world"}, mesh);
    CHECK(mc.rank() == r);
    for (std::size_t a = 0; a < 2; ++a) {
      // Row-major mesh: rank = 3*i + j; axis 0 groups share j, axis 1 groups share i.
      std::vector<int> want;
      for (int k = 0; k < mesh.size(a); ++k) want.push_back(a == 0 ? 3 * k + r % 3 : 3 * (r / 3) + k);
      CHECK(mc.axis(a).world == want);
      CHECK(mc.axis(a).label == "axis" + std::to_string(a));
      CHECK(mc.axis(a).rank() == (a == 0 ? r / 3 : r % 3));
    }
  }
  CHECK_THROWS_WITH_AS((basic_mesh_communicator<recording_comm>(recording_comm{0, 4, iota(4), "world"}, mesh)),
                       doctest::Contains("rank 0: a world of 4 ranks cannot form mesh(2,3) (6 ranks)"), comm_error);
}

TEST_CASE("the Gloo backend's split reports what check_split finds") {
  std::vector<std::string> errors(2);
  run_ranks(2, [&](gloo_communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    try {
      (void)c.split({c.rank(), c.rank()}, "twice");
    } catch (const comm_error& e) {
      errors[r] = e.what();
    }
  });
  CHECK(errors[0].find("rank 0: split 'twice' names rank 0 twice") != std::string::npos);
  CHECK(errors[1].find("rank 1: split 'twice' names rank 1 twice") != std::string::npos);
}
