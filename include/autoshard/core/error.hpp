#pragma once
/// autoshard's one exception hierarchy. Every message names the tensor, the dimension
/// and the numbers involved, e.g.
///   throw shape_error("tensor 'wte': dim 0 of size 50257 does not divide over 4 ranks");
/// what() is "<kind> error: <message>" ("shape error: tensor 'wte': ..."); the program name
/// is not part of it: the `autoshard` tool prints "autoshard: " before it, and a message
/// nested in another ("plan file 'p.json': its graph is invalid: graph error: ...") reads
/// without it.
#include <stdexcept>  // std::runtime_error
#include <cstddef>    // std::size_t
#include <string>     // std::string
#include <string_view>  // std::string_view

namespace autoshard {

/// Base of every error autoshard throws.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
  /// what() without its "<kind> error: " label, to nest one message in another of a
  /// different kind: graph_error("vertex 'fc': " + std::string(e.message())).
  std::string_view message() const noexcept { return std::string_view(what()).substr(label_); }

 protected:
  error(std::string_view label, const std::string& what)
      : std::runtime_error(std::string(label) + what), label_(label.size()) {}

 private:
  std::size_t label_ = 0;
};

/// A sharding spec that does not parse or does not fit its mesh or tensor.
class spec_error : public error {
 public:
  explicit spec_error(const std::string& what) : error("spec error: ", what) {}
};

/// A shape that does not fit: a rank mismatch, a size that does not divide.
class shape_error : public error {
 public:
  explicit shape_error(const std::string& what) : error("shape error: ", what) {}
};

/// The model graph is not valid: a cycle, an unknown operator, a missing operand.
class graph_error : public error {
 public:
  explicit graph_error(const std::string& what) : error("graph error: ", what) {}
};

/// The auto-sharding ILP failed: infeasible, time-out without incumbent, bad plan file.
class solver_error : public error {
 public:
  explicit solver_error(const std::string& what) : error("solver error: ", what) {}
  /// No answer was found, but none was proven not to exist (the search ran out of time).
  static solver_error none_found(const std::string& what) {
    solver_error e(what);
    e.unproven_ = true;
    return e;
  }
  /// No answer was found, and none cheaper than the solve's cutoff exists (solve_options::cutoff).
  static solver_error cut_off(const std::string& what) {
    solver_error e(what);
    e.cut_off_ = true;
    return e;
  }
  /// Whether this says only that no answer was found (none_found), not that none exists.
  bool unproven() const noexcept { return unproven_; }
  /// Whether this says that no answer cheaper than the cutoff exists (cut_off).
  bool beyond_cutoff() const noexcept { return cut_off_; }

 private:
  bool unproven_ = false;
  bool cut_off_ = false;
};

/// A file could not be read or written, or its contents are malformed.
class io_error : public error {
 public:
  explicit io_error(const std::string& what) : error("io error: ", what) {}
};

/// A collective failed: a peer died, timed out, or sent a mismatched size.
class comm_error : public error {
 public:
  explicit comm_error(const std::string& what) : error("comm error: ", what) {}
};

/// A CUDA or NCCL call failed, or no device is present.
class device_error : public error {
 public:
  explicit device_error(const std::string& what) : error("device error: ", what) {}
};

/// A failure while executing a graph: a kernel given pieces it cannot use, a plan whose
/// specs do not fit the graph, values missing for a source. Names the vertex.
class exec_error : public error {
 public:
  explicit exec_error(const std::string& what) : error("execution error: ", what) {}
};

/// Work this process cannot do within what the machine gives it: an allocation that failed,
/// or an estimate made before starting above the memory, threads or address space left.
/// Names the estimate and the limit.
class resource_error : public error {
 public:
  explicit resource_error(const std::string& what) : error("resource error: ", what) {}
};

}  // namespace autoshard
