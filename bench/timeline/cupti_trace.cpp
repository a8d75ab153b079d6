// libdpml_cupti_trace.so — a GPU timeline of a program's profiled window, without Nsight Systems
// (not installed on the lent GPU machines): every kernel, copy and memset that starts between the
// program's cudaProfilerStart and cudaProfilerStop, with its real start and end on the GPU while
// the other streams run (Nsight Compute serialises kernels, so it cannot show what overlaps what).
//
//   export CUDA_INJECTION64_PATH=build/.../libdpml_cupti_trace.so DPML_TRACE_OUT=dir/run
//   gpt_train --cuda-profile ...            # one CSV per process: dir/run.r<rank>.csv
//   bench/timeline/timeline.py dir/a.r0.csv dir/b.r0.csv
//
// CUDA loads the library at its initialisation and calls InitializeInjection(); CUPTI's activity
// API then hands over records in buffers, which are kept in memory and written at exit, one line
// per record: kind, start and end (ns, CUPTI's clock), device, stream, grid and block, registers
// per thread, dynamic shared memory, start and end of the host's runtime call that launched it
// (0 if unknown), demangled name. Activity is enabled only inside the profiler
// window, so the CSV holds the steady-state step(s) the program brackets.

#include <cupti.h>

#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <unistd.h>

namespace {

#define TRACE_CUPTI(call)                                                                   \
  do {                                                                                      \
    if (CUptiResult r_ = (call); r_ != CUPTI_SUCCESS) {                                     \
      const char* what_ = nullptr;                                                          \
      cuptiGetResultString(r_, &what_);                                                     \
      std::fprintf(stderr, "dpml_cupti_trace: %s failed: %s\n", #call, what_ ? what_ : "?"); \
    }                                                                                       \
  } while (0)

constexpr std::size_t kBufferBytes = 8u << 20;

struct Record {
  const char* kind;
  std::uint64_t start, end;
  std::uint32_t device, stream;
  int grid[3], block[3];
  int registers;
  int dynamic_smem;
  std::uint32_t correlation;
  std::string name;
};

// The host side of each launch or copy (runtime API record), joined to its GPU record by the
// correlation id: when the host called it, so a timeline shows whether the GPU waited for the host.
struct ApiCall {
  std::uint64_t start, end;
};

std::mutex records_mutex;
std::vector<Record> records;
std::unordered_map<std::uint32_t, ApiCall> api_calls;

// GPU records: on inside the profiler window only. Host API records: on from the start (enabling
// them from inside an API callback yields none), kept only where a GPU record has their id.
const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                    CUPTI_ACTIVITY_KIND_MEMSET};
const CUpti_ActivityKind api_kinds[] = {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER};

std::string demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  std::vector<Record> batch;
  std::vector<std::pair<std::uint32_t, ApiCall>> calls;
  CUpti_Activity* a = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
    if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
      batch.push_back({"kernel", k->start, k->end, k->deviceId, k->streamId, {k->gridX, k->gridY, k->gridZ},
                       {k->blockX, k->blockY, k->blockZ}, k->registersPerThread, k->dynamicSharedMemory,
                       k->correlationId, demangle(k->name)});
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(a);
      batch.push_back({"memcpy", m->start, m->end, m->deviceId, m->streamId, {0, 0, 0}, {0, 0, 0}, 0, 0,
                       m->correlationId, "memcpy kind " + std::to_string(m->copyKind) + " bytes " + std::to_string(m->bytes)});
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(a);
      batch.push_back({"memset", m->start, m->end, m->deviceId, m->streamId, {0, 0, 0}, {0, 0, 0}, 0, 0,
                       m->correlationId, "memset bytes " + std::to_string(m->bytes)});
    }
  }
  std::free(buffer);
  std::lock_guard lock(records_mutex);
  for (auto& r : batch) records.push_back(std::move(r));
  for (const auto& [id, call] : calls) api_calls.emplace(id, call);
}

// Activity on inside [cudaProfilerStart, cudaProfilerStop].
void CUPTIAPI on_api(void*, CUpti_CallbackDomain, CUpti_CallbackId id, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 && info->callbackSite == CUPTI_API_EXIT) {
    for (auto k : kinds) TRACE_CUPTI(cuptiActivityEnable(k));
  } else if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && info->callbackSite == CUPTI_API_ENTER) {
    for (auto k : kinds) TRACE_CUPTI(cuptiActivityDisable(k));
    TRACE_CUPTI(cuptiActivityFlushAll(1));
  }
}

// "r<rank>" under a launcher that names the rank (Open MPI, MPICH's PMI, Slurm), else "p<pid>".
std::string process_name() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(var)) return std::string("r") + v;
  return "p" + std::to_string(getpid());
}

void write_records() {
  TRACE_CUPTI(cuptiActivityFlushAll(1));
  const char* prefix = std::getenv("DPML_TRACE_OUT");
  const std::string path = std::string(prefix ? prefix : "dpml_trace") + "." + process_name() + ".csv";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "dpml_cupti_trace: cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "kind,start_ns,end_ns,device,stream,grid,block,registers,dynamic_smem,api_start_ns,api_end_ns,name\n");
  std::lock_guard lock(records_mutex);
  for (const auto& r : records) {
    std::string name = r.name;
    for (auto& c : name)
      if (c == '"') c = '\'';
    const auto call = api_calls.find(r.correlation);
    const ApiCall host = call == api_calls.end() ? ApiCall{0, 0} : call->second;
    std::fprintf(f, "%s,%llu,%llu,%u,%u,%dx%dx%d,%dx%dx%d,%d,%d,%llu,%llu,\"%s\"\n", r.kind,
                 (unsigned long long)r.start, (unsigned long long)r.end, r.device, r.stream, r.grid[0], r.grid[1],
                 r.grid[2], r.block[0], r.block[1], r.block[2], r.registers, r.dynamic_smem,
                 (unsigned long long)host.start, (unsigned long long)host.end, name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "dpml_cupti_trace: %zu records in %s\n", records.size(), path.c_str());
}

}  // namespace

extern "C" int InitializeInjection() {
  static CUpti_SubscriberHandle subscriber;
  TRACE_CUPTI(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  TRACE_CUPTI(cuptiSubscribe(&subscriber, on_api, nullptr));
  TRACE_CUPTI(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                  CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000));
  TRACE_CUPTI(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                  CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000));
  for (auto k : api_kinds) TRACE_CUPTI(cuptiActivityEnable(k));
  std::atexit(write_records);
  return 1;
}
