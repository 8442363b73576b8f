/* Stub ROCr (libhsa-runtime64.so.1): GPU agents and queues whose CU masks a test can read back.
 * Built from the real hsa.h/hsa_ext_amd.h so the prototypes are the runtime's. GPUs: $ROCM_STUB_DEVICES
 * (default 1) of $ROCM_STUB_CUS CUs (default 104). Agent handles: CPU 0x1000, GPU i 0x2000+i.
 *
 * $ROCM_STUB_ROCR_MASKING=1: the CU masks follow ROCr's own rule (ROCR-Runtime Flag::parse_masks,
 * AqlQueue::SetCUMasking): HSA_CU_MASK ("<gpu>:<cu>[-<cu>],...[;...]", the decimal form) is read
 * with getenv once, at the first call (ROCr: when the runtime loads); a new queue gets its GPU's mask
 * (not under HSA_CU_MASK_SKIP_INIT=1: ROCr's AqlQueue constructor then skips it);
 * every hsa_amd_queue_cu_set_mask is ANDed with it, answering HSA_STATUS_CU_MASK_REDUCED when that
 * dropped bits. Without it, a mask is stored as given (what a runtime that trusts its caller does). */
#include <stdlib.h>
#include <string.h>

#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

#define EXPORT __attribute__((visibility("default")))
#define MASK_WORDS 8

struct stub_queue {
	hsa_queue_t queue; /* first: the hsa_queue_t* handed out points here */
	uint64_t agent;
	uint32_t mask_bits;
	uint32_t mask[MASK_WORDS];
};

static int env_int(const char *name, int fallback)
{
	const char *v = getenv(name);
	return v && *v ? atoi(v) : fallback;
}

EXPORT int rocshare_stub_gpu_count(void) { return env_int("ROCM_STUB_DEVICES", 1); }
EXPORT int rocshare_stub_cu_count(void) { return env_int("ROCM_STUB_CUS", 104); }

#define STUB_GPUS 16
static struct {
	int state; /* 0 unread, 1 reading, 2 read */
	int set[STUB_GPUS];
	uint32_t mask[STUB_GPUS][MASK_WORDS];
} global_g;

/* HSA_CU_MASK as ROCr reads it, in its decimal form; a set with a syntax error ends the parse. */
static void parse_global_masks(const char *s)
{
	while (s && *s) {
		char *end;
		long gpu = strtol(s, &end, 10);
		if (end == s || *end != ':' || gpu < 0 || gpu >= STUB_GPUS)
			return;
		uint32_t mask[MASK_WORDS] = {0};
		s = end;
		do {
			long low = strtol(s + 1, &end, 10), high = low;
			if (end == s + 1 || low < 0)
				return;
			s = end;
			if (*s == '-') {
				high = strtol(s + 1, &end, 10);
				if (end == s + 1)
					return;
				s = end;
			}
			for (long cu = low; cu <= high && cu < 32 * MASK_WORDS; cu++)
				mask[cu / 32] |= 1u << (cu % 32);
		} while (*s == ',');
		memcpy(global_g.mask[gpu], mask, sizeof mask);
		global_g.set[gpu] = 1;
		if (*s == ';')
			s++;
		else if (*s)
			return;
	}
}

/* The GPU's global mask (NULL: none), read once at the first call that needs it. */
static const uint32_t *global_mask(int gpu)
{
	const char *on = getenv("ROCM_STUB_ROCR_MASKING");
	if (!on || strcmp(on, "1") || gpu < 0 || gpu >= STUB_GPUS)
		return NULL;
	int st = 0;
	if (__atomic_compare_exchange_n(&global_g.state, &st, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		parse_global_masks(getenv("HSA_CU_MASK"));
		__atomic_store_n(&global_g.state, 2, __ATOMIC_RELEASE);
	}
	while (__atomic_load_n(&global_g.state, __ATOMIC_ACQUIRE) != 2)
		;
	return global_g.set[gpu] ? global_g.mask[gpu] : NULL;
}

EXPORT hsa_status_t hsa_init(void) { global_mask(0); return HSA_STATUS_SUCCESS; }
EXPORT hsa_status_t hsa_shut_down(void) { return HSA_STATUS_SUCCESS; }

EXPORT hsa_status_t hsa_iterate_agents(hsa_status_t (*callback)(hsa_agent_t, void *), void *data)
{
	hsa_agent_t cpu = {0x1000};
	hsa_status_t st = callback(cpu, data);
	for (int i = 0; st == HSA_STATUS_SUCCESS && i < rocshare_stub_gpu_count(); i++) {
		hsa_agent_t gpu = {0x2000 + (uint64_t)i};
		st = callback(gpu, data);
	}
	return st == HSA_STATUS_INFO_BREAK ? HSA_STATUS_SUCCESS : st;
}

EXPORT hsa_status_t hsa_agent_get_info(hsa_agent_t agent, hsa_agent_info_t attribute, void *value)
{
	int gpu = agent.handle >= 0x2000 && agent.handle < 0x2000 + (uint64_t)rocshare_stub_gpu_count();
	if (!gpu && agent.handle != 0x1000)
		return HSA_STATUS_ERROR_INVALID_AGENT;
	if (attribute == HSA_AGENT_INFO_DEVICE) {
		*(hsa_device_type_t *)value = gpu ? HSA_DEVICE_TYPE_GPU : HSA_DEVICE_TYPE_CPU;
		return HSA_STATUS_SUCCESS;
	}
	if ((int)attribute == HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT) {
		*(uint32_t *)value = gpu ? (uint32_t)rocshare_stub_cu_count() : 1;
		return HSA_STATUS_SUCCESS;
	}
	return HSA_STATUS_ERROR_INVALID_ARGUMENT;
}

EXPORT hsa_status_t hsa_queue_create(hsa_agent_t agent, uint32_t size, hsa_queue_type32_t type,
				     void (*callback)(hsa_status_t, hsa_queue_t *, void *), void *data,
				     uint32_t private_segment_size, uint32_t group_segment_size, hsa_queue_t **queue)
{
	(void)type, (void)callback, (void)data, (void)private_segment_size, (void)group_segment_size;
	hsa_device_type_t t;
	if (!queue || hsa_agent_get_info(agent, HSA_AGENT_INFO_DEVICE, &t) != HSA_STATUS_SUCCESS || t != HSA_DEVICE_TYPE_GPU)
		return HSA_STATUS_ERROR_INVALID_AGENT;
	struct stub_queue *q = calloc(1, sizeof *q);
	if (!q)
		return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
	q->queue.size = size;
	q->agent = agent.handle;
	int cus = rocshare_stub_cu_count(); /* a new queue may use every CU, or its GPU's global mask */
	const uint32_t *global = global_mask((int)(agent.handle - 0x2000));
	const char *skip = getenv("HSA_CU_MASK_SKIP_INIT");
	if (skip && !strcmp(skip, "1"))
		global = NULL; /* ROCr's AqlQueue then skips SetCUMasking(0, nullptr) at creation */
	for (int cu = 0; cu < cus && cu < 32 * MASK_WORDS; cu++)
		q->mask[cu / 32] |= (global ? global[cu / 32] : ~0u) & 1u << (cu % 32);
	q->mask_bits = (uint32_t)((cus + 31) / 32 * 32);
	*queue = &q->queue;
	return HSA_STATUS_SUCCESS;
}

EXPORT hsa_status_t hsa_queue_destroy(hsa_queue_t *queue)
{
	if (!queue)
		return HSA_STATUS_ERROR_INVALID_QUEUE;
	free(queue);
	return HSA_STATUS_SUCCESS;
}

/* As ROCr: the mask is stored as given (this stub does not apply HSA_CU_MASK itself, so a test sees
 * what a runtime that trusts its caller would hand the driver). */
EXPORT hsa_status_t hsa_amd_queue_cu_set_mask(const hsa_queue_t *queue, uint32_t num_cu_mask_count, const uint32_t *cu_mask)
{
	if (!queue)
		return HSA_STATUS_ERROR_INVALID_QUEUE;
	if (num_cu_mask_count % 32 || (num_cu_mask_count && !cu_mask))
		return HSA_STATUS_ERROR_INVALID_ARGUMENT;
	struct stub_queue *q = (struct stub_queue *)queue;
	const uint32_t *global = global_mask((int)(q->agent - 0x2000));
	int reduced = 0;
	memset(q->mask, 0, sizeof q->mask);
	uint32_t words = num_cu_mask_count / 32;
	for (uint32_t w = 0; w < words; w++) {
		uint32_t keep = num_cu_mask_count ? cu_mask[w] : ~0u;
		keep &= global && w < MASK_WORDS ? global[w] : (w < MASK_WORDS ? ~0u : 0);
		reduced |= global && keep != cu_mask[w];
		if (w < MASK_WORDS)
			q->mask[w] = keep;
	}
	if (!num_cu_mask_count) /* 0: all CUs (ROCr's reset), within the global mask */
		for (int cu = 0; cu < rocshare_stub_cu_count() && cu < 32 * MASK_WORDS; cu++)
			q->mask[cu / 32] |= (global ? global[cu / 32] : ~0u) & 1u << (cu % 32);
	q->mask_bits = num_cu_mask_count;
	return reduced ? (hsa_status_t)HSA_STATUS_CU_MASK_REDUCED : HSA_STATUS_SUCCESS;
}

EXPORT hsa_status_t hsa_amd_queue_cu_get_mask(const hsa_queue_t *queue, uint32_t num_cu_mask_count, uint32_t *cu_mask)
{
	if (!queue)
		return HSA_STATUS_ERROR_INVALID_QUEUE;
	if (!num_cu_mask_count || num_cu_mask_count % 32 || !cu_mask)
		return HSA_STATUS_ERROR_INVALID_ARGUMENT;
	const struct stub_queue *q = (const struct stub_queue *)queue;
	for (uint32_t w = 0; w < num_cu_mask_count / 32; w++)
		cu_mask[w] = w < MASK_WORDS ? q->mask[w] : 0;
	return HSA_STATUS_SUCCESS;
}
