// core/src/memory_graph_file.cpp: the query-routed graph's file (rotary/memory_graph.h) - MemoryGraph::save, open
// and open_bytes, the one reader of the format. The file plumbing (mapping, atomic write, FNV-1a) is
// mapped_file.h's; the memory's fingerprint key_rows.h's.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "key_rows.h"
#include "mapped_file.h"
#include "memory_graph_impl.h"
#include "rotary/error.h"
#include "rotary/memory_graph.h"

namespace rotary {

// The graph file.
//
// All fields native little-endian; every block a multiple of 8 bytes (a 4-byte block padded with zeros):
//   [0, 8)    magic "RTKVGRF1"
//   header    int64 kv_heads, head_dim, storage (rotary::DType), size (rows taken in), graph_rows, builds, and the
//             build's settings degree, query_neighbors, training_queries, entry_points, min_graph_rows,
//             routing_queries; uint64 memory_check (key_rows.h: the memory it was built over); uint64 FNV-1a of the
//             header bytes before it
//   body      per kv head: int64 seen, kept, edges, entries, routes, route_width, rows; then samples f32 [kept, D],
//             offsets int64 [rows + 1], edges u32 [edges], entries int64 [entries], route queries f32 [routes, D],
//             route rows int64 [routes, route_width]
//   uint64    FNV-1a of the body's bytes
// The training sample is saved with the graph, so an opened graph grows and rebuilds as the one saved would (the
// same sample, the same reservoir draws from `seen` on). Opening copies the file into the graph's own arrays (a
// graph is 44-550 bytes a row: docs/bench-memory.md) after checking every count, offset and row number against
// the rows it covers: a search then indexes the memory and its own arrays only with numbers that were checked.
namespace {

using detail::HeadGraph;
using detail::memory_check;  // (save's)

constexpr char kGraphMagic[8] = {'R', 'T', 'K', 'V', 'G', 'R', 'F', '1'};

struct GraphHeader {
  int64_t kv_heads = 0, head_dim = 0, storage = 0, size = 0, graph_rows = 0, builds = 0;
  int64_t degree = 0, query_neighbors = 0, training_queries = 0, entry_points = 0, min_graph_rows = 0,
          routing_queries = 0;
  uint64_t memory_check = 0;
};

struct HeadCounts {
  int64_t seen = 0, kept = 0, edges = 0, entries = 0, routes = 0, route_width = 0, rows = 0;
};

int64_t padded(int64_t bytes) { return (bytes + 7) / 8 * 8; }

}  // namespace

void MemoryGraph::save(const std::string& path) const {
  const Impl& m = *impl_;
  check(m.covered == m.memory->size(), "memory_graph.save rows taken in", m.covered,
        "the memory's size " + std::to_string(m.memory->size()) + " (sync after appending)");
  const MemoryGraphConfig& c = m.config;
  GraphHeader h;
  h.kv_heads = m.memory->kv_heads(), h.head_dim = m.memory->head_dim(), h.storage = int64_t(m.memory->storage());
  h.size = m.covered, h.graph_rows = m.graph_rows, h.builds = m.builds;
  h.degree = c.degree, h.query_neighbors = c.query_neighbors, h.training_queries = c.training_queries;
  h.entry_points = c.entry_points, h.min_graph_rows = c.min_graph_rows, h.routing_queries = c.routing_queries;
  h.memory_check = memory_check(*m.memory);
  const int64_t D = h.head_dim;
  write_file_atomic(path, "memory_graph.save", [&](FileSink& out) {
    out.write(kGraphMagic, 8);
    out.write(&h, sizeof h);
    const uint64_t header_hash = fnv1a64(&h, sizeof h);
    out.write(&header_hash, sizeof header_hash);
    detail::HashingSink body(out);
    for (const HeadGraph& g : m.heads) {
      HeadCounts n;
      n.seen = g.seen, n.kept = int64_t(g.samples.size()) / D, n.edges = int64_t(g.edges.size());
      n.entries = int64_t(g.entries.size()), n.routes = int64_t(g.route_queries.size()) / D;
      n.route_width = g.route_width, n.rows = g.rows;
      body.write(&n, sizeof n);
      const uint64_t start = body.written();
      body.write(g.samples.data(), g.samples.size() * 4);
      body.pad_to(start + uint64_t(padded(int64_t(g.samples.size()) * 4)));
      body.write(g.offsets.data(), g.offsets.size() * 8);
      const uint64_t edges_at = body.written();
      body.write(g.edges.data(), g.edges.size() * 4);
      body.pad_to(edges_at + uint64_t(padded(n.edges * 4)));
      body.write(g.entries.data(), g.entries.size() * 8);
      const uint64_t routes_at = body.written();
      body.write(g.route_queries.data(), g.route_queries.size() * 4);
      body.pad_to(routes_at + uint64_t(padded(int64_t(g.route_queries.size()) * 4)));
      body.write(g.route_rows.data(), g.route_rows.size() * 8);
    }
    const uint64_t body_hash = body.hash();
    out.write(&body_hash, sizeof body_hash);
  });
}

MemoryGraph MemoryGraph::open(const std::string& path, const KvMemory& memory, const MemoryGraphConfig& config) {
  config.validate();  // before the file is looked at
  const detail::MappedFile map = detail::MappedFile::open(
      path, "memory_graph.open path", "a rotary graph file (a regular file)", "memory_graph.open");
  return open_bytes(map.data(), map.size(), memory, config, path);  // the one reader of the format; copies
}

MemoryGraph MemoryGraph::open_bytes(const void* data, size_t bytes, const KvMemory& memory,
                                    const MemoryGraphConfig& config, const std::string& source) {
  MemoryGraph graph(memory, config);  // validates the config
  const detail::ReaderErrors errors{"memory_graph.open", source};
  auto bad = [&](const std::string& what) { return errors.bad(what); };
  auto damaged = [&](const char* field, int64_t value, const std::string& allowed) {
    return errors.damaged(field, value, allowed);
  };
  const auto* base = static_cast<const char*>(data);
  const size_t fixed = 8 + sizeof(GraphHeader) + 8;
  if (base == nullptr || bytes < fixed || std::memcmp(base, kGraphMagic, 8) != 0)
    throw bad("not a rotary graph file (no RTKVGRF1 magic)");
  GraphHeader h;
  std::memcpy(&h, base + 8, sizeof h);
  uint64_t header_hash = 0;
  std::memcpy(&header_hash, base + 8 + sizeof h, 8);
  if (header_hash != fnv1a64(&h, sizeof h)) throw bad("a damaged header (checksum)");
  detail::check_index_file_memory(errors, h.kv_heads, h.head_dim, h.storage, h.size, h.memory_check, memory);
  if (h.graph_rows < 0 || h.graph_rows > std::min<int64_t>(h.size, UINT32_MAX))
    throw damaged("graph_rows", h.graph_rows, "0..min(size = " + std::to_string(h.size) + ", 2^32 - 1)");
  if (h.builds < 0 || h.builds > 64 || (h.builds > 0) != (h.graph_rows > 0))
    throw damaged("builds", h.builds, h.graph_rows > 0 ? "1..64 (a graph of rows)" : "0 (no graph)");
  // The run's build settings against the file, before the body is looked at.
  auto differs = [&](const std::string& field, const std::string& file, const std::string& want) {
    return bad("written for " + field + " = " + file + ", " + want);
  };
  const std::pair<const char*, std::pair<int64_t, int64_t>> settings[] = {
      {"degree", {h.degree, config.degree}},
      {"query_neighbors", {h.query_neighbors, config.query_neighbors}},
      {"training_queries", {h.training_queries, config.training_queries}},
      {"entry_points", {h.entry_points, config.entry_points}},
      {"min_graph_rows", {h.min_graph_rows, config.min_graph_rows}},
      {"routing_queries", {h.routing_queries, config.routing_queries}}};
  for (const auto& [field, values] : settings)
    if (values.first != values.second)
      throw differs(field, std::to_string(values.first), "this run asks " + std::to_string(values.second));
  if (bytes < fixed + 8) throw bad("truncated before its body's checksum (" + std::to_string(bytes) + " bytes)");
  const size_t body_end = bytes - 8;
  uint64_t body_hash = 0;
  std::memcpy(&body_hash, base + body_end, 8);
  if (body_hash != fnv1a64(base + fixed, body_end - fixed)) throw bad("a damaged body (checksum)");

  // The body, read with a cursor that never passes its end; every count bounded before its block is sized.
  const int64_t D = h.head_dim, G = h.graph_rows;
  size_t at = fixed;
  // A block of `count` elements into `out` (resized only once the file is known to hold them: a crafted count
  // cannot make the reader allocate what the file does not have).
  auto take = [&](auto& out, int64_t count, const std::string& what) {
    const int64_t element = int64_t(sizeof(out[0]));
    const int64_t n = checked_mul(count, element, "memory_graph.open: " + what, "a block that fits in the file");
    if (uint64_t(padded(n)) > body_end - at)
      throw bad("truncated inside " + what + " (" + std::to_string(bytes) + " bytes)");
    out.resize(size_t(count));
    if (n > 0) std::memcpy(out.data(), base + at, size_t(n));
    at += size_t(padded(n));
  };
  auto out_of_range = [&](const std::string& what, int64_t value, int64_t lo, int64_t hi) {
    return bad("a damaged body: " + what + " = " + std::to_string(value) + " is invalid; allowed: " +
               std::to_string(lo) + ".." + std::to_string(hi));
  };
  auto in_range = [&](const std::string& what, int64_t value, int64_t lo, int64_t hi) {
    if (value < lo || value > hi) throw out_of_range(what, value, lo, hi);
  };
  // Per element (millions of them): the message is made only for the one that fails.
  auto all_in_range = [&](const std::string& head, const char* what, const auto* values, int64_t count, int64_t lo,
                          int64_t hi) {
    for (int64_t i = 0; i < count; ++i)
      if (int64_t(values[i]) < lo || int64_t(values[i]) > hi)
        throw out_of_range(head + what + "[" + std::to_string(i) + "]", int64_t(values[i]), lo, hi);
  };
  Impl& m = *graph.impl_;
  for (int64_t k = 0; k < h.kv_heads; ++k) {
    const std::string head = "kv head " + std::to_string(k) + " ";
    std::vector<HeadCounts> counts;
    take(counts, 1, head + "counts");
    const HeadCounts n = counts[0];
    in_range(head + "rows", n.rows, G, G);
    in_range(head + "seen", n.seen, 0, int64_t(1) << 50);
    in_range(head + "kept", n.kept, std::min(n.seen, h.training_queries), std::min(n.seen, h.training_queries));
    in_range(head + "edges", n.edges, 0, G * (h.degree + 2));
    in_range(head + "entries", n.entries, G > 0 ? 1 : 0, std::min(h.entry_points, G));
    in_range(head + "routes", n.routes, 0, G > 0 ? h.routing_queries : 0);
    const int64_t width = G > 0 ? std::min(h.query_neighbors, G) : 0;
    in_range(head + "route_width", n.route_width, width, width);
    HeadGraph& g = m.heads[size_t(k)];
    g.seen = n.seen, g.rows = n.rows, g.route_width = n.route_width;
    take(g.samples, n.kept * D, head + "samples");
    take(g.offsets, G + 1, head + "offsets");
    take(g.edges, n.edges, head + "edges");
    take(g.entries, n.entries, head + "entries");
    take(g.route_queries, n.routes * D, head + "route queries");
    take(g.route_rows, n.routes * n.route_width, head + "route rows");
    // Every number a search indexes with, against the rows it covers.
    in_range(head + "offsets[0]", g.offsets[0], 0, 0);
    for (int64_t r = 0; r < G; ++r) {
      const int64_t lo = g.offsets[size_t(r)], hi = std::min(n.edges, lo + h.degree + 2), at_r = g.offsets[size_t(r + 1)];
      if (at_r < lo || at_r > hi) throw out_of_range(head + "offsets[" + std::to_string(r + 1) + "]", at_r, lo, hi);
    }
    in_range(head + "offsets[" + std::to_string(G) + "]", g.offsets[size_t(G)], n.edges, n.edges);
    all_in_range(head, "edges", g.edges.data(), n.edges, 0, G - 1);
    all_in_range(head, "entries", g.entries.data(), n.entries, 0, G - 1);
    all_in_range(head, "route rows", g.route_rows.data(), int64_t(g.route_rows.size()), 0, G - 1);
    for (const std::vector<float>* v : {&g.samples, &g.route_queries})
      for (size_t i = 0; i < v->size(); ++i)
        if (!std::isfinite((*v)[i]))
          throw bad("a damaged body: " + head + (v == &g.samples ? "samples[" : "route queries[") +
                    std::to_string(i) + "] is not finite");
  }
  if (at != body_end)
    throw bad("size " + std::to_string(bytes) + " bytes: " + std::to_string(body_end - at) +
              " bytes after the last kv head's graph (trailing bytes)");
  m.covered = h.size, m.graph_rows = G, m.builds = h.builds;
  return graph;
}

}  // namespace rotary
