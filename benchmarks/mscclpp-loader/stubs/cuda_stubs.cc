// CUDA runtime / driver stubs for load-plan. Written for load-plan; not MSCCL++ code.
//
// The MSCCL++ sources compiled into load-plan (src/core/executor/execution_plan.cc and
// src/core/errors.cc) only reference two CUDA symbols, both from errors.cc (they build the text of
// CudaError / CuError exceptions). There is no GPU and no libcuda.so on the build machine, so both are
// provided here. Neither is reached while loading a plan; they exist so the link succeeds.
// No NVML, ibverbs, mlx5dv, numa or GDRCopy symbol is referenced by these sources, so no stubs are
// needed for those libraries (the files that use them -- ib.cc, ibverbs_wrapper.cc, numa.cc, gdr.cc,
// gpu_utils.cc, ... -- are not compiled).
#include <cuda.h>
#include <cuda_runtime_api.h>

extern "C" {

const char* cudaGetErrorString(cudaError_t error) {
  (void)error;
  return "CUDA runtime stub (load-plan): no GPU available";
}

CUresult cuGetErrorString(CUresult error, const char** pStr) {
  (void)error;
  if (pStr) *pStr = "CUDA driver stub (load-plan): no GPU available";
  return CUDA_SUCCESS;
}

}  // extern "C"
