// lab/train/distributed.h: data-parallel training over torch c10d (ProcessGroupGloo, CPU).
//
// Every rank builds the same model from the same seed and draws the SAME global batch from the same data RNG,
// then computes the loss of its own rows divided by the global mask weight; summing the gradients over ranks
// (one all-reduce of a flat buffer per step) gives exactly the single-process gradient of the global batch, up
// to float summation order. Rank 0 alone evaluates and writes metrics and checkpoints.
//
// How a process finds its group (the torchrun conventions):
//   RANK, WORLD_SIZE              this process's rank and the number of processes
//   MASTER_ADDR, MASTER_PORT      rank 0's TCPStore (across machines), or
//   ROTARY_STORE_FILE             a FileStore path on a shared file system (what `--nproc` uses locally)
//   GLOO_SOCKET_IFNAME            optional: the network interface gloo binds to (default: this host's name, or
//                                 127.0.0.1 with a FileStore)
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rotary::train {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place sum over ranks of a contiguous CPU tensor.
  virtual void all_reduce_sum(torch::Tensor& t) = 0;
  // In-place copy of rank `root`'s tensor to every rank.
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  virtual void barrier() = 0;
};

struct WorkerEnv {
  int rank = 0;
  int world_size = 1;
};
// RANK and WORLD_SIZE from the environment, if both are set (this process is one rank of a group).
std::optional<WorkerEnv> worker_env_from_environment();

// Joins the group described by the environment (see above); rotary::Error naming the variable that is missing
// or bad. Blocks until every rank has joined.
std::unique_ptr<Communicator> connect_from_environment();

struct LaunchSpec {
  int nproc = 1;        // processes on this machine
  int nnodes = 1;       // machines
  int node_rank = 0;    // this machine's index; ranks are node_rank * nproc + i
  std::string store_file;  // used when MASTER_ADDR is not set (single machine)
};
// Starts spec.nproc copies of this executable with `argv` (which must re-run the same command) and the rank
// variables set, forwards SIGINT/SIGTERM to them, waits, and returns the exit status for the launcher: 0 if all
// succeeded, else the first non-zero status (a worker killed by a signal counts as 128 + signal). If one worker
// fails the others are terminated so nothing waits forever on a dead peer.
int launch_workers(const LaunchSpec& spec, const std::vector<std::string>& argv);

}  // namespace rotary::train
