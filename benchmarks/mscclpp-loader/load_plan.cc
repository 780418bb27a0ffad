// load-plan: load an MSCCL++ JSON execution plan with MSCCL++'s own plan-loading code for one rank,
// and report whether MSCCL++ accepts it at a given message size.
//
// Written for this tool (not MSCCL++ code). Compiled with -fno-access-control so that it can reach
// ExecutionPlan::impl_ (a private member that only mscclpp::Executor is a friend of), exactly as
// Executor::Impl does in src/core/executor/executor.cc.
//
// usage: load-plan [-v] [--mscclpp-only] PLAN.json RANK NBYTES
//   NBYTES: per-rank message size as NCCL gives it (allgather: per-rank input; reducescatter:
//   per-rank output; everything else: the buffer size). Suffixes K/M/G (powers of 1024) accepted.
// exit: 0 accepted; 1 refused (exception); 2 usage / unreadable file; 3 aborted (assertion);
//       4 crashed (SIGSEGV/SIGBUS/SIGFPE).

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <mscclpp/concurrency_device.hpp>
#include <mscclpp/errors.hpp>
#include <mscclpp/executor.hpp>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "execution_common.hpp"  // MSCCL++ internal: Operation, DeviceExecutionPlan, MAX_* limits
#include "execution_plan.hpp"    // MSCCL++ internal: ExecutionPlan::Impl

using mscclpp::BufferType;
using mscclpp::ChannelType;
using mscclpp::OperationType;

namespace {

// ---------------------------------------------------------------------------------------------
// stderr capture, so that whatever happens (exception, libstdc++/nlohmann assertion + abort, crash)
// the outcome is reported on ONE line on the real stderr.
int gOrigStderr = -1;
int gCaptureFd = -1;
char gHeader[512] = "load-plan";  // "rank=R nbytes=N"
const char* volatile gStage = "start";

void writeAll(int fd, const char* s, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}
void writeStr(int fd, const char* s) { writeAll(fd, s, strlen(s)); }

// Copy captured stderr to the real stderr with newlines replaced by " | " (only write/read/lseek).
void dumpCaptured(bool oneLine) {
  if (gCaptureFd < 0 || gOrigStderr < 0) return;
  off_t end = lseek(gCaptureFd, 0, SEEK_CUR);
  if (end <= 0) return;
  lseek(gCaptureFd, 0, SEEK_SET);
  char buf[4096];
  bool first = true;
  ssize_t r;
  while ((r = read(gCaptureFd, buf, sizeof(buf))) > 0) {
    if (!oneLine) {
      writeAll(gOrigStderr, buf, (size_t)r);
      continue;
    }
    if (first) writeStr(gOrigStderr, " [captured stderr: ");
    first = false;
    for (ssize_t i = 0; i < r; i++) {
      if (buf[i] == '\n')
        writeStr(gOrigStderr, " | ");
      else
        writeAll(gOrigStderr, &buf[i], 1);
    }
  }
  if (oneLine && !first) writeStr(gOrigStderr, "]");
}

void fatalSignal(int sig) {
  int code = (sig == SIGABRT) ? 3 : 4;
  fflush(stderr);
  writeStr(gOrigStderr, "REFUSED ");
  writeStr(gOrigStderr, gHeader);
  writeStr(gOrigStderr, " stage=");
  writeStr(gOrigStderr, gStage);
  writeStr(gOrigStderr, sig == SIGABRT ? ": aborted (assertion failure / std::terminate inside this stage)"
                                       : ": crashed with a fatal signal inside this stage");
  dumpCaptured(true);
  writeStr(gOrigStderr, "\n");
  _exit(code);
}

void startCapture() {
  FILE* f = tmpfile();
  if (!f) return;
  fflush(stderr);
  gOrigStderr = dup(2);
  gCaptureFd = dup(fileno(f));
  dup2(gCaptureFd, 2);
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = fatalSignal;
  for (int s : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE}) sigaction(s, &sa, nullptr);
}

std::string oneLine(std::string s) {
  for (auto& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

[[noreturn]] void refuse(const std::string& kind, const std::string& msg) {
  fflush(stderr);
  std::string line = "REFUSED " + std::string(gHeader) + " stage=" + gStage + ": " + kind + oneLine(msg);
  writeStr(gOrigStderr >= 0 ? gOrigStderr : 2, line.c_str());
  dumpCaptured(true);
  writeStr(gOrigStderr >= 0 ? gOrigStderr : 2, "\n");
  _exit(1);
}

// Failures found by checks that load-plan adds on top of MSCCL++ (places where MSCCL++ would index a
// std::vector / fixed-size array out of range, or talk to a non-existent rank, without checking).
struct DriverCheckFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
bool gDriverChecks = true;
template <typename... Args>
void driverCheck(bool ok, Args&&... args) {
  if (ok || !gDriverChecks) return;
  std::ostringstream os;
  (os << ... << args);
  throw DriverCheckFailure(os.str());
}

bool parseSize(const char* s, size_t& out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  std::string suf(end);
  unsigned long long mul = 1;
  if (suf.empty() || suf == "B")
    mul = 1;
  else if (suf == "K" || suf == "KiB" || suf == "k")
    mul = 1ull << 10;
  else if (suf == "M" || suf == "MiB")
    mul = 1ull << 20;
  else if (suf == "G" || suf == "GiB")
    mul = 1ull << 30;
  else
    return false;
  out = (size_t)(v * mul);
  return true;
}

const char* chanName(ChannelType t) {
  switch (t) {
    case ChannelType::MEMORY:
      return "memory";
    case ChannelType::PORT:
      return "port";
    case ChannelType::SWITCH:
      return "switch";
    default:
      return "none";
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool verbose = false;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "-v" || a == "--verbose")
      verbose = true;
    else if (a == "--mscclpp-only")
      gDriverChecks = false;
    else if (a == "-h" || a == "--help") {
      pos.clear();
      break;
    } else
      pos.push_back(a);
  }
  if (pos.size() != 3) {
    fprintf(stderr,
            "usage: load-plan [-v] [--mscclpp-only] PLAN.json RANK NBYTES\n"
            "  exit 0 if MSCCL++ (commit %s) accepts the plan for RANK at per-rank message size NBYTES\n",
            MSCCLPP_GIT_COMMIT);
    return 2;
  }
  const std::string path = pos[0];
  char* endp = nullptr;
  long rankL = strtol(pos[1].c_str(), &endp, 10);
  size_t nbytes = 0;
  if (*endp || endp == pos[1].c_str() || rankL < 0 || !parseSize(pos[2].c_str(), nbytes)) {
    fprintf(stderr, "load-plan: bad RANK or NBYTES (%s %s)\n", pos[1].c_str(), pos[2].c_str());
    return 2;
  }
  const int rank = (int)rankL;
  {
    std::ifstream probe(path);
    if (!probe) {
      fprintf(stderr, "load-plan: cannot open %s\n", path.c_str());
      return 2;
    }
  }
  snprintf(gHeader, sizeof(gHeader), "rank=%d nbytes=%zu", rank, nbytes);
  startCapture();

  try {
    // World size. In the executor it comes from the communicator's bootstrap; here, as for the
    // caller's check-plan.sh, it is the length of the plan's "gpus" array (parsed by load-plan itself).
    gStage = "read-world-size(load-plan)";
    int nranks = 0;
    bool parsed = true;
    {
      std::ifstream f(path);
      nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded())
        parsed = false;  // not valid JSON: let MSCCL++'s own json::parse below report it
      else if (j.is_object() && j.contains("gpus") && j["gpus"].is_array())
        nranks = (int)j["gpus"].size();
    }
    if (parsed) {
      driverCheck(nranks > 0, "plan has no non-empty \"gpus\" array");
      driverCheck(rank < nranks, "rank ", rank, " out of range: plan has ", nranks, " gpus");
    }

    // ---- MSCCL++: ExecutionPlan::ExecutionPlan -> ExecutionPlan::Impl::Impl (execution_plan.cc) ----
    gStage = "ExecutionPlan::ExecutionPlan";
    mscclpp::ExecutionPlan plan(path, rank);
    auto& impl = *plan.impl_;  // private member; this TU is built with -fno-access-control

    // Message sizes exactly as src/ext/nccl/nccl.cc passes them to DslAlgorithm::execute ->
    // Executor::execute(rank, sendbuff, recvbuff, sendBuffSize, recvBuffSize, ...).
    const std::string coll = plan.collective();
    size_t inputSize = nbytes, outputSize = nbytes;
    if (coll == "allgather") outputSize = nbytes * (size_t)nranks;
    if (coll == "reducescatter") inputSize = nbytes * (size_t)nranks;

    // Executor::execute takes the memory ranges of the *allocations* (cuMemGetAddressRange) and the
    // offsets of the buffers inside them. Model: separate exact-size allocations for out-of-place,
    // NCCL-style in-place layout (sendbuff inside recvbuff or vice versa) for in-place plans.
    size_t sendMemRange = inputSize, recvMemRange = outputSize, constSrcOffset = 0, constDstOffset = 0;
    if (plan.isInPlace()) {
      if (coll == "allgather") {
        sendMemRange = recvMemRange = outputSize;
        constSrcOffset = (size_t)rank * inputSize;
      } else if (coll == "reducescatter") {
        sendMemRange = recvMemRange = inputSize;
        constDstOffset = (size_t)rank * outputSize;
      } else {
        sendMemRange = recvMemRange = std::max(inputSize, outputSize);
      }
    }

    // ---- MSCCL++: what Executor::Impl::setupExecutionContext does for a new context ----
    gStage = "ExecutionPlan::Impl::reset";
    impl.reset();
    gStage = "ExecutionPlan::Impl::loadExecutionPlan";
    impl.loadExecutionPlan(inputSize, outputSize, constSrcOffset, constDstOffset);

    // setupScratchBuffer (executor.cc), host part: MSCCL++ size computations + the executor's check.
    gStage = "Executor::setupScratchBuffer";
    const size_t defaultScratchBufferSize = (1 << 27);  // Executor::Impl::defaultScratchBufferSize
    size_t scratchBufferSize = impl.calScratchBufferSize(std::min(sendMemRange, impl.maxMessageSize),
                                                         std::min(recvMemRange, impl.maxMessageSize));
    uint32_t scratchChunkSize = impl.calMaxScratchChunkSize(scratchBufferSize);
    if (impl.reuseResources) {
      if (scratchBufferSize > defaultScratchBufferSize) {  // the executor refuses this too
        throw mscclpp::Error("a plan that reuses resources needs " + std::to_string(scratchBufferSize) +
                                 " bytes of scratch, more than the executor's default of " +
                                 std::to_string(defaultScratchBufferSize),
                             mscclpp::ErrorCode::ExecutorError);
      }
      scratchBufferSize = defaultScratchBufferSize;
    }
    // [not run: GpuBuffer(scratchBufferSize) -- device allocation]

    // setupConnections: one connection per (channel, peer), plus the unpaired ones.
    gStage = "Executor::setupConnections";
    int nConnections = 0;
    for (ChannelType ct : {ChannelType::MEMORY, ChannelType::PORT}) {
      for (int pass = 0; pass < 2; pass++) {
        std::vector<mscclpp::ChannelInfo> infos =
            pass == 0 ? impl.getChannelInfos(ct) : impl.getUnpairedChannelInfos(nranks, ct);
        for (const auto& info : infos)
          for (int peer : info.connectedPeers) {
            driverCheck(peer >= 0 && peer < nranks, chanName(ct), " channel of rank ", rank,
                        " connects to non-existent rank ", peer, " (world size ", nranks, ")");
            nConnections++;  // [not run: comm->connect(transport, peer, tag)]
          }
      }
    }
    std::vector<mscclpp::NvlsInfo> nvlsInfos = impl.nvlsInfos.at(rank);
    for (const auto& info : nvlsInfos) {
      for (int r : info.ranks)
        driverCheck(r >= 0 && r < nranks, "switch channel rank group contains non-existent rank ", r);
      // getBufferSize(info.bufferType) in executor.cc throws for NONE
      if (info.bufferType != BufferType::INPUT && info.bufferType != BufferType::OUTPUT &&
          info.bufferType != BufferType::SCRATCH)
        throw mscclpp::Error("a switch channel names no input, output or scratch buffer",
                             mscclpp::ErrorCode::ExecutorError);
      // [not run: connectNvlsCollective(comm, info.ranks, size)]
    }

    // setupChannels: context.memoryChannels / portChannels get one entry per (channel, peer) of this
    // rank's own channel list (not the unpaired ones).
    gStage = "Executor::setupChannels";
    size_t nMemoryChannels = 0, nPortChannels = 0;
    for (const auto& info : impl.getChannelInfos(ChannelType::MEMORY)) nMemoryChannels += info.connectedPeers.size();
    for (const auto& info : impl.getChannelInfos(ChannelType::PORT)) nPortChannels += info.connectedPeers.size();
    // [not run: buildSemaphore / MemoryDevice2DeviceSemaphore / ProxyService::addSemaphore]

    // setupRegisteredMemories
    gStage = "Executor::setupRegisteredMemories";
    for (const auto& b : impl.getLocalBufferToSend())
      driverCheck(b.accessRank >= 0 && b.accessRank < nranks, "buffer would be sent to non-existent rank ",
                  b.accessRank);
    size_t nRegisteredMemoryAddresses = 0, nRegisteredMemoryIds = 0;
    auto remoteBuffers = impl.getRemoteBufferInfos();
    for (const auto& b : remoteBuffers) {
      driverCheck(b.rank >= 0 && b.rank < nranks, "remote buffer owned by non-existent rank ", b.rank);
      for (ChannelType ct : b.accessChannelTypes) {
        if (ct == ChannelType::MEMORY) nRegisteredMemoryAddresses++;
        if (ct == ChannelType::PORT) nRegisteredMemoryIds++;
      }
    }
    // [not run: registerMemory / sendMemory / recvMemory]

    // setupNvlsChannels: one SwitchChannel per NvlsInfo of this rank.
    size_t nNvlsChannels = nvlsInfos.size();

    // setupSemaphores: DeviceSemaphore per SemaphoreInfo (host objects only).
    gStage = "Executor::setupSemaphores";
    std::vector<mscclpp::DeviceSemaphore> semaphores;
    for (const auto& info : impl.semaphoreInfos) semaphores.emplace_back(info.initValue);
    // [not run: GpuBuffer + gpuMemcpy of the semaphores]

    // setupDeviceExecutionPlan: build the DeviceExecutionPlan structs in host memory.
    gStage = "Executor::setupDeviceExecutionPlan";
    const int nTb = impl.getThreadblockCount();
    size_t totalOps = 0;
    std::vector<mscclpp::DeviceExecutionPlan> devicePlans(nTb);
    for (int tb = 0; tb < nTb; tb++) {
      mscclpp::DeviceExecutionPlan& d = devicePlans[tb];
      memset((void*)&d, 0, sizeof(d));
      std::vector<mscclpp::Operation> ops = impl.getOperations(tb);
      d.nOperations = ops.size();
      const auto& mc = impl.threadblockMemoryChannels.at(tb);
      const auto& pc = impl.threadblockPortChannels.at(tb);
      const auto& nc = impl.threadblockNvlsChannels.at(tb);
      const auto& mb = impl.threadblockMemoryChannelBuffers.at(tb);
      const auto& pb = impl.threadblockPortChannelBuffers.at(tb);
      d.nMemoryChannels = mc.size();
      d.nPortChannels = pc.size();
      // executor.cc writes these into fixed arrays of MAX_CHANNEL entries and indexes
      // context.memoryChannels[index] etc. with std::vector::operator[] (no bounds check).
      driverCheck(mc.size() <= (size_t)mscclpp::MAX_CHANNEL, "threadblock ", tb, " uses ", mc.size(),
                  " memory channels > MAX_CHANNEL ", mscclpp::MAX_CHANNEL);
      driverCheck(pc.size() <= (size_t)mscclpp::MAX_CHANNEL, "threadblock ", tb, " uses ", pc.size(),
                  " port channels > MAX_CHANNEL ", mscclpp::MAX_CHANNEL);
      driverCheck(nc.size() <= (size_t)mscclpp::MAX_CHANNEL, "threadblock ", tb, " uses ", nc.size(),
                  " switch channels > MAX_CHANNEL ", mscclpp::MAX_CHANNEL);
      driverCheck(mb.size() <= (size_t)mscclpp::MAX_CHANNEL, "threadblock ", tb, " references ", mb.size(),
                  " memory-channel remote buffers > MAX_CHANNEL ", mscclpp::MAX_CHANNEL);
      driverCheck(pb.size() <= (size_t)mscclpp::MAX_CHANNEL, "threadblock ", tb, " references ", pb.size(),
                  " port-channel remote buffers > MAX_CHANNEL ", mscclpp::MAX_CHANNEL);
      for (int index : mc)
        driverCheck(index >= 0 && (size_t)index < nMemoryChannels, "threadblock ", tb, " memory channel id ", index,
                    " out of range: rank ", rank, " has ", nMemoryChannels, " memory channels");
      for (int index : pc)
        driverCheck(index >= 0 && (size_t)index < nPortChannels, "threadblock ", tb, " port channel id ", index,
                    " out of range: rank ", rank, " has ", nPortChannels, " port channels");
      for (int index : nc)
        driverCheck(index >= 0 && (size_t)index < nNvlsChannels, "threadblock ", tb, " switch channel id ", index,
                    " out of range: rank ", rank, " has ", nNvlsChannels, " switch channels");
      for (const auto& p : mb)
        driverCheck(p.first >= 0 && (size_t)p.first < nRegisteredMemoryAddresses, "threadblock ", tb,
                    " memory-channel remote buffer index ", p.first, " out of range (", nRegisteredMemoryAddresses,
                    ")");
      for (const auto& p : pb)
        driverCheck(p.first >= 0 && (size_t)p.first < nRegisteredMemoryIds, "threadblock ", tb,
                    " port-channel remote buffer index ", p.first, " out of range (", nRegisteredMemoryIds, ")");
      for (size_t i = 0; i < mb.size() && i < (size_t)mscclpp::MAX_CHANNEL; i++)
        d.remoteBuffers.memoryChannelBufferTypes[i] = mb[i].second;
      for (size_t i = 0; i < pb.size() && i < (size_t)mscclpp::MAX_CHANNEL; i++)
        d.remoteBuffers.portChannelBufferTypes[i] = pb[i].second;
      // [not run: deviceHandle(context.memoryChannels[index]) etc. -- needs real channels]

      if (ops.size() > mscclpp::MAX_OPERATION) {  // the executor refuses this too
        throw mscclpp::Error("threadblock " + std::to_string(tb) + " has " + std::to_string(ops.size()) +
                                 " operations; the device plan holds at most " + std::to_string(mscclpp::MAX_OPERATION),
                             mscclpp::ErrorCode::ExecutorError);
      }
      for (size_t i = 0; i < ops.size(); i++) d.operations[i] = ops[i];
      totalOps += ops.size();

      // Device-side invariants of the operations (execution_kernel.hpp indexes the threadblock's
      // channel arrays, the semaphore array and the device syncers with these values unchecked).
      for (size_t i = 0; i < ops.size(); i++) {
        const mscclpp::Operation& op = ops[i];
        if (op.type == OperationType::PIPELINE) {
          driverCheck(i + op.nOperations < ops.size(), "threadblock ", tb, " op ", i,
                      " pipeline claims more inner ops than present");
          continue;
        }
        if (op.type == OperationType::SEM_ACQUIRE || op.type == OperationType::SEM_RELEASE) {
          driverCheck(op.nDeviceSemaphores <= (uint32_t)mscclpp::MAX_DEVICE_SEMAPHORES, "threadblock ", tb, " op ", i,
                      " uses ", op.nDeviceSemaphores, " semaphores > MAX_DEVICE_SEMAPHORES");
          for (uint32_t k = 0; k < op.nDeviceSemaphores && k < (uint32_t)mscclpp::MAX_DEVICE_SEMAPHORES; k++)
            driverCheck(op.deviceSemaphoreIds[k] < semaphores.size(), "threadblock ", tb, " op ", i,
                        " semaphore id ", op.deviceSemaphoreIds[k], " out of range (", semaphores.size(),
                        " semaphores)");
          continue;
        }
        if (op.type == OperationType::BARRIER) {
          driverCheck(op.deviceSyncerIndex < (uint32_t)mscclpp::MAX_DEVICE_SYNCERS, "threadblock ", tb, " op ", i,
                      " barrier_id ", op.deviceSyncerIndex, " >= MAX_DEVICE_SYNCERS");
          continue;
        }
        driverCheck(op.nChannels <= mscclpp::MAX_CHANNEL_PER_OPERATION, "threadblock ", tb, " op ", i, " uses ",
                    (int)op.nChannels, " channels > MAX_CHANNEL_PER_OPERATION ", mscclpp::MAX_CHANNEL_PER_OPERATION);
        const int maxBufs = mscclpp::MAX_LOCAL_BUFFER_PER_OPERATION + mscclpp::MAX_CHANNEL_PER_OPERATION;
        driverCheck(op.nInputs <= maxBufs, "threadblock ", tb, " op ", i, " has ", (int)op.nInputs,
                    " src buffers > ", maxBufs);
        driverCheck(op.nOutputs <= maxBufs, "threadblock ", tb, " op ", i, " has ", (int)op.nOutputs,
                    " dst buffers > ", maxBufs);
        size_t nTbChannels = op.channelType == ChannelType::MEMORY ? mc.size()
                             : op.channelType == ChannelType::PORT ? pc.size()
                             : op.channelType == ChannelType::SWITCH ? nc.size()
                                                                     : 0;
        for (int k = 0; k < op.nChannels && k < mscclpp::MAX_CHANNEL_PER_OPERATION; k++)
          driverCheck(op.channelIndexes[k] < nTbChannels, "threadblock ", tb, " op ", i, " channel index ",
                      (int)op.channelIndexes[k], " out of range: threadblock has ", nTbChannels, " ",
                      chanName(op.channelType), " channels");
      }
    }
    // [not run: GpuBuffer + gpuMemcpy of the DeviceExecutionPlans, ExecutionKernel::launchKernel]
    gStage = "done";

    if (verbose) {
      printf(
          "ACCEPTED %s plan=\"%s\" collective=%s inplace=%d protocol_LL=%d nranks=%d input=%zu output=%zu "
          "scratch=%zu scratchChunk=%u threadblocks=%d ops=%zu connections=%d memoryChannels=%zu portChannels=%zu "
          "switchChannels=%zu remoteBuffers=%zu semaphores=%zu\n",
          gHeader, impl.name.c_str(), coll.c_str(), (int)impl.isInPlace, (int)impl.isUsingPacket, nranks, inputSize,
          outputSize, scratchBufferSize, scratchChunkSize, nTb, totalOps, nConnections, nMemoryChannels, nPortChannels,
          nNvlsChannels, remoteBuffers.size(), semaphores.size());
    }
  } catch (const DriverCheckFailure& e) {
    refuse("load-plan check (MSCCL++ would index out of range here): ", e.what());
  } catch (const mscclpp::BaseError& e) {
    refuse("mscclpp::Error: ", e.what());
  } catch (const nlohmann::json::exception& e) {
    refuse("nlohmann::json exception: ", e.what());
  } catch (const std::exception& e) {
    refuse("std::exception: ", e.what());
  } catch (...) {
    refuse("unknown exception", "");
  }
  fflush(stdout);
  fflush(stderr);
  dumpCaptured(false);  // pass through anything MSCCL++ logged
  return 0;
}
