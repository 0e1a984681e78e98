// lab/train/distributed.cpp: the Gloo communicator (the launcher is in launcher.cpp).
#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <string>

#include "rotary/error.h"
#include "rotary/parse_number.h"
#include "train/distributed.h"

namespace rotary::train {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, int lo, int hi) {
  std::optional<std::string> v = env(name);
  if (!v) fail(name, "<unset>", "a decimal integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(parse_integer(*v, name, lo, hi));
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world, bool local) : rank_(rank), world_(world) {
    auto opts = c10d::ProcessGroupGloo::Options::create();
    if (std::optional<std::string> ifname = env("GLOO_SOCKET_IFNAME"))
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(*ifname));
    else if (local)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void all_reduce_sum(torch::Tensor& t) override {
    std::vector<at::Tensor> ts{t};
    group_->allreduce(ts)->wait();
  }
  void broadcast(torch::Tensor& t, int root) override {
    std::vector<at::Tensor> ts{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    group_->broadcast(ts, o)->wait();
  }
  void barrier() override { group_->barrier()->wait(); }

 private:
  int rank_, world_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

}  // namespace

std::optional<WorkerEnv> worker_env_from_environment() {
  if (!env("RANK") || !env("WORLD_SIZE")) return std::nullopt;
  WorkerEnv w;
  w.world_size = env_int("WORLD_SIZE", 1, 65536);
  w.rank = env_int("RANK", 0, w.world_size - 1);
  return w;
}

std::unique_ptr<Communicator> connect_from_environment() {
  std::optional<WorkerEnv> w = worker_env_from_environment();
  if (!w) fail("RANK/WORLD_SIZE", "<unset>", "both set for a data-parallel worker");
  c10::intrusive_ptr<c10d::Store> store;
  bool local = false;
  if (std::optional<std::string> addr = env("MASTER_ADDR")) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(env_int("MASTER_PORT", 1, 65535));
    o.isServer = w->rank == 0;
    o.numWorkers = static_cast<size_t>(w->world_size);
    store = c10::make_intrusive<c10d::TCPStore>(*addr, o);
    local = *addr == "127.0.0.1" || *addr == "localhost";
  } else if (std::optional<std::string> file = env("ROTARY_STORE_FILE")) {
    store = c10::make_intrusive<c10d::FileStore>(*file, w->world_size);
    local = true;
  } else {
    fail("MASTER_ADDR", "<unset>", "rank 0's host name (with MASTER_PORT), or ROTARY_STORE_FILE = a shared file path");
  }
  try {
    return std::make_unique<GlooCommunicator>(store, w->rank, w->world_size, local);
  } catch (const c10::Error& e) {
    throw Error(std::string("rotary: data-parallel group could not be formed (rank ") + std::to_string(w->rank) +
                "): " + e.what_without_backtrace());
  }
}

}  // namespace rotary::train
