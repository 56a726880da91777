/* ks_cuda_driver.h: the CUDA driver API entry points and constants kernelset uses, declared here
 * without cuda.h (the library must build where no CUDA toolkit is installed).
 *
 * The lists are X-macros over type names spelled KS_CU*: driver.c defines those as plain C types
 * of the same ABI; tests/test_capi_aot.py compiles the same lists against a real cuda.h with
 * KS_CU* mapped to cuda.h's own types, so any wrong prototype, versioned symbol name (_v2) or
 * constant value fails to compile there.
 *
 * KS_CU_FUNCS(X): X(name, "exported symbol", (parameters)); every function returns CUresult.
 * KS_CU_CONSTS(X): X(our name, cuda.h name, value).
 */
#ifndef KS_CUDA_DRIVER_H_
#define KS_CUDA_DRIVER_H_

#define KS_CU_FUNCS(X)                                                                                    \
  X(cuInit, "cuInit", (unsigned int flags))                                                               \
  X(cuDriverGetVersion, "cuDriverGetVersion", (int *version))                                             \
  X(cuGetErrorName, "cuGetErrorName", (KS_CUresult error, const char **str))                              \
  X(cuGetErrorString, "cuGetErrorString", (KS_CUresult error, const char **str))                          \
  X(cuDeviceGet, "cuDeviceGet", (KS_CUdevice * device, int ordinal))                                      \
  X(cuDeviceGetCount, "cuDeviceGetCount", (int *count))                                                   \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", (int *value, KS_CUdevice_attribute attrib, KS_CUdevice dev)) \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (KS_CUcontext * ctx, KS_CUdevice dev))          \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", (KS_CUcontext * ctx))                                             \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", (KS_CUcontext ctx))                                               \
  X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", (KS_CUcontext ctx))                                          \
  X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", (KS_CUcontext * ctx))                                          \
  X(cuCtxGetDevice, "cuCtxGetDevice", (KS_CUdevice * device))                                             \
  X(cuCtxSynchronize, "cuCtxSynchronize", (void))                                                         \
  X(cuModuleLoadData, "cuModuleLoadData", (KS_CUmodule * module, const void *image))                      \
  X(cuModuleLoadDataEx, "cuModuleLoadDataEx",                                                             \
    (KS_CUmodule * module, const void *image, unsigned int num_options, KS_CUjit_option *options,        \
     void **option_values))                                                                               \
  X(cuModuleGetFunction, "cuModuleGetFunction", (KS_CUfunction * func, KS_CUmodule module, const char *name)) \
  X(cuFuncSetAttribute, "cuFuncSetAttribute", (KS_CUfunction func, KS_CUfunction_attribute attrib, int value)) \
  X(cuFuncGetAttribute, "cuFuncGetAttribute", (int *value, KS_CUfunction_attribute attrib, KS_CUfunction func)) \
  X(cuLaunchKernel, "cuLaunchKernel",                                                                     \
    (KS_CUfunction func, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z, unsigned int block_x, \
     unsigned int block_y, unsigned int block_z, unsigned int shared_bytes, KS_CUstream stream, void **params, \
     void **extra))                                                                                       \
  X(cuPointerGetAttribute, "cuPointerGetAttribute",                                                       \
    (void *data, KS_CUpointer_attribute attrib, KS_CUdeviceptr ptr))                                      \
  X(cuMemAlloc, "cuMemAlloc_v2", (KS_CUdeviceptr * ptr, size_t bytes))                                    \
  X(cuMemFree, "cuMemFree_v2", (KS_CUdeviceptr ptr))                                                      \
  X(cuMemAllocAsync, "cuMemAllocAsync", (KS_CUdeviceptr * ptr, size_t bytes, KS_CUstream stream))          \
  X(cuMemFreeAsync, "cuMemFreeAsync", (KS_CUdeviceptr ptr, KS_CUstream stream))                           \
  X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", (KS_CUdeviceptr dst, const void *src, size_t bytes))                 \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", (void *dst, KS_CUdeviceptr src, size_t bytes))                     \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", (KS_CUstream stream, KS_CUstreamCaptureStatus * status))

#define KS_CU_CONSTS(X)                                                                                   \
  X(KS_CUDA_SUCCESS, CUDA_SUCCESS, 0)                                                                     \
  X(KS_CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE, 1)                                             \
  X(KS_CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY, 2)                                             \
  X(KS_CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE, 100)                                                   \
  X(KS_CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE, 101)                                         \
  X(KS_CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_NO_BINARY_FOR_GPU, 209)                                   \
  X(KS_CUDA_ERROR_INVALID_PTX, CUDA_ERROR_INVALID_PTX, 218)                                               \
  X(KS_CUDA_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222)                       \
  X(KS_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 16)            \
  X(KS_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 75)    \
  X(KS_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 76)    \
  X(KS_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,                                            \
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 97)                                            \
  X(KS_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 8) \
  X(KS_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 9)                       \
  X(KS_CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER, 5)                                               \
  X(KS_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, 6)                         \
  X(KS_CU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_NONE, 0)

#endif /* KS_CUDA_DRIVER_H_ */
