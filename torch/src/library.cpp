// The rotary op library. Each op file adds its schema with TORCH_LIBRARY_FRAGMENT(rotary, m) and its CPU and
// Autograd kernels with TORCH_LIBRARY_IMPL; this file declares the namespace itself.
#include <torch/library.h>

TORCH_LIBRARY(rotary, m) {}
