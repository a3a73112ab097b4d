/* The CUDA backend (backend.h's table on an NVIDIA GPU: cuda_backend.cu, cuda_matmul.cu):
 * every buffer in device memory (cudaMalloc), weights uploaded once at load in their stored
 * format, one stream per backend. Built when CMake's GERBIL_CUDA is on (GERBIL_HAVE_CUDA). */
#ifndef GB_CUDA_H
#define GB_CUDA_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend on device `device` (0-based). GERBIL_ERR_UNSUPPORTED with a message when
 * there is no such device (or no driver). */
gerbil_status backend_cuda_new(int device, struct backend **out);
/* Devices the CUDA runtime sees (0 without a driver or GPU). */
int cuda_device_count(void);
/* Device i's name and memory; GERBIL_ERR_UNSUPPORTED when there is no such device. */
gerbil_status cuda_device_info(int i, char *name, size_t cap, size_t *total_bytes, size_t *free_bytes);

#ifdef __cplusplus
}
#endif

#endif
