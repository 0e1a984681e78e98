// core/src/gguf.cpp: see rotary/gguf.h.
#include "rotary/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>

#include "mapped_file.h"
#include "rotary/error.h"

namespace rotary {
namespace {

constexpr int kMaxDims = 4;                 // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 16;          // arrays inside arrays; real files nest none (ggml reads none)
constexpr uint32_t kLastValueType = 12;

// ggml-common.h's blocks: QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = 32, QK_K = 256, each block's bytes.
struct TypeRow {
  uint32_t id;
  GgmlTypeInfo info;
};
constexpr TypeRow kTypes[] = {
    {0, {"F32", 1, 4}},       {1, {"F16", 1, 2}},        {2, {"Q4_0", 32, 2 + 16}},
    {3, {"Q4_1", 32, 2 + 2 + 16}},  {6, {"Q5_0", 32, 2 + 4 + 16}}, {7, {"Q5_1", 32, 2 + 2 + 4 + 16}},
    {8, {"Q8_0", 32, 2 + 32}},
    {10, {"Q2_K", 256, 2 + 2 + 256 / 16 + 256 / 4}},          // d, dmin, scales[16], qs[64]: 84
    {11, {"Q3_K", 256, 2 + 256 / 4 + 256 / 8 + 12}},          // hmask[32], qs[64], scales[12], d: 110
    {12, {"Q4_K", 256, 2 + 2 + 256 / 2 + 12}},                // d, dmin, scales[12], qs[128]: 144
    {13, {"Q5_K", 256, 2 + 2 + 256 / 2 + 256 / 8 + 12}},      // + qh[32]: 176
    {14, {"Q6_K", 256, 2 + 256 / 2 + 256 / 4 + 256 / 16}},    // ql[128], qh[64], scales[16], d: 210
    {15, {"Q8_K", 256, 4 + 256 + 256 / 8}},                   // float d, qs[256], bsums[16]: 292
    {24, {"I8", 1, 1}},       {25, {"I16", 1, 2}},       {26, {"I32", 1, 4}},
    {27, {"I64", 1, 8}},      {28, {"F64", 1, 8}},       {30, {"BF16", 1, 2}},
};

// Names of the ggml types rotary does not read, for the message that refuses them.
const char* unsupported_type_name(uint32_t id) {
  switch (id) {
    case 4: return "Q4_2, removed from ggml";
    case 5: return "Q4_3, removed from ggml";
    case 9: return "Q8_1";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 29: return "IQ1_M";
    case 31: return "Q4_0_4_4, removed from ggml";
    case 32: return "Q4_0_4_8, removed from ggml";
    case 33: return "Q4_0_8_8, removed from ggml";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 36: case 37: case 38: return "an IQ4_NL repacking, removed from ggml";
    case 39: return "MXFP4";
    case 40: return "NVFP4";
    case 41: return "Q1_0";
    case 42: return "Q2_0";
  }
  return nullptr;
}

// Bytes of a scalar value type; 0 for string and array.
size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::String: case GgufType::Array: return 0;
  }
  return 0;
}

template <class T> constexpr GgufType type_of() {
  if constexpr (std::is_same_v<T, uint8_t>) return GgufType::U8;
  else if constexpr (std::is_same_v<T, int8_t>) return GgufType::I8;
  else if constexpr (std::is_same_v<T, uint16_t>) return GgufType::U16;
  else if constexpr (std::is_same_v<T, int16_t>) return GgufType::I16;
  else if constexpr (std::is_same_v<T, uint32_t>) return GgufType::U32;
  else if constexpr (std::is_same_v<T, int32_t>) return GgufType::I32;
  else if constexpr (std::is_same_v<T, uint64_t>) return GgufType::U64;
  else if constexpr (std::is_same_v<T, int64_t>) return GgufType::I64;
  else if constexpr (std::is_same_v<T, float>) return GgufType::F32;
  else if constexpr (std::is_same_v<T, double>) return GgufType::F64;
  else if constexpr (std::is_same_v<T, bool>) return GgufType::Bool;
  else if constexpr (std::is_same_v<T, std::string_view>) return GgufType::String;
  else static_assert(sizeof(T) == 0, "not a GGUF value type");
}

// A little-endian scalar at p (the file's byte order; x86 and ARM Linux read it as it is).
template <class T> T load(const uint8_t* p) {
  if constexpr (std::is_same_v<T, bool>) {
    return *p != 0;
  } else {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
}

std::string scalar_text(GgufType t, const uint8_t* p) {
  switch (t) {
    case GgufType::U8: return std::to_string(load<uint8_t>(p));
    case GgufType::I8: return std::to_string(load<int8_t>(p));
    case GgufType::U16: return std::to_string(load<uint16_t>(p));
    case GgufType::I16: return std::to_string(load<int16_t>(p));
    case GgufType::U32: return std::to_string(load<uint32_t>(p));
    case GgufType::I32: return std::to_string(load<int32_t>(p));
    case GgufType::U64: return std::to_string(load<uint64_t>(p));
    case GgufType::I64: return std::to_string(load<int64_t>(p));
    case GgufType::F32: {
      char buf[32];  // the shortest decimal that reads back as the same float: 9 significant digits
      std::snprintf(buf, sizeof buf, "%.9g", double(load<float>(p)));
      return buf;
    }
    case GgufType::F64: return to_text(load<double>(p));
    case GgufType::Bool: return load<bool>(p) ? "true" : "false";
    case GgufType::String: case GgufType::Array: break;
  }
  return "?";
}

std::string type_text(const GgufValue& v) {
  if (v.type() != GgufType::Array) return gguf_type_name(v.type());
  return "array of " + gguf_type_name(v.array_type());
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::string gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::U8: return "uint8";
    case GgufType::I8: return "int8";
    case GgufType::U16: return "uint16";
    case GgufType::I16: return "int16";
    case GgufType::U32: return "uint32";
    case GgufType::I32: return "int32";
    case GgufType::F32: return "float32";
    case GgufType::Bool: return "bool";
    case GgufType::String: return "string";
    case GgufType::Array: return "array";
    case GgufType::U64: return "uint64";
    case GgufType::I64: return "int64";
    case GgufType::F64: return "float64";
  }
  return "type " + std::to_string(uint32_t(type));
}

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  for (const TypeRow& row : kTypes)
    if (row.id == type) return &row.info;
  return nullptr;
}

std::string ggml_type_name(GgmlType type) {
  const GgmlTypeInfo* info = ggml_type_info(uint32_t(type));
  return info ? info->name : "type " + std::to_string(uint32_t(type));
}

std::string ggml_supported_types() {
  std::string s;
  for (const TypeRow& row : kTypes) s += (s.empty() ? "" : ", ") + std::string(row.info.name) + " (" + std::to_string(row.id) + ")";
  return s;
}

// ---- Values ---------------------------------------------------------------------------------------------------

std::string GgufValue::text(size_t limit) const {
  switch (type_) {
    case GgufType::String: return quoted_text(std::string_view(reinterpret_cast<const char*>(raw_), raw_size_), limit);
    case GgufType::Array: {
      std::string s = "[";
      const size_t elem = scalar_size(elem_);
      for (uint64_t i = 0; i < count_; ++i) {
        if (s.size() > limit) {
          s += "...";
          break;
        }
        if (i) s += ", ";
        if (elem_ == GgufType::String) s += quoted_text(strings_[i], limit);
        else if (elem_ == GgufType::Array) s += items_[i].text(limit);
        else s += scalar_text(elem_, raw_ + i * elem);
      }
      return s + "] (" + std::to_string(count_) + (count_ == 1 ? " item)" : " items)");
    }
    default: return scalar_text(type_, raw_);
  }
}

template <class T> T GgufValue::as(std::string_view what) const {
  static_assert(!std::is_same_v<T, std::string_view>, "as_string reads strings");
  if (type_ != type_of<T>()) fail(std::string(what) + " type", type_text(*this), gguf_type_name(type_of<T>()));
  return load<T>(raw_);
}

std::string_view GgufValue::as_string(std::string_view what) const {
  if (type_ != GgufType::String) fail(std::string(what) + " type", type_text(*this), "string");
  return {reinterpret_cast<const char*>(raw_), size_t(raw_size_)};
}

template <class T> std::vector<T> GgufValue::as_array(std::string_view what) const {
  if (type_ != GgufType::Array || elem_ != type_of<T>())
    fail(std::string(what) + " type", type_text(*this), "array of " + gguf_type_name(type_of<T>()));
  if constexpr (std::is_same_v<T, std::string_view>) {
    return strings_;
  } else {
    std::vector<T> out(static_cast<size_t>(count_));
    for (size_t i = 0; i < out.size(); ++i) out[i] = load<T>(raw_ + i * sizeof(T));
    return out;
  }
}

// ---- Tensors --------------------------------------------------------------------------------------------------

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // checked when read: at most 2^63 - 1
  return n;
}

std::vector<int64_t> GgufTensor::shape() const { return {dims.rbegin(), dims.rend()}; }

// ---- The parser -----------------------------------------------------------------------------------------------

struct GgufParser {
  GgufFile& f;
  const uint8_t* base;
  size_t size;
  size_t pos = 0;

  [[noreturn]] void bad(const std::string& field, const std::string& value, const std::string& allowed) const {
    fail(f.source_ + ": " + field, value, allowed);
  }
  size_t left() const { return size - pos; }
  std::string at() const { return " at byte " + std::to_string(pos); }

  // n bytes from here, or a refusal naming the field cut off by the end of the file.
  const uint8_t* take(uint64_t n, const std::string& field) {
    if (n > left())
      bad(field, "cut off" + at() + " (" + std::to_string(n) + " bytes needed, " + std::to_string(left()) + " left)",
          "a complete file");
    const uint8_t* p = base + pos;
    pos += size_t(n);
    return p;
  }
  template <class T> T read(const std::string& field) { return load<T>(take(sizeof(T), field)); }

  // A string: its uint64 length checked against the bytes left before anything is read.
  std::string_view read_string(const std::string& field) {
    const uint64_t n = read<uint64_t>(field + " length");
    if (n > left())
      bad(field + " length", std::to_string(n),
          "at most the " + std::to_string(left()) + " bytes left in the file" + at() + " (the file is truncated or the length lies)");
    return {reinterpret_cast<const char*>(take(n, field)), size_t(n)};
  }

  GgufType read_type(const std::string& field) {
    const uint32_t t = read<uint32_t>(field);
    if (t > kLastValueType)
      bad(field, std::to_string(t),
          "0 to 12: uint8, int8, uint16, int16, uint32, int32, float32, bool, string, array, uint64, int64, float64");
    return GgufType(t);
  }

  void check_bools(const uint8_t* p, uint64_t n, const std::string& field) const {
    for (uint64_t i = 0; i < n; ++i)
      if (p[i] > 1) bad(field, std::to_string(p[i]) + (n > 1 ? " (item " + std::to_string(i) + ")" : ""), "0 or 1 (a bool)");
  }

  // A value of type t; `field` names it ("metadata <key>" or that with [i] for array items).
  GgufValue read_value(GgufType t, const std::string& field, int depth) {
    GgufValue v;
    v.type_ = t;
    if (t == GgufType::String) {
      const std::string_view s = read_string(field);
      v.raw_ = reinterpret_cast<const uint8_t*>(s.data());
      v.raw_size_ = s.size();
      return v;
    }
    if (t != GgufType::Array) {
      v.raw_ = take(scalar_size(t), field);
      if (t == GgufType::Bool) check_bools(v.raw_, 1, field);
      return v;
    }
    v.elem_ = read_type(field + " array type");
    v.count_ = read<uint64_t>(field + " array length");
    // Every element takes at least min bytes, so a count the rest of the file cannot hold is refused before any
    // allocation or multiplication.
    const size_t elem = scalar_size(v.elem_);
    const size_t min = v.elem_ == GgufType::String ? 8 : v.elem_ == GgufType::Array ? 12 : elem;
    if (v.count_ > left() / min)
      bad(field + " array length", std::to_string(v.count_),
          "at most " + std::to_string(left() / min) + " items of " + gguf_type_name(v.elem_) + " (" +
              std::to_string(min) + "+ bytes each) in the " + std::to_string(left()) + " bytes left" + at());
    if (v.elem_ == GgufType::Array && depth + 1 >= kMaxArrayDepth)
      bad(field + " array nesting", std::to_string(depth + 2),
          "at most " + std::to_string(kMaxArrayDepth) + " arrays inside each other");
    if (elem != 0) {
      v.raw_ = take(v.count_ * elem, field);  // count <= left / elem: no overflow
      if (v.elem_ == GgufType::Bool) check_bools(v.raw_, v.count_, field);
    } else if (v.elem_ == GgufType::String) {
      v.strings_.reserve(size_t(v.count_));  // 16 bytes for each 8+ of the file; the other vectors grow as they are
                                             // read (a value or tensor info takes more memory than file)
      for (uint64_t i = 0; i < v.count_; ++i) {
        const uint64_t n = read<uint64_t>(field + "[" + std::to_string(i) + "] length");
        if (n > left())
          bad(field + "[" + std::to_string(i) + "] length", std::to_string(n),
              "at most the " + std::to_string(left()) + " bytes left in the file" + at() +
                  " (the file is truncated or the length lies)");
        v.strings_.emplace_back(reinterpret_cast<const char*>(base + pos), size_t(n));
        pos += size_t(n);
      }
    } else {
      for (uint64_t i = 0; i < v.count_; ++i)
        v.items_.push_back(read_value(GgufType::Array, field + "[" + std::to_string(i) + "]", depth + 1));
    }
    return v;
  }

  void parse() {
    if (size < 4 || std::memcmp(base, "GGUF", 4) != 0)
      bad("magic", quoted_text(std::string_view(reinterpret_cast<const char*>(base), std::min<size_t>(size, 4))),
          "\"GGUF\" (the file is not GGUF)");
    pos = 4;
    const uint32_t version = read<uint32_t>("version");
    if (version != 2 && version != 3) {
      const uint32_t swapped = __builtin_bswap32(version);
      bad("version", std::to_string(version),
          swapped >= 1 && swapped <= 3 ? "2 or 3, little-endian (this is a big-endian GGUF file, which rotary does not read)"
          : version == 1             ? "2 or 3 (version 1, with 32-bit counts, is not read)"
                                     : "2 or 3");
    }
    f.version_ = version;
    const uint64_t n_tensors = read<uint64_t>("tensor count");
    const uint64_t n_kv = read<uint64_t>("metadata count");
    // A key and its value take at least 14 bytes (length, one byte of key, type, one byte of value), a tensor info
    // 33 (length, one byte of name, n_dims, one dim, type, offset): larger counts cannot be in the file.
    if (n_kv > left() / 14)
      bad("metadata count", std::to_string(n_kv),
          "at most " + std::to_string(left() / 14) + " (14+ bytes each in the " + std::to_string(left()) + " bytes left)");
    if (n_tensors > left() / 33)
      bad("tensor count", std::to_string(n_tensors),
          "at most " + std::to_string(left() / 33) + " (33+ bytes each in the " + std::to_string(left()) + " bytes left)");

    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string field = "metadata key #" + std::to_string(i);
      const std::string_view key = read_string(field);
      if (key.empty()) bad(field, "\"\"" + at(), "a non-empty key");
      const auto [it, added] = f.key_index_.emplace(key, f.metadata_.size());
      if (!added)
        bad(field, quoted_text(key), "keys that appear once (it is also key #" + std::to_string(it->second) + ")");
      const std::string name = "metadata " + escaped_text(key.substr(0, 200));
      const GgufType t = read_type(name + " value type");
      f.metadata_.push_back({key, read_value(t, name, 0)});
    }
    if (const GgufValue* a = f.find("general.alignment")) {
      if (a->type() != GgufType::U32) bad("metadata general.alignment type", type_text(*a), "uint32");
      const uint32_t alignment = load<uint32_t>(a->raw());
      if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        bad("metadata general.alignment", std::to_string(alignment), "a power of two (default 32)");
      f.alignment_ = alignment;
    }

    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensor t;
      const std::string_view name = read_string("tensor #" + std::to_string(i) + " name");
      if (name.empty()) bad("tensor #" + std::to_string(i) + " name", "\"\"", "a non-empty name");
      t.name = std::string(name);
      const std::string field = "tensor " + escaped_text(name.substr(0, 200));
      if (f.tensor_index_.count(t.name))
        bad("tensor #" + std::to_string(i) + " name", quoted_text(name),
            "names that appear once (it is also tensor #" + std::to_string(f.tensor_index_.at(t.name)) + ")");
      const uint32_t n_dims = read<uint32_t>(field + " n_dims");
      if (n_dims < 1 || n_dims > kMaxDims) bad(field + " n_dims", std::to_string(n_dims), "1 to 4");
      int64_t numel = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const std::string dim = field + " dims[" + std::to_string(d) + "]";
        const uint64_t v = read<uint64_t>(dim);
        if (v == 0 || v > uint64_t(std::numeric_limits<int64_t>::max()))
          bad(dim, std::to_string(v), "1 to 2^63 - 1");
        t.dims.push_back(int64_t(v));
        if (__builtin_mul_overflow(numel, int64_t(v), &numel))
          bad(field + " element count", shape_text(t.dims) + " (past 2^63)", "at most 2^63 - 1 elements");
      }
      const uint32_t type = read<uint32_t>(field + " type");
      const GgmlTypeInfo* info = ggml_type_info(type);
      if (!info) {
        const char* known = unsupported_type_name(type);
        bad(field + " type", std::to_string(type) + (known ? std::string(" (") + known + ")" : " (not a ggml type)"),
            "one of " + ggml_supported_types());
      }
      t.type = GgmlType(type);
      if (t.dims[0] % info->block_size != 0)
        bad(field + " dims[0]", std::to_string(t.dims[0]),
            "a multiple of " + std::to_string(info->block_size) + ", the block size of " + info->name +
                " (rows are whole blocks)");
      int64_t bytes = 0;
      if (__builtin_mul_overflow(numel / info->block_size, info->type_size, &bytes))
        bad(field + " bytes", shape_text(t.dims) + " " + info->name + " (past 2^63)", "at most 2^63 - 1 bytes");
      t.bytes = size_t(bytes);
      t.offset = read<uint64_t>(field + " offset");
      if (t.offset % f.alignment_ != 0)
        bad(field + " offset", std::to_string(t.offset),
            "a multiple of the alignment " + std::to_string(f.alignment_) + " (general.alignment, default 32)");
      f.tensor_index_.emplace(t.name, f.tensors_.size());
      f.tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment (pos <= size < 2^63: no overflow).
    const uint64_t pad = (f.alignment_ - pos % f.alignment_) % f.alignment_;
    f.data_offset_ = uint64_t(pos) + pad;
    if (pad > left() && !f.tensors_.empty())
      bad("data section start", std::to_string(f.data_offset_),
          "at most the file size " + std::to_string(size) + " (the padding after the tensor infos is cut off)");
    const uint64_t data_size = pad > left() ? 0 : uint64_t(left()) - pad;
    const uint8_t* data = base + (pad > left() ? size : pos + pad);
    for (GgufTensor& t : f.tensors_) {
      if (t.offset > data_size || t.bytes > data_size - t.offset)
        bad("tensor " + escaped_text(std::string_view(t.name).substr(0, 200)) + " offset",
            std::to_string(t.offset) + " (+ " + std::to_string(t.bytes) + " bytes of " + ggml_type_name(t.type) + " " +
                shape_text(t.dims) + ")",
            "a range inside the " + std::to_string(data_size) + " bytes of the data section (the file is truncated or the offset lies)");
      t.data = data + t.offset;
    }
    // No two tensors share bytes.
    std::vector<size_t> order(f.tensors_.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const GgufTensor &x = f.tensors_[a], &y = f.tensors_[b];
      return x.offset < y.offset || (x.offset == y.offset && a < b);
    });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufTensor &a = f.tensors_[order[i - 1]], &b = f.tensors_[order[i]];
      if (a.offset + a.bytes > b.offset)
        bad("tensor " + escaped_text(std::string_view(b.name).substr(0, 200)) + " offset",
            std::to_string(b.offset) + " (inside tensor " + escaped_text(std::string_view(a.name).substr(0, 200)) +
                " at [" + std::to_string(a.offset) + ", " + std::to_string(a.offset + a.bytes) + "))",
            "ranges that do not overlap");
    }
  }
};

// ---- The file -------------------------------------------------------------------------------------------------

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.source_ = path;
  f.map_ = std::make_unique<detail::MappedFile>(
      detail::MappedFile::open(path, "GGUF file", "a readable regular file", "gguf"));
  f.parse(static_cast<const uint8_t*>(f.map_->data()), f.map_->size());
  return f;
}

GgufFile GgufFile::from_bytes(std::string_view bytes, const std::string& source) {
  GgufFile f;
  f.source_ = source;
  f.owned_.assign(bytes.begin(), bytes.end());
  f.parse(f.owned_.data(), f.owned_.size());
  return f;
}

// A vector's buffer moves with it, and the mapping stays where it is: views (keys, strings, tensors) stay valid.
GgufFile::GgufFile(GgufFile&& o) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&& o) noexcept = default;
GgufFile::~GgufFile() = default;

void GgufFile::parse(const uint8_t* bytes, size_t size) {
  static const uint8_t kEmpty = 0;
  GgufParser p{*this, bytes ? bytes : &kEmpty, size};
  p.parse();
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const GgufValue& GgufFile::value_or_missing(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) throw Error("rotary: " + source_ + ": metadata " + escaped_text(key) + " is missing");
  return *v;
}

template <class T> T GgufFile::get(std::string_view key) const {
  return value_or_missing(key).as<T>(source_ + ": metadata " + std::string(key));
}

template <class T> std::optional<T> GgufFile::get_optional(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  return v->as<T>(source_ + ": metadata " + std::string(key));
}

template <class T> std::vector<T> GgufFile::get_array(std::string_view key) const {
  return value_or_missing(key).as_array<T>(source_ + ": metadata " + std::string(key));
}

std::string_view GgufFile::get_string(std::string_view key) const {
  return value_or_missing(key).as_string(source_ + ": metadata " + std::string(key));
}

std::optional<std::string_view> GgufFile::get_optional_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  return v->as_string(source_ + ": metadata " + std::string(key));
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::get_tensor(std::string_view name, const std::vector<int64_t>& expected_shape) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) throw Error("rotary: " + source_ + ": tensor " + escaped_text(name) + " is missing");
  if (t->shape() != expected_shape)
    fail(source_ + ": tensor " + std::string(name) + " shape", shape_text(t->shape()), shape_text(expected_shape));
  return *t;
}

// ---- The instantiations of the typed getters ---------------------------------------------------------------

#define ROTARY_GGUF_TYPES(X) \
  X(uint8_t) X(int8_t) X(uint16_t) X(int16_t) X(uint32_t) X(int32_t) X(uint64_t) X(int64_t) X(float) X(double) X(bool)
#define ROTARY_GGUF_AS(T)                                                  \
  template T GgufValue::as<T>(std::string_view) const;                     \
  template std::vector<T> GgufValue::as_array<T>(std::string_view) const;  \
  template T GgufFile::get<T>(std::string_view) const;                     \
  template std::optional<T> GgufFile::get_optional<T>(std::string_view) const;
ROTARY_GGUF_TYPES(ROTARY_GGUF_AS)
#undef ROTARY_GGUF_AS
template std::vector<std::string_view> GgufValue::as_array<std::string_view>(std::string_view) const;

#define ROTARY_GGUF_GET_ARRAY(T) template std::vector<T> GgufFile::get_array<T>(std::string_view) const;
ROTARY_GGUF_TYPES(ROTARY_GGUF_GET_ARRAY)
ROTARY_GGUF_GET_ARRAY(std::string_view)
#undef ROTARY_GGUF_GET_ARRAY

}  // namespace rotary
