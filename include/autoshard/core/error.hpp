#pragma once
/// autoshard's one exception hierarchy. Every message names the tensor, the dimension
/// and the numbers involved, e.g.
///   throw shape_error("tensor 'wte': dim 0 of size 50257 does not divide over 4 ranks");
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string

namespace autoshard {

/// Base of every error autoshard throws.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error("autoshard: " + what) {}
};

/// A sharding spec that does not parse or does not fit its mesh or tensor.
class spec_error : public error {
 public:
  explicit spec_error(const std::string& what) : error("spec error: " + what) {}
};

/// A shape that does not fit: a rank mismatch, a size that does not divide.
class shape_error : public error {
 public:
  explicit shape_error(const std::string& what) : error("shape error: " + what) {}
};

/// The model graph is not valid: a cycle, an unknown operator, a missing operand.
class graph_error : public error {
 public:
  explicit graph_error(const std::string& what) : error("graph error: " + what) {}
};

/// The auto-sharding ILP failed: infeasible, time-out without incumbent, bad plan file.
class solver_error : public error {
 public:
  explicit solver_error(const std::string& what) : error("solver error: " + what) {}
};

/// A file could not be read or written, or its contents are malformed.
class io_error : public error {
 public:
  explicit io_error(const std::string& what) : error("io error: " + what) {}
};

/// A collective failed: a peer died, timed out, or sent a mismatched size.
class comm_error : public error {
 public:
  explicit comm_error(const std::string& what) : error("comm error: " + what) {}
};

/// A CUDA or NCCL call failed, or no device is present.
class device_error : public error {
 public:
  explicit device_error(const std::string& what) : error("device error: " + what) {}
};

}  // namespace autoshard
