// rotary/gguf.h: reading GGUF files (llama.cpp's model format) in place, by memory-mapping them.
//
// The format (little-endian throughout; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
//   "GGUF", uint32 version (2 or 3), uint64 tensor count, uint64 metadata count,
//   the metadata: each a string key, a uint32 value type and the value - uint8 / int8 / uint16 / int16 / uint32 /
//     int32 / uint64 / int64 / float32 / float64 / bool (one byte, 0 or 1) / string (uint64 length, then the bytes,
//     no terminator) / array (uint32 element type, uint64 count, the elements: any of these types, arrays too),
//   the tensor infos: each a string name, uint32 n_dims (1 to 4), n_dims uint64 dims, uint32 ggml type, uint64
//     offset into the data section,
//   padding to `general.alignment` (a uint32 power of two; 32 when the key is absent), then the data section; each
//     tensor's offset is a multiple of the alignment and its bytes lie inside the file.
//
// Every count, length and offset is checked against the bytes left before it is used, in overflow-safe arithmetic,
// so a truncated or lying file is a rotary::Error naming the file, the field (the key or the tensor), its value and
// what is allowed - never a read past the mapping or an allocation sized by a lie. Refused: a bad magic, a version
// other than 2 and 3 (version 1, with 32-bit counts, is long gone; a big-endian file is named as such), a length or
// count past the end of the file, duplicate keys, an empty key, an unknown value type, arrays nested deeper than 16,
// a bool other than 0 / 1, a `general.alignment` that is not a uint32 power of two, duplicate tensor names, n_dims
// outside [1, 4], a dim of 0, an element count past 2^63, an unknown or unsupported ggml type (named, with the
// supported list), a row length that is not a whole number of the type's blocks, a misaligned offset, data past the
// end of the file, two tensors sharing bytes.
//
// Dims: GGUF (ggml) lists a tensor's dims innermost first - dims[0] is the length of a row (ggml's ne[0]), the
// fastest-varying index. `GgufTensor::dims` keeps that order; `GgufTensor::shape()` is the row-major shape the
// rest of rotary (and safetensors, numpy, torch) uses, the dims reversed: a [4096 x 11008] matrix of Hugging Face's
// (rows x columns) is stored in GGUF with dims {11008, 4096}. Quantized types are blocks along the row: a row of
// dims[0] values is dims[0] / block_size blocks of type_size bytes (Q4_0: 32 values in 18 bytes).
//
// Views: metadata strings and arrays of numbers point into the mapping, as do tensors' bytes; they are valid while
// the GgufFile lives (a moved GgufFile keeps them valid). Nothing there is aligned for its type but the tensors'
// data (to the file's alignment, within a page-aligned mapping or a from_bytes buffer aligned to 16): read metadata
// numbers through the getters, which copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rotary {

namespace detail {
class MappedFile;  // core-internal (core/src/mapped_file.h)
}  // namespace detail

// GGUF metadata value types, numbered as in the file.
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9, U64 = 10, I64 = 11,
  F64 = 12,
};
// "uint8", "int8", ..., "float32", "bool", "string", "array", "uint64", "int64", "float64"; "type <n>" otherwise.
std::string gguf_type_name(GgufType type);

// ggml tensor types, numbered as in the file (ggml.h's enum ggml_type). The ones rotary knows the layout of; the
// rest (IQ*, TQ*, MXFP4, Q8_1, the removed 4..5 and 31..33) are refused by number with this list.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13,
  Q6_K = 14, Q8_K = 15, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};
struct GgmlTypeInfo {
  const char* name;     // "F32", "Q4_K", ...
  int64_t block_size;   // values per block (1 for the plain types, 32, or 256 for the k-quants: QK_K)
  int64_t type_size;    // bytes per block (ggml's type_size: Q4_0 18, Q8_0 34, Q4_K 144, Q6_K 210, ...)
};
// The layout of a supported type (its block size and bytes from ggml-common.h); nullptr for any other number.
const GgmlTypeInfo* ggml_type_info(uint32_t type);
std::string ggml_type_name(GgmlType type);
std::string ggml_supported_types();  // "F32 (0), F16 (1), Q4_0 (2), ..." - the list messages give

// One metadata value. Scalars and arrays of numbers are views of the file's bytes; read them through GgufFile's
// getters (or as_* here), which check the type and copy.
class GgufValue {
 public:
  GgufType type() const { return type_; }
  GgufType array_type() const { return elem_; }   // the element type of an Array (meaningless otherwise)
  uint64_t array_size() const { return count_; }  // the element count of an Array (0 otherwise)
  // The value's text in messages and dumps, at most `limit` bytes: 7, -3, 0.5, true, "text", [1, 2, ...] (n items).
  std::string text(size_t limit = 100) const;

  // The scalar of exactly that type (rotary::Error "<what> has type <t>; expected <type>" otherwise).
  template <class T> T as(std::string_view what) const;
  // String and arrays; the elements of nested arrays through items().
  std::string_view as_string(std::string_view what) const;
  template <class T> std::vector<T> as_array(std::string_view what) const;  // numbers, bool, std::string_view
  const std::vector<GgufValue>& items() const { return items_; }             // an array of arrays: its elements

  // Where the value's bytes lie: a scalar's (little-endian), a string's text, an array of numbers' elements.
  const uint8_t* raw() const { return raw_; }

 private:
  friend class GgufFile;
  friend struct GgufParser;
  GgufType type_ = GgufType::U8;
  GgufType elem_ = GgufType::U8;
  uint64_t count_ = 0;
  const uint8_t* raw_ = nullptr;
  uint64_t raw_size_ = 0;                 // string: its length
  std::vector<std::string_view> strings_;  // an array of strings
  std::vector<GgufValue> items_;           // an array of arrays
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> dims;  // GGUF order, innermost first: dims[0] = the row length (ggml's ne[0])
  uint64_t offset = 0;        // into the data section (a multiple of the alignment)
  const void* data = nullptr; // inside the mapping
  size_t bytes = 0;           // numel / block_size x type_size
  int64_t numel() const;
  std::vector<int64_t> shape() const;  // row-major (outermost first): dims reversed
};

struct GgufMetadataEntry {
  std::string_view key;
  GgufValue value;
};

class GgufFile {
 public:
  // Maps `path` read-only; rotary::Error naming the path for a missing, unreadable or malformed file.
  static GgufFile open(const std::string& path);
  // The same checks on bytes in memory (tests, fuzzing); `source` names them in messages. Keeps its own copy.
  static GgufFile from_bytes(std::string_view bytes, const std::string& source);

  GgufFile(GgufFile&& other) noexcept;
  GgufFile& operator=(GgufFile&& other) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // where the data section starts in the file
  const std::string& source() const { return source_; }

  // Metadata, in file order; find is nullptr for a key that is absent.
  const std::vector<GgufMetadataEntry>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  // Typed getters: rotary::Error "<source>: metadata <key> is missing" for an absent key, and "<source>: metadata
  // <key> type = <its type> is invalid; allowed: <expected>" for a value of another type (no conversion: a uint32 is
  // not read as an int32 or a uint64, as llama.cpp reads it).
  template <class T> T get(std::string_view key) const;  // uint8_t ... int64_t, float, double, bool
  template <class T> std::optional<T> get_optional(std::string_view key) const;  // nullopt when absent
  template <class T> std::vector<T> get_array(std::string_view key) const;       // an array of T (T as above or
                                                                                  // std::string_view)
  std::string_view get_string(std::string_view key) const;
  std::optional<std::string_view> get_optional_string(std::string_view key) const;
  uint32_t get_u32(std::string_view key) const { return get<uint32_t>(key); }
  float get_f32(std::string_view key) const { return get<float>(key); }
  std::vector<std::string_view> get_strings(std::string_view key) const { return get_array<std::string_view>(key); }
  std::vector<int32_t> get_i32_array(std::string_view key) const { return get_array<int32_t>(key); }
  std::vector<float> get_f32_array(std::string_view key) const { return get_array<float>(key); }

  // Tensors, in the order of their infos; find is nullptr for a name that is absent.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;
  // rotary::Error "<source>: tensor <name> is missing" / "... shape = [a, b] is invalid; allowed: [c, d]" (row-major).
  const GgufTensor& get_tensor(std::string_view name, const std::vector<int64_t>& expected_shape) const;

 private:
  friend struct GgufParser;
  GgufFile() = default;
  void parse(const uint8_t* bytes, size_t size);
  const GgufValue& value_or_missing(std::string_view key) const;

  std::string source_;
  std::unique_ptr<detail::MappedFile> map_;  // the file mapped read-only (open), or null
  std::vector<uint8_t> owned_;               // from_bytes
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;  // GGUF_DEFAULT_ALIGNMENT, until general.alignment says otherwise
  uint64_t data_offset_ = 0;
  std::vector<GgufMetadataEntry> metadata_;
  std::map<std::string_view, size_t, std::less<>> key_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace rotary
