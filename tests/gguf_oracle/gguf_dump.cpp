// tests/gguf_oracle/gguf_dump.cpp: what rotary's GGUF reader (rotary/gguf.h) reads from a file, as JSON, for the
// gguf-py oracle (test_gguf_oracle.py) to compare with what gguf-py wrote and what its own reader reads.
//   gguf_dump FILE     {"version", "alignment", "data_offset", "metadata": [{"key", "value"}], "tensors": [...]}
//   gguf_dump --types  {"<ggml type id>": [name, block size, bytes per block], ...} for every type rotary reads
// A value is {"type": "uint32", "value": 7}, {"type": "string", "hex": "<its bytes>"} or {"type": "array", "elem":
// "int32", "items": [values]}; a tensor {"name", "type", "dims" (GGUF order), "shape" (row-major), "offset",
// "bytes", "hex" (its bytes)}. A refused file prints the rotary::Error on stderr and exits 1.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "rotary/error.h"
#include "rotary/gguf.h"

namespace {

using nlohmann::json;
using rotary::GgufType;
using rotary::GgufValue;

std::string hex(const void* data, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(data)[i];
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

json scalar(GgufType t, const GgufValue& v) {
  switch (t) {
    case GgufType::U8: return v.as<uint8_t>("v");
    case GgufType::I8: return v.as<int8_t>("v");
    case GgufType::U16: return v.as<uint16_t>("v");
    case GgufType::I16: return v.as<int16_t>("v");
    case GgufType::U32: return v.as<uint32_t>("v");
    case GgufType::I32: return v.as<int32_t>("v");
    case GgufType::U64: return v.as<uint64_t>("v");
    case GgufType::I64: return v.as<int64_t>("v");
    case GgufType::F32: return double(v.as<float>("v"));
    case GgufType::F64: return v.as<double>("v");
    case GgufType::Bool: return v.as<bool>("v");
    default: return nullptr;
  }
}

template <class T> json items_of(const GgufValue& v) {
  json out = json::array();
  for (const T& x : v.as_array<T>("v")) {
    if constexpr (std::is_same_v<T, std::string_view>) out.push_back({{"type", "string"}, {"hex", hex(x.data(), x.size())}});
    else out.push_back({{"type", rotary::gguf_type_name(v.array_type())}, {"value", std::is_same_v<T, float> ? json(double(x)) : json(x)}});
  }
  return out;
}

json value(const GgufValue& v) {
  const std::string type = rotary::gguf_type_name(v.type());
  if (v.type() == GgufType::String) {
    const std::string_view s = v.as_string("v");
    return {{"type", type}, {"hex", hex(s.data(), s.size())}};
  }
  if (v.type() != GgufType::Array) return {{"type", type}, {"value", scalar(v.type(), v)}};
  json items;
  switch (v.array_type()) {
    case GgufType::U8: items = items_of<uint8_t>(v); break;
    case GgufType::I8: items = items_of<int8_t>(v); break;
    case GgufType::U16: items = items_of<uint16_t>(v); break;
    case GgufType::I16: items = items_of<int16_t>(v); break;
    case GgufType::U32: items = items_of<uint32_t>(v); break;
    case GgufType::I32: items = items_of<int32_t>(v); break;
    case GgufType::U64: items = items_of<uint64_t>(v); break;
    case GgufType::I64: items = items_of<int64_t>(v); break;
    case GgufType::F32: items = items_of<float>(v); break;
    case GgufType::F64: items = items_of<double>(v); break;
    case GgufType::Bool: items = items_of<bool>(v); break;
    case GgufType::String: items = items_of<std::string_view>(v); break;
    case GgufType::Array:
      items = json::array();
      for (const GgufValue& item : v.items()) items.push_back(value(item));
      break;
  }
  return {{"type", type}, {"elem", rotary::gguf_type_name(v.array_type())}, {"items", items}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gguf_dump FILE | --types\n");
    return 2;
  }
  json out;
  if (std::string(argv[1]) == "--types") {
    for (uint32_t id = 0; id < 256; ++id)
      if (const rotary::GgmlTypeInfo* t = rotary::ggml_type_info(id))
        out[std::to_string(id)] = {t->name, t->block_size, t->type_size};
  } else {
    try {
      const rotary::GgufFile f = rotary::GgufFile::open(argv[1]);
      out = {{"version", f.version()}, {"alignment", f.alignment()}, {"data_offset", f.data_offset()}};
      out["metadata"] = json::array();
      for (const rotary::GgufMetadataEntry& e : f.metadata())
        out["metadata"].push_back({{"key", std::string(e.key)}, {"value", value(e.value)}});
      out["tensors"] = json::array();
      for (const rotary::GgufTensor& t : f.tensors())
        out["tensors"].push_back({{"name", t.name}, {"type", rotary::ggml_type_name(t.type)}, {"dims", t.dims},
                                  {"shape", t.shape()}, {"offset", t.offset}, {"bytes", t.bytes},
                                  {"hex", hex(t.data, t.bytes)}});
    } catch (const rotary::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  }
  std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  return 0;
}
