/* The hook's logic under the sanitizers: hook.c and account.c linked into this program, bound to
 * the stub runtime through the hook's own la_objopen/la_symbind64 (as ld.so would call them), then
 * driven through the wrappers it hands back. An audit library cannot be sanitized in its own link
 * namespace, so this is where ASan and UBSan see the hook's code; test/run.sh runs it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hip/hip_runtime_api.h>
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

#include "../src/hook.h"

unsigned int la_version(unsigned int version);
unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie);
uintptr_t la_symbind64(ElfW(Sym) *sym, unsigned int ndx, uintptr_t *refcook, uintptr_t *defcook, unsigned int *flags,
		       const char *symname);
hsa_queue_t *rocshare_stub_stream_queue(hipStream_t stream);

#define MIB (1ull << 20)
static int failures_g;
#define CHECK(cond)                                                              \
	do {                                                                         \
		if (!(cond)) {                                                           \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);      \
			failures_g++;                                                        \
		}                                                                        \
	} while (0)

static struct link_map *hip_g, *hsa_g, *self_g;

static struct link_map *map_of(const char *soname)
{
	void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
	struct link_map *m = NULL;
	if (!h || dlinfo(h, RTLD_DI_LINKMAP, &m) != 0) {
		fprintf(stderr, "cannot find %s\n", soname);
		exit(2);
	}
	return m;
}

/* What ld.so does for a call from this program to a runtime function: ask the hook. */
static void *bind(struct link_map *def, const char *name)
{
	void *h = dlopen(def->l_name, RTLD_NOW | RTLD_NOLOAD);
	ElfW(Sym) sym;
	memset(&sym, 0, sizeof sym);
	sym.st_value = (uintptr_t)dlsym(h, name);
	uintptr_t ref = (uintptr_t)self_g, defc = (uintptr_t)def;
	unsigned int flags = 0;
	return (void *)la_symbind64(&sym, 0, &ref, &defc, &flags, name);
}
#define BIND(def, fn) ((__typeof__(&fn))bind(def, #fn))

static void test_binding(void)
{
	void *h = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_NOLOAD);
	CHECK(bind(hip_g, "hipGetDeviceCount") == dlsym(h, "hipGetDeviceCount")); /* not ours: untouched */
	CHECK(bind(hip_g, "hipMalloc") != dlsym(h, "hipMalloc"));
}

static void test_boundary(void)
{
	__typeof__(&hipMalloc) m = BIND(hip_g, hipMalloc);
	__typeof__(&hipFree) f = BIND(hip_g, hipFree);
	void *a = NULL, *b = NULL;
	CHECK(m(&a, 64 * MIB) == hipSuccess);
	CHECK(m(&b, 1) == hipErrorOutOfMemory);
	CHECK(account_used(0) == 64 * MIB);
	CHECK(f(a) == hipSuccess);
	CHECK(account_used(0) == 0);
	CHECK(m(&b, 64 * MIB + 1) == hipErrorOutOfMemory);
	CHECK(f((void *)0x1234) == hipErrorInvalidValue); /* the runtime's own error comes through */
	CHECK(m(&b, 0) == hipSuccess && b == NULL);
	size_t free_bytes = 0, total = 0;
	CHECK(BIND(hip_g, hipMemGetInfo)(&free_bytes, &total) == hipSuccess);
	CHECK(total == 64 * MIB && free_bytes == 64 * MIB);
}

static void test_unlimited_device(void)
{
	__typeof__(&hipMalloc) m = BIND(hip_g, hipMalloc);
	void *p = NULL;
	hipSetDevice(1); /* no HIP_DEVICE_MEMORY_LIMIT_1: passed through, the stub's 16 GiB apply */
	CHECK(m(&p, 8192 * MIB) == hipSuccess);
	CHECK(BIND(hip_g, hipFree)(p) == hipSuccess);
	hipSetDevice(0);
}

static void test_pitched_and_vmm(void)
{
	size_t pitch = 0;
	void *p = NULL;
	/* width 1000 pads to a 1024-byte pitch: 1000*65536 fits in 64 MiB, the padded size does not */
	CHECK(BIND(hip_g, hipMallocPitch)(&p, &pitch, 1000, 65536 + 1) == hipErrorOutOfMemory);
	CHECK(account_used(0) == 0);
	CHECK(BIND(hip_g, hipMallocPitch)(&p, &pitch, 1000, 65536) == hipSuccess && pitch == 1024);
	CHECK(account_used(0) == 64 * MIB);
	CHECK(BIND(hip_g, hipFree)(p) == hipSuccess);
	hipMemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.location.type = hipMemLocationTypeDevice;
	hipMemGenericAllocationHandle_t h1, h2;
	CHECK(BIND(hip_g, hipMemCreate)(&h1, 48 * MIB, &prop, 0) == hipSuccess);
	CHECK(BIND(hip_g, hipMemCreate)(&h2, 32 * MIB, &prop, 0) == hipErrorOutOfMemory);
	CHECK(BIND(hip_g, hipMemRelease)(h1) == hipSuccess);
	CHECK(account_used(0) == 0);
}

static void *churn(void *arg)
{
	__typeof__(&hipMalloc) m = arg;
	__typeof__(&hipFree) f = BIND(hip_g, hipFree);
	for (int i = 0; i < 2000; i++) {
		void *p = NULL;
		if (m(&p, 8 * MIB) == hipSuccess)
			f(p);
	}
	return NULL;
}

static void test_threads(void)
{
	pthread_t t[8];
	void *m = BIND(hip_g, hipMalloc);
	for (int i = 0; i < 8; i++)
		pthread_create(&t[i], NULL, churn, m);
	for (int i = 0; i < 8; i++)
		pthread_join(t[i], NULL);
	CHECK(account_used(0) == 0); /* every free gave back exactly what was counted */
}

static void test_fork(void)
{
	__typeof__(&hipMalloc) m = BIND(hip_g, hipMalloc);
	void *p = NULL;
	CHECK(m(&p, 40 * MIB) == hipSuccess);
	pid_t child = fork();
	if (child == 0) {
		void *q = NULL;
		int ok = m(&q, 40 * MIB) == hipErrorOutOfMemory && m(&q, 24 * MIB) == hipSuccess &&
			 account_used(0) == 64 * MIB;
		_exit(ok ? 0 : 1); /* exits holding 24 MiB: the parent must get it back */
	}
	int status = 0;
	waitpid(child, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	size_t free_bytes = 0, total = 0;
	BIND(hip_g, hipMemGetInfo)(&free_bytes, &total); /* reclaims the dead child's slot */
	CHECK(free_bytes == 24 * MIB);
	CHECK(BIND(hip_g, hipFree)(p) == hipSuccess);
	CHECK(account_used(0) == 0);
}

static void test_cu_mask(void)
{
	__typeof__(&hsa_queue_create) create = BIND(hsa_g, hsa_queue_create);
	__typeof__(&hsa_amd_queue_cu_set_mask) set = BIND(hsa_g, hsa_amd_queue_cu_set_mask);
	hsa_agent_t gpu0 = {0x2000};
	hsa_queue_t *q = NULL;
	CHECK(create(gpu0, 4096, HSA_QUEUE_TYPE_MULTI, NULL, NULL, 0, 0, &q) == HSA_STATUS_SUCCESS);
	uint32_t want[4] = {~0u, ~0u, ~0u, ~0u}, got[4] = {0};
	CHECK(set(q, 128, want) == HSA_STATUS_SUCCESS);
	hsa_amd_queue_cu_get_mask(q, 128, got);
	CHECK(got[0] == 0xffff0000u && got[1] == 0x0000000fu && got[2] == 0 && got[3] == 0); /* HSA_CU_MASK 0:16-35 */
	uint32_t outside[1] = {0x0000ffffu};
	CHECK(set(q, 32, outside) == HSA_STATUS_ERROR_INVALID_ARGUMENT);
	CHECK(set(q, 33, want) == HSA_STATUS_ERROR_INVALID_ARGUMENT); /* the runtime's own check */
	BIND(hsa_g, hsa_queue_destroy)(q);
	/* a queue on the second GPU gets that GPU's slice (HSA_CU_MASK 1:40-47), not the first's */
	hsa_agent_t gpu1 = {0x2001};
	CHECK(create(gpu1, 4096, HSA_QUEUE_TYPE_MULTI, NULL, NULL, 0, 0, &q) == HSA_STATUS_SUCCESS);
	CHECK(set(q, 128, want) == HSA_STATUS_SUCCESS);
	memset(got, 0, sizeof got);
	hsa_amd_queue_cu_get_mask(q, 128, got);
	CHECK(got[0] == 0 && got[1] == 0x0000ff00u && got[2] == 0 && got[3] == 0);
	BIND(hsa_g, hsa_queue_destroy)(q);
}

/* The hook's own parsers (parse.c) answer as libc's strtol/strtoull in base 10 would, value and
 * end alike, except that parse_u64 takes no '-' (strtoull negates: "-1" is 2^64-1). */
static void test_parse(void)
{
	static const char *const inputs[] = {
		"0", "4096m", "  12 ", "+7", "", "m", "-", "+", "18446744073709551615", "18446744073709551616",
		"99999999999999999999999k", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
		"-9223372036854775809", "0:16-35;1:40-47", "-3:1", "007x",
	};
	for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++) {
		const char *s = inputs[i], *end;
		char *libc_end;
		long l = parse_long(s, &end);
		CHECK(l == strtol(s, &libc_end, 10) && end == libc_end);
		if (strchr(s, '-') == NULL) {
			uint64_t u = parse_u64(s, &end);
			CHECK(u == strtoull(s, &libc_end, 10) && end == libc_end);
		}
	}
	const char *end;
	CHECK(parse_u64("-1", &end) == 0 && *end == '-');
	CHECK(parse_u64(" 5", NULL) == 5);
}

int main(void)
{
	char dir[] = "/tmp/rocshare-hook-test-XXXXXX";
	if (!mkdtemp(dir))
		return 2;
	setenv("ROCSHARE_HOOK_DIR", dir, 1);
	setenv("HIP_DEVICE_MEMORY_LIMIT_0", "64m", 1);
	setenv("HSA_CU_MASK", "0:16-35;1:40-47", 1);
	setenv("ROCSHARE_STUB_DEVICES", "2", 1);
	la_version(LAV_CURRENT);
	hip_g = map_of("libamdhip64.so.5");
	hsa_g = map_of("libhsa-runtime64.so.1");
	self_g = map_of(NULL);
	uintptr_t cookie = 0;
	la_objopen(hip_g, LM_ID_BASE, &cookie);
	la_objopen(hsa_g, LM_ID_BASE, &cookie);
	test_parse();
	test_binding();
	test_boundary();
	test_unlimited_device();
	test_pitched_and_vmm();
	test_threads();
	test_fork();
	test_cu_mask();
	printf("%s: %d failures\n", failures_g ? "FAIL" : "ok", failures_g);
	return failures_g != 0;
}
