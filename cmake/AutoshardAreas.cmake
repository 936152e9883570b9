# One INTERFACE target per area of include/autoshard/, each with its own header set (the
# top-level CMakeLists.txt proves from it that every public header compiles on its own).
# An area's package component is its folder name (core, io, graph, plan, solve, pass, tensor,
# comm, exec, device, ...); its target is autoshard::<folder> and, for the older names,
# autoshard::<export name> (autoshard, glpk, gloo, cuda), which stay accepted as components.
# Each area records the packages it needs (PACKAGES, find_dependency arguments) and the
# areas it builds on, so find_package(autoshard COMPONENTS x) looks up only x's.
#   core   -> autoshard::core, autoshard::autoshard  (standard library only)
#   io     -> autoshard::io         (+ nlohmann-json: checked JSON reading, atomic file writing)
#   graph  -> autoshard::graph      (+ Boost.Graph header-only)
#   plan   -> autoshard::plan       (graph + io: the plan document, its one reader and writer)
#   onnx   -> autoshard::onnx       (graph + libonnx and protobuf: ONNX models in)
#   solve  -> autoshard::solve, autoshard::glpk  (io + GLPK: the graph-free strategy ILP)
#   pass   -> autoshard::pass       (plan + solve: the auto-sharding pass, plan loading,
#                                    exports, the plan's picture)
#   tensor -> autoshard::tensor     (+ Eigen)
#   comm   -> autoshard::comm       (core only: communicator concept, mesh communicators,
#                                    redistribute execution, calibration; backend-free)
#   gloo   -> autoshard::gloo       (comm + io + Gloo: the Gloo backend, TCP store,
#                                    launcher, calibration file)
#   exec   -> autoshard::exec       (pass + tensor + gloo: the reference executor,
#                                    tensor-parallel layers)
#   device -> autoshard::device, autoshard::cuda  (tensor + comm + CUDA runtime, NCCL)
set(AUTOSHARD_INSTALLED_TARGETS "")
set(AUTOSHARD_AREAS "")
set(AUTOSHARD_AREA_METADATA "")  # lines of the installed autoshardAreas.cmake

function(autoshard_area target export_name folder)
  cmake_parse_arguments(A "" "" "DEPS;EXTRA_HEADERS;PACKAGES" ${ARGN})
  file(GLOB_RECURSE _hdrs CONFIGURE_DEPENDS
       "${PROJECT_SOURCE_DIR}/include/autoshard/${folder}/*.hpp")
  list(APPEND _hdrs ${A_EXTRA_HEADERS})
  if(NOT _hdrs)
    return()
  endif()
  add_library(${target} INTERFACE)
  add_library(autoshard::${export_name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  target_sources(${target} INTERFACE FILE_SET HEADERS
                 BASE_DIRS "${PROJECT_SOURCE_DIR}/include" FILES ${_hdrs})
  target_compile_features(${target} INTERFACE cxx_std_20)
  target_link_libraries(${target} INTERFACE ${A_DEPS})
  set_property(TARGET ${target} PROPERTY AUTOSHARD_AREA ${folder})
  if(NOT export_name STREQUAL folder)
    add_library(autoshard::${folder} ALIAS ${target})
  endif()
  # The areas this one builds on: the autoshard targets among DEPS.
  set(_area_deps "")
  foreach(_d IN LISTS A_DEPS)
    if(TARGET ${_d})
      get_target_property(_f ${_d} AUTOSHARD_AREA)
      if(_f)
        list(APPEND _area_deps ${_f})
      endif()
    endif()
  endforeach()
  string(REPLACE ";" "|" _pkgs "${A_PACKAGES}")
  set(AUTOSHARD_AREA_METADATA "${AUTOSHARD_AREA_METADATA}autoshard_area_record(${folder} ${export_name} \"${_area_deps}\" \"${_pkgs}\")\n" PARENT_SCOPE)
  set(AUTOSHARD_INSTALLED_TARGETS ${AUTOSHARD_INSTALLED_TARGETS} ${target} PARENT_SCOPE)
  set(AUTOSHARD_AREAS ${AUTOSHARD_AREAS} ${folder} PARENT_SCOPE)
endfunction()

autoshard_area(autoshard autoshard core
               EXTRA_HEADERS "${PROJECT_SOURCE_DIR}/include/autoshard/autoshard.hpp")
# Backend-free communication: needs nothing but the core, so it is always built.
autoshard_area(autoshard_comm comm comm DEPS autoshard)

find_package(Boost 1.74 CONFIG COMPONENTS headers)
find_package(nlohmann_json 3.10 CONFIG)
find_package(Eigen3 3.4 CONFIG)
find_package(GLPK)
find_package(Gloo CONFIG)
find_package(Threads REQUIRED)

if(TARGET nlohmann_json::nlohmann_json)
  autoshard_area(autoshard_io io io DEPS autoshard nlohmann_json::nlohmann_json
                 PACKAGES "nlohmann_json 3.10 CONFIG")
else()
  message(STATUS "autoshard: autoshard::io skipped (needs nlohmann-json)")
endif()
if(TARGET Boost::headers AND TARGET autoshard_io)
  autoshard_area(autoshard_graph graph graph DEPS autoshard_io Boost::headers
                 PACKAGES "Boost 1.74 CONFIG COMPONENTS headers")
else()
  message(STATUS "autoshard: autoshard::graph skipped (needs Boost, nlohmann-json and include/autoshard/graph)")
endif()
# ONNX import (include/autoshard/onnx): Debian's libonnx-dev, whose config names protobuf's
# target without looking it up, so Protobuf (CMake's FindProtobuf) comes first.
find_package(Protobuf QUIET)
if(TARGET protobuf::libprotobuf)
  find_package(ONNX CONFIG QUIET)
endif()
if(TARGET autoshard_graph AND TARGET onnx AND TARGET protobuf::libprotobuf)
  autoshard_area(autoshard_onnx onnx onnx DEPS autoshard_graph onnx PACKAGES "Protobuf" "ONNX CONFIG")
else()
  message(STATUS "autoshard: autoshard::onnx skipped (needs libonnx-dev, libprotobuf-dev and autoshard::graph)")
endif()
if(TARGET autoshard_graph)
  autoshard_area(autoshard_plan plan plan DEPS autoshard_graph)
else()
  message(STATUS "autoshard: autoshard::plan skipped (needs autoshard::graph)")
endif()
# The strategy ILP needs no graph: a user who wants only the solver never pulls in Boost.Graph.
if(TARGET autoshard_io AND TARGET GLPK::GLPK)
  autoshard_area(autoshard_glpk glpk solve DEPS autoshard_io GLPK::GLPK Threads::Threads PACKAGES "GLPK" "Threads")
else()
  message(STATUS "autoshard: autoshard::glpk skipped (needs GLPK and autoshard::io)")
endif()
if(TARGET autoshard_plan AND TARGET autoshard_glpk)
  autoshard_area(autoshard_pass pass pass DEPS autoshard_plan autoshard_glpk)
else()
  message(STATUS "autoshard: autoshard::pass skipped (needs autoshard::plan and autoshard::solve)")
endif()
if(TARGET Eigen3::Eigen AND TARGET autoshard_io)
  autoshard_area(autoshard_tensor tensor tensor DEPS autoshard_io Eigen3::Eigen PACKAGES "Eigen3 3.4 CONFIG")
else()
  message(STATUS "autoshard: Eigen not found; autoshard::tensor skipped")
endif()
# The Gloo backend (include/autoshard/gloo): io for the calibration file.
if(TARGET gloo AND TARGET autoshard_io)
  autoshard_area(autoshard_gloo gloo gloo DEPS autoshard_comm autoshard_io gloo Threads::Threads
                 PACKAGES "Gloo CONFIG" "Threads")
else()
  message(STATUS "autoshard: Gloo or autoshard::io not found; autoshard::gloo skipped")
endif()
# The reference executor runs a graph with a solved plan on real ranks: every area below it.
if(TARGET autoshard_gloo AND TARGET autoshard_pass AND TARGET autoshard_tensor)
  autoshard_area(autoshard_exec exec exec DEPS autoshard_gloo autoshard_pass autoshard_tensor)
else()
  message(STATUS "autoshard: autoshard::exec skipped (needs autoshard::gloo, ::pass and ::tensor)")
endif()

# CUDA: only where nvcc exists. NCCL comes with the CUDA toolkit on these machines.
set(AUTOSHARD_HAVE_CUDA OFF)
if(AUTOSHARD_ENABLE_CUDA)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/lib)
    if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND TARGET autoshard_tensor)
      set(AUTOSHARD_HAVE_CUDA ON)
      if(NOT TARGET autoshard_nccl_lib)
        add_library(autoshard_nccl_lib INTERFACE)
        target_include_directories(autoshard_nccl_lib INTERFACE $<BUILD_INTERFACE:${NCCL_INCLUDE_DIR}>)
        target_link_libraries(autoshard_nccl_lib INTERFACE $<BUILD_INTERFACE:${NCCL_LIBRARY}>)
      endif()
    endif()
  endif()
endif()

# The device area (include/autoshard/device): CUDA placement and the NCCL backend, on top of
# the tensor area. NCCL ships no CMake config: the build links the located library through
# autoshard_nccl_lib; the installed package records its absolute path.
if(AUTOSHARD_HAVE_CUDA)
  # nccl.hpp implements the communicator concept of comm/ and uses its mesh communicator.
  autoshard_area(autoshard_cuda cuda device
                 DEPS autoshard_tensor autoshard_comm CUDA::cudart "$<BUILD_INTERFACE:autoshard_nccl_lib>"
                      "$<INSTALL_INTERFACE:${NCCL_LIBRARY}>"
                 PACKAGES "CUDAToolkit")
  if(TARGET autoshard_cuda)
    target_include_directories(autoshard_cuda SYSTEM INTERFACE "$<INSTALL_INTERFACE:${NCCL_INCLUDE_DIR}>")
  endif()
endif()
