/* hook-probe: drives every HIP entry point the hook covers against whatever libamdhip64 the loader
 * gives it (the stub, normally) and prints what happened as one JSON object. It decides nothing:
 * the tests work out what each value must be.
 *
 *   hook-probe                 every entry point at the slice's limit and one unit past it
 *   hook-probe alloc <bytes>   one hipMalloc; prints its result, holds it until stdin closes
 *   hook-probe info            hipMemGetInfo only
 *   hook-probe fork <bytes>    allocate, fork; the child reports its own view and allocation
 *   hook-probe hold <bytes>    one hipMalloc; prints its result, holds it until killed (the demo's processes)
 *   hook-probe serve           per line of stdin, "<bytes>": one hipMalloc, "free": hipFree of the newest
 *                              still held; each answered {"op","result","free","total","held","pid"};
 *                              everything held until stdin closes
 *   hook-probe bench <pairs>   ns per hipMalloc+hipFree pair after as many untimed: p50, p99
 *   hook-probe bench-launch <n>  ns per hipLaunchKernel after as many untimed: p50, p99
 *   hook-probe queues          one command per line of stdin, each answered by a line
 *                              {"result","masks":[[CUs of stream 0],...]}: "new" (hipStreamCreate),
 *                              "all <i>" (stream i's queue asks ROCr for every CU), "launch"
 *                              (hipLaunchKernel), "alloc <bytes>" (hipMalloc, held), "masks"
 *
 * The limit L is HIP_DEVICE_MEMORY_LIMIT_0 read here (MiB with "m"), else 1 GiB. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hip/hip_runtime_api.h>
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

#include "../src/hip6.h"

hsa_queue_t *rocshare_stub_stream_queue(hipStream_t stream);

#define MIB (1ull << 20)
static const char *name(hipError_t e) { return hipGetErrorName(e); }

static unsigned long long limit_bytes(void)
{
	const char *v = getenv("HIP_DEVICE_MEMORY_LIMIT_0");
	return v ? strtoull(v, NULL, 10) * MIB : 1024 * MIB;
}

static void print_info(const char *key)
{
	size_t f = 0, t = 0;
	hipError_t e = hipMemGetInfo(&f, &t);
	printf("\"%s\":{\"result\":\"%s\",\"free\":%zu,\"total\":%zu}", key, name(e), f, t);
}

/* One entry point: a way to allocate n bytes (n a multiple of 1 MiB) and the matching free. */
struct entry {
	const char *name;
	hipError_t (*alloc)(void **handle, unsigned long long bytes);
	hipError_t (*release)(void *handle);
};

static hipMemPool_t pool_g;
static hipError_t a_malloc(void **h, unsigned long long n) { return hipMalloc(h, n); }
static hipError_t a_ext(void **h, unsigned long long n) { return hipExtMallocWithFlags(h, n, hipDeviceMallocFinegrained); }
static hipError_t a_managed(void **h, unsigned long long n) { return hipMallocManaged(h, n, hipMemAttachGlobal); }
static hipError_t a_async(void **h, unsigned long long n) { return hipMallocAsync(h, n, NULL); }
static hipError_t a_pool(void **h, unsigned long long n) { return hipMallocFromPoolAsync(h, n, pool_g, NULL); }
static hipError_t a_pitch(void **h, unsigned long long n) { size_t p; return hipMallocPitch(h, &p, 1024, n / 1024); }
static hipError_t a_mempitch(void **h, unsigned long long n) { size_t p; return hipMemAllocPitch((hipDeviceptr_t *)h, &p, 1024, n / 1024, 4); }
static hipError_t a_3d(void **h, unsigned long long n)
{
	hipPitchedPtr p;
	hipExtent e = {1024, 1024, n / MIB};
	hipError_t err = hipMalloc3D(&p, e);
	*h = p.ptr;
	return err;
}
static hipChannelFormatDesc float_desc = {32, 0, 0, 0, hipChannelFormatKindFloat};
static hipError_t a_array(void **h, unsigned long long n) { return hipMallocArray((hipArray **)h, &float_desc, 1024, n / 4096, 0); }
static hipError_t a_3darray(void **h, unsigned long long n) { hipExtent e = {256, 1024, n / MIB}; return hipMalloc3DArray((hipArray **)h, &float_desc, e, 0); }
static hipError_t a_arraycreate(void **h, unsigned long long n)
{
	HIP_ARRAY_DESCRIPTOR d = {1024, n / 4096, HIP_AD_FORMAT_FLOAT, 1};
	return hipArrayCreate((hipArray **)h, &d);
}
static hipError_t a_array3dcreate(void **h, unsigned long long n)
{
	HIP_ARRAY3D_DESCRIPTOR d = {256, 1024, n / MIB, HIP_AD_FORMAT_UNSIGNED_INT8, 4, 0};
	return hipArray3DCreate((hipArray **)h, &d);
}
/* At most n bytes as a 2-level mipmap of 1-byte texels: a W x 2048 base and a (W/2) x 1024 level */
static hipError_t a_mipmapped(void **h, unsigned long long n)
{
	hipChannelFormatDesc byte_desc = {8, 0, 0, 0, hipChannelFormatKindUnsigned};
	hipExtent e = {n * 4 / 5 / 2048, 2048, 0};
	return hipMallocMipmappedArray((hipMipmappedArray_t *)h, &byte_desc, e, 2, 0);
}
static hipError_t a_mipmapcreate(void **h, unsigned long long n)
{
	HIP_ARRAY3D_DESCRIPTOR d = {n * 4 / 5 / 2048, 2048, 0, HIP_AD_FORMAT_UNSIGNED_INT8, 1, 0};
	return hipMipmappedArrayCreate((hipMipmappedArray_t *)h, &d, 2);
}
static hipError_t a_memcreate(void **h, unsigned long long n)
{
	hipMemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = hipMemAllocationTypePinned;
	prop.location.type = hipMemLocationTypeDevice;
	prop.location.id = 0;
	return hipMemCreate((hipMemGenericAllocationHandle_t *)h, n, &prop, 0);
}
static hipError_t f_free(void *h) { return hipFree(h); }
static hipError_t f_async(void *h) { return hipFreeAsync(h, NULL); }
static hipError_t f_array(void *h) { return hipFreeArray(h); }
static hipError_t f_release(void *h) { return hipMemRelease(h); }
static hipError_t f_mipmap(void *h) { return hipFreeMipmappedArray(h); }
static hipError_t f_mipmapdestroy(void *h) { return hipMipmappedArrayDestroy(h); }

static const struct entry entries[] = {
	{"hipMalloc", a_malloc, f_free}, {"hipExtMallocWithFlags", a_ext, f_free},
	{"hipMallocManaged", a_managed, f_free}, {"hipMallocAsync", a_async, f_async},
	{"hipMallocFromPoolAsync", a_pool, f_async}, {"hipMallocPitch", a_pitch, f_free},
	{"hipMemAllocPitch", a_mempitch, f_free}, {"hipMalloc3D", a_3d, f_free},
	{"hipMallocArray", a_array, f_array}, {"hipMalloc3DArray", a_3darray, f_array},
	{"hipArrayCreate", a_arraycreate, f_array}, {"hipArray3DCreate", a_array3dcreate, f_array},
	{"hipMallocMipmappedArray", a_mipmapped, f_mipmap}, {"hipMipmappedArrayCreate", a_mipmapcreate, f_mipmapdestroy},
	{"hipMemCreate", a_memcreate, f_release},
};

/* At the limit (must succeed), one MiB more while holding it (must fail), then free. */
static void probe_entry(const struct entry *e, unsigned long long limit)
{
	void *held = NULL, *more = NULL;
	hipError_t at = e->alloc(&held, limit);
	hipError_t past = e->alloc(&more, MIB);
	size_t f = 0, t = 0;
	hipMemGetInfo(&f, &t);
	hipError_t freed = at == hipSuccess ? e->release(held) : hipErrorInvalidValue;
	if (past == hipSuccess)
		e->release(more);
	size_t f2 = 0;
	hipMemGetInfo(&f2, &t);
	printf("\"%s\":{\"at_limit\":\"%s\",\"past_limit\":\"%s\",\"free_while_held\":%zu,\"free\":\"%s\",\"free_after\":%zu}",
	       e->name, name(at), name(past), f, name(freed), f2);
}

static void print_cu_mask(void)
{
	uint32_t all[8];
	memset(all, 0xff, sizeof all);
	hipStream_t s = NULL;
	hipError_t e = hipExtStreamCreateWithCUMask(&s, 8, all);
	printf("\"cu_mask\":{\"result\":\"%s\",\"cus\":[", name(e));
	uint32_t got[8] = {0};
	if (e == hipSuccess && hsa_amd_queue_cu_get_mask(rocshare_stub_stream_queue(s), 256, got) == HSA_STATUS_SUCCESS)
		for (int cu = 0, first = 1; cu < 256; cu++)
			if (got[cu / 32] >> (cu % 32) & 1) {
				printf("%s%d", first ? "" : ",", cu);
				first = 0;
			}
	printf("]}");
	if (s)
		hipStreamDestroy(s);
}

static int run_all(void)
{
	unsigned long long limit = limit_bytes();
	int count = 0;
	hipError_t e = hipGetDeviceCount(&count);
	printf("{\"limit\":%llu,\"deviceCount\":{\"result\":\"%s\",\"count\":%d},", limit, name(e), count);
	print_info("memGetInfo");
	hipDeviceProp_t prop;
	e = hipGetDeviceProperties(&prop, 0);
	printf(",\"totalGlobalMem\":{\"result\":\"%s\",\"bytes\":%zu}", name(e), e == hipSuccess ? prop.totalGlobalMem : 0);
	e = hipGetDevicePropertiesR0000(&prop, 0);
	printf(",\"totalGlobalMemR0000\":{\"result\":\"%s\",\"bytes\":%zu}", name(e),
	       e == hipSuccess ? prop.totalGlobalMem : 0);
	/* ROCm 6's struct is larger than its head: give the call room for all of it. */
	union { struct rocshare_device_prop_r0600_head head; char whole[4096]; } prop6;
	e = hipGetDevicePropertiesR0600(&prop6.head, 0);
	printf(",\"totalGlobalMemR0600\":{\"result\":\"%s\",\"bytes\":%zu}", name(e),
	       e == hipSuccess ? prop6.head.total_global_mem : 0);
	size_t total = 0;
	e = hipDeviceTotalMem(&total, 0);
	printf(",\"deviceTotalMem\":{\"result\":\"%s\",\"bytes\":%zu}", name(e), total);
	int attr = 0;
	e = hipDeviceGetAttribute(&attr, hipDeviceAttributeTotalGlobalMem, 0);
	printf(",\"attributeTotalGlobalMem\":{\"result\":\"%s\",\"value\":%d}", name(e), attr);
	hipMemPoolProps props;
	memset(&props, 0, sizeof props);
	props.allocType = hipMemAllocationTypePinned;
	props.location.type = hipMemLocationTypeDevice;
	hipMemPoolCreate(&pool_g, &props);
	for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
		printf(",");
		probe_entry(&entries[i], limit);
	}
	hipMemPoolDestroy(pool_g);
	void *host = NULL;
	e = hipHostMalloc(&host, 2 * limit, 0);
	printf(",\"hipHostMalloc_twice_limit\":\"%s\"", name(e));
	hipHostFree(host);
	printf(",\"hipFree_bogus\":\"%s\"", name(hipFree((void *)0x1234)));
	printf(",\"hipSetDevice_99\":\"%s\",", name(hipSetDevice(99)));
	print_cu_mask();
	printf("}\n");
	return 0;
}

static int run_alloc(unsigned long long bytes)
{
	void *p = NULL;
	hipError_t e = hipMalloc(&p, bytes);
	printf("{\"result\":\"%s\",\"pid\":%d}\n", name(e), (int)getpid());
	fflush(stdout);
	char c;
	while (read(0, &c, 1) > 0) /* hold until the test closes stdin (or kills us) */
		;
	if (e == hipSuccess)
		hipFree(p);
	return 0;
}

static int run_hold(unsigned long long bytes)
{
	void *p = NULL;
	hipError_t e = hipMalloc(&p, bytes);
	printf("{\"result\":\"%s\",\"pid\":%d}\n", name(e), (int)getpid());
	fflush(stdout);
	for (;;)
		pause(); /* held until killed */
	return 0;
}

/* One line per request: "<bytes>" allocates, "free" frees the newest allocation still held. Each
 * answer says what the runtime answered, its memory info, what this process holds by its own count
 * and its pid, so a test can show the same process before and after its limit changed. */
static int run_serve(void)
{
	char line[64];
	void *held[256];
	unsigned long long sizes[256], total_held = 0;
	int count = 0;
	while (fgets(line, sizeof line, stdin)) {
		hipError_t e;
		const char *op = strncmp(line, "free", 4) ? "alloc" : "free";
		if (*op == 'f') {
			e = count ? hipFree(held[count - 1]) : hipErrorInvalidValue;
			if (e == hipSuccess)
				total_held -= sizes[--count];
		} else {
			void *p = NULL;
			unsigned long long bytes = strtoull(line, NULL, 10);
			e = count < 256 ? hipMalloc(&p, bytes) : hipErrorInvalidValue;
			if (e == hipSuccess) {
				held[count] = p;
				sizes[count++] = bytes;
				total_held += bytes;
			}
		}
		size_t f = 0, t = 0;
		hipMemGetInfo(&f, &t);
		printf("{\"op\":\"%s\",\"result\":\"%s\",\"free\":%zu,\"total\":%zu,\"held\":%llu,\"pid\":%d}\n",
		       op, name(e), f, t, total_held, (int)getpid());
		fflush(stdout);
	}
	return 0; /* held memory goes with the process */
}

static int run_fork(unsigned long long bytes)
{
	void *p = NULL;
	hipError_t parent = hipMalloc(&p, bytes);
	fflush(stdout);
	pid_t child = fork();
	if (child == 0) {
		void *q = NULL;
		hipError_t e = hipMalloc(&q, bytes);
		size_t f = 0, t = 0;
		hipMemGetInfo(&f, &t);
		printf("{\"parent\":\"%s\",\"child\":\"%s\",\"child_free\":%zu,", name(parent), name(e), f);
		/* the parent's pointer is not the child's to free: the hook must not give its bytes back */
		printf("\"child_free_parent_ptr\":\"%s\",", name(hipFree(p)));
		fflush(stdout);
		_exit(e == hipSuccess ? (hipFree(q), 0) : 0);
	}
	int status;
	waitpid(child, &status, 0);
	size_t f = 0, t = 0;
	hipMemGetInfo(&f, &t);
	printf("\"parent_free_after_child\":%zu}\n", f);
	return 0;
}

static void print_masks(const char *result, hipStream_t *streams, int n)
{
	printf("{\"result\":\"%s\",\"masks\":[", result);
	for (int i = 0; i < n; i++) {
		uint32_t got[8] = {0};
		printf("%s[", i ? "," : "");
		if (hsa_amd_queue_cu_get_mask(rocshare_stub_stream_queue(streams[i]), 256, got) == HSA_STATUS_SUCCESS)
			for (int cu = 0, first = 1; cu < 256; cu++)
				if (got[cu / 32] >> (cu % 32) & 1) {
					printf("%s%d", first ? "" : ",", cu);
					first = 0;
				}
		printf("]");
	}
	printf("]}\n");
	fflush(stdout);
}

static void kernel(void) {}
static int cmp(const void *a, const void *b);

static int run_queues(void)
{
	hipStream_t streams[16];
	int n = 0;
	char line[64];
	while (fgets(line, sizeof line, stdin)) {
		const char *result = "unknown command";
		if (!strncmp(line, "new", 3)) {
			hipError_t e = n < 16 ? hipStreamCreate(&streams[n]) : hipErrorInvalidValue;
			n += e == hipSuccess;
			result = name(e);
		} else if (!strncmp(line, "all ", 4) && atoi(line + 4) >= 0 && atoi(line + 4) < n) {
			uint32_t all[8];
			memset(all, 0xff, sizeof all);
			hsa_status_t st = hsa_amd_queue_cu_set_mask(rocshare_stub_stream_queue(streams[atoi(line + 4)]), 256, all);
			result = st == HSA_STATUS_SUCCESS ? "HSA_STATUS_SUCCESS" : (int)st == HSA_STATUS_CU_MASK_REDUCED ? "HSA_STATUS_CU_MASK_REDUCED" : "HSA_STATUS_ERROR";
		} else if (!strncmp(line, "launch", 6)) {
			dim3 one = {1, 1, 1};
			result = name(hipLaunchKernel((const void *)kernel, one, one, NULL, 0, n ? streams[0] : NULL));
		} else if (!strncmp(line, "alloc ", 6)) {
			void *p = NULL;
			result = name(hipMalloc(&p, strtoull(line + 6, NULL, 10)));
		} else if (!strncmp(line, "masks", 5)) {
			result = "hipSuccess";
		}
		print_masks(result, streams, n);
	}
	return 0;
}

static int run_bench_launch(int n)
{
	long long *ns = malloc(sizeof *ns * (size_t)n);
	dim3 one = {1, 1, 1};
	if (!ns)
		return 1;
	for (int i = 0; i < n; i++) /* warm-up, untimed */
		hipLaunchKernel((const void *)kernel, one, one, NULL, 0, NULL);
	for (int i = 0; i < n; i++) {
		struct timespec a, b;
		clock_gettime(CLOCK_MONOTONIC, &a);
		hipError_t e = hipLaunchKernel((const void *)kernel, one, one, NULL, 0, NULL);
		clock_gettime(CLOCK_MONOTONIC, &b);
		if (e != hipSuccess)
			return 1;
		ns[i] = (b.tv_sec - a.tv_sec) * 1000000000ll + (b.tv_nsec - a.tv_nsec);
	}
	qsort(ns, (size_t)n, sizeof *ns, cmp);
	printf("{\"launches\":%d,\"p50_ns\":%lld,\"p99_ns\":%lld}\n", n, ns[n / 2], ns[n * 99 / 100]);
	free(ns);
	return 0;
}

static int cmp(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return (x > y) - (x < y);
}

static int run_bench(int pairs)
{
	long long *ns = malloc(sizeof *ns * (size_t)pairs);
	if (!ns)
		return 1;
	for (int i = 0; i < pairs; i++) { /* warm-up, untimed: first-touch page faults of both tables */
		void *p;
		if (hipMalloc(&p, 4096) == hipSuccess)
			hipFree(p);
	}
	for (int i = 0; i < pairs; i++) {
		struct timespec a, b;
		void *p;
		clock_gettime(CLOCK_MONOTONIC, &a);
		hipError_t e = hipMalloc(&p, 4096);
		hipFree(p);
		clock_gettime(CLOCK_MONOTONIC, &b);
		if (e != hipSuccess)
			return 1;
		ns[i] = (b.tv_sec - a.tv_sec) * 1000000000ll + (b.tv_nsec - a.tv_nsec);
	}
	qsort(ns, (size_t)pairs, sizeof *ns, cmp);
	printf("{\"pairs\":%d,\"p50_ns\":%lld,\"p99_ns\":%lld}\n", pairs, ns[pairs / 2], ns[pairs * 99 / 100]);
	free(ns);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "alloc"))
		return run_alloc(strtoull(argv[2], NULL, 10));
	if (argc >= 3 && !strcmp(argv[1], "fork"))
		return run_fork(strtoull(argv[2], NULL, 10));
	if (argc >= 3 && !strcmp(argv[1], "hold"))
		return run_hold(strtoull(argv[2], NULL, 10));
	if (argc >= 2 && !strcmp(argv[1], "serve"))
		return run_serve();
	if (argc >= 3 && !strcmp(argv[1], "bench"))
		return run_bench(atoi(argv[2]));
	if (argc >= 3 && !strcmp(argv[1], "bench-launch"))
		return run_bench_launch(atoi(argv[2]));
	if (argc >= 2 && !strcmp(argv[1], "queues"))
		return run_queues();
	if (argc >= 2 && !strcmp(argv[1], "info")) {
		printf("{");
		print_info("memGetInfo");
		printf("}\n");
		return 0;
	}
	return run_all();
}
