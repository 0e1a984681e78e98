// Model: the architecture's checks, the tensor slots, and loading - each matrix used in place in its stored format
// or converted once (bf16 / f16 / f32 / q8); norms and biases copied to float32 (they are small).
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <string>

#include "model_impl.h"
#include "rotary/content_hash.h"
#include "rotary/ggml_quants.h"
#include "rotary/error.h"
#include "rotary_engine/model.h"

namespace rotary::engine {


namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

int64_t elements(const StoredTensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}
// The bytes a stored tensor occupies: its elements, or its blocks.
int64_t stored_bytes(const StoredTensor& t) {
  return t.blocks ? weight_row_bytes(*t.blocks, elements(t)) : elements(t) * int64_t(dtype_size(t.dtype));
}
// Elements [first, first + n) (row-major; a block format: whole blocks) of a stored tensor as doubles, exactly (a
// block's values by ggml_dequantize_reference).
void stored_values(const StoredTensor& t, int64_t first, int64_t n, double* out) {
  if (!t.blocks) {
    for (int64_t i = 0; i < n; ++i) out[i] = load_as_double(t.data, t.dtype, first + i);
    return;
  }
  ggml_dequantize_reference(ggml_type_of(*t.blocks), static_cast<const uint8_t*>(t.data) + weight_row_bytes(*t.blocks, first),
                            n, out);
}
// Element i (row-major) of a stored tensor as a double (a block format: its block decoded).
double stored_value(const StoredTensor& t, int64_t i) {
  if (!t.blocks) return load_as_double(t.data, t.dtype, i);
  const int64_t block = weight_block_size(*t.blocks);
  std::vector<double> values(static_cast<size_t>(block));
  stored_values(t, i / block * block, block, values.data());
  return values[size_t(i % block)];
}
std::string stored_type_name(const StoredTensor& t) { return t.blocks ? weight_format_name(*t.blocks) : dtype_name(t.dtype); }

// The block formats the linear layers take ("q8_0, q4_0, ..."), for messages: every WeightFormat from Q8_0 on, so
// the list follows rotary/linear.h.
std::string block_format_list() {
  std::string list;
  for (int f = int(WeightFormat::Q8_0); f <= int(kLastWeightFormat); ++f)
    list += (list.empty() ? "" : ", ") + std::string(weight_format_name(WeightFormat(f)));
  return list;
}
// Row r of a [rows, cols] stored tensor as float32: its exact values (stored_values), rounded once.
void row_floats(const StoredTensor& t, int64_t r, int64_t cols, float* out) {
  std::vector<double> row(static_cast<size_t>(cols));
  stored_values(t, r * cols, cols, row.data());
  for (int64_t c = 0; c < cols; ++c) out[c] = float(row[size_t(c)]);
}
// The byte offsets of a block format's f16 scales within a block: a non-finite scale is the only way its weights
// can be non-finite (the quants are integers).
std::vector<int> block_scale_offsets(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K: return {0, 2};  // d, dmin
    case WeightFormat::Q6_K: return {208};   // d, after the quants and sub-block scales
    case WeightFormat::Q4_1:
    case WeightFormat::Q5_1: return {0, 2};  // d, m
    default: return {0};                     // Q8_0, Q4_0, Q5_0: d
  }
}

class Loader {
 public:
  Loader(Model::Impl& m, const std::function<StoredTensor(const std::string&)>& lookup, const LoadOptions& o)
      : m_(m), lookup_(lookup), o_(o), threads_(o.threads > 0 ? o.threads : omp_get_max_threads()) {}

  StoredTensor get(const std::string& name, const std::vector<int64_t>& shape) {
    StoredTensor t = lookup_(name);
    if (t.shape != shape) fail("tensor " + name + ".shape", shape_text(t.shape), shape_text(shape));
    if (t.data == nullptr) fail("tensor " + name + ".data", "null", "the tensor's bytes");
    if (t.blocks && (t.shape.empty() || t.shape.back() % weight_block_size(*t.blocks) != 0))
      fail("tensor " + (t.source.empty() ? name : t.source) + ".shape", shape_text(t.shape),
           std::string("rows of whole ") + weight_format_name(*t.blocks) + " blocks (a multiple of " +
               std::to_string(weight_block_size(*t.blocks)) + " columns)");
    check_finite(name, t);
    hash_stored(name, t);
    return t;
  }
  // The tensor's name, stored dtype, shape and bytes, folded into Model::weights_hash.
  void hash_stored(const std::string& name, const StoredTensor& t) const {
    uint64_t& h = m_.weights_hash;
    h = content_hash64(name.data(), name.size(), h);
    // (a block format's id apart from the dtypes': "Q8_0" was 0x51385f30, kept so Q8_0 files hash as before)
    h = content_hash_mix(h, !t.blocks                        ? uint64_t(t.dtype)
                            : *t.blocks == WeightFormat::Q8_0 ? uint64_t(0x51385f30)
                                                              : uint64_t(0x424c4b00) + uint64_t(*t.blocks));
    for (int64_t d : t.shape) h = content_hash_mix(h, uint64_t(d));
    h = content_hash64(t.data, size_t(stored_bytes(t)), h, threads_);
  }
  // A NaN or Inf weight would poison every logit after it: refused by name and element, before any work (one
  // read of the weights, which the first forward would make anyway).
  // (A block format: its quants are integers, so only its f16 scales can be non-finite.)
  void check_finite(const std::string& name, const StoredTensor& t) const {
    const int64_t n = elements(t);
    int64_t bad = n;
    if (t.blocks) {
      const int64_t block = weight_block_size(*t.blocks), bytes = weight_block_bytes(*t.blocks);
      const std::vector<int> offsets = block_scale_offsets(*t.blocks);
#pragma omp parallel for schedule(static) num_threads(threads_) reduction(min : bad)
      for (int64_t b = 0; b < n / block; ++b) {
        const uint8_t* p = static_cast<const uint8_t*>(t.data) + b * bytes;
        for (int o : offsets)
          if ((uint16_t(p[o] | p[o + 1] << 8) & 0x7c00u) == 0x7c00u && b * block < bad) bad = b * block;
      }
      if (bad < n)
        fail("tensor " + (t.source.empty() ? name : t.source),
             "non-finite (the block of elements " + std::to_string(bad) + ".." + std::to_string(bad + block - 1) +
                 " has a non-finite f16 scale)",
             "finite weights");
      return;
    }
#pragma omp parallel for schedule(static) num_threads(threads_) reduction(min : bad)
    for (int64_t i = 0; i < n; ++i) {
      bool finite = true;
      switch (t.dtype) {
        case DType::BF16: finite = (static_cast<const uint16_t*>(t.data)[i] & 0x7f80u) != 0x7f80u; break;
        case DType::F16: finite = (static_cast<const uint16_t*>(t.data)[i] & 0x7c00u) != 0x7c00u; break;
        case DType::F32: finite = std::isfinite(static_cast<const float*>(t.data)[i]); break;
        case DType::F64: finite = std::isfinite(static_cast<const double*>(t.data)[i]); break;
      }
      if (!finite && i < bad) bad = i;
    }
    if (bad < n)
      fail("tensor " + (t.source.empty() ? name : t.source),
           "non-finite (element " + std::to_string(bad) + " is " + to_text(stored_value(t, bad)) + ")",
           "finite weights");
  }
  // A [rows, cols] matrix in `format`: in place when stored so, else converted into storage the model owns.
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols, std::optional<WeightFormat> want) {
    const StoredTensor t = get(name, {rows, cols});
    // As stored unless asked otherwise (a block format in place; f64 as f32).
    const WeightFormat f = want                ? *want
                           : t.blocks          ? *t.blocks
                           : t.dtype == DType::F64 ? WeightFormat::F32
                                                   : weight_format_of(t.dtype);
    WeightMatrix w;
    w.format = f, w.rows = rows, w.cols = cols, w.row_stride = cols;
    if (t.blocks ? f == *t.blocks : t.dtype != DType::F64 && f == weight_format_of(t.dtype)) {
      w.data = t.data;
      return w;
    }
    if (is_block_format(f)) return blocks(t, name, rows, cols, f);
    std::vector<uint8_t>& bytes = m_.owned.emplace_back(size_t(rows * cols * weight_element_size(f)));
    m_.owned_bytes += int64_t(bytes.size());
    if (f == WeightFormat::Q8) {
      std::vector<uint16_t>& scales = m_.owned_halves.emplace_back(size_t(rows * q8_blocks(cols)));
      m_.owned_bytes += int64_t(scales.size()) * 2;
      if (t.blocks == WeightFormat::Q8_0) {
        split_q8_0_blocks(t, rows * cols / kQ8Block, reinterpret_cast<int8_t*>(bytes.data()), scales.data());
      } else if (t.blocks) {  // decoded row by row (exact floats), then quantized as any float matrix
        std::vector<float> values(size_t(rows * cols));
#pragma omp parallel for schedule(static) num_threads(threads_)
        for (int64_t r = 0; r < rows; ++r) row_floats(t, r, cols, values.data() + r * cols);
        quantize_q8(values.data(), DType::F32, rows, cols, cols, reinterpret_cast<int8_t*>(bytes.data()),
                    scales.data(), threads_);
      } else {
        quantize_q8(t.data, t.dtype, rows, cols, cols, reinterpret_cast<int8_t*>(bytes.data()), scales.data(), threads_);
      }
      w.scales = scales.data(), w.scale_stride = q8_blocks(cols);
    } else {
      const DType to = f == WeightFormat::F32 ? DType::F32 : f == WeightFormat::F16 ? DType::F16 : DType::BF16;
      // A finite weight past the target's range (f16: |w| >= 65520 rounds to Inf) is refused by element, as q8's
      // scale overflow is: an Inf weight would only show later as non-finite logits.
      int64_t overflow = rows * cols;
#pragma omp parallel for schedule(static) num_threads(threads_) reduction(min : overflow)
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> row(static_cast<size_t>(cols));
        stored_values(t, r * cols, cols, row.data());
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          store_from_double(bytes.data(), to, i, row[size_t(c)]);
          if (!std::isfinite(load_as_double(bytes.data(), to, i)) && i < overflow) overflow = i;
        }
      }
      if (overflow < rows * cols)
        fail("tensor " + (t.source.empty() ? name : t.source),
             "element " + std::to_string(overflow) + " (row " + std::to_string(overflow / cols) + ", column " +
                 std::to_string(overflow % cols) + ") = " + to_text(stored_value(t, overflow)) +
                 ", past " + weight_format_name(f) + "'s range",
             std::string("|w| <= ") +
                 (to == DType::F16    ? "65504, f16's largest finite value (--weights bf16 or f32 keep such weights)"
                  : to == DType::BF16 ? "3.3895e38, bf16's largest finite value (--weights f32 keeps such weights)"
                                      : "3.4028e38, f32's largest finite value"));
    }
    w.data = bytes.data();
    release_pages(t);
    return w;
  }
  // A matrix converted to one of llama.cpp's block formats (--weights q4_k, ...): each row decoded to its exact float
  // values and written by ggml_quantize, the bytes llama.cpp's reference quantizer writes for the same floats (its
  // llama-quantize without an importance matrix). Rows must be whole blocks, as llama.cpp requires.
  WeightMatrix blocks(const StoredTensor& t, const std::string& name, int64_t rows, int64_t cols, WeightFormat f) {
    const int64_t block = weight_block_size(f);
    if (cols % block != 0)
      fail("tensor " + (t.source.empty() ? name : t.source),
           "rows of " + std::to_string(cols) + " weights to convert to " + weight_format_name(f),
           "rows of a whole number of " + std::string(weight_format_name(f)) + " blocks (" + std::to_string(block) +
               " weights; llama.cpp's quantizer takes no other) - another --weights, e.g. q8_0 or q8 (blocks of 32)");
    const GgmlType type = ggml_type_of(f);
    const int64_t row_bytes = weight_row_bytes(f, cols);
    std::vector<uint8_t>& bytes = m_.owned.emplace_back(size_t(rows * row_bytes));
    m_.owned_bytes += int64_t(bytes.size());
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads_)
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> values(static_cast<size_t>(cols));
      row_floats(t, r, cols, values.data());
      ggml_quantize(type, values.data(), cols, bytes.data() + r * row_bytes);
    }
    WeightMatrix w;
    w.format = f, w.rows = rows, w.cols = cols, w.row_stride = cols, w.data = bytes.data();
    release_pages(t);
    return w;
  }
  // Q8_0 blocks (34 bytes: f16 scale, 32 quants) into the engine's q8 arrays: the same quants and scale bits, so a
  // Q8_0 matrix runs exactly the numbers llama.cpp stored (rows are whole blocks: `blocks` in all, row after row).
  void split_q8_0_blocks(const StoredTensor& t, int64_t blocks, int8_t* quants, uint16_t* scales) const {
    const uint8_t* in = static_cast<const uint8_t*>(t.data);
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t b = 0; b < blocks; ++b) {
      std::memcpy(&scales[b], in + b * weight_block_bytes(WeightFormat::Q8_0), 2);
      std::memcpy(quants + b * kQ8Block, in + b * weight_block_bytes(WeightFormat::Q8_0) + 2, kQ8Block);
    }
  }
  // A converted tensor's stored bytes are not read again: their pages (of a mapped file, read once by the
  // conversion) are handed back, so that a model converted to q8 holds its q8 bytes, not also the file it came from
  // (Llama-2-13B: 14.6 GB of q8 beside a 26 GB bf16 file). MADV_PAGEOUT only reclaims - it never changes contents -
  // so it is safe whatever memory the lookup returned; whole pages inside the tensor only.
  static void release_pages(const StoredTensor& t) {
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(t.data) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(t.data) + uintptr_t(stored_bytes(t))) / page * page;
#ifdef MADV_PAGEOUT
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);  // advice: failure is harmless
#endif
  }
  // A vector as float32 the model owns.
  const float* vector(const std::string& name, int64_t n) {
    const StoredTensor t = get(name, {n});
    std::vector<float>& v = m_.owned_floats.emplace_back(size_t(n));
    m_.owned_bytes += n * 4;
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(stored_value(t, i));
    return v.data();
  }
  Linear linear(const std::string& n, int64_t rows, int64_t cols, bool bias) {
    Linear l;
    l.w = matrix(n + ".weight", rows, cols, o_.weights);
    if (bias) l.bias = vector(n + ".bias", rows);
    return l;
  }
  NormWeights norm(const std::string& n, NormKind kind, int64_t d) {
    NormWeights w;
    w.weight = vector(n + ".weight", d);
    if (kind == NormKind::LayerNorm) w.bias = vector(n + ".bias", d);
    return w;
  }

 private:
  Model::Impl& m_;
  const std::function<StoredTensor(const std::string&)>& lookup_;
  const LoadOptions& o_;
  int threads_;
};

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
const Architecture& Model::arch() const { return impl_->arch; }
WeightFormat Model::matrix_format() const { return impl_->layers.front().o.w.format; }
ActivationFormat Model::activations() const { return impl_->activations; }
int64_t Model::owned_bytes() const { return impl_->owned_bytes; }
uint64_t Model::weights_hash() const { return impl_->weights_hash; }

void Model::logits(const float* hidden, int64_t n, float* out, int threads) const {
  check(n >= 0, "n", n, ">= 0");
  check(threads >= 0, "threads", threads, ">= 0 (0: OpenMP's default)");
  if (n == 0) return;
  LinearParams p;
  p.w = impl_->head.w, p.tokens = n, p.x = hidden, p.x_stride = impl_->arch.d_model, p.y = out;
  p.y_stride = impl_->arch.vocab_size, p.activations = impl_->activations, p.threads = threads;
  linear_forward(p);
}

int64_t Model::weight_bytes_per_token() const {
  auto bytes = [](const WeightMatrix& w) {
    if (!w.data) return int64_t(0);
    return weight_matrix_bytes(w.format, w.rows, w.cols);
  };
  int64_t total = bytes(impl_->head.w);
  for (const Layer& l : impl_->layers)
    for (const Linear* x : {&l.q, &l.k, &l.v, &l.qkv, &l.o, &l.gate, &l.up, &l.down}) total += bytes(x->w);
  return total;
}

std::shared_ptr<const Model> Model::load(const Architecture& arch,
                                         const std::function<StoredTensor(const std::string&)>& lookup,
                                         const LoadOptions& options, std::shared_ptr<const void> keep_alive) {
  arch.validate();
  check(options.threads >= 0, "threads", options.threads, ">= 0 (0: OpenMP's default)");
  // Unset, the activations follow the weights (LoadOptions::activations): q8 when every matrix as run is q8 or a
  // block format. Decided, like the checks below, before any weight is read or converted: from the conversion's
  // target, or else every matrix's stored type (the embedding only when it is also the head).
  const auto each_matrix = [&](const std::function<void(const TensorSlot&, const StoredTensor&)>& visit) {
    for (const TensorSlot& s : tensor_slots(arch)) {
      if (s.shape.size() != 2) continue;
      const StoredTensor t = lookup(s.name);  // (the embedding too: a missing tensor is named in slot order)
      if (s.name != "embed" || arch.tie_embeddings) visit(s, t);
    }
  };
  ActivationFormat activations = ActivationFormat::F32;
  if (options.activations) {
    activations = *options.activations;
  } else if (options.weights) {
    if (*options.weights == WeightFormat::Q8 || is_block_format(*options.weights)) activations = ActivationFormat::Q8;
  } else {
    bool all_blocks = true;
    each_matrix([&](const TensorSlot&, const StoredTensor& t) { all_blocks = all_blocks && t.blocks.has_value(); });
    if (all_blocks) activations = ActivationFormat::Q8;
  }
  // bf16 activations need every matrix in bf16, q8 activations every matrix in q8 (made at load) or a block format.
  const auto refuse = [&](const std::string& what) {
    const bool bf16 = activations == ActivationFormat::BF16;
    fail("activations", std::string(activation_format_name(activations)) + " with " + what,
         bf16 ? "bf16 activations with bf16 weights throughout (--weights bf16 converts them at load), or f32 "
                "activations"
              : "q8 activations with q8 weights (--weights q8 converts them at load) or a GGUF file's block-format "
                "weights as stored (" + block_format_list() + "), or f32 activations");
  };
  if (activations != ActivationFormat::F32 && activations != ActivationFormat::BF16 &&
      activations != ActivationFormat::Q8)
    fail("activations", std::to_string(int(activations)), "f32, bf16, q8");
  if (activations == ActivationFormat::BF16 && options.weights && *options.weights != WeightFormat::BF16)
    refuse(std::string("weights converted to ") + weight_format_name(*options.weights));
  if (activations == ActivationFormat::Q8 && options.weights && *options.weights != WeightFormat::Q8 &&
      !is_block_format(*options.weights))
    refuse(std::string("weights converted to ") + weight_format_name(*options.weights));
  // As stored, every matrix must be bf16 for bf16 activations, a block format (a GGUF file's) for q8 activations.
  if (activations != ActivationFormat::F32 && !options.weights)
    each_matrix([&](const TensorSlot& s, const StoredTensor& t) {
      const bool fits = activations == ActivationFormat::BF16 ? !t.blocks && t.dtype == DType::BF16 : t.blocks.has_value();
      if (!fits) refuse("tensor " + (t.source.empty() ? s.name : t.source) + " stored as " + stored_type_name(t));
    });
  auto m = std::make_unique<Impl>();
  m->arch = arch;
  m->keep_alive = std::move(keep_alive);
  Loader load(*m, lookup, options);
  const int64_t d = arch.d_model, hq = arch.n_heads * arch.head_dim, hkv = arch.n_kv_heads * arch.head_dim;
  // The embedding is read a row per token, so it stays as stored unless it is also the head (tied): then it takes
  // the matrices' format, which the head's speed and size follow.
  m->embed = load.matrix("embed", arch.vocab_size, d, arch.tie_embeddings ? options.weights : std::nullopt);
  for (int64_t i = 0; i < arch.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    Layer& l = m->layers.emplace_back();
    l.attn_norm = load.norm(p + "attn_norm", arch.norm, d);
    if (arch.fused_qkv) {
      l.qkv = load.linear(p + "qkv", 3 * hq, d, arch.qkv_bias);
    } else {
      l.q = load.linear(p + "q", hq, d, arch.qkv_bias);
      l.k = load.linear(p + "k", hkv, d, arch.qkv_bias);
      l.v = load.linear(p + "v", hkv, d, arch.qkv_bias);
    }
    l.o = load.linear(p + "o", d, hq, arch.out_bias);
    l.mlp_norm = load.norm(p + "mlp_norm", arch.norm, d);
    if (arch.mlp == MlpKind::SwiGlu) l.gate = load.linear(p + "gate", arch.d_ff, d, arch.mlp_bias);
    l.up = load.linear(p + "up", arch.d_ff, d, arch.mlp_bias);
    l.down = load.linear(p + "down", d, arch.d_ff, arch.mlp_bias);
  }
  m->final_norm = load.norm("final_norm", arch.norm, d);
  m->head.w = arch.tie_embeddings ? m->embed : load.matrix("lm_head", arch.vocab_size, d, options.weights);
  m->activations = activations;
  return std::shared_ptr<const Model>(new Model(std::move(m)));
}

}  // namespace rotary::engine
