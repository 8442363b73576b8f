/* ROCm 6's versioned device-properties calls, absent from the ROCm 5.7 headers the hook builds on.
 *
 * From HIP 6.0, hip_runtime_api.h maps hipGetDeviceProperties to hipGetDevicePropertiesR0600, whose
 * struct hipDeviceProp_tR0600 has a new layout, and keeps the 5.x layout (hipDeviceProp_t here) as
 * hipGetDevicePropertiesR0000. PyTorch and vLLM built for ROCm 6 size themselves by the R0600 call.
 * Only the head of the R0600 struct is declared: the published layout puts totalGlobalMem after
 * name[256], a 16-byte uuid, luid[8] and luidDeviceNodeMask, and nothing past it is touched. */
#ifndef ROCSHARE_HIP6_H
#define ROCSHARE_HIP6_H

#include <stddef.h>

#include <hip/hip_runtime_api.h>

struct rocshare_device_prop_r0600_head {
	char name[256];
	char uuid[16];
	char luid[8];
	unsigned int luid_device_node_mask;
	size_t total_global_mem;
};

hipError_t hipGetDevicePropertiesR0600(struct rocshare_device_prop_r0600_head *prop, int device);
hipError_t hipGetDevicePropertiesR0000(hipDeviceProp_t *prop, int device);

/* The offset HIP 6's headers give totalGlobalMem in hipDeviceProp_tR0600 on LP64. */
_Static_assert(offsetof(struct rocshare_device_prop_r0600_head, total_global_mem) == 288,
	       "hipDeviceProp_tR0600.totalGlobalMem lies at byte 288");

#endif
