/* Stub HIP runtime (libamdhip64.so.5), built from the real hip_runtime_api.h: a simulated GPU for the
 * hook's tests. $ROCM_STUB_DEVICES GPUs (default 1, 0: hipErrorNoDevice), $ROCM_STUB_VRAM_MIB
 * of VRAM each (default 16384), $ROCM_STUB_CUS CUs. Device memory is fake addresses (never
 * dereferenced), counted per device against the VRAM like a real GPU; managed memory is not
 * bounded by VRAM (it pages to the host). Streams with a CU mask go through the stub ROCr's queue
 * calls, as HIP's CLR does, so the hook sees those bindings from this library. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <hip/hip_runtime_api.h>
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

#include "../src/hip6.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 16
#define TABLE_SLOTS (1u << 16)
#define PITCH_BYTES 256

int rocshare_stub_gpu_count(void);
int rocshare_stub_cu_count(void);

enum kind { K_DEV = 1, K_MANAGED, K_ARRAY, K_MIPMAP, K_HANDLE };
struct alloc { uintptr_t key; uint64_t bytes; int device, kind; };

static pthread_mutex_t lock_g = PTHREAD_MUTEX_INITIALIZER;
static struct alloc table_g[TABLE_SLOTS];
static uint64_t used_g[MAX_DEVICES];
static uintptr_t next_address_g = 0x100000000000ull;
static __thread int current_g;

struct ihipStream_t { hsa_queue_t *queue; int device; };
struct ihipMemPoolHandle_t { int device; };
struct ihipMemGenericAllocationHandle { int device, maps, released; };
#define MAPPING_SLOTS 1024
struct mapping { uintptr_t ptr; size_t size; struct ihipMemGenericAllocationHandle *handle; };
static struct mapping mappings_g[MAPPING_SLOTS];

static uint64_t vram_bytes(void)
{
	const char *v = getenv("ROCM_STUB_VRAM_MIB");
	return (uint64_t)(v && *v ? strtoull(v, NULL, 10) : 16384) << 20;
}

static int devices(void) { int n = rocshare_stub_gpu_count(); return n > MAX_DEVICES ? MAX_DEVICES : n; }

#define GONE ((uintptr_t)1) /* a freed entry: lookups go past it, inserts reuse it */

static uint32_t home(uintptr_t key) { return (uint32_t)((key >> 12) * 0x9E3779B1u) & (TABLE_SLOTS - 1); }

static struct alloc *find_locked(uintptr_t key, int kind)
{
	for (uint32_t n = 0, i = home(key); n < TABLE_SLOTS && table_g[i].key; n++, i = (i + 1) & (TABLE_SLOTS - 1))
		if (table_g[i].key == key && table_g[i].kind == kind)
			return &table_g[i];
	return NULL;
}

static struct alloc *free_slot_locked(uintptr_t key)
{
	for (uint32_t n = 0, i = home(key); n < TABLE_SLOTS; n++, i = (i + 1) & (TABLE_SLOTS - 1))
		if (table_g[i].key == 0 || table_g[i].key == GONE)
			return &table_g[i];
	return NULL;
}

/* Count bytes on device (VRAM-bounded unless managed) and record key; key 0: make an address. */
static hipError_t record(uintptr_t *key, uint64_t bytes, int device, int kind)
{
	pthread_mutex_lock(&lock_g);
	hipError_t err = hipSuccess;
	if (kind != K_MANAGED && used_g[device] + bytes > vram_bytes()) {
		err = hipErrorOutOfMemory;
	} else {
		if (!*key) {
			*key = next_address_g;
			next_address_g += (bytes + 4095) / 4096 * 4096 + 4096;
		}
		struct alloc *slot = free_slot_locked(*key);
		if (!slot) {
			err = hipErrorOutOfMemory;
		} else {
			*slot = (struct alloc){*key, bytes, device, kind};
			if (kind != K_MANAGED)
				used_g[device] += bytes;
		}
	}
	pthread_mutex_unlock(&lock_g);
	return err;
}

static hipError_t forget_locked(uintptr_t key, int kind)
{
	struct alloc *a = key ? find_locked(key, kind) : NULL;
	if (a) {
		if (a->kind != K_MANAGED)
			used_g[a->device] -= a->bytes;
		a->key = GONE;
	}
	return a ? hipSuccess : hipErrorInvalidValue;
}

static hipError_t forget(uintptr_t key, int kind)
{
	pthread_mutex_lock(&lock_g);
	hipError_t err = forget_locked(key, kind);
	pthread_mutex_unlock(&lock_g);
	return err;
}

static hipError_t device_alloc(void **ptr, uint64_t bytes, int device, int kind)
{
	if (!ptr)
		return hipErrorInvalidValue;
	if (devices() <= 0)
		return hipErrorNoDevice;
	*ptr = NULL;
	if (!bytes)
		return hipSuccess;
	uintptr_t key = 0;
	hipError_t err = record(&key, bytes, device, kind);
	if (err == hipSuccess)
		*ptr = (void *)key;
	return err;
}

EXPORT hipError_t hipInit(unsigned int flags) { (void)flags; return devices() > 0 ? hipSuccess : hipErrorNoDevice; }
EXPORT hipError_t hipDriverGetVersion(int *v) { if (!v) return hipErrorInvalidValue; *v = HIP_VERSION; return hipSuccess; }
EXPORT hipError_t hipRuntimeGetVersion(int *v) { return hipDriverGetVersion(v); }

EXPORT hipError_t hipGetDeviceCount(int *count)
{
	if (!count)
		return hipErrorInvalidValue;
	*count = devices() > 0 ? devices() : 0;
	return *count ? hipSuccess : hipErrorNoDevice;
}

EXPORT hipError_t hipSetDevice(int device)
{
	if (device < 0 || device >= devices())
		return hipErrorInvalidDevice;
	current_g = device;
	return hipSuccess;
}

EXPORT hipError_t hipGetDevice(int *device)
{
	if (!device)
		return hipErrorInvalidValue;
	if (devices() <= 0)
		return hipErrorNoDevice;
	*device = current_g;
	return hipSuccess;
}

EXPORT hipError_t hipMalloc(void **ptr, size_t size) { return device_alloc(ptr, size, current_g, K_DEV); }
EXPORT hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned int flags) { (void)flags; return device_alloc(ptr, size, current_g, K_DEV); }
EXPORT hipError_t hipMallocManaged(void **ptr, size_t size, unsigned int flags) { (void)flags; return device_alloc(ptr, size, current_g, K_MANAGED); }
EXPORT hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream) { return device_alloc(ptr, size, stream ? stream->device : current_g, K_DEV); }
EXPORT hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, hipMemPool_t pool, hipStream_t stream)
{
	(void)stream;
	return pool ? device_alloc(ptr, size, pool->device, K_DEV) : hipErrorInvalidValue;
}

EXPORT hipError_t hipFree(void *ptr)
{
	if (!ptr)
		return hipSuccess;
	return forget((uintptr_t)ptr, K_DEV) == hipSuccess ? hipSuccess : forget((uintptr_t)ptr, K_MANAGED);
}

EXPORT hipError_t hipFreeAsync(void *ptr, hipStream_t stream) { (void)stream; return hipFree(ptr); }

EXPORT hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags)
{
	(void)flags;
	if (!ptr)
		return hipErrorInvalidValue;
	*ptr = size ? malloc(size) : NULL;
	return size && !*ptr ? hipErrorOutOfMemory : hipSuccess;
}

EXPORT hipError_t hipHostFree(void *ptr) { free(ptr); return hipSuccess; }

static size_t pitch_of(size_t width) { return (width + PITCH_BYTES - 1) / PITCH_BYTES * PITCH_BYTES; }

EXPORT hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height)
{
	if (!pitch)
		return hipErrorInvalidValue;
	*pitch = pitch_of(width);
	return device_alloc(ptr, (uint64_t)*pitch * height, current_g, K_DEV);
}

EXPORT hipError_t hipMemAllocPitch(hipDeviceptr_t *ptr, size_t *pitch, size_t width, size_t height, unsigned int element_bytes)
{
	(void)element_bytes;
	return hipMallocPitch((void **)ptr, pitch, width, height);
}

EXPORT hipError_t hipMalloc3D(hipPitchedPtr *p, hipExtent e)
{
	if (!p)
		return hipErrorInvalidValue;
	p->pitch = pitch_of(e.width);
	p->xsize = e.width;
	p->ysize = e.height;
	return device_alloc(&p->ptr, (uint64_t)p->pitch * e.height * e.depth, current_g, K_DEV);
}

static hipError_t array_alloc(hipArray **array, uint64_t bytes)
{
	if (!array)
		return hipErrorInvalidValue;
	hipArray *a = calloc(1, sizeof *a);
	if (!a)
		return hipErrorOutOfMemory;
	uintptr_t key = (uintptr_t)a;
	hipError_t err = record(&key, bytes, current_g, K_ARRAY);
	if (err != hipSuccess)
		free(a);
	*array = err == hipSuccess ? a : NULL;
	return err;
}

static uint64_t span(size_t w, size_t h, size_t d) { return (uint64_t)w * (h ? h : 1) * (d ? d : 1); }
static uint64_t channel_bytes(const hipChannelFormatDesc *d) { return (uint64_t)(d->x + d->y + d->z + d->w) / 8; }
static uint64_t format_bytes(enum hipArray_Format f)
{
	return f == HIP_AD_FORMAT_UNSIGNED_INT8 || f == HIP_AD_FORMAT_SIGNED_INT8 ? 1
	       : f == HIP_AD_FORMAT_UNSIGNED_INT16 || f == HIP_AD_FORMAT_SIGNED_INT16 || f == HIP_AD_FORMAT_HALF ? 2 : 4;
}

EXPORT hipError_t hipMallocArray(hipArray **array, const hipChannelFormatDesc *desc, size_t width, size_t height, unsigned int flags)
{
	(void)flags;
	return desc ? array_alloc(array, channel_bytes(desc) * span(width, height, 0)) : hipErrorInvalidValue;
}

EXPORT hipError_t hipMalloc3DArray(hipArray **array, const struct hipChannelFormatDesc *desc, struct hipExtent e, unsigned int flags)
{
	(void)flags;
	return desc ? array_alloc(array, channel_bytes(desc) * span(e.width, e.height, e.depth)) : hipErrorInvalidValue;
}

EXPORT hipError_t hipArrayCreate(hipArray **array, const HIP_ARRAY_DESCRIPTOR *d)
{
	return d ? array_alloc(array, format_bytes(d->Format) * d->NumChannels * span(d->Width, d->Height, 0)) : hipErrorInvalidValue;
}

EXPORT hipError_t hipArray3DCreate(hipArray **array, const HIP_ARRAY3D_DESCRIPTOR *d)
{
	return d ? array_alloc(array, format_bytes(d->Format) * d->NumChannels * span(d->Width, d->Height, d->Depth)) : hipErrorInvalidValue;
}

EXPORT hipError_t hipFreeArray(hipArray *array)
{
	hipError_t err = forget((uintptr_t)array, K_ARRAY);
	if (err == hipSuccess)
		free(array);
	return err;
}

EXPORT hipError_t hipArrayDestroy(hipArray *array) { return hipFreeArray(array); }

static uint64_t mipmap_span(size_t w, size_t h, size_t d, unsigned int levels)
{
	uint64_t sum = 0;
	for (unsigned int l = 0; l < levels && l < 64; l++)
		sum += (uint64_t)(w >> l ? w >> l : 1) * (h ? (h >> l ? h >> l : 1) : 1) * (d ? (d >> l ? d >> l : 1) : 1);
	return sum;
}

static hipError_t mipmap_alloc(hipMipmappedArray_t *array, uint64_t bytes)
{
	if (!array)
		return hipErrorInvalidValue;
	hipMipmappedArray_t a = calloc(1, sizeof *a);
	if (!a)
		return hipErrorOutOfMemory;
	uintptr_t key = (uintptr_t)a;
	hipError_t err = record(&key, bytes, current_g, K_MIPMAP);
	if (err != hipSuccess)
		free(a);
	*array = err == hipSuccess ? a : NULL;
	return err;
}

EXPORT hipError_t hipMallocMipmappedArray(hipMipmappedArray_t *array, const struct hipChannelFormatDesc *desc,
					  struct hipExtent e, unsigned int levels, unsigned int flags)
{
	(void)flags;
	return desc ? mipmap_alloc(array, channel_bytes(desc) * mipmap_span(e.width, e.height, e.depth, levels)) : hipErrorInvalidValue;
}

EXPORT hipError_t hipMipmappedArrayCreate(hipMipmappedArray_t *array, HIP_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	return d ? mipmap_alloc(array, format_bytes(d->Format) * d->NumChannels * mipmap_span(d->Width, d->Height, d->Depth, levels))
		 : hipErrorInvalidValue;
}

EXPORT hipError_t hipFreeMipmappedArray(hipMipmappedArray_t array)
{
	hipError_t err = forget((uintptr_t)array, K_MIPMAP);
	if (err == hipSuccess)
		free(array);
	return err;
}

EXPORT hipError_t hipMipmappedArrayDestroy(hipMipmappedArray_t array) { return hipFreeMipmappedArray(array); }

EXPORT hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size, const hipMemAllocationProp *prop, unsigned long long flags)
{
	(void)flags;
	if (!handle || !prop || prop->location.id < 0 || prop->location.id >= devices())
		return hipErrorInvalidValue;
	struct ihipMemGenericAllocationHandle *h = calloc(1, sizeof *h);
	if (!h)
		return hipErrorOutOfMemory;
	uintptr_t key = (uintptr_t)h;
	hipError_t err = record(&key, size, prop->location.id, K_HANDLE);
	if (err != hipSuccess)
		free(h);
	*handle = err == hipSuccess ? h : NULL;
	return err;
}

/* As the real runtime (and CUDA's cuMemRelease): releasing a handle that is still mapped only
 * defers the free; its memory stays in use until the last mapping is unmapped. */
EXPORT hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle)
{
	pthread_mutex_lock(&lock_g);
	hipError_t err = handle && find_locked((uintptr_t)handle, K_HANDLE) && !handle->released ? hipSuccess
												  : hipErrorInvalidValue;
	int free_now = err == hipSuccess && handle->maps == 0;
	if (err == hipSuccess)
		handle->released = 1;
	if (free_now)
		forget_locked((uintptr_t)handle, K_HANDLE);
	pthread_mutex_unlock(&lock_g);
	if (free_now)
		free(handle);
	return err;
}

EXPORT hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr, unsigned long long flags)
{
	(void)alignment;
	(void)addr;
	(void)flags;
	if (!ptr || !size)
		return hipErrorInvalidValue;
	pthread_mutex_lock(&lock_g);
	*ptr = (void *)next_address_g;
	next_address_g += (size + 4095) / 4096 * 4096 + 4096;
	pthread_mutex_unlock(&lock_g);
	return hipSuccess;
}

EXPORT hipError_t hipMemAddressFree(void *ptr, size_t size) { return ptr && size ? hipSuccess : hipErrorInvalidValue; }

EXPORT hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
			    unsigned long long flags)
{
	(void)offset;
	(void)flags;
	hipError_t err = hipErrorInvalidValue;
	pthread_mutex_lock(&lock_g);
	for (int i = 0; ptr && size && handle && !handle->released && find_locked((uintptr_t)handle, K_HANDLE) &&
			i < MAPPING_SLOTS; i++) {
		if (mappings_g[i].ptr)
			continue;
		mappings_g[i] = (struct mapping){(uintptr_t)ptr, size, handle};
		handle->maps++;
		err = hipSuccess;
		break;
	}
	pthread_mutex_unlock(&lock_g);
	return err;
}

/* Unmap every mapping inside [ptr, ptr + size); a released handle whose last mapping goes is freed. */
EXPORT hipError_t hipMemUnmap(void *ptr, size_t size)
{
	struct ihipMemGenericAllocationHandle *gone[MAPPING_SLOTS];
	int found = 0, n_gone = 0;
	pthread_mutex_lock(&lock_g);
	for (int i = 0; i < MAPPING_SLOTS; i++) {
		struct mapping *m = &mappings_g[i];
		if (!m->ptr || m->ptr < (uintptr_t)ptr || m->ptr - (uintptr_t)ptr >= size)
			continue;
		found = 1;
		if (--m->handle->maps == 0 && m->handle->released) {
			forget_locked((uintptr_t)m->handle, K_HANDLE);
			gone[n_gone++] = m->handle;
		}
		m->ptr = 0;
	}
	pthread_mutex_unlock(&lock_g);
	for (int i = 0; i < n_gone; i++)
		free(gone[i]);
	return found ? hipSuccess : hipErrorInvalidValue;
}

EXPORT hipError_t hipMemPoolCreate(hipMemPool_t *pool, const hipMemPoolProps *props)
{
	if (!pool || !props || props->location.id < 0 || props->location.id >= devices())
		return hipErrorInvalidValue;
	*pool = calloc(1, sizeof **pool);
	if (!*pool)
		return hipErrorOutOfMemory;
	(*pool)->device = props->location.id;
	return hipSuccess;
}

static struct ihipMemPoolHandle_t default_pools_g[MAX_DEVICES];

EXPORT hipError_t hipMemPoolDestroy(hipMemPool_t pool)
{
	if (pool >= default_pools_g && pool < default_pools_g + MAX_DEVICES)
		return hipErrorInvalidValue; /* a device's default pool is not the caller's to destroy */
	free(pool);
	return hipSuccess;
}

/* Each device's default pool (hipDeviceGetMemPool: the current pool, here always the default). */
EXPORT hipError_t hipDeviceGetDefaultMemPool(hipMemPool_t *pool, int device)
{
	if (!pool || device < 0 || device >= devices())
		return hipErrorInvalidValue;
	default_pools_g[device].device = device;
	*pool = &default_pools_g[device];
	return hipSuccess;
}

EXPORT hipError_t hipDeviceGetMemPool(hipMemPool_t *pool, int device) { return hipDeviceGetDefaultMemPool(pool, device); }

EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
	if (!free_bytes || !total_bytes)
		return hipErrorInvalidValue;
	if (devices() <= 0)
		return hipErrorNoDevice;
	pthread_mutex_lock(&lock_g);
	*total_bytes = vram_bytes();
	*free_bytes = vram_bytes() - used_g[current_g];
	pthread_mutex_unlock(&lock_g);
	return hipSuccess;
}

EXPORT hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int device)
{
	if (!prop)
		return hipErrorInvalidValue;
	if (device < 0 || device >= devices())
		return hipErrorInvalidDevice;
	memset(prop, 0, sizeof *prop);
	strcpy(prop->name, "AMD Instinct MI210 (rocshare stub)");
	strcpy(prop->gcnArchName, "gfx90a:sramecc+:xnack-");
	prop->totalGlobalMem = vram_bytes();
	prop->multiProcessorCount = rocshare_stub_cu_count();
	return hipSuccess;
}

/* ROCm 6's names (src/hip6.h): the 5.x layout, and the R0600 layout whose head is declared. */
EXPORT hipError_t hipGetDevicePropertiesR0000(hipDeviceProp_t *prop, int device)
{
	return hipGetDeviceProperties(prop, device);
}

EXPORT hipError_t hipGetDevicePropertiesR0600(struct rocshare_device_prop_r0600_head *prop, int device)
{
	if (!prop)
		return hipErrorInvalidValue;
	if (device < 0 || device >= devices())
		return hipErrorInvalidDevice;
	memset(prop, 0, sizeof *prop);
	strcpy(prop->name, "AMD Instinct MI210 (rocshare stub)");
	prop->total_global_mem = vram_bytes();
	return hipSuccess;
}

EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device)
{
	if (!bytes)
		return hipErrorInvalidValue;
	if (device < 0 || device >= devices())
		return hipErrorInvalidDevice;
	*bytes = vram_bytes();
	return hipSuccess;
}

EXPORT hipError_t hipDeviceGetAttribute(int *value, hipDeviceAttribute_t attr, int device)
{
	if (!value)
		return hipErrorInvalidValue;
	if (device < 0 || device >= devices())
		return hipErrorInvalidDevice;
	if (attr == hipDeviceAttributeTotalGlobalMem)
		*value = vram_bytes() > 0x7fffffff ? 0x7fffffff : (int)vram_bytes();
	else if (attr == hipDeviceAttributeMultiprocessorCount)
		*value = rocshare_stub_cu_count();
	else
		return hipErrorInvalidValue;
	return hipSuccess;
}

static hipError_t stream_create(hipStream_t *stream, uint32_t words, const uint32_t *mask)
{
	if (!stream)
		return hipErrorInvalidValue;
	struct ihipStream_t *s = calloc(1, sizeof *s);
	if (!s)
		return hipErrorOutOfMemory;
	s->device = current_g;
	hsa_agent_t agent = {0x2000 + (uint64_t)current_g};
	hsa_status_t st = hsa_queue_create(agent, 4096, HSA_QUEUE_TYPE_MULTI, NULL, NULL, 0, 0, &s->queue);
	if (st == HSA_STATUS_SUCCESS && mask)
		st = hsa_amd_queue_cu_set_mask(s->queue, words * 32, mask);
	if (st != HSA_STATUS_SUCCESS && (int)st != HSA_STATUS_CU_MASK_REDUCED) {
		if (s->queue)
			hsa_queue_destroy(s->queue);
		free(s);
		return hipErrorInvalidValue;
	}
	*stream = s;
	return hipSuccess;
}

EXPORT hipError_t hipStreamCreate(hipStream_t *stream) { return stream_create(stream, 0, NULL); }
EXPORT hipError_t hipExtStreamCreateWithCUMask(hipStream_t *stream, uint32_t words, const uint32_t *mask)
{
	return mask && words ? stream_create(stream, words, mask) : hipErrorInvalidValue;
}

/* Kernel launches: nothing runs; a launch needs a function and is answered hipSuccess. */
EXPORT hipError_t hipLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared_bytes, hipStream_t stream)
{
	(void)grid, (void)block, (void)args, (void)shared_bytes, (void)stream;
	return f ? hipSuccess : hipErrorInvalidDeviceFunction;
}

EXPORT hipError_t hipExtLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared_bytes,
				     hipStream_t stream, hipEvent_t start, hipEvent_t stop, int flags)
{
	(void)start, (void)stop, (void)flags;
	return hipLaunchKernel(f, grid, block, args, shared_bytes, stream);
}

EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
					unsigned int by, unsigned int bz, unsigned int shared_bytes, hipStream_t stream,
					void **params, void **extra)
{
	(void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared_bytes, (void)stream, (void)params, (void)extra;
	return f ? hipSuccess : hipErrorInvalidResourceHandle;
}

EXPORT hipError_t hipLaunchCooperativeKernel(const void *f, dim3 grid, dim3 block, void **args, unsigned int shared_bytes,
					     hipStream_t stream)
{
	return hipLaunchKernel(f, grid, block, args, shared_bytes, stream);
}

EXPORT hipError_t hipGraphLaunch(hipGraphExec_t graph, hipStream_t stream)
{
	(void)stream;
	return graph ? hipSuccess : hipErrorInvalidValue;
}

EXPORT hipError_t hipStreamGetDevice(hipStream_t stream, hipDevice_t *device)
{
	if (!device)
		return hipErrorInvalidValue;
	*device = stream ? stream->device : current_g;
	return hipSuccess;
}

EXPORT hipError_t hipStreamDestroy(hipStream_t stream)
{
	if (!stream)
		return hipErrorInvalidHandle;
	hsa_queue_destroy(stream->queue);
	free(stream);
	return hipSuccess;
}

/* Stub only: the ROCr queue behind a stream, so a test reads its CU mask back with hsa_amd_queue_cu_get_mask. */
EXPORT hsa_queue_t *rocshare_stub_stream_queue(hipStream_t stream) { return stream ? stream->queue : NULL; }

EXPORT const char *hipGetErrorName(hipError_t e)
{
	switch (e) {
	case hipSuccess: return "hipSuccess";
	case hipErrorInvalidValue: return "hipErrorInvalidValue";
	case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
	case hipErrorNoDevice: return "hipErrorNoDevice";
	case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
	case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
	default: return "hipErrorUnknown";
	}
}
