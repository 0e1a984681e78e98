// rotary/safetensors.h: reading Hugging Face safetensors files by memory-mapping them.
//
// The format: 8 bytes little-endian N, N bytes of JSON - {"<name>": {"dtype": "BF16", "shape": [4096, 4096],
// "data_offsets": [begin, end]}, ..., "__metadata__": {"<key>": "<text>"}} - then the data, each tensor row-major
// at [begin, end) of the data part. Every field is checked before a byte of data is touched: the header length
// against the file, each tensor's dtype, shape and offsets (inside the data, end - begin = numel x dtype size, no two
// tensors overlapping), so a truncated file or a header that lies is a rotary::Error naming the file, the tensor
// and the field, never a read past the mapping. Tensors are views into the mapping (valid while the file object
// lives); weights stay in their stored dtype (F32, F16, BF16, F64; other dtypes are refused by name). The format does
// not promise alignment (Hugging Face's writer pads the header to 8 bytes, so its files are aligned; others need
// not be): read a view through memcpy, or check `data`'s alignment before casting it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/dtype.h"

namespace rotary {

namespace detail {
class MappedFile;  // core-internal (core/src/mapped_file.h)
}  // namespace detail

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping
  size_t bytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps `path` read-only; rotary::Error naming the path for a missing, unreadable or malformed file.
  static SafetensorsFile open(const std::string& path);
  // The same checks on bytes in memory (tests, fuzzing); `source` names them in messages. Keeps its own copy.
  static SafetensorsFile from_bytes(std::string_view bytes, const std::string& source);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in data order
  const SafetensorsTensor* find(std::string_view name) const;                 // nullptr if absent
  // rotary::Error "<source>: tensor <name> is missing" / "... has shape [a, b]; expected [c, d]".
  const SafetensorsTensor& get(std::string_view name, const std::vector<int64_t>& expected_shape) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& source() const { return source_; }

 private:
  SafetensorsFile() = default;
  void parse(const uint8_t* bytes, size_t size);  // fills tensors_ and metadata_ or throws

  std::string source_;
  std::unique_ptr<detail::MappedFile> map_;  // the file mapped read-only (open), or null
  std::vector<uint8_t> owned_;  // from_bytes
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face model directory's weights: `model.safetensors`, or `model.safetensors.index.json`
// ({"metadata": {...}, "weight_map": {"<tensor>": "<shard file>", ...}}) and the shards it names, each mapped once.
// The index is checked before any shard is used: shard names are plain file names inside the directory (no '/',
// no ".."), every shard exists, every tensor the index lists is in the shard it names, and no tensor is in two
// shards; anything else is a rotary::Error naming the index file, the tensor and the field.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open(const std::string& model_dir);

  const SafetensorsTensor* find(std::string_view name) const;  // nullptr if absent
  // rotary::Error "<dir>: tensor <name> is missing" / "<shard>: tensor <name> shape = [a, b] is invalid; ...".
  const SafetensorsTensor& get(std::string_view name, const std::vector<int64_t>& expected_shape) const;
  std::vector<std::string> names() const;  // every tensor, sorted
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> tensors_;  // into shards_ (stable: moved, not copied)
};

}  // namespace rotary
