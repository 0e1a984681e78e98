// The rotary op library. Each op file adds its schema with TORCH_LIBRARY_FRAGMENT(rotary, m) and its CPU and
// Autograd kernels with TORCH_LIBRARY_IMPL; this file declares the namespace itself and `version`.
#include <string>

#include <torch/library.h>

#ifndef ROTARY_VERSION
#error "ROTARY_VERSION (the project's version) is set by torch/CMakeLists.txt"
#endif

namespace {

// The project version this library was built from (CMakeLists.txt's project(rotary VERSION ...)): Python's
// rotary.__version__. It takes no tensor, so it has no dispatch key: one kernel for every backend (CatchAll).
std::string version() { return ROTARY_VERSION; }

}  // namespace

TORCH_LIBRARY(rotary, m) { m.def("version() -> str", &version); }
