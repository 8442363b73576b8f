/* rocshare's in-container memory hook: an rtld-audit(7) library (LD_AUDIT) that keeps a container's
 * HIP device memory within HIP_DEVICE_MEMORY_LIMIT_<i> and its queues within HSA_CU_MASK.
 *
 * How: la_objopen marks the HIP runtime (libamdhip64.so.*) and ROCr (libhsa-runtime64.so.*) as
 * binding targets; la_symbind64 hands every other object our wrapper instead of the runtime's
 * allocation, free, memory-info and queue-mask functions, and the runtime's own address for
 * everything else. The runtime's calls into itself are never wrapped (no double counting); its
 * calls into ROCr's queue functions are (that is how hipExtStreamCreateWithCUMask gets narrowed).
 *
 * Invariants:
 * - Configuration is read once from the environment at la_version (the process cannot widen it
 *   by changing its own environment later) and is read-only afterwards.
 *   One exception: with $ROCSHARE_SLICE_DIR (the agent's read-only slice folder) the limited
 *   GPUs' values and the masked GPUs' CU masks come from its limits file, checked on every
 *   allocation (limits.c), so a resize applies without a restart; the set of limited and masked
 *   GPUs stays the environment's. At la_version the file's mask replaces HSA_CU_MASK in the initial
 *   environment, for ROCr to load with (start_slice_masks).
 * - Per-process state (pid, account slot, pointer table, queues) lives in MADV_WIPEONFORK memory, so a
 *   fork()ed child starts clean and claims its own slot (pthread_atfork would not run: the audit
 *   library has its own libc copy, and fork() runs only the application's handlers).
 * - Every memory wrapper is re-entrant and lock-free; the queue-mask calls (queue creation and
 *   destruction, set_mask, a resize's re-masking: rare) are serialized by one lock. Errors are the
 *   runtime's own codes; a device with no limit is passed through untouched.
 * - A limited allocation without an account slot (every slot held, or the account file unusable)
 *   is refused, never counted privately; every refusal, and the hook disabling itself, prints one
 *   line on stderr and leaves the same text in the account (say()).
 * - An allocation is charged to the GPU it lands on (the stream's, the pool's, prop.location's),
 *   and given back once: one free path (uncounted()); a VMM handle when released AND unmapped.
 * - We never dlopen the runtime (the audit namespace must not load a second copy): functions we
 *   call ourselves are found in the runtime's own dynamic symbol table.
 */
#define _GNU_SOURCE
#include "hip6.h"
#include "hook.h"

#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <link.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <hip/hip_runtime_api.h>
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT const char rocshare_hook_version[] = "rocshare-hook " HOOK_VERSION;

/* ---- configuration (environment, read once) ---- */

struct config {
	uint64_t limit_bytes[HOOK_MAX_DEVICES]; /* 0: no limit on that device */
	int any_limit;
	int oversubscribe;                       /* HIP_OVERSUBSCRIBE=true */
	int cu_mask_set[HOOK_MAX_DEVICES];
	uint32_t cu_mask[HOOK_MAX_DEVICES][CU_MASK_WORDS];
	int any_cu_mask;
	const char *account_dir;
};
static struct config config_g;

/* "4096m" MiB, "4g" GiB, "512k" KiB, digits only: bytes. 0 when malformed. */
static uint64_t parse_size_bytes(const char *s)
{
	const char *end;
	uint64_t v = parse_u64(s, &end);
	if (end == s)
		return 0;
	switch (*end) {
	case 'k': case 'K': return v << 10;
	case 'm': case 'M': return v << 20;
	case 'g': case 'G': return v << 30;
	case 0: return v;
	default: return 0;
	}
}

/* HSA_CU_MASK="<i>:<a>-<b>,<c>[;<j>:...]", the form ROCr reads. */
static void parse_cu_masks(const char *s)
{
	while (s && *s) {
		const char *end;
		long dev = parse_long(s, &end);
		if (end == s || *end != ':')
			return;
		s = end + 1;
		int usable = dev >= 0 && dev < HOOK_MAX_DEVICES;
		while (*s && *s != ';') {
			long lo = parse_long(s, &end), hi = lo;
			if (end == s)
				return;
			s = end;
			if (*s == '-') {
				hi = parse_long(s + 1, &end);
				s = end;
			}
			for (long cu = lo; usable && cu <= hi && cu >= 0 && cu < 32 * CU_MASK_WORDS; cu++)
				config_g.cu_mask[dev][cu / 32] |= 1u << (cu % 32);
			if (*s == ',')
				s++;
		}
		if (usable)
			config_g.cu_mask_set[dev] = config_g.any_cu_mask = 1;
		if (*s == ';')
			s++;
	}
}

static void read_config(void)
{
	for (int d = 0; d < HOOK_MAX_DEVICES; d++) {
		char name[48];
		snprintf(name, sizeof name, "HIP_DEVICE_MEMORY_LIMIT_%d", d);
		const char *v = getenv(name);
		if (v)
			config_g.limit_bytes[d] = parse_size_bytes(v);
		config_g.any_limit |= config_g.limit_bytes[d] != 0;
	}
	const char *o = getenv("HIP_OVERSUBSCRIBE");
	config_g.oversubscribe = o && (!strcmp(o, "true") || !strcmp(o, "1"));
	parse_cu_masks(getenv("HSA_CU_MASK"));
	config_g.account_dir = getenv("ROCSHARE_HOOK_DIR");
	account_use_agent_folder(getenv("ROCSHARE_ACCOUNT_DIR"));
	limits_configure(getenv("ROCSHARE_SLICE_DIR"));
}

/* ---- what the hook says when it refuses or gives up ---- */

/* One line on stderr ("rocshare-hook[pid]: ..."), and the same text as the note in the container's
 * account, so whoever inspects the container finds the last reason there. */
static void say(const char *fmt, ...)
{
	char line[256];
	int head = snprintf(line, sizeof line, "rocshare-hook[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line + head, sizeof line - (size_t)head - 1, fmt, ap);
	va_end(ap);
	account_note(line + head);
	size_t n = strlen(line);
	line[n] = '\n';
	ssize_t written = write(2, line, n + 1);
	(void)written; /* nowhere left to report a failed write */
}

/* ---- the runtime's functions ---- */

static struct link_map *hip_map_g, *hsa_map_g;

/* Address of a defined dynamic symbol of map, from its DT_GNU_HASH or DT_HASH table. */
static void *elf_lookup(struct link_map *map, const char *name)
{
	if (!map)
		return NULL;
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const uint32_t *gnu_hash = NULL, *sysv_hash = NULL;
	for (const ElfW(Dyn) *d = map->l_ld; d->d_tag != DT_NULL; d++) {
		/* glibc relocates these in place on most architectures, not on all */
		uintptr_t p = d->d_un.d_ptr < map->l_addr ? d->d_un.d_ptr + map->l_addr : d->d_un.d_ptr;
		if (d->d_tag == DT_SYMTAB) symtab = (const void *)p;
		else if (d->d_tag == DT_STRTAB) strtab = (const void *)p;
		else if (d->d_tag == DT_GNU_HASH) gnu_hash = (const void *)p;
		else if (d->d_tag == DT_HASH) sysv_hash = (const void *)p;
	}
	if (!symtab || !strtab)
		return NULL;
	if (gnu_hash) {
		uint32_t h = 5381;
		for (const unsigned char *c = (const unsigned char *)name; *c; c++)
			h = h * 33 + *c;
		uint32_t nbuckets = gnu_hash[0], symoffset = gnu_hash[1], bloom_words = gnu_hash[2];
		const uint32_t *buckets = gnu_hash + 4 + bloom_words * (sizeof(ElfW(Addr)) / 4);
		const uint32_t *chain = buckets + nbuckets;
		for (uint32_t i = buckets[h % nbuckets]; i >= symoffset; i++) {
			uint32_t ch = chain[i - symoffset];
			if ((ch | 1) == (h | 1) && symtab[i].st_shndx != SHN_UNDEF && !strcmp(strtab + symtab[i].st_name, name))
				return (void *)(map->l_addr + symtab[i].st_value);
			if (ch & 1)
				break;
		}
		return NULL;
	}
	for (uint32_t i = 0; sysv_hash && i < sysv_hash[1]; i++) /* nchain = symbol count */
		if (symtab[i].st_shndx != SHN_UNDEF && !strcmp(strtab + symtab[i].st_name, name))
			return (void *)(map->l_addr + symtab[i].st_value);
	return NULL;
}

/* One cached address per runtime function we call: the bound address when la_symbind64 saw it,
 * else looked up once. */
#define REAL(lib, fn) ((__typeof__(&fn))real_fn(&real_##fn, lib, #fn))
static void *real_fn(void **slot, struct link_map **lib, const char *name)
{
	void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (!p) {
		p = elf_lookup(*lib, name);
		__atomic_store_n(slot, p, __ATOMIC_RELEASE);
	}
	return p;
}

/* ---- per-process state: wiped on fork ---- */

enum kind { K_PTR = 1, K_ARRAY, K_MIPMAP, K_HANDLE, K_MAPPING, K_POOL };
struct entry {
	uintptr_t key; /* 0 empty, TOMBSTONE freed */
	uint64_t bytes; /* K_MAPPING: the mapped range's size */
	uint64_t link;  /* K_HANDLE: references (the handle itself + its mappings); K_MAPPING: the handle */
	int32_t device, kind;
};
#define TOMBSTONE ((uintptr_t)1)
#define TABLE_SLOTS (1u << 18)

struct process {
	int state; /* 0 new (or forked), 1 starting, 2 ready */
	int pid;
	struct slot *slot; /* NULL: no slot to be had (every one held, or the account unusable) */
	const char *no_slot_why;
};
static struct process *process_g;   /* one page, MADV_WIPEONFORK */
#define QUEUE_SLOTS 4096 /* KFD's default limit of queues per process and device */

struct queue_rec {
	uintptr_t queue; /* 0: free */
	int dev;         /* the GPU's index as HSA_CU_MASK numbers it; -1 unknown */
	int has_want;
	uint32_t want[CU_MASK_WORDS];
};
static struct entry *table_g;       /* TABLE_SLOTS entries, MADV_WIPEONFORK */
static struct queue_rec *queues_g;  /* QUEUE_SLOTS ROCr queues (their CU masks), MADV_WIPEONFORK */
static int wipe_on_fork_g = 1;      /* 0: kernel without it, compare pids instead */

static void setup_process_memory(void)
{
	process_g = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	table_g = mmap(NULL, TABLE_SLOTS * sizeof(struct entry), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	queues_g = mmap(NULL, QUEUE_SLOTS * sizeof(struct queue_rec), PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (process_g == MAP_FAILED || table_g == MAP_FAILED || queues_g == MAP_FAILED) {
		int err = errno;
		process_g = NULL; /* wrappers then pass everything through */
		queues_g = NULL;
		account_attach(config_g.account_dir, (int)getpid()); /* for the note; no slot */
		say("disabled: cannot map its per-process memory (%s): this process's GPU memory is NOT limited",
		    strerror(err));
		return;
	}
#ifdef MADV_WIPEONFORK
	if (madvise(process_g, 4096, MADV_WIPEONFORK) || madvise(table_g, TABLE_SLOTS * sizeof(struct entry), MADV_WIPEONFORK) ||
	    madvise(queues_g, QUEUE_SLOTS * sizeof(struct queue_rec), MADV_WIPEONFORK))
		wipe_on_fork_g = 0;
#else
	wipe_on_fork_g = 0;
#endif
}

static struct process *process_get(void)
{
	struct process *p = process_g;
	if (!p)
		return NULL;
	int st = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
	if (st == 2 && (wipe_on_fork_g || p->pid == getpid()))
		return p;
	if (st == 2) { /* forked child on a kernel without MADV_WIPEONFORK */
		memset(table_g, 0, TABLE_SLOTS * sizeof(struct entry));
		memset(queues_g, 0, QUEUE_SLOTS * sizeof(struct queue_rec));
		__atomic_store_n(&p->state, 0, __ATOMIC_RELEASE);
		st = 0;
	}
	if (st == 0 && __atomic_compare_exchange_n(&p->state, &st, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		p->pid = getpid();
		p->slot = account_open(config_g.account_dir, p->pid, &p->no_slot_why);
		__atomic_store_n(&p->state, 2, __ATOMIC_RELEASE);
		return p;
	}
	while (__atomic_load_n(&p->state, __ATOMIC_ACQUIRE) != 2)
		sched_yield();
	return p;
}

static size_t table_home(uintptr_t key)
{
	return (size_t)((key >> 4) * 0x9E3779B97F4A7C15ull >> 46) & (TABLE_SLOTS - 1);
}

static int table_insert_linked(uintptr_t key, uint64_t bytes, uint64_t link, int device, int kind)
{
	for (size_t n = 0, i = table_home(key); n < TABLE_SLOTS; n++, i = (i + 1) & (TABLE_SLOTS - 1)) {
		uintptr_t cur = __atomic_load_n(&table_g[i].key, __ATOMIC_ACQUIRE);
		if (cur != 0 && cur != TOMBSTONE)
			continue;
		/* claim with a marker first, so no lookup sees the key before bytes/device are set */
		if (!__atomic_compare_exchange_n(&table_g[i].key, &cur, TOMBSTONE + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			continue;
		table_g[i].bytes = bytes;
		__atomic_store_n(&table_g[i].link, link, __ATOMIC_RELAXED);
		table_g[i].device = device;
		table_g[i].kind = kind;
		__atomic_store_n(&table_g[i].key, key, __ATOMIC_RELEASE);
		return 1;
	}
	return 0;
}

static int table_insert(uintptr_t key, uint64_t bytes, int device, int kind)
{
	return table_insert_linked(key, bytes, 1, device, kind);
}

/* The live entry of key and kind, or NULL. */
static struct entry *table_entry(uintptr_t key, int kind)
{
	for (size_t n = 0, i = table_home(key); n < TABLE_SLOTS; n++, i = (i + 1) & (TABLE_SLOTS - 1)) {
		uintptr_t cur = __atomic_load_n(&table_g[i].key, __ATOMIC_ACQUIRE);
		if (cur == 0)
			return NULL;
		if (cur == key && table_g[i].kind == kind)
			return &table_g[i];
	}
	return NULL;
}

/* Remove key of that kind; 1 and its bytes/device when it was there. */
static int table_remove(uintptr_t key, int kind, uint64_t *bytes, int *device)
{
	for (size_t n = 0, i = table_home(key); n < TABLE_SLOTS; n++, i = (i + 1) & (TABLE_SLOTS - 1)) {
		uintptr_t cur = __atomic_load_n(&table_g[i].key, __ATOMIC_ACQUIRE);
		if (cur == 0)
			return 0;
		if (cur != key || table_g[i].kind != kind)
			continue;
		*bytes = table_g[i].bytes;
		*device = table_g[i].device;
		if (__atomic_compare_exchange_n(&table_g[i].key, &cur, TOMBSTONE, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			return 1;
		return 0; /* a concurrent free of the same pointer won */
	}
	return 0;
}

/* ---- accounting helpers shared by the wrappers ---- */

static void *real_hipGetDevice, *real_hipFree, *real_hipMallocManaged, *real_hsa_iterate_agents,
	*real_hsa_agent_get_info;

static int current_device(void)
{
	int dev = 0;
	__typeof__(&hipGetDevice) get = REAL(&hip_map_g, hipGetDevice);
	if (!get || get(&dev) != hipSuccess || dev < 0 || dev >= HOOK_MAX_DEVICES)
		return 0;
	return dev;
}

/* The environment's limit: which GPUs are limited at all (0: passed through), fixed at start. */
static uint64_t env_limit(int dev)
{
	return dev >= 0 && dev < HOOK_MAX_DEVICES ? config_g.limit_bytes[dev] : 0;
}

/* The limit enforced now: the slice's limits file when the agent gave one (a resize applies at
 * once), else the environment's; 0 and *why when the file is unusable (the caller refuses). */
static uint64_t enforced_limit(int dev, const char **why)
{
	return limits_current(dev, env_limit(dev), why);
}

/* The limit to report (memory info, device properties): the enforced one, or the environment's
 * while the limits file is unusable (allocations are refused meanwhile). */
static uint64_t limit_of(int dev)
{
	const char *why = NULL;
	uint64_t limit = enforced_limit(dev, &why);
	return why ? env_limit(dev) : limit;
}

/* The process's slot; one more try when it had none (a slot may have been freed since). */
static struct slot *slot_of(struct process *p)
{
	struct slot *s = __atomic_load_n(&p->slot, __ATOMIC_ACQUIRE), *none = NULL;
	if (s)
		return s;
	const char *why = NULL;
	s = account_open(config_g.account_dir, p->pid, &why);
	if (!s) {
		__atomic_store_n(&p->no_slot_why, why, __ATOMIC_RELEASE);
		return NULL;
	}
	if (__atomic_compare_exchange_n(&p->slot, &none, s, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return s;
	account_close(s); /* another thread of ours got one first */
	return none;
}

/* The refusal's line: asked, held (when this process has a slot to read the account by), limit. */
static void say_refused(struct process *p, int dev, uint64_t bytes, const char *why)
{
	if (__atomic_load_n(&p->slot, __ATOMIC_ACQUIRE))
		say("refused %llu bytes on GPU %d: %s (the container holds %llu of its %llu-byte limit)",
		    (unsigned long long)bytes, dev, why, (unsigned long long)account_used(dev),
		    (unsigned long long)limit_of(dev));
	else
		say("refused %llu bytes on GPU %d: %s (what the container holds is unknown; its limit is %llu bytes)",
		    (unsigned long long)bytes, dev, why, (unsigned long long)limit_of(dev));
}

static void follow_file(void);

/* Reserve bytes on dev before the runtime allocates; NULL when dev is unlimited (pass through).
 * No slot in the account: refused (never a fresh private account with a whole limit of its own). */
static struct process *reserve(int dev, uint64_t bytes, hipError_t *refusal)
{
	*refusal = hipSuccess;
	struct process *p = env_limit(dev) ? process_get() : NULL;
	if (!p)
		return NULL;
	struct slot *s = slot_of(p);
	const char *limits_why = NULL;
	uint64_t limit = enforced_limit(dev, &limits_why);
	follow_file(); /* the file was just looked at: a new CU mask applies to the queues too */
	if (!s) {
		*refusal = hipErrorOutOfMemory;
		say_refused(p, dev, bytes, __atomic_load_n(&p->no_slot_why, __ATOMIC_ACQUIRE));
	} else if (limits_why) {
		*refusal = hipErrorOutOfMemory;
		say_refused(p, dev, bytes, limits_why);
	} else if (!account_reserve(s, dev, bytes, limit, p->pid)) {
		*refusal = hipErrorOutOfMemory;
		say_refused(p, dev, bytes, "past the slice");
	}
	return p;
}

/* After the runtime answered: keep the reservation under key, or give it back. */
static hipError_t settle(struct process *p, hipError_t err, uintptr_t key, int kind, int dev, uint64_t bytes)
{
	if (err == hipSuccess && key && table_insert(key, bytes, dev, kind))
		return err;
	if (err == hipSuccess && key)
		return err; /* table full: stays counted (never under-count) */
	account_release(__atomic_load_n(&p->slot, __ATOMIC_ACQUIRE), dev, bytes);
	return err;
}

/* The one free path: forget key's charge, let the runtime free it, then give the bytes back (or,
 * when the runtime refused, keep key counted as before). */
typedef hipError_t (*free_call)(uintptr_t key, const void *args);

static hipError_t uncounted(uintptr_t key, int kind, free_call call, const void *args)
{
	uint64_t bytes = 0;
	int dev = 0;
	int was_counted = key && process_g && table_remove(key, kind, &bytes, &dev);
	hipError_t err = call(key, args);
	if (!was_counted)
		return err;
	if (err == hipSuccess)
		account_release(__atomic_load_n(&process_get()->slot, __ATOMIC_ACQUIRE), dev, bytes);
	else
		table_insert(key, bytes, dev, kind);
	return err;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static uint64_t dims(size_t w, size_t h, size_t d)
{
	return sat_mul(sat_mul(w, h ? h : 1), d ? d : 1);
}

/* ---- HIP wrappers: allocations ---- */

static void *real_hipMalloc, *real_hipExtMallocWithFlags, *real_hipMallocAsync, *real_hipMallocFromPoolAsync,
	*real_hipFreeAsync, *real_hipMallocPitch, *real_hipMemAllocPitch, *real_hipMalloc3D, *real_hipMallocArray,
	*real_hipMalloc3DArray, *real_hipArrayCreate, *real_hipArray3DCreate, *real_hipFreeArray, *real_hipArrayDestroy,
	*real_hipMallocMipmappedArray, *real_hipMipmappedArrayCreate, *real_hipFreeMipmappedArray, *real_hipMipmappedArrayDestroy, *real_hipMemCreate,
	*real_hipMemRelease, *real_hipMemGetInfo, *real_hipGetDeviceProperties,
	*real_hipGetDevicePropertiesR0000, *real_hipGetDevicePropertiesR0600, *real_hipDeviceTotalMem,
	*real_hipDeviceGetAttribute, *real_hsa_queue_create, *real_hsa_queue_destroy, *real_hsa_amd_queue_cu_set_mask;

/* Under HIP_OVERSUBSCRIBE the slice may be larger than what the GPU has free: when the GPU itself
 * is full, the allocation falls back to managed memory (pages to host RAM; needs XNACK). */
static hipError_t oversubscribed(hipError_t err, void **ptr, size_t size)
{
	if (err != hipErrorOutOfMemory || !config_g.oversubscribe)
		return err;
	__typeof__(&hipMallocManaged) managed = REAL(&hip_map_g, hipMallocManaged);
	return managed ? managed(ptr, size, hipMemAttachGlobal) : err;
}

/* The shape of every counted allocation: reserve bytes on dev, call the runtime (which writes the
 * new pointer, array or handle to *out), maybe fall back to managed memory, settle. A padded
 * (pitched) allocation's call also writes what the runtime really took to *taken: the difference
 * is reserved after the call, or the allocation is freed and refused. */
typedef hipError_t (*alloc_call)(void **out, size_t size, const void *args);

struct request {
	int dev, kind, may_oversubscribe;
	uint64_t bytes;        /* reserved before the call */
	const uint64_t *taken; /* NULL: the runtime took bytes */
};

/* A padded allocation took more than was reserved: reserve the rest, else free it and refuse. */
static hipError_t top_up(struct process *p, const struct request *r, void *ptr, uint64_t taken)
{
	struct slot *s = __atomic_load_n(&p->slot, __ATOMIC_ACQUIRE);
	const char *limits_why = NULL;
	uint64_t limit = enforced_limit(r->dev, &limits_why);
	if (!limits_why && account_reserve(s, r->dev, taken - r->bytes, limit, p->pid))
		return hipSuccess;
	say_refused(p, r->dev, taken, "past the slice once padded");
	REAL(&hip_map_g, hipFree)(ptr);
	return hipErrorOutOfMemory;
}

static hipError_t count_call(const struct request *r, void **out, alloc_call call, const void *args)
{
	hipError_t err;
	struct process *p = reserve(r->dev, r->bytes, &err);
	if (err != hipSuccess)
		return err;
	err = call(out, r->bytes, args);
	if (r->may_oversubscribe)
		err = oversubscribed(err, out, r->bytes);
	if (!p)
		return err;
	uint64_t bytes = r->bytes;
	if (err == hipSuccess && out && r->taken && *r->taken > bytes) {
		err = top_up(p, r, *out, *r->taken);
		bytes = err == hipSuccess ? *r->taken : bytes;
	}
	return settle(p, err, err == hipSuccess && out ? (uintptr_t)*out : 0, r->kind, r->dev, bytes);
}

static hipError_t counted(int dev, uint64_t bytes, int kind, void **out, alloc_call call, const void *args,
			  int may_oversubscribe)
{
	struct request r = {dev, kind, may_oversubscribe, bytes, NULL};
	return count_call(&r, out, call, args);
}

static hipError_t counted_alloc(void **ptr, size_t size, alloc_call call, const void *args, int may_oversubscribe)
{
	return counted(current_device(), size, K_PTR, ptr, call, args, may_oversubscribe);
}

static hipError_t call_malloc(void **ptr, size_t size, const void *unused)
{
	(void)unused;
	return REAL(&hip_map_g, hipMalloc)(ptr, size);
}

static hipError_t call_ext_malloc(void **ptr, size_t size, const void *flags)
{
	return REAL(&hip_map_g, hipExtMallocWithFlags)(ptr, size, *(const unsigned int *)flags);
}

static hipError_t call_managed(void **ptr, size_t size, const void *flags)
{
	return REAL(&hip_map_g, hipMallocManaged)(ptr, size, *(const unsigned int *)flags);
}

static hipError_t call_async(void **ptr, size_t size, const void *stream)
{
	return REAL(&hip_map_g, hipMallocAsync)(ptr, size, (hipStream_t)stream);
}

struct pool_args { hipMemPool_t pool; hipStream_t stream; };

static hipError_t call_from_pool(void **ptr, size_t size, const void *args)
{
	const struct pool_args *a = args;
	return REAL(&hip_map_g, hipMallocFromPoolAsync)(ptr, size, a->pool, a->stream);
}

static hipError_t w_hipMalloc(void **ptr, size_t size)
{
	return counted_alloc(ptr, size, call_malloc, NULL, 1);
}

static hipError_t w_hipExtMallocWithFlags(void **ptr, size_t size, unsigned int flags)
{
	return counted_alloc(ptr, size, call_ext_malloc, &flags, 1);
}

static hipError_t w_hipMallocManaged(void **ptr, size_t size, unsigned int flags)
{
	return counted_alloc(ptr, size, call_managed, &flags, 0);
}

/* ---- stream-ordered allocations: charged to the stream's (or the pool's) GPU ---- */

static void *real_hipStreamGetDevice, *real_hipMemPoolCreate, *real_hipMemPoolDestroy,
	*real_hipDeviceGetDefaultMemPool, *real_hipDeviceGetMemPool;

/* The GPU a stream runs on; the null stream (and a runtime that cannot say) is the current one. */
static int stream_device(hipStream_t stream)
{
	hipDevice_t dev = 0;
	__typeof__(&hipStreamGetDevice) get = REAL(&hip_map_g, hipStreamGetDevice);
	if (!stream || !get || get(stream, &dev) != hipSuccess || dev < 0 || dev >= HOOK_MAX_DEVICES)
		return current_device();
	return dev;
}

/* The GPU a pool's memory lives on, as recorded when the pool was made or handed out; a pool we
 * never saw: the stream's GPU. */
static int pool_device(hipMemPool_t pool, hipStream_t stream)
{
	struct entry *e = pool && config_g.any_limit && process_get() ? table_entry((uintptr_t)pool, K_POOL) : NULL;
	return e ? e->device : stream_device(stream);
}

static void remember_pool(hipError_t err, hipMemPool_t *pool, int dev)
{
	if (err == hipSuccess && pool && *pool && dev >= 0 && dev < HOOK_MAX_DEVICES && config_g.any_limit &&
	    process_get() && !table_entry((uintptr_t)*pool, K_POOL))
		table_insert((uintptr_t)*pool, 0, dev, K_POOL);
}

static hipError_t w_hipMemPoolCreate(hipMemPool_t *pool, const hipMemPoolProps *props)
{
	hipError_t err = REAL(&hip_map_g, hipMemPoolCreate)(pool, props);
	remember_pool(err, pool, props && props->location.type == hipMemLocationTypeDevice ? props->location.id : -1);
	return err;
}

static hipError_t w_hipDeviceGetDefaultMemPool(hipMemPool_t *pool, int dev)
{
	hipError_t err = REAL(&hip_map_g, hipDeviceGetDefaultMemPool)(pool, dev);
	remember_pool(err, pool, dev);
	return err;
}

static hipError_t w_hipDeviceGetMemPool(hipMemPool_t *pool, int dev)
{
	hipError_t err = REAL(&hip_map_g, hipDeviceGetMemPool)(pool, dev);
	remember_pool(err, pool, dev);
	return err;
}

static hipError_t w_hipMemPoolDestroy(hipMemPool_t pool)
{
	uint64_t unused_bytes = 0;
	int unused_dev = 0;
	hipError_t err = REAL(&hip_map_g, hipMemPoolDestroy)(pool);
	if (err == hipSuccess && pool && process_g)
		table_remove((uintptr_t)pool, K_POOL, &unused_bytes, &unused_dev);
	return err;
}

static hipError_t w_hipMallocAsync(void **ptr, size_t size, hipStream_t stream)
{
	return counted(stream_device(stream), size, K_PTR, ptr, call_async, stream, 0);
}

static hipError_t w_hipMallocFromPoolAsync(void **ptr, size_t size, hipMemPool_t pool, hipStream_t stream)
{
	struct pool_args a = {pool, stream};
	return counted(pool_device(pool, stream), size, K_PTR, ptr, call_from_pool, &a, 0);
}

/* ---- frees: one path (uncounted) ---- */

static hipError_t call_free(uintptr_t ptr, const void *unused)
{
	(void)unused;
	return REAL(&hip_map_g, hipFree)((void *)ptr);
}

static hipError_t call_free_async(uintptr_t ptr, const void *stream)
{
	return REAL(&hip_map_g, hipFreeAsync)((void *)ptr, (hipStream_t)stream);
}

static hipError_t w_hipFree(void *ptr)
{
	return uncounted((uintptr_t)ptr, K_PTR, call_free, NULL);
}

static hipError_t w_hipFreeAsync(void *ptr, hipStream_t stream)
{
	return uncounted((uintptr_t)ptr, K_PTR, call_free_async, stream);
}

/* ---- pitched: the unpadded size reserved first, settled on what the runtime really took ---- */

struct pitch_args {
	size_t *pitch;
	size_t width, height, depth;
	unsigned int element_bytes;
	hipPitchedPtr *pitched;
	uint64_t taken; /* written by the call */
};

static hipError_t pitched(void **out, uint64_t estimate, struct pitch_args *a, alloc_call call)
{
	struct request r = {current_device(), K_PTR, 0, estimate, &a->taken};
	a->taken = r.bytes;
	return count_call(&r, out, call, a);
}

static hipError_t call_malloc_pitch(void **ptr, size_t unused, const void *args)
{
	struct pitch_args *a = (struct pitch_args *)args;
	(void)unused;
	hipError_t err = REAL(&hip_map_g, hipMallocPitch)(ptr, a->pitch, a->width, a->height);
	if (err == hipSuccess)
		a->taken = sat_mul(*a->pitch, a->height);
	return err;
}

static hipError_t w_hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height)
{
	struct pitch_args a = {pitch, width, height, 0, 0, NULL, 0};
	return pitched(ptr, sat_mul(width, height), &a, call_malloc_pitch);
}

static hipError_t call_mem_alloc_pitch(void **ptr, size_t unused, const void *args)
{
	struct pitch_args *a = (struct pitch_args *)args;
	(void)unused;
	hipError_t err = REAL(&hip_map_g, hipMemAllocPitch)((hipDeviceptr_t *)ptr, a->pitch, a->width, a->height,
							    a->element_bytes);
	if (err == hipSuccess)
		a->taken = sat_mul(*a->pitch, a->height);
	return err;
}

static hipError_t w_hipMemAllocPitch(hipDeviceptr_t *ptr, size_t *pitch, size_t width, size_t height,
				     unsigned int element_bytes)
{
	struct pitch_args a = {pitch, width, height, 0, element_bytes, NULL, 0};
	return pitched((void **)ptr, sat_mul(width, height), &a, call_mem_alloc_pitch);
}

static hipError_t call_malloc_3d(void **unused_out, size_t unused, const void *args)
{
	struct pitch_args *a = (struct pitch_args *)args;
	hipExtent e = {a->width, a->height, a->depth};
	(void)unused_out;
	(void)unused;
	hipError_t err = REAL(&hip_map_g, hipMalloc3D)(a->pitched, e);
	if (err == hipSuccess)
		a->taken = sat_mul(sat_mul(a->pitched->pitch, a->height), a->depth);
	return err;
}

static hipError_t w_hipMalloc3D(hipPitchedPtr *p, hipExtent extent)
{
	struct pitch_args a = {NULL, extent.width, extent.height, extent.depth, 0, p, 0};
	uint64_t estimate = sat_mul(sat_mul(extent.width, extent.height), extent.depth);
	return pitched(p ? &p->ptr : NULL, estimate, &a, call_malloc_3d);
}

/* ---- arrays: counted at their element bytes (the runtime's padding is not seen) ---- */

static uint64_t format_bytes(enum hipArray_Format f)
{
	switch (f) {
	case HIP_AD_FORMAT_UNSIGNED_INT8: case HIP_AD_FORMAT_SIGNED_INT8: return 1;
	case HIP_AD_FORMAT_UNSIGNED_INT16: case HIP_AD_FORMAT_SIGNED_INT16: case HIP_AD_FORMAT_HALF: return 2;
	default: return 4;
	}
}

static uint64_t channel_bytes(const hipChannelFormatDesc *desc)
{
	return desc ? (uint64_t)(desc->x + desc->y + desc->z + desc->w) / 8 : 0;
}

struct array_args {
	const void *desc; /* hipChannelFormatDesc, HIP_ARRAY_DESCRIPTOR or HIP_ARRAY3D_DESCRIPTOR */
	size_t width, height, depth;
	unsigned int flags, levels;
};

static hipError_t array_alloc(uint64_t bytes, hipArray **array, alloc_call call, const struct array_args *args)
{
	return counted(current_device(), bytes, K_ARRAY, (void **)array, call, args, 0);
}

static hipError_t call_malloc_array(void **array, size_t unused, const void *args)
{
	const struct array_args *x = args;
	(void)unused;
	return REAL(&hip_map_g, hipMallocArray)((hipArray **)array, x->desc, x->width, x->height, x->flags);
}

static hipError_t w_hipMallocArray(hipArray **array, const hipChannelFormatDesc *desc, size_t width, size_t height,
				   unsigned int flags)
{
	struct array_args x = {desc, width, height, 0, flags, 0};
	return array_alloc(sat_mul(channel_bytes(desc), dims(width, height, 0)), array, call_malloc_array, &x);
}

static hipError_t call_malloc_3d_array(void **array, size_t unused, const void *args)
{
	const struct array_args *x = args;
	hipExtent e = {x->width, x->height, x->depth};
	(void)unused;
	return REAL(&hip_map_g, hipMalloc3DArray)((hipArray **)array, x->desc, e, x->flags);
}

static hipError_t w_hipMalloc3DArray(hipArray **array, const struct hipChannelFormatDesc *desc, struct hipExtent extent,
				     unsigned int flags)
{
	struct array_args x = {desc, extent.width, extent.height, extent.depth, flags, 0};
	return array_alloc(sat_mul(channel_bytes(desc), dims(extent.width, extent.height, extent.depth)), array,
			   call_malloc_3d_array, &x);
}

static hipError_t call_array_create(void **array, size_t unused, const void *args)
{
	(void)unused;
	return REAL(&hip_map_g, hipArrayCreate)((hipArray **)array, ((const struct array_args *)args)->desc);
}

static hipError_t w_hipArrayCreate(hipArray **array, const HIP_ARRAY_DESCRIPTOR *d)
{
	struct array_args x = {d, 0, 0, 0, 0, 0};
	uint64_t bytes = d ? sat_mul(format_bytes(d->Format) * d->NumChannels, dims(d->Width, d->Height, 0)) : 0;
	return array_alloc(bytes, array, call_array_create, &x);
}

static hipError_t call_array_3d_create(void **array, size_t unused, const void *args)
{
	(void)unused;
	return REAL(&hip_map_g, hipArray3DCreate)((hipArray **)array, ((const struct array_args *)args)->desc);
}

static hipError_t w_hipArray3DCreate(hipArray **array, const HIP_ARRAY3D_DESCRIPTOR *d)
{
	struct array_args x = {d, 0, 0, 0, 0, 0};
	uint64_t bytes = d ? sat_mul(format_bytes(d->Format) * d->NumChannels, dims(d->Width, d->Height, d->Depth)) : 0;
	return array_alloc(bytes, array, call_array_3d_create, &x);
}

/* A mipmapped array takes every level: each halves width, height and depth (at least 1). */
static uint64_t mipmap_elements(size_t w, size_t h, size_t d, unsigned int levels)
{
	uint64_t sum = 0;
	for (unsigned int l = 0; l < levels && l < 64; l++) {
		uint64_t lw = w >> l ? w >> l : 1, lh = h >> l ? h >> l : 1, ld = d >> l ? d >> l : 1;
		uint64_t level = dims(lw, h ? lh : 0, d ? ld : 0);
		sum = sum + level < sum ? UINT64_MAX : sum + level;
	}
	return sum;
}

static hipError_t call_malloc_mipmapped(void **array, size_t unused, const void *args)
{
	const struct array_args *x = args;
	hipExtent e = {x->width, x->height, x->depth};
	(void)unused;
	return REAL(&hip_map_g, hipMallocMipmappedArray)((hipMipmappedArray_t *)array, x->desc, e, x->levels, x->flags);
}

static hipError_t w_hipMallocMipmappedArray(hipMipmappedArray_t *array, const struct hipChannelFormatDesc *desc,
					    struct hipExtent e, unsigned int levels, unsigned int flags)
{
	struct array_args x = {desc, e.width, e.height, e.depth, flags, levels};
	uint64_t bytes = sat_mul(channel_bytes(desc), mipmap_elements(e.width, e.height, e.depth, levels));
	return counted(current_device(), bytes, K_MIPMAP, (void **)array, call_malloc_mipmapped, &x, 0);
}

static hipError_t call_mipmapped_create(void **array, size_t unused, const void *args)
{
	const struct array_args *x = args;
	(void)unused;
	return REAL(&hip_map_g, hipMipmappedArrayCreate)((hipMipmappedArray_t *)array, (HIP_ARRAY3D_DESCRIPTOR *)x->desc,
							  x->levels);
}

static hipError_t w_hipMipmappedArrayCreate(hipMipmappedArray_t *array, HIP_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	struct array_args x = {d, 0, 0, 0, 0, levels};
	uint64_t bytes = d ? sat_mul(format_bytes(d->Format) * d->NumChannels,
				     mipmap_elements(d->Width, d->Height, d->Depth, levels)) : 0;
	return counted(current_device(), bytes, K_MIPMAP, (void **)array, call_mipmapped_create, &x, 0);
}

static hipError_t call_free_mipmapped(uintptr_t array, const void *unused)
{
	(void)unused;
	return REAL(&hip_map_g, hipFreeMipmappedArray)((hipMipmappedArray_t)array);
}

static hipError_t call_mipmapped_destroy(uintptr_t array, const void *unused)
{
	(void)unused;
	return REAL(&hip_map_g, hipMipmappedArrayDestroy)((hipMipmappedArray_t)array);
}

static hipError_t call_free_array(uintptr_t array, const void *unused)
{
	(void)unused;
	return REAL(&hip_map_g, hipFreeArray)((hipArray *)array);
}

static hipError_t call_array_destroy(uintptr_t array, const void *unused)
{
	(void)unused;
	return REAL(&hip_map_g, hipArrayDestroy)((hipArray *)array);
}

static hipError_t w_hipFreeMipmappedArray(hipMipmappedArray_t array)
{
	return uncounted((uintptr_t)array, K_MIPMAP, call_free_mipmapped, NULL);
}

static hipError_t w_hipMipmappedArrayDestroy(hipMipmappedArray_t array)
{
	return uncounted((uintptr_t)array, K_MIPMAP, call_mipmapped_destroy, NULL);
}

static hipError_t w_hipFreeArray(hipArray *array)
{
	return uncounted((uintptr_t)array, K_ARRAY, call_free_array, NULL);
}

static hipError_t w_hipArrayDestroy(hipArray *array)
{
	return uncounted((uintptr_t)array, K_ARRAY, call_array_destroy, NULL);
}

/* ---- virtual memory (PyTorch's expandable segments): physical handles count ----
 * A handle's memory lives until it is released AND its last mapping is gone (hipMemRelease of a
 * mapped handle only defers the free). Its entry holds one reference for the handle and one per
 * mapping (K_MAPPING entries, keyed by address); the last reference dropped un-charges it. */

static void *real_hipMemMap, *real_hipMemUnmap;

struct mem_create_args { const hipMemAllocationProp *prop; unsigned long long flags; };

static hipError_t call_mem_create(void **handle, size_t size, const void *args)
{
	const struct mem_create_args *a = args;
	return REAL(&hip_map_g, hipMemCreate)((hipMemGenericAllocationHandle_t *)handle, size, a->prop, a->flags);
}

static hipError_t w_hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size, const hipMemAllocationProp *prop,
				 unsigned long long flags)
{
	int dev = prop && prop->location.type == hipMemLocationTypeDevice ? prop->location.id : -1;
	struct mem_create_args a = {prop, flags};
	return counted(dev, size, K_HANDLE, (void **)handle, call_mem_create, &a, 0);
}

/* Drop one reference of a counted handle; the last one gives its bytes back. */
static void handle_unref(uintptr_t handle)
{
	struct entry *e = process_g ? table_entry(handle, K_HANDLE) : NULL;
	uint64_t bytes = 0;
	int dev = 0;
	if (!e || __atomic_sub_fetch(&e->link, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	if (table_remove(handle, K_HANDLE, &bytes, &dev))
		account_release(__atomic_load_n(&process_get()->slot, __ATOMIC_ACQUIRE), dev, bytes);
}

static hipError_t w_hipMemRelease(hipMemGenericAllocationHandle_t handle)
{
	hipError_t err = REAL(&hip_map_g, hipMemRelease)(handle);
	if (err == hipSuccess && handle)
		handle_unref((uintptr_t)handle);
	return err;
}

static hipError_t w_hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
			      unsigned long long flags)
{
	hipError_t err = REAL(&hip_map_g, hipMemMap)(ptr, size, offset, handle, flags);
	struct entry *e = err == hipSuccess && process_g ? table_entry((uintptr_t)handle, K_HANDLE) : NULL;
	if (!e)
		return err;
	__atomic_add_fetch(&e->link, 1, __ATOMIC_ACQ_REL);
	if (!table_insert_linked((uintptr_t)ptr, size, (uintptr_t)handle, 0, K_MAPPING))
		__atomic_sub_fetch(&e->link, 1, __ATOMIC_ACQ_REL); /* table full: the handle stays counted */
	return err;
}

/* Every mapping in [ptr, ptr + size) we recorded, back to back from ptr, lets go of its handle. */
static void unmap_range(uintptr_t ptr, size_t size)
{
	for (uintptr_t at = ptr; at - ptr < size;) {
		struct entry *m = table_entry(at, K_MAPPING);
		uint64_t mapped_bytes = 0;
		int unused = 0;
		uintptr_t handle = m ? (uintptr_t)__atomic_load_n(&m->link, __ATOMIC_ACQUIRE) : 0;
		if (!m || !table_remove(at, K_MAPPING, &mapped_bytes, &unused) || !mapped_bytes)
			return;
		handle_unref(handle);
		at += mapped_bytes;
	}
}

static hipError_t w_hipMemUnmap(void *ptr, size_t size)
{
	hipError_t err = REAL(&hip_map_g, hipMemUnmap)(ptr, size);
	if (err == hipSuccess && ptr && process_g)
		unmap_range((uintptr_t)ptr, size);
	return err;
}

/* ---- what frameworks size themselves by: the slice, not the GPU ---- */

static hipError_t w_hipMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
	hipError_t err = REAL(&hip_map_g, hipMemGetInfo)(free_bytes, total_bytes);
	int dev = current_device();
	uint64_t limit = limit_of(dev);
	struct process *p = env_limit(dev) ? process_get() : NULL;
	if (err != hipSuccess || !p || !free_bytes || !total_bytes)
		return err;
	account_refresh(p->pid);
	uint64_t used = account_used(dev);
	uint64_t slice_free = used < limit ? limit - used : 0;
	if (!config_g.oversubscribe && *free_bytes < slice_free)
		slice_free = *free_bytes; /* the GPU itself has less left than the slice */
	*free_bytes = slice_free;
	*total_bytes = limit;
	return err;
}

/* A call that reported dev's total memory succeeded: the slice's limit instead, where dev has one. */
static hipError_t as_slice_total(hipError_t err, size_t *total_bytes, int dev)
{
	if (err == hipSuccess && total_bytes && env_limit(dev))
		*total_bytes = limit_of(dev);
	return err;
}

static hipError_t w_hipGetDeviceProperties(hipDeviceProp_t *prop, int dev)
{
	hipError_t err = REAL(&hip_map_g, hipGetDeviceProperties)(prop, dev);
	return as_slice_total(err, prop ? &prop->totalGlobalMem : NULL, dev);
}

/* ROCm 6 (hip6.h): the 5.x layout under its versioned name, and the R0600 layout. */
static hipError_t w_hipGetDevicePropertiesR0000(hipDeviceProp_t *prop, int dev)
{
	hipError_t err = REAL(&hip_map_g, hipGetDevicePropertiesR0000)(prop, dev);
	return as_slice_total(err, prop ? &prop->totalGlobalMem : NULL, dev);
}

static hipError_t w_hipGetDevicePropertiesR0600(struct rocshare_device_prop_r0600_head *prop, int dev)
{
	hipError_t err = REAL(&hip_map_g, hipGetDevicePropertiesR0600)(prop, dev);
	return as_slice_total(err, prop ? &prop->total_global_mem : NULL, dev);
}

static hipError_t w_hipDeviceTotalMem(size_t *bytes, hipDevice_t dev)
{
	return as_slice_total(REAL(&hip_map_g, hipDeviceTotalMem)(bytes, dev), bytes, dev);
}

static hipError_t w_hipDeviceGetAttribute(int *value, hipDeviceAttribute_t attr, int dev)
{
	hipError_t err = REAL(&hip_map_g, hipDeviceGetAttribute)(value, attr, dev);
	if (err == hipSuccess && value && attr == hipDeviceAttributeTotalGlobalMem && env_limit(dev)) {
		uint64_t limit = limit_of(dev);
		*value = limit > INT_MAX ? INT_MAX : (int)limit;
	}
	return err;
}

/* ---- ROCr queues: a CU mask never leaves the slice, and follows the slice when it is resized ----
 * ROCr's rule (ROCR-Runtime: core/util/flag.cpp Flag::parse_masks, called once from
 * core/runtime/amd_topology.cpp BuildTopology when the runtime loads; core/runtime/amd_aql_queue.cpp
 * AqlQueue::SetCUMasking): HSA_CU_MASK is read with the program's getenv when the runtime loads;
 * every queue gets it at creation (unless HSA_CU_MASK_SKIP_INIT=1), and every
 * hsa_amd_queue_cu_set_mask is ANDed with it (HSA_STATUS_CU_MASK_REDUCED when bits were dropped).
 * A process's queues therefore never use a CU outside the mask its runtime loaded with:
 * start_slice_masks() puts the slice file's current mask into HSA_CU_MASK before the runtime reads
 * it; a mask applied later can shrink below that, or grow back up to it, never past it.
 *
 * Every queue seen created is tracked (queues_g) with the mask its owner asked for (want; all CUs
 * when it never asked); the hook applies want AND the current slice at creation, on the owner's
 * set_mask, and to every tracked queue when the file's masks change (follow_slice_locked). These
 * calls are rare and serialized by one lock (ROCr serializes SetCUMasking too), so a queue always
 * ends with the slice of the last change the hook saw. */

static struct {
	uint32_t mask[HOOK_MAX_DEVICES][CU_MASK_WORDS]; /* the slice now (GPUs the environment masks) */
	uint32_t rocr[HOOK_MAX_DEVICES][CU_MASK_WORDS]; /* what this process's ROCr loaded with */
	uint32_t changes_applied;                        /* the limits_masks_changes() mask follows */
	const char *said_problem;                        /* the file's problem last said (NULL none) */
	int64_t checked_s;                               /* the launch check: the second it last looked */
	int32_t lock;                                    /* the holder's pid, 0 free */
} slice_g;

static void queue_lock(void)
{
	int32_t me = (int32_t)getpid();
	for (;;) {
		int32_t cur = 0;
		if (__atomic_compare_exchange_n(&slice_g.lock, &cur, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return;
		/* held by another process: a parent's thread at our fork(), which will never let go here */
		if (cur != me && __atomic_compare_exchange_n(&slice_g.lock, &cur, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return;
		sched_yield();
	}
}

static void queue_unlock(void)
{
	__atomic_store_n(&slice_g.lock, 0, __ATOMIC_RELEASE);
}

static int cu_count(const uint32_t mask[CU_MASK_WORDS])
{
	int n = 0;
	for (int w = 0; w < CU_MASK_WORDS; w++)
		n += __builtin_popcount(mask[w]);
	return n;
}

/* The slice's mask for a queue on GPU dev: its own, or for an unknown GPU (-1) the CUs every
 * masked GPU allows (never wider than any slice); 0 when dev is not masked (a whole GPU). */
static int slice_of(int dev, uint32_t out[CU_MASK_WORDS])
{
	int limited = 0;
	for (int w = 0; w < CU_MASK_WORDS; w++)
		out[w] = ~0u;
	for (int d = 0; d < HOOK_MAX_DEVICES; d++) {
		if (!config_g.cu_mask_set[d] || (dev >= 0 && d != dev))
			continue;
		limited = 1;
		for (int w = 0; w < CU_MASK_WORDS; w++)
			out[w] &= slice_g.mask[d][w];
	}
	return limited;
}

/* Give a tracked queue its want AND the slice (the slice itself when none of want is left). */
static hsa_status_t apply_locked(const struct queue_rec *r)
{
	uint32_t slice[CU_MASK_WORDS], mask[CU_MASK_WORDS], any = 0;
	if (!slice_of(r->dev, slice))
		return HSA_STATUS_SUCCESS; /* a whole GPU: the owner's own mask stands */
	for (int w = 0; w < CU_MASK_WORDS; w++)
		any |= mask[w] = (r->has_want ? r->want[w] : ~0u) & slice[w];
	if (!any)
		memcpy(mask, slice, sizeof mask);
	hsa_status_t st = REAL(&hsa_map_g, hsa_amd_queue_cu_set_mask)((hsa_queue_t *)r->queue, 32 * CU_MASK_WORDS, mask);
	return st == (hsa_status_t)HSA_STATUS_CU_MASK_REDUCED ? HSA_STATUS_SUCCESS : st;
}

/* The slice file brought other masks: they become the slice and every tracked queue follows. */
static void follow_slice_locked(void)
{
	const char *problem = limits_problem();
	if (problem != __atomic_load_n(&slice_g.said_problem, __ATOMIC_ACQUIRE) && problem)
		say("keeps its queues' CU masks as they are: %s", problem);
	__atomic_store_n(&slice_g.said_problem, problem, __ATOMIC_RELEASE);
	if (limits_masks_changes() == __atomic_load_n(&slice_g.changes_applied, __ATOMIC_ACQUIRE))
		return;
	uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS], present = 0;
	uint32_t changes = limits_cu_masks(masks, &present);
	for (int d = 0; d < HOOK_MAX_DEVICES; d++) {
		if (!config_g.cu_mask_set[d] || !(present & (1u << d)))
			continue; /* a whole GPU stays whole; a GPU without a line keeps its mask */
		memcpy(slice_g.mask[d], masks[d], sizeof masks[d]);
		uint32_t usable[CU_MASK_WORDS];
		for (int w = 0; w < CU_MASK_WORDS; w++)
			usable[w] = masks[d][w] & slice_g.rocr[d][w];
		if (cu_count(usable) < cu_count(masks[d]))
			say("GPU %d's slice has %d CUs now; this process's queues keep at most %d of them, the CUs its "
			    "runtime started with (ROCr ANDs every queue's mask with HSA_CU_MASK as read at start); a process "
			    "started now gets all %d", d, cu_count(masks[d]), cu_count(usable), cu_count(masks[d]));
	}
	__atomic_store_n(&slice_g.changes_applied, changes, __ATOMIC_RELEASE);
	int failed = 0;
	for (size_t i = 0; queues_g && i < QUEUE_SLOTS; i++)
		if (queues_g[i].queue && apply_locked(&queues_g[i]) != HSA_STATUS_SUCCESS)
			failed++;
	if (failed)
		say("the runtime refused the resized slice's CU mask on %d queue(s): they keep their mask", failed);
}

/* After the limits file was looked at: follow it when its masks or its problem changed. */
static void follow_file(void)
{
	if (!config_g.any_cu_mask || !limits_configured())
		return;
	if (limits_masks_changes() == __atomic_load_n(&slice_g.changes_applied, __ATOMIC_ACQUIRE) &&
	    limits_problem() == __atomic_load_n(&slice_g.said_problem, __ATOMIC_ACQUIRE))
		return;
	queue_lock();
	follow_slice_locked();
	queue_unlock();
}

/* A process that only launches kernels sees a resize too: at most one look a second. */
static void launch_check(void)
{
	struct timespec now;
	if (!config_g.any_cu_mask || !limits_configured() || clock_gettime(CLOCK_MONOTONIC_COARSE, &now))
		return;
	int64_t last = __atomic_load_n(&slice_g.checked_s, __ATOMIC_RELAXED);
	if (last == (int64_t)now.tv_sec ||
	    !__atomic_compare_exchange_n(&slice_g.checked_s, &last, (int64_t)now.tv_sec, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		return;
	limits_check();
	follow_file();
}

static struct queue_rec *find_locked(const hsa_queue_t *queue)
{
	for (size_t i = 0; queues_g && queue && i < QUEUE_SLOTS; i++)
		if (queues_g[i].queue == (uintptr_t)queue)
			return &queues_g[i];
	return NULL;
}

/* The slice's masks at start: the environment's, then the limits file's (a resize made before this
 * process started), written into HSA_CU_MASK for the runtime to load with. The audit library's libc
 * has its own `environ`, but at la_version it points at the process's initial array (shared with the
 * program's libc, which ROCr's getenv reads): replacing the entry's pointer there reaches ROCr, where
 * setenv of a new name would not (it reallocates our copy's array only). */
static char env_mask_g[9216];

static int append(size_t *n, const char *fmt, int a, int b)
{
	int k = snprintf(env_mask_g + *n, sizeof env_mask_g - *n, fmt, a, b);
	if (k < 0 || (size_t)k >= sizeof env_mask_g - *n)
		return 0;
	*n += (size_t)k;
	return 1;
}

static int render_env_mask(void)
{
	size_t n = 0;
	int ok = append(&n, "HSA_CU_MASK=", 0, 0), sets = 0;
	for (int d = 0; ok && d < HOOK_MAX_DEVICES; d++) {
		if (!config_g.cu_mask_set[d])
			continue;
		ok = append(&n, sets++ ? ";%d:" : "%d:", d, 0);
		for (int cu = 0, runs = 0; ok && cu < 32 * CU_MASK_WORDS; cu++) {
			if (!(slice_g.mask[d][cu / 32] >> (cu % 32) & 1))
				continue;
			int high = cu;
			while (high + 1 < 32 * CU_MASK_WORDS && slice_g.mask[d][(high + 1) / 32] >> ((high + 1) % 32) & 1)
				high++;
			ok = high > cu ? append(&n, runs++ ? ",%d-%d" : "%d-%d", cu, high)
				       : append(&n, runs++ ? ",%d" : "%d", cu, 0);
			cu = high;
		}
	}
	return ok;
}

static void start_slice_masks(void)
{
	memcpy(slice_g.mask, config_g.cu_mask, sizeof slice_g.mask);
	memcpy(slice_g.rocr, config_g.cu_mask, sizeof slice_g.rocr);
	if (!config_g.any_cu_mask || !limits_configured())
		return;
	limits_check();
	if (limits_problem())
		return; /* said at the first queue, which is refused while the file was never good */
	uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS], present = 0;
	slice_g.changes_applied = limits_cu_masks(masks, &present);
	for (int d = 0; d < HOOK_MAX_DEVICES; d++)
		if (config_g.cu_mask_set[d] && (present & (1u << d)))
			memcpy(slice_g.mask[d], masks[d], sizeof masks[d]);
	if (!memcmp(slice_g.mask, config_g.cu_mask, sizeof slice_g.mask) || !render_env_mask())
		return; /* the same mask, or (beyond any real GPU) too long to write: ROCr keeps the environment's */
	for (char **e = environ; e && *e; e++)
		if (!strncmp(*e, "HSA_CU_MASK=", 12)) {
			*e = env_mask_g;
			memcpy(slice_g.rocr, slice_g.mask, sizeof slice_g.rocr);
		}
}

static hsa_status_t count_gpu(hsa_agent_t agent, void *data)
{
	uint64_t *want_and_index = data; /* [0] agent handle, [1] GPUs before it, [2] found */
	hsa_device_type_t type;
	if (REAL(&hsa_map_g, hsa_agent_get_info)(agent, HSA_AGENT_INFO_DEVICE, &type) != HSA_STATUS_SUCCESS ||
	    type != HSA_DEVICE_TYPE_GPU)
		return HSA_STATUS_SUCCESS;
	if (agent.handle == want_and_index[0]) {
		want_and_index[2] = 1;
		return HSA_STATUS_INFO_BREAK;
	}
	want_and_index[1]++;
	return HSA_STATUS_SUCCESS;
}

/* The agent's index among GPUs, as HSA_CU_MASK numbers them; -1 unknown. */
static int gpu_index(uint64_t agent_handle)
{
	uint64_t state[3] = {agent_handle, 0, 0};
	__typeof__(&hsa_iterate_agents) iterate = REAL(&hsa_map_g, hsa_iterate_agents);
	if (!iterate || !REAL(&hsa_map_g, hsa_agent_get_info))
		return -1;
	iterate(count_gpu, state);
	return state[2] ? (int)state[1] : -1;
}

/* Track the new queue and give it the slice now; NULL, or why it cannot be given one. */
static const char *adopt_queue(hsa_queue_t *queue, int dev)
{
	uint32_t slice[CU_MASK_WORDS];
	int limited = slice_of(dev, slice);
	if (limited && limits_configured() && limits_problem() && !limits_masks_changes())
		return limits_problem(); /* the file was never good: no slice to give it */
	struct queue_rec *r = NULL;
	for (size_t i = 0; !r && i < QUEUE_SLOTS; i++)
		if (!queues_g[i].queue)
			r = &queues_g[i];
	if (!r)
		return "this process has 4096 queues already, the most the hook keeps CU masks for";
	memset(r, 0, sizeof *r);
	r->queue = (uintptr_t)queue;
	r->dev = dev;
	if (apply_locked(r) == HSA_STATUS_SUCCESS)
		return NULL;
	r->queue = 0;
	return "the runtime refused the slice's CU mask";
}

static hsa_status_t w_hsa_queue_create(hsa_agent_t agent, uint32_t size, hsa_queue_type32_t type,
				       void (*callback)(hsa_status_t, hsa_queue_t *, void *), void *data,
				       uint32_t private_segment_size, uint32_t group_segment_size, hsa_queue_t **queue)
{
	hsa_status_t st = REAL(&hsa_map_g, hsa_queue_create)(agent, size, type, callback, data, private_segment_size,
							     group_segment_size, queue);
	if (st != HSA_STATUS_SUCCESS || !queue || !*queue || !config_g.any_cu_mask || !process_get() || !queues_g)
		return st;
	int dev = gpu_index(agent.handle);
	limits_check();
	queue_lock();
	follow_slice_locked();
	const char *why = adopt_queue(*queue, dev);
	queue_unlock();
	if (!why)
		return st;
	say("refused a queue on GPU %d: %s", dev, why);
	REAL(&hsa_map_g, hsa_queue_destroy)(*queue);
	*queue = NULL;
	return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
}

static hsa_status_t w_hsa_queue_destroy(hsa_queue_t *queue)
{
	if (config_g.any_cu_mask && queues_g && queue) {
		queue_lock(); /* no resize applies to it once the runtime frees it */
		struct queue_rec *r = find_locked(queue);
		if (r)
			r->queue = 0;
		queue_unlock();
	}
	return REAL(&hsa_map_g, hsa_queue_destroy)(queue);
}

/* The owner's own mask: narrowed to the slice as it is now, and kept to follow later resizes. */
static hsa_status_t w_hsa_amd_queue_cu_set_mask(const hsa_queue_t *queue, uint32_t bits, const uint32_t *mask)
{
	__typeof__(&hsa_amd_queue_cu_set_mask) real = REAL(&hsa_map_g, hsa_amd_queue_cu_set_mask);
	uint32_t slice[CU_MASK_WORDS], narrowed[CU_MASK_WORDS], want[CU_MASK_WORDS] = {0};
	if (!config_g.any_cu_mask || bits % 32 || (bits && !mask))
		return real(queue, bits, mask); /* no slice mask, or the runtime's own argument error */
	uint32_t words = bits ? bits / 32 : CU_MASK_WORDS; /* 0 bits: "all CUs", i.e. the slice's */
	if (words > CU_MASK_WORDS)
		words = CU_MASK_WORDS;
	for (uint32_t w = 0; w < words; w++)
		want[w] = bits ? mask[w] : ~0u;
	limits_check();
	queue_lock();
	follow_slice_locked();
	struct queue_rec *r = find_locked(queue);
	if (!slice_of(r ? r->dev : -1, slice)) {
		queue_unlock();
		return real(queue, bits, mask);
	}
	uint32_t any = 0;
	for (uint32_t w = 0; w < words; w++)
		any |= narrowed[w] = want[w] & slice[w];
	hsa_status_t st = any ? real(queue, words * 32, narrowed) : HSA_STATUS_ERROR_INVALID_ARGUMENT;
	if (r && (st == HSA_STATUS_SUCCESS || st == (hsa_status_t)HSA_STATUS_CU_MASK_REDUCED)) {
		r->has_want = bits != 0;
		memcpy(r->want, want, sizeof want);
	}
	queue_unlock();
	return st; /* HSA_STATUS_ERROR_INVALID_ARGUMENT: nothing of the slice left */
}

/* ---- kernel launches: only the rate-limited look at the slice file ---- */

static void *real_hipLaunchKernel, *real_hipExtLaunchKernel, *real_hipModuleLaunchKernel, *real_hipLaunchCooperativeKernel,
	*real_hipGraphLaunch;

static hipError_t w_hipLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared_bytes, hipStream_t stream)
{
	launch_check();
	return REAL(&hip_map_g, hipLaunchKernel)(f, grid, block, args, shared_bytes, stream);
}

static hipError_t w_hipExtLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, size_t shared_bytes,
				       hipStream_t stream, hipEvent_t start, hipEvent_t stop, int flags)
{
	launch_check();
	return REAL(&hip_map_g, hipExtLaunchKernel)(f, grid, block, args, shared_bytes, stream, start, stop, flags);
}

static hipError_t w_hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz,
					  unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared_bytes,
					  hipStream_t stream, void **params, void **extra)
{
	launch_check();
	return REAL(&hip_map_g, hipModuleLaunchKernel)(f, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, extra);
}

static hipError_t w_hipLaunchCooperativeKernel(const void *f, dim3 grid, dim3 block, void **args,
					       unsigned int shared_bytes, hipStream_t stream)
{
	launch_check();
	return REAL(&hip_map_g, hipLaunchCooperativeKernel)(f, grid, block, args, shared_bytes, stream);
}

static hipError_t w_hipGraphLaunch(hipGraphExec_t graph, hipStream_t stream)
{
	launch_check();
	return REAL(&hip_map_g, hipGraphLaunch)(graph, stream);
}

/* ---- the audit interface ---- */

struct wrapper {
	const char *name;
	void *fn;
	void **real;
	struct link_map **lib;
};
#define W(lib, name) {#name, (void *)w_##name, &real_##name, lib}
static const struct wrapper wrappers_g[] = {
	W(&hip_map_g, hipMalloc), W(&hip_map_g, hipExtMallocWithFlags), W(&hip_map_g, hipMallocManaged),
	W(&hip_map_g, hipMallocAsync), W(&hip_map_g, hipMallocFromPoolAsync), W(&hip_map_g, hipFree),
	W(&hip_map_g, hipFreeAsync), W(&hip_map_g, hipMallocPitch), W(&hip_map_g, hipMemAllocPitch),
	W(&hip_map_g, hipMalloc3D), W(&hip_map_g, hipMallocArray), W(&hip_map_g, hipMalloc3DArray),
	W(&hip_map_g, hipArrayCreate), W(&hip_map_g, hipArray3DCreate), W(&hip_map_g, hipFreeArray),
	W(&hip_map_g, hipMallocMipmappedArray), W(&hip_map_g, hipMipmappedArrayCreate),
	W(&hip_map_g, hipFreeMipmappedArray), W(&hip_map_g, hipMipmappedArrayDestroy),
	W(&hip_map_g, hipArrayDestroy), W(&hip_map_g, hipMemPoolCreate), W(&hip_map_g, hipMemPoolDestroy),
	W(&hip_map_g, hipDeviceGetDefaultMemPool), W(&hip_map_g, hipDeviceGetMemPool),
	W(&hip_map_g, hipMemCreate), W(&hip_map_g, hipMemRelease), W(&hip_map_g, hipMemMap), W(&hip_map_g, hipMemUnmap),
	W(&hip_map_g, hipMemGetInfo),
	W(&hip_map_g, hipGetDeviceProperties), W(&hip_map_g, hipGetDevicePropertiesR0000),
	W(&hip_map_g, hipGetDevicePropertiesR0600), W(&hip_map_g, hipDeviceTotalMem), W(&hip_map_g, hipDeviceGetAttribute),
	W(&hsa_map_g, hsa_queue_create), W(&hsa_map_g, hsa_queue_destroy), W(&hsa_map_g, hsa_amd_queue_cu_set_mask),
	W(&hip_map_g, hipLaunchKernel), W(&hip_map_g, hipExtLaunchKernel), W(&hip_map_g, hipModuleLaunchKernel),
	W(&hip_map_g, hipLaunchCooperativeKernel), W(&hip_map_g, hipGraphLaunch),
};

EXPORT unsigned int la_version(unsigned int version)
{
	read_config();
	setup_process_memory();
	start_slice_masks();
	return version < LAV_CURRENT ? version : LAV_CURRENT; /* older loaders keep us, newer too */
}

static int has_prefix(const char *path, const char *prefix)
{
	const char *base = strrchr(path, '/');
	return !strncmp(base ? base + 1 : path, prefix, strlen(prefix));
}

EXPORT unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
	(void)lmid;
	(void)cookie;
	const char *name = map->l_name ? map->l_name : "";
	if (has_prefix(name, "libamdhip64.so")) {
		hip_map_g = map;
		return LA_FLG_BINDTO | LA_FLG_BINDFROM;
	}
	if (has_prefix(name, "libhsa-runtime64.so")) {
		hsa_map_g = map;
		return LA_FLG_BINDTO | LA_FLG_BINDFROM;
	}
	return LA_FLG_BINDFROM;
}

EXPORT uintptr_t la_symbind64(ElfW(Sym) *sym, unsigned int ndx, uintptr_t *refcook, uintptr_t *defcook,
			      unsigned int *flags, const char *symname)
{
	(void)ndx;
	(void)flags;
	struct link_map *def = (struct link_map *)*defcook, *ref = (struct link_map *)*refcook;
	if (ref == def || (def != hip_map_g && def != hsa_map_g) || !process_g)
		return sym->st_value;
	for (size_t i = 0; i < sizeof wrappers_g / sizeof wrappers_g[0]; i++) {
		const struct wrapper *w = &wrappers_g[i];
		if (*w->lib == def && !strcmp(w->name, symname)) {
			__atomic_store_n(w->real, (void *)sym->st_value, __ATOMIC_RELEASE);
			return (uintptr_t)w->fn;
		}
	}
	return sym->st_value;
}
