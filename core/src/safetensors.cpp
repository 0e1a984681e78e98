// core/src/safetensors.cpp: see rotary/safetensors.h.
#include "rotary/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <limits>

#include "mapped_file.h"
#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/json_guard.h"

namespace rotary {
namespace {

// Real headers are kilobytes to a few megabytes (one entry per tensor); the format's own reader caps at 100 MB.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.source_ = path;
  f.map_ = std::make_unique<detail::MappedFile>(
      detail::MappedFile::open(path, "safetensors file", "a readable regular file", "safetensors"));
  f.parse(static_cast<const uint8_t*>(f.map_->data()), f.map_->size());
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::string_view bytes, const std::string& source) {
  SafetensorsFile f;
  f.source_ = source;
  f.owned_.assign(bytes.begin(), bytes.end());
  f.parse(f.owned_.data(), f.owned_.size());
  return f;
}

// A vector's buffer moves with it, and the mapping stays where it is: the tensors' views stay valid.
SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

void SafetensorsFile::parse(const uint8_t* bytes, size_t size) {
  const std::string& src = source_;
  auto bad = [&](const std::string& field, const std::string& value, const std::string& allowed) {
    fail(src + ": " + field, value, allowed);
  };
  if (size < 8) bad("file size", std::to_string(size), ">= 8 bytes (the header length)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
  if (n > kMaxHeaderBytes || n > size - 8)
    bad("header length", std::to_string(n),
        "at most the " + std::to_string(size - 8) + " bytes after it (and 100 MiB): the file is truncated or not safetensors");
  const uint8_t* data = bytes + 8 + n;
  const size_t data_size = size - 8 - size_t(n);
  const nlohmann::json header = parse_json(std::string_view(reinterpret_cast<const char*>(bytes + 8), size_t(n)), src);
  if (!header.is_object()) bad("header", json_excerpt(header), "a JSON object of tensors");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) bad("__metadata__", json_excerpt(e), "an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__." + m.key(), json_excerpt(m.value()), "a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string field = "tensor " + name;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") || e.size() != 3)
      bad(field, json_excerpt(e), "an object with exactly dtype, shape and data_offsets");
    SafetensorsTensor t;
    t.name = name;
    const nlohmann::json& dt = e["dtype"];
    const std::string dtype = dt.is_string() ? dt.get<std::string>() : json_excerpt(dt);
    if (dtype == "F32") t.dtype = DType::F32;
    else if (dtype == "F16") t.dtype = DType::F16;
    else if (dtype == "BF16") t.dtype = DType::BF16;
    else if (dtype == "F64") t.dtype = DType::F64;
    else bad(field + " dtype", dtype, "F32, F16, BF16, F64 (other safetensors dtypes are not supported)");
    const nlohmann::json& shape = e["shape"];
    if (!shape.is_array() || shape.size() > 16) bad(field + " shape", json_excerpt(shape), "an array of at most 16 sizes");
    // numel is bounded by the data it must fit in, so the product is checked against that as it grows.
    uint64_t numel = 1;
    for (const nlohmann::json& d : shape) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        bad(field + " shape", json_excerpt(shape), "non-negative integers");
      const uint64_t v = d.get<uint64_t>();
      t.shape.push_back(int64_t(std::min<uint64_t>(v, uint64_t(std::numeric_limits<int64_t>::max()))));
      if (v != 0 && numel > data_size / v) numel = uint64_t(data_size) + 1;  // more than could fit: refused below
      else numel *= v;
    }
    const nlohmann::json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(field + " data_offsets", json_excerpt(off), "[begin, end], two non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      bad(field + " data_offsets", json_excerpt(off),
          "0 <= begin <= end <= " + std::to_string(data_size) + " (the data after the header)");
    const uint64_t want = numel > data_size ? uint64_t(data_size) + 1 : numel * dtype_size(t.dtype);
    if (end - begin != want)
      bad(field + " data_offsets", json_excerpt(off),
          "a range of numel x " + std::to_string(dtype_size(t.dtype)) + " bytes for shape " + shape_text(t.shape) +
              " " + dtype);
    t.data = data + begin;
    t.bytes = size_t(end - begin);
    tensors_.push_back(std::move(t));
  }
  // No two tensors share bytes (a header that aliases them would let a write through one change another).
  std::sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.data < b.data || (a.data == b.data && a.bytes < b.bytes);
  });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const SafetensorsTensor& a = tensors_[i - 1];
    if (static_cast<const uint8_t*>(a.data) + a.bytes > static_cast<const uint8_t*>(tensors_[i].data))
      bad("tensor " + tensors_[i].name + " data_offsets", "overlapping " + a.name, "ranges that do not overlap");
  }
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  for (const SafetensorsTensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const SafetensorsTensor& SafetensorsFile::get(std::string_view name, const std::vector<int64_t>& expected_shape) const {
  const SafetensorsTensor* t = find(name);
  if (!t) throw Error("rotary: " + source_ + ": tensor " + std::string(name) + " is missing");
  if (t->shape != expected_shape)
    fail(source_ + ": tensor " + std::string(name) + " shape", shape_text(t->shape), shape_text(expected_shape));
  return *t;
}

// ---- A model directory: one file or an index with shards ------------------------------------------------------

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  SafetensorsCheckpoint c;
  c.source_ = model_dir;
  std::error_code ec;
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    const std::string src = index.string();
    const nlohmann::json j = parse_json(read_regular_file(src, "shard index"), src);
    const nlohmann::json* map = j.is_object() && j.contains("weight_map") ? &j.at("weight_map") : nullptr;
    if (!map || !map->is_object() || map->empty())
      fail(src + ": weight_map", map ? json_excerpt(*map) : "missing", "an object {\"<tensor>\": \"<shard file>\"}");
    std::map<std::string, size_t> shard_of_file;
    std::vector<std::pair<std::string, size_t>> listed;  // tensor, shard
    for (const auto& [name, file] : map->items()) {
      const std::string field = src + ": weight_map[\"" + name + "\"]";
      if (!file.is_string()) fail(field, json_excerpt(file), "a shard file name");
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." || !f.ends_with(".safetensors"))
        fail(field, f, "a *.safetensors file name inside the model directory (no '/')");
      auto [it, added] = shard_of_file.emplace(f, c.shards_.size());
      if (added) c.shards_.push_back(SafetensorsFile::open((dir / f).string()));
      listed.emplace_back(name, it->second);
    }
    for (const SafetensorsFile& shard : c.shards_)
      for (const SafetensorsTensor& t : shard.tensors())
        if (!c.tensors_.emplace(t.name, &t).second)
          throw Error("rotary: " + src + ": tensor " + t.name + " is in two shards (" + shard.source() + " and another)");
    for (const auto& [name, shard] : listed)
      if (c.shards_[shard].find(name) == nullptr)
        throw Error("rotary: " + src + ": weight_map puts tensor " + name + " in " + c.shards_[shard].source() +
                    ", which does not hold it");
  } else if (fs::exists(single, ec)) {
    c.shards_.push_back(SafetensorsFile::open(single.string()));
    for (const SafetensorsTensor& t : c.shards_.back().tensors()) c.tensors_.emplace(t.name, &t);
  } else {
    std::string other;
    for (const char* name : {"pytorch_model.bin", "pytorch_model.bin.index.json", "model.gguf"})
      if (fs::exists(dir / name, ec)) other = std::string(" (it has ") + name + ", a format rotary does not read)";
    fail("model directory " + model_dir, "without model.safetensors or model.safetensors.index.json" + other,
         "a Hugging Face model directory with safetensors weights");
  }
  return c;
}

const SafetensorsTensor* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

const SafetensorsTensor& SafetensorsCheckpoint::get(std::string_view name,
                                                   const std::vector<int64_t>& expected_shape) const {
  const SafetensorsTensor* t = find(name);
  if (!t) throw Error("rotary: " + source_ + ": tensor " + std::string(name) + " is missing");
  if (t->shape != expected_shape)
    fail(source_ + ": tensor " + std::string(name) + " shape", shape_text(t->shape), shape_text(expected_shape));
  return *t;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

}  // namespace rotary
