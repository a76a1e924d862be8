#pragma once
// A Communicator for device tensors that moves them through host memory over a host (MPI)
// communicator: the path for several ranks sharing one GPU, where NCCL refuses to run (it needs
// one rank per device), and for machines without NCCL.
//
// Note [Host staging]: every operation copies its device inputs to host buffers (a device-to-
// host copy on the calling thread's current stream, so it follows the compute that produced
// them), runs the host communicator's operation on those buffers, and copies the results back
// into the device tensors. A blocking operation copies back before it returns; an async_op one
// returns the host communicator's Work wrapped so that wait() copies back (the device tensors
// hold their old values until then, as the Communicator contract allows: they must not be read
// before wait()). Host tensors pass straight through, unless `stage_host_tensors` asks for the
// same staging as device tensors (the CPU stand-in that tests the staging on machines without a
// GPU). The host communicator checks consistency, times out and counts the bytes; this one
// counts its own calls like any communicator.
#include <optional>
#include <utility>

#include "tardelli/distributed/communicator.h"

namespace td::distributed {

// A communicator over `host` (an MPI communicator: its rank, size and name) that takes CPU and
// CUDA tensors. split() gives host-staged sub-groups.
CommPtr host_staged(const CommPtr& host, bool stage_host_tensors = false);

// The first two ranks of `world` (in rank order) on the same host with the same CUDA device
// index `device` (each rank passes its own), or nullopt when every rank has a device of its
// own: NCCL refuses such ranks, host staging serves them (Note [Ranks on GPUs] in
// src/train/trainer.cpp). Collective over `world` (one all-gather of host hash and device).
std::optional<std::pair<int, int>> ranks_sharing_a_device(const CommPtr& world, int device);

}  // namespace td::distributed
