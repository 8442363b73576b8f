/* The hook's logic under the sanitizers: hook.c and account.c linked into this program, bound to
 * the stub runtime through the hook's own la_objopen/la_symbind64 (as ld.so would call them), then
 * driven through the wrappers it hands back. An audit library cannot be sanitized in its own link
 * namespace, so this is where ASan and UBSan see the hook's code; test/run.sh runs it. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

#ifndef CU_MASK_WORDS
#define CU_MASK_WORDS 8 /* 82838a0's hook had it in hook.c */
#endif
#ifndef ACCOUNT_SLOTS
#define ACCOUNT_SLOTS 256 /* the hook of fea6fe5 had it in account.c */
#endif
/* fea6fe5's hook left no note: this stands in for it there (the hook's own wins when it has one). */
__attribute__((weak)) uint32_t account_read_note(char *out, size_t out_bytes)
{
	if (out_bytes)
		out[0] = 0;
	return 0;
}

/* 14d01c1's hook had no limits file: these stand in for it there (the hook's own win when it has them). */
__attribute__((weak)) void limits_configure(const char *slice_dir)
{
	(void)slice_dir;
}
__attribute__((weak)) const char *limits_parse(const char *text, size_t n, uint64_t bytes[HOOK_MAX_DEVICES],
					       uint32_t *present)
{
	(void)text, (void)n, (void)bytes, (void)present;
	return "no limits file in this hook";
}
/* 82838a0's hook read no cu-mask lines: this stands in for it there. */
__attribute__((weak)) const char *limits_parse_cu_masks(const char *text, size_t n,
							uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS], uint32_t *mask_present)
{
	(void)text, (void)n, (void)masks, (void)mask_present;
	return "no cu-mask lines in this hook";
}
__attribute__((weak)) uint64_t account_peak(int device)
{
	(void)device;
	return 0;
}

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

/* ---- the account: full, exec, zombies, uids (issue 39 part 4) ---- */

static char self_g_path[4096];

/* The hook's refusal leaves its reason in the container's account. */
static void test_refusal_is_noted(void)
{
	void *p = NULL;
	char note[256];
	uint32_t before = account_read_note(note, sizeof note);
	CHECK(BIND(hip_g, hipMalloc)(&p, 64 * MIB + 1) == hipErrorOutOfMemory);
	CHECK(account_read_note(note, sizeof note) == before + 1);
	CHECK(strstr(note, "refused 67108865 bytes on GPU 0: past the slice") != NULL);
	CHECK(strstr(note, "of its 67108864-byte limit") != NULL);
}

/* Run this program again as a fresh process image (the hook opens the account anew), as uid when
 * uid > 0; its exit status. stdin_fd/stdout_fd: -1 to keep the parent's. */
static pid_t spawn_self(uid_t uid, const char *dir, const char *mode, const char *mib, int stdin_fd, int stdout_fd)
{
	pid_t child = fork();
	if (child != 0)
		return child;
	if (stdin_fd >= 0)
		dup2(stdin_fd, 0);
	if (stdout_fd >= 0)
		dup2(stdout_fd, 1);
	if (dir)
		setenv("ROCSHARE_HOOK_DIR", dir, 1);
	if (uid > 0 && (setgid(uid) != 0 || setuid(uid) != 0))
		_exit(3);
	execl(self_g_path, self_g_path, mode, mib, (char *)NULL);
	_exit(3);
}

static int exit_status(pid_t child)
{
	int status = 0;
	waitpid(child, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

/* exec without fork: the new image finds the old image's slot (same pid, same start time) and must
 * not be charged for what the old image held. */
static void test_exec_releases_the_old_image(void)
{
	__typeof__(&hipMalloc) m = BIND(hip_g, hipMalloc);
	CHECK(account_used(0) == 0);
	pid_t child = fork();
	if (child == 0) {
		void *p = NULL;
		if (m(&p, 40 * MIB) != hipSuccess)
			_exit(4);
		execl(self_g_path, self_g_path, "alloc", "64", (char *)NULL); /* the whole slice is free again */
		_exit(3);
	}
	CHECK(exit_status(child) == 0);
}

/* A zombie (exited, not yet reaped) holds no GPU memory. */
static void test_zombie_is_dead(void)
{
	__typeof__(&hipMalloc) m = BIND(hip_g, hipMalloc);
	pid_t child = fork();
	if (child == 0) {
		void *p = NULL;
		_exit(m(&p, 40 * MIB) == hipSuccess ? 0 : 1);
	}
	siginfo_t info;
	memset(&info, 0, sizeof info);
	CHECK(waitid(P_PID, child, &info, WEXITED | WNOWAIT) == 0 && info.si_status == 0); /* exited, still a zombie */
	size_t free_bytes = 0, total = 0;
	CHECK(BIND(hip_g, hipMemGetInfo)(&free_bytes, &total) == hipSuccess);
	CHECK(free_bytes == 64 * MIB);
	exit_status(child);
}

/* Every slot held by a live process and the container at its limit: one more process is refused,
 * not handed a private account with a whole limit of its own. */
static void test_full_account_refuses(void)
{
	__typeof__(&hipMalloc) m = BIND(hip_g, hipMalloc);
	int ready[2], release[2];
	void *none = NULL;
	CHECK(m(&none, 0) == hipSuccess); /* this process's own slot (if no earlier test took it) */
	CHECK(pipe(ready) == 0 && pipe(release) == 0);
	pid_t holders[ACCOUNT_SLOTS - 1]; /* this process holds the last slot */
	for (int i = 0; i < ACCOUNT_SLOTS - 1; i++) {
		holders[i] = fork();
		if (holders[i] == 0) {
			void *p = NULL;
			char ok = m(&p, i == 0 ? 64 * MIB : 0) == hipSuccess ? '0' : '1', byte;
			close(release[1]);
			if (write(ready[1], &ok, 1) != 1 || read(release[0], &byte, 1) != 0)
				_exit(5);
			_exit(0);
		}
	}
	close(release[0]);
	int held = 0;
	for (int i = 0; i < ACCOUNT_SLOTS - 1; i++) {
		char ok = '1';
		held += read(ready[0], &ok, 1) == 1 && ok == '0';
	}
	CHECK(held == ACCOUNT_SLOTS - 1);
	pid_t extra = fork();
	if (extra == 0) {
		void *p = NULL;
		hipError_t err = m(&p, 1 * MIB);
		_exit(err == hipErrorOutOfMemory ? 0 : err == hipSuccess ? 1 : 2);
	}
	CHECK(exit_status(extra) == 0);
	close(release[1]);
	for (int i = 0; i < ACCOUNT_SLOTS - 1; i++)
		CHECK(exit_status(holders[i]) == 0);
	close(ready[0]);
	close(ready[1]);
	extra = fork(); /* the holders are gone: their slots come back */
	if (extra == 0) {
		void *p = NULL;
		_exit(m(&p, 64 * MIB) == hipSuccess ? 0 : 1);
	}
	CHECK(exit_status(extra) == 0);
}

static int read_int_file(const char *path)
{
	char buf[16] = "";
	int fd = open(path, O_RDONLY);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
	if (fd >= 0)
		close(fd);
	return n > 0 ? atoi(buf) : -1;
}

static void chmod_account_files(const char *dir, mode_t mode)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[512];
	int found = 0;
	while (d && (e = readdir(d)))
		if (strstr(e->d_name, ".acct")) {
			snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
			found += chmod(path, mode) == 0;
		}
	if (d)
		closedir(d);
	CHECK(found == 1);
}

/* Two non-root uids of one container share one account: the second opens the first's file (no
 * O_CREAT, which fs.protected_regular refuses in a sticky folder), and a file it cannot open is a
 * refusal, never a new account of its own elsewhere. */
static void test_uids_share_one_account(void)
{
	if (getuid() != 0) {
		printf("skip test_uids_share_one_account: needs root to switch uids\n");
		return;
	}
	char dir[] = "/tmp/rocshare-hook-uids-XXXXXX";
	int hold_in[2], hold_out[2];
	CHECK(mkdtemp(dir) && chmod(dir, 01777) == 0 && pipe2(hold_in, O_CLOEXEC) == 0 && pipe2(hold_out, O_CLOEXEC) == 0);
	pid_t first = spawn_self(1001, dir, "hold", "40", hold_in[0], hold_out[1]);
	close(hold_in[0]);
	close(hold_out[1]);
	char ok = '1';
	CHECK(read(hold_out[0], &ok, 1) == 1 && ok == '0'); /* uid 1001 holds 40 MiB of the 64 */
	if (read_int_file("/proc/sys/fs/protected_regular") >= 1)
		CHECK(exit_status(spawn_self(1002, dir, "alloc", "40", -1, -1)) == 1);
	else
		printf("skip the fs.protected_regular half of test_uids_share_one_account: it is 0 on this machine\n");
	CHECK(exit_status(spawn_self(1002, dir, "alloc", "24", -1, -1)) == 0); /* one account: 24 fit */
	chmod_account_files(dir, 0600); /* the file exists; uid 1002 cannot open it */
	CHECK(exit_status(spawn_self(1002, dir, "alloc", "1", -1, -1)) == 1);
	close(hold_in[1]);
	CHECK(exit_status(first) == 0);
	close(hold_out[0]);
}

/* When the hook cannot set itself up it says so on stderr (the process then runs unlimited). */
static void test_disabling_is_said(void)
{
#if defined(__SANITIZE_ADDRESS__)
	printf("skip test_disabling_is_said under ASan: it limits the address space, ASan's shadow needs it all\n");
#else
	int err_pipe[2];
	CHECK(pipe(err_pipe) == 0);
	pid_t child = fork();
	if (child == 0) {
		dup2(err_pipe[1], 2);
		long pages = 0, page_bytes = sysconf(_SC_PAGESIZE);
		FILE *f = fopen("/proc/self/statm", "r");
		if (!f || fscanf(f, "%ld", &pages) != 1)
			_exit(2);
		fclose(f);
		struct rlimit r = {(rlim_t)pages * page_bytes + (1 << 20), (rlim_t)pages * page_bytes + (1 << 20)};
		setrlimit(RLIMIT_AS, &r); /* room for the hook's first page, not for its 8 MiB table */
		la_version(LAV_CURRENT);
		_exit(0);
	}
	close(err_pipe[1]);
	char text[512] = "";
	ssize_t n = read(err_pipe[0], text, sizeof text - 1);
	text[n > 0 ? n : 0] = 0;
	close(err_pipe[0]);
	CHECK(exit_status(child) == 0);
	CHECK(strstr(text, "rocshare-hook[") && strstr(text, "]: disabled: cannot map its per-process memory"));
	CHECK(strstr(text, "NOT limited\n") != NULL);
	char note[256];
	CHECK(account_read_note(note, sizeof note) > 0 && !strncmp(note, "disabled: cannot map", 20));
#endif
}

/* ---- a reclaim matches pid AND start time ---- */

/* The head of an account slot as account.c lays it out (the test reads the file as any reader would). */
struct slot_head {
	int32_t pid, pad;
	uint64_t start_ticks;
};
#define SLOT_BYTES (sizeof(struct slot_head) + 16 * sizeof(uint64_t))
#define ACCOUNT_HEAD_BYTES 8

/* kill() as account.c's liveness check calls it: when armed, the watched slot is first given the
 * start time of a new owner under the same pid (a process that claimed the slot, freed meanwhile,
 * between the reclaimer's look and its pid swap). */
static struct slot_head *race_slot_g;
static uint64_t race_new_ticks_g;
int kill(pid_t pid, int sig)
{
	if (race_slot_g) {
		__atomic_store_n(&race_slot_g->start_ticks, race_new_ticks_g, __ATOMIC_RELEASE);
		race_slot_g = NULL;
	}
	return (int)syscall(SYS_kill, pid, sig);
}

static struct slot_head *slot_of_pid(unsigned char *account, pid_t pid)
{
	for (int i = 0; i < ACCOUNT_SLOTS; i++) {
		struct slot_head *s = (struct slot_head *)(account + ACCOUNT_HEAD_BYTES + (size_t)i * SLOT_BYTES);
		if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == pid)
			return s;
	}
	return NULL;
}

static unsigned char *map_account_file(size_t *bytes)
{
	DIR *d = opendir(getenv("ROCSHARE_HOOK_DIR"));
	struct dirent *e;
	char path[512] = "";
	while (d && (e = readdir(d)))
		if (strstr(e->d_name, ".acct") && !strstr(e->d_name, ".new"))
			snprintf(path, sizeof path, "%s/%s", getenv("ROCSHARE_HOOK_DIR"), e->d_name);
	if (d)
		closedir(d);
	int fd = open(path, O_RDWR);
	if (fd < 0)
		return NULL;
	*bytes = (size_t)lseek(fd, 0, SEEK_END);
	void *m = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return m == MAP_FAILED ? NULL : m;
}

/* A slot that looks dead (its start time is not its pid's) but is claimed by a new process under
 * that pid before the reclaimer swaps the pid: the reclaim must leave it (and its 40 MiB) alone. */
static void test_reclaim_matches_start_time(void)
{
	__typeof__(&hipMalloc) m = BIND(hip_g, hipMalloc);
	int ready[2], release[2];
	CHECK(pipe(ready) == 0 && pipe(release) == 0);
	pid_t owner = fork();
	if (owner == 0) {
		void *p = NULL;
		char ok = m(&p, 40 * MIB) == hipSuccess ? '0' : '1', byte;
		close(release[1]);
		_exit(write(ready[1], &ok, 1) == 1 && read(release[0], &byte, 1) == 0 ? 0 : 5);
	}
	close(release[0]);
	char ok = '1';
	CHECK(read(ready[0], &ok, 1) == 1 && ok == '0');
	size_t bytes = 0;
	unsigned char *account = map_account_file(&bytes);
	struct slot_head *s = account ? slot_of_pid(account, owner) : NULL;
	CHECK(s != NULL);
	if (s) {
		race_new_ticks_g = s->start_ticks;
		__atomic_store_n(&s->start_ticks, s->start_ticks + 1, __ATOMIC_RELEASE); /* an older owner's */
		race_slot_g = s;
		size_t free_bytes = 0, total = 0;
		CHECK(BIND(hip_g, hipMemGetInfo)(&free_bytes, &total) == hipSuccess); /* reclaims what is dead */
		CHECK(race_slot_g == NULL); /* the liveness check ran */
		CHECK(__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == owner);
		CHECK(free_bytes == 24 * MIB);
	}
	race_slot_g = NULL;
	close(release[1]);
	CHECK(exit_status(owner) == 0);
	close(ready[0]);
	close(ready[1]);
	if (account)
		munmap(account, bytes);
}

/* ---- wrappers: the right GPU, the right moment ---- */

static void test_array_destroy_gives_back(void)
{
	HIP_ARRAY_DESCRIPTOR d = {.Width = 8192, .Height = 1024, .Format = HIP_AD_FORMAT_FLOAT, .NumChannels = 1};
	hipArray *a = NULL;
	CHECK(BIND(hip_g, hipArrayCreate)(&a, &d) == hipSuccess); /* 32 MiB */
	CHECK(account_used(0) == 32 * MIB);
	CHECK(BIND(hip_g, hipArrayDestroy)(a) == hipSuccess);
	CHECK(account_used(0) == 0);
}

/* GPU 0 has the 64 MiB slice, GPU 1 none: a stream's or a pool's allocation is charged to its GPU. */
static void test_stream_and_pool_devices(void)
{
	__typeof__(&hipMallocAsync) async = BIND(hip_g, hipMallocAsync);
	__typeof__(&hipMallocFromPoolAsync) from_pool = BIND(hip_g, hipMallocFromPoolAsync);
	hipStream_t on0 = NULL, on1 = NULL;
	void *p = NULL;
	CHECK(hipStreamCreate(&on0) == hipSuccess);
	hipSetDevice(1);
	CHECK(hipStreamCreate(&on1) == hipSuccess);
	CHECK(async(&p, 128 * MIB, on0) == hipErrorOutOfMemory); /* current GPU 1, stream on GPU 0 */
	hipMemPoolProps props;
	memset(&props, 0, sizeof props);
	props.allocType = hipMemAllocationTypePinned;
	props.location.type = hipMemLocationTypeDevice;
	props.location.id = 0;
	hipMemPool_t pool0 = NULL, default0 = NULL;
	CHECK(BIND(hip_g, hipMemPoolCreate)(&pool0, &props) == hipSuccess);
	CHECK(from_pool(&p, 128 * MIB, pool0, on1) == hipErrorOutOfMemory);
	CHECK(BIND(hip_g, hipDeviceGetDefaultMemPool)(&default0, 0) == hipSuccess);
	CHECK(from_pool(&p, 128 * MIB, default0, on1) == hipErrorOutOfMemory);
	CHECK(from_pool(&p, 32 * MIB, pool0, on1) == hipSuccess && account_used(0) == 32 * MIB);
	CHECK(BIND(hip_g, hipFree)(p) == hipSuccess && account_used(0) == 0);
	CHECK(BIND(hip_g, hipMemPoolDestroy)(pool0) == hipSuccess);
	hipSetDevice(0);
	CHECK(async(&p, 128 * MIB, on1) == hipSuccess && account_used(0) == 0); /* GPU 1 has no limit */
	CHECK(BIND(hip_g, hipFree)(p) == hipSuccess);
	hipStreamDestroy(on0);
	hipStreamDestroy(on1);
}

/* A released handle that is still mapped is still in use: counted until its last mapping goes. */
static void test_release_waits_for_unmap(void)
{
	hipMemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.location.type = hipMemLocationTypeDevice;
	hipMemGenericAllocationHandle_t h = NULL, other = NULL;
	void *va = NULL;
	CHECK(BIND(hip_g, hipMemCreate)(&h, 48 * MIB, &prop, 0) == hipSuccess);
	CHECK(hipMemAddressReserve(&va, 96 * MIB, 0, NULL, 0) == hipSuccess);
	CHECK(BIND(hip_g, hipMemMap)(va, 48 * MIB, 0, h, 0) == hipSuccess);
	CHECK(BIND(hip_g, hipMemMap)((char *)va + 48 * MIB, 48 * MIB, 0, h, 0) == hipSuccess);
	CHECK(BIND(hip_g, hipMemRelease)(h) == hipSuccess);
	CHECK(account_used(0) == 48 * MIB);
	CHECK(BIND(hip_g, hipMemCreate)(&other, 32 * MIB, &prop, 0) == hipErrorOutOfMemory);
	CHECK(BIND(hip_g, hipMemUnmap)(va, 48 * MIB) == hipSuccess && account_used(0) == 48 * MIB);
	CHECK(BIND(hip_g, hipMemUnmap)((char *)va + 48 * MIB, 48 * MIB) == hipSuccess);
	CHECK(account_used(0) == 0);
	CHECK(hipMemAddressFree(va, 96 * MIB) == hipSuccess);
}

/* The modes this program runs in when spawn_self or an exec starts it again: its exit status says. */
static int run_mode(const char *mode, const char *mib)
{
	void *p = NULL;
	hipError_t err = BIND(hip_g, hipMalloc)(&p, (size_t)atoi(mib) * MIB);
	int status = err == hipSuccess ? 0 : err == hipErrorOutOfMemory ? 1 : 2;
	if (strcmp(mode, "hold") != 0)
		return status;
	char ok = (char)('0' + status), byte;
	if (write(1, &ok, 1) != 1 || read(0, &byte, 1) != 0) /* held until the parent closes stdin */
		return 2;
	return status;
}


/* ---- the slice's limits file (issue 43): read on every allocation, fail closed ---- */

static void write_text(const char *path, const char *text, int in_place)
{
	char tmp[600];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	int fd = open(in_place ? path : tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
	if (!in_place)
		CHECK(rename(tmp, path) == 0);
}

static void test_limits_parse(void)
{
	uint64_t bytes[HOOK_MAX_DEVICES] = {0};
	uint32_t present = 0;
	const char *ok = "rocshare-limits 1\ngeneration 3\nmemory 0 4294967296\ncu-mask 0 0-15\nmemory 2 7\nfuture x\n";
	CHECK(limits_parse(ok, strlen(ok), bytes, &present) == NULL);
	CHECK(present == 5u && bytes[0] == 4294967296ull && bytes[2] == 7);
	uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS], mask_present = 0;
	const char *two = "rocshare-limits 1\ncu-mask 0 0-15\ncu-mask 3 31,33-35,255\n";
	CHECK(limits_parse_cu_masks(two, strlen(two), masks, &mask_present) == NULL);
	CHECK(mask_present == 9u && masks[0][0] == 0xffffu && masks[0][1] == 0);
	CHECK(masks[3][0] == 0x80000000u && masks[3][1] == 0xeu && masks[3][7] == 0x80000000u);
	static const char *const refused[] = {
		"", "rocshare-limits 2\nmemory 0 1\n", "rocshare-limits 1", "rocshare-limits 1\nmemory 0 1",
		"rocshare-limits 1\nmemory 0  1\n", "rocshare-limits 1\nmemory  0 1\n", "rocshare-limits 1\nmemory 16 1\n",
		"rocshare-limits 1\nmemory -1 1\n", "rocshare-limits 1\nmemory 0 -1\n", "rocshare-limits 1\nmemory 0 1x\n",
		"rocshare-limits 1\nmemory 0 18446744073709551616\n", "rocshare-limits 1\nmemory 0\n",
		"rocshare-limits 1\nmemory 0 1\nmemory 0 2\n", "rocshare-limits 1\nmemory \n", "ROCSHARE-LIMITS 1\n",
		"rocshare-limits 1\nmemory 0 +1\n", "rocshare-limits 1\ncu-mask 0 1-\n", "rocshare-limits 1\ncu-mask 0 ,1\n",
		"rocshare-limits 1\ncu-mask 0 3-2\n", "rocshare-limits 1\ncu-mask 0 256\n", "rocshare-limits 1\ncu-mask 16 1\n",
		"rocshare-limits 1\ncu-mask 0 0x3\n", "rocshare-limits 1\ncu-mask 0 1\ncu-mask 0 2\n", "rocshare-limits 1\ncu-mask 0\n",
	};
	for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
		const char *why = limits_parse(refused[i], strlen(refused[i]), bytes, &present);
		if (!why)
			fprintf(stderr, "accepted: %s\n", refused[i]);
		CHECK(why != NULL);
	}
	CHECK(limits_parse("rocshare-limits 1\nmemory 0 1\n\0", 30, bytes, &present) != NULL); /* NUL byte */
	static char big[4200];
	memset(big, '#', sizeof big);
	memcpy(big, "rocshare-limits 1\n", 18);
	big[sizeof big - 1] = '\n';
	CHECK(limits_parse(big, sizeof big, bytes, &present) != NULL);
}

/* A process holding 48 MiB under a 64 MiB limit file is refused 32 more; the file raised to 128 MiB,
 * the same process gets them (no restart). An in-place rewrite of the same size within the same
 * second is seen too. A missing, symlinked, malformed or foreign-version file refuses (fail closed),
 * and so does a file without a line for the limited GPU. */
static void test_limits_file_resize(void)
{
	__typeof__(&hipMalloc) m = BIND(hip_g, hipMalloc);
	__typeof__(&hipFree) f = BIND(hip_g, hipFree);
	char dir[] = "/tmp/rocshare-hook-slice-XXXXXX", path[600], link_path[600];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/limits", dir);
	write_text(path, "rocshare-limits 1\ngeneration 1\nmemory 0 67108864\n", 0);
	limits_configure(dir);
	void *held = NULL, *more = NULL, *extra = NULL;
	CHECK(m(&held, 48 * MIB) == hipSuccess);
	CHECK(m(&more, 32 * MIB) == hipErrorOutOfMemory);
	write_text(path, "rocshare-limits 1\ngeneration 2\nmemory 0 134217728\n", 0);
	CHECK(m(&more, 32 * MIB) == hipSuccess); /* 80 of 128 MiB */
	size_t free_bytes = 0, total = 0;
	CHECK(BIND(hip_g, hipMemGetInfo)(&free_bytes, &total) == hipSuccess);
	CHECK(total == 128 * MIB && free_bytes == 48 * MIB);
	write_text(path, "rocshare-limits 1\ngeneration 3\nmemory 0 067108864\n", 1); /* same size, in place */
	CHECK(m(&extra, 1 * MIB) == hipErrorOutOfMemory); /* shrunk below what is held: nothing more */
	CHECK(f(more) == hipSuccess);
	CHECK(m(&extra, 16 * MIB) == hipSuccess && f(extra) == hipSuccess); /* 48 + 16 = 64 */
	write_text(path, "rocshare-limits 1\nmemory 1 134217728\n", 0); /* no line for GPU 0 */
	CHECK(m(&extra, 1 * MIB) == hipErrorOutOfMemory);
	write_text(path, "rocshare-limits 2\nmemory 0 134217728\n", 0);
	CHECK(m(&extra, 1 * MIB) == hipErrorOutOfMemory);
	char note[256];
	account_read_note(note, sizeof note);
	CHECK(strstr(note, "not version 1") != NULL);
	snprintf(link_path, sizeof link_path, "%s/elsewhere", dir);
	write_text(link_path, "rocshare-limits 1\nmemory 0 134217728\n", 0);
	CHECK(unlink(path) == 0 && symlink(link_path, path) == 0);
	CHECK(m(&extra, 1 * MIB) == hipErrorOutOfMemory); /* a symlink is not followed */
	CHECK(unlink(path) == 0);
	CHECK(m(&extra, 1 * MIB) == hipErrorOutOfMemory); /* missing */
	account_read_note(note, sizeof note);
	CHECK(strstr(note, "limits file is missing") != NULL);
	write_text(path, "rocshare-limits 1\nmemory 0 67108864\n", 0);
	CHECK(m(&extra, 16 * MIB) == hipSuccess && f(extra) == hipSuccess);
	CHECK(account_peak(0) >= 80 * MIB);
	CHECK(f(held) == hipSuccess);
	limits_configure(NULL);
	unlink(path);
	unlink(link_path);
	rmdir(dir);
}

/* Resizes while 4 threads allocate and free 16 MiB pieces: the limit flips between 64 and 128 MiB
 * 300 times as the agent writes it (a new file renamed over the old); the threads take turns (a
 * mutex, so what is held is known exactly: a reservation's tentative addition would otherwise show
 * in account_used(); racing reservations are race_test.c's), the file changes under them. Nothing
 * held ever passes the larger limit, and everything is given back. */
struct resize_race {
	__typeof__(&hipMalloc) m;
	__typeof__(&hipFree) f;
	pthread_mutex_t lock;
	uint64_t held_bytes, most_held_bytes;
	int stop, past, granted;
};

static void *resize_churn(void *arg)
{
	struct resize_race *r = arg;
	void *held[8] = {0};
	for (int round = 0; !__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE); round++) {
		int i = round % 8;
		pthread_mutex_lock(&r->lock);
		if (held[i]) {
			r->f(held[i]);
			held[i] = NULL;
			r->held_bytes -= 16 * MIB;
		} else if (r->m(&held[i], 16 * MIB) == hipSuccess) {
			r->granted++;
			r->held_bytes += 16 * MIB;
			r->past += r->held_bytes > 128 * MIB || account_used(0) != r->held_bytes;
			r->most_held_bytes = r->held_bytes > r->most_held_bytes ? r->held_bytes : r->most_held_bytes;
		} else {
			held[i] = NULL;
		}
		pthread_mutex_unlock(&r->lock);
	}
	pthread_mutex_lock(&r->lock); /* the others may still be in their last round */
	for (int i = 0; i < 8; i++)
		if (held[i]) {
			r->f(held[i]);
			r->held_bytes -= 16 * MIB;
		}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

static void test_resize_race(void)
{
	char dir[] = "/tmp/rocshare-hook-race-XXXXXX", path[600];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/limits", dir);
	write_text(path, "rocshare-limits 1\nmemory 0 67108864\n", 0);
	limits_configure(dir);
	struct resize_race r = {BIND(hip_g, hipMalloc), BIND(hip_g, hipFree), PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, 0};
	pthread_t t[4];
	int err_fd = dup(2), devnull = open("/dev/null", O_WRONLY); /* the refusals' lines */
	dup2(devnull, 2);
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, resize_churn, &r);
	for (int flip = 0; flip < 300; flip++)
		write_text(path, flip % 2 ? "rocshare-limits 1\nmemory 0 67108864\n" : "rocshare-limits 1\nmemory 0 134217728\n",
			   0);
	__atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	dup2(err_fd, 2);
	close(err_fd);
	close(devnull);
	printf("resize race: %d granted, %d past 128 MiB or miscounted, at most %llu MiB held\n", r.granted, r.past,
	       (unsigned long long)(r.most_held_bytes / MIB));
	CHECK(r.past == 0 && r.most_held_bytes > 64 * MIB); /* the larger limit applied while they ran */
	CHECK(account_used(0) == 0);
	limits_configure(NULL);
	unlink(path);
	rmdir(dir);
}

/* ---- a resized slice's CU mask reaches the queues (issue 43) ----
 * The stub ROCr follows ROCr's rule here (ROCM_STUB_ROCR_MASKING=1): its global mask is this
 * program's HSA_CU_MASK, 0:16-35, as read at its first call. */

/* 1 when q's mask is exactly CUs low..high (else said on stderr, unless quiet). */
static int mask_was(hsa_queue_t *q, int low, int high, int quiet)
{
	uint32_t got[8] = {0}, want[8] = {0};
	for (int cu = low; cu <= high; cu++)
		want[cu / 32] |= 1u << (cu % 32);
	if (hsa_amd_queue_cu_get_mask(q, 256, got) != HSA_STATUS_SUCCESS)
		return 0;
	if (memcmp(got, want, sizeof got) && !quiet)
		fprintf(stderr, "mask %08x %08x, want CUs %d-%d\n", got[1], got[0], low, high);
	return !memcmp(got, want, sizeof got);
}
#define mask_is(q, low, high) mask_was(q, low, high, 0)

static void write_cu_limits(const char *path, const char *ranges)
{
	char text[256];
	snprintf(text, sizeof text, "rocshare-limits 1\nmemory 0 67108864\ncu-mask 0 %s\ncu-mask 1 40-47\n", ranges);
	write_text(path, text, 0);
}

static hsa_queue_t *new_queue(void)
{
	hsa_agent_t gpu0 = {0x2000};
	hsa_queue_t *q = NULL;
	if (BIND(hsa_g, hsa_queue_create)(gpu0, 4096, HSA_QUEUE_TYPE_MULTI, NULL, NULL, 0, 0, &q) != HSA_STATUS_SUCCESS)
		return NULL;
	return q;
}

/* A new queue gets CUs low..high (made and destroyed). */
static int new_queue_masked(int low, int high)
{
	hsa_queue_t *q = new_queue();
	int ok = q && mask_is(q, low, high);
	if (q)
		BIND(hsa_g, hsa_queue_destroy)(q);
	return ok;
}

/* Queues made before and after each change end with the new mask: shrink, grow back, grow past
 * what ROCr loaded with (ROCr's AND: what it started with, and the hook says so), a launch-only
 * process (within about a second); the owner's own narrower mask follows within the slice; the
 * owner cannot widen past the slice after a shrink. */
static void test_cu_mask_resize(void)
{
	__typeof__(&hsa_amd_queue_cu_set_mask) set = BIND(hsa_g, hsa_amd_queue_cu_set_mask);
	__typeof__(&hipMalloc) m = BIND(hip_g, hipMalloc);
	__typeof__(&hipFree) f = BIND(hip_g, hipFree);
	char dir[] = "/tmp/rocshare-hook-cumask-XXXXXX", path[600], note[256];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/limits", dir);
	write_cu_limits(path, "16-35");
	setenv("ROCM_STUB_ROCR_MASKING", "1", 1);
	limits_configure(dir);
	hsa_queue_t *before = new_queue(), *own = new_queue();
	CHECK(before && own && mask_is(before, 16, 35));
	uint32_t cus_16_23[1] = {0x00ff0000u}, all[8];
	memset(all, 0xff, sizeof all);
	CHECK(set(own, 32, cus_16_23) == HSA_STATUS_SUCCESS && mask_is(own, 16, 23));
	write_cu_limits(path, "16-25"); /* shrink */
	hsa_queue_t *after = new_queue();
	CHECK(after && mask_is(after, 16, 25) && mask_is(before, 16, 25) && mask_is(own, 16, 23));
	CHECK(set(after, 256, all) == HSA_STATUS_SUCCESS && mask_is(after, 16, 25)); /* not past the shrunk slice */
	write_cu_limits(path, "16-35"); /* grow back, seen by an allocation */
	void *p = NULL;
	CHECK(m(&p, MIB) == hipSuccess && f(p) == hipSuccess);
	CHECK(mask_is(before, 16, 35) && mask_is(after, 16, 35) && mask_is(own, 16, 23));
	write_cu_limits(path, "0-47"); /* past what ROCr loaded with: ROCr keeps 16-35, said */
	hsa_queue_t *later = new_queue();
	CHECK(later && mask_is(later, 16, 35) && mask_is(before, 16, 35));
	account_read_note(note, sizeof note);
	CHECK(strstr(note, "has 48 CUs now; this process's queues keep at most 20") != NULL);
	__typeof__(&hipLaunchKernel) launch = BIND(hip_g, hipLaunchKernel);
	dim3 one = {1, 1, 1};
	CHECK(launch((const void *)test_cu_mask_resize, one, one, NULL, 0, NULL) == hipSuccess); /* this second's look */
	write_cu_limits(path, "16-19"); /* a process that only launches kernels: seen within about a second */
	int launches = 0;
	for (struct timespec t0, t; launches < 1000000 && !mask_was(before, 16, 19, 1); launches++) {
		if (!launches)
			clock_gettime(CLOCK_MONOTONIC, &t0);
		CHECK(launch((const void *)test_cu_mask_resize, one, one, NULL, 0, NULL) == hipSuccess);
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 3)
			break;
		usleep(1000);
	}
	CHECK(mask_is(before, 16, 19) && mask_is(after, 16, 19) && mask_is(later, 16, 19) && mask_is(own, 16, 19));
	printf("cu mask resize: a launch-only process followed the file after %d launches 1 ms apart\n", launches);
	for (hsa_queue_t **q = (hsa_queue_t *[]){before, own, after, later, NULL}; *q; q++)
		BIND(hsa_g, hsa_queue_destroy)(*q);
	limits_configure(NULL);
	unlink(path);
	rmdir(dir);
}

/* A bad file never widens: a malformed, oversized, repeated, out-of-range, symlinked or missing
 * cu-mask keeps the queues at the last good mask (16-19), new ones too, and says why. */
static void test_cu_mask_bad_file_never_widens(void)
{
	char dir[] = "/tmp/rocshare-hook-cubad-XXXXXX", path[600], wide[600], note[256];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/limits", dir);
	snprintf(wide, sizeof wide, "%s/wide", dir);
	setenv("ROCM_STUB_ROCR_MASKING", "1", 1);
	write_cu_limits(path, "16-19");
	limits_configure(dir);
	hsa_queue_t *q = new_queue();
	CHECK(q && mask_is(q, 16, 19));
	static char big[4200];
	memset(big, '#', sizeof big);
	memcpy(big, "rocshare-limits 1\nmemory 0 67108864\ncu-mask 0 0-47\n", 51);
	big[sizeof big - 1] = 0;
	big[sizeof big - 2] = '\n';
	static const char *const bad[][2] = {
		{"rocshare-limits 1\nmemory 0 67108864\ncu-mask 0 0-x\n", "malformed cu-mask"},
		{"rocshare-limits 1\nmemory 0 67108864\ncu-mask 0 16-47,\n", "malformed cu-mask"},
		{"rocshare-limits 1\nmemory 0 67108864\ncu-mask 0 47-16\n", "malformed cu-mask"},
		{"rocshare-limits 1\nmemory 0 67108864\ncu-mask 0 0-256\n", "malformed cu-mask"},
		{"rocshare-limits 1\nmemory 0 67108864\ncu-mask 0 \n", "malformed cu-mask"},
		{"rocshare-limits 1\nmemory 0 67108864\ncu-mask 0 0-47\ncu-mask 0 0-47\n", "two cu-mask lines"},
		{"rocshare-limits 2\nmemory 0 67108864\ncu-mask 0 0-47\n", "not version 1"},
		{big, "larger than 4096"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		write_text(path, bad[i][0], 0);
		hsa_queue_t *fresh = new_queue();
		CHECK(fresh && mask_is(fresh, 16, 19) && mask_is(q, 16, 19));
		account_read_note(note, sizeof note);
		if (!strstr(note, bad[i][1]))
			fprintf(stderr, "note %s, want %s\n", note, bad[i][1]);
		CHECK(strstr(note, bad[i][1]) != NULL);
		if (fresh)
			BIND(hsa_g, hsa_queue_destroy)(fresh);
	}
	write_cu_limits(wide, "0-47");
	CHECK(unlink(path) == 0 && symlink(wide, path) == 0);
	hsa_queue_t *fresh = new_queue();
	CHECK(fresh && mask_is(fresh, 16, 19) && mask_is(q, 16, 19));
	CHECK(unlink(path) == 0);
	CHECK(new_queue_masked(16, 19));
	account_read_note(note, sizeof note);
	CHECK(strstr(note, "limits file is missing") != NULL);
	BIND(hsa_g, hsa_queue_destroy)(q);
	if (fresh)
		BIND(hsa_g, hsa_queue_destroy)(fresh);
	limits_configure(NULL);
	unlink(wide);
	rmdir(dir);
}

/* The slice flips between 16-35 and 16-23 while 4 threads create queues, ask for every CU and
 * destroy some, in 10 rounds of 20 changes: after each round's last change (and one more look), no
 * queue is wider than that last slice. */
struct cu_race {
	int stop, rounds;
	hsa_queue_t *kept[4][8];
};

static void *cu_churn(void *arg)
{
	struct cu_race *r = ((struct cu_race **)arg)[0];
	int me = (int)(intptr_t)((void **)arg)[1];
	__typeof__(&hsa_amd_queue_cu_set_mask) set = BIND(hsa_g, hsa_amd_queue_cu_set_mask);
	uint32_t all[8];
	memset(all, 0xff, sizeof all);
	for (int round = 0; !__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE) || round < 16; round++) {
		int i = round % 8;
		if (r->kept[me][i])
			BIND(hsa_g, hsa_queue_destroy)(r->kept[me][i]);
		r->kept[me][i] = new_queue();
		if (r->kept[me][i] && round % 3)
			set(r->kept[me][i], 256, all);
		__atomic_add_fetch(&r->rounds, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void test_cu_mask_race(void)
{
	char dir[] = "/tmp/rocshare-hook-curace-XXXXXX", path[600];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/limits", dir);
	setenv("ROCM_STUB_ROCR_MASKING", "1", 1);
	write_cu_limits(path, "16-35");
	limits_configure(dir);
	int wider = 0, live = 0, rounds = 0;
	for (int epoch = 0; epoch < 10; epoch++) {
		struct cu_race r;
		memset(&r, 0, sizeof r);
		pthread_t t[4];
		void *args[4][2];
		for (int i = 0; i < 4; i++) {
			args[i][0] = &r;
			args[i][1] = (void *)(intptr_t)i;
			pthread_create(&t[i], NULL, cu_churn, args[i]);
		}
		for (int flip = 0; flip < 20; flip++) { /* ends at 16-23 */
			write_cu_limits(path, flip % 2 ? "16-23" : "16-35");
			usleep(500);
		}
		__atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
		for (int i = 0; i < 4; i++)
			pthread_join(t[i], NULL);
		hsa_queue_t *last = new_queue(); /* one more look after the last change */
		wider += !last || !mask_is(last, 16, 23);
		for (int i = 0; i < 4; i++)
			for (int j = 0; j < 8; j++)
				if (r.kept[i][j]) {
					live++;
					wider += !mask_is(r.kept[i][j], 16, 23);
					BIND(hsa_g, hsa_queue_destroy)(r.kept[i][j]);
				}
		if (last)
			BIND(hsa_g, hsa_queue_destroy)(last);
		rounds += r.rounds;
		write_cu_limits(path, "16-35");
	}
	printf("cu mask race: 10 x 20 changes under %d queue rounds; %d live queues, %d not on their round's last slice\n",
	       rounds, live, wider);
	CHECK(live == 320 && wider == 0);
	limits_configure(NULL);
	unlink(path);
	rmdir(dir);
}

/* $ROCSHARE_ACCOUNT_DIR: the account is usage.v3.acct there; a folder that cannot hold it is a
 * refusal, never /tmp or a private account (run in a child: the account is mapped once per image). */
static void test_agent_folder(void)
{
	char dir[] = "/tmp/rocshare-hook-acct-XXXXXX", path[600];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/usage.v3.acct", dir);
	pid_t child = fork();
	if (child == 0) {
		setenv("ROCSHARE_ACCOUNT_DIR", dir, 1);
		execl(self_g_path, self_g_path, "alloc", "8", (char *)NULL);
		_exit(3);
	}
	CHECK(exit_status(child) == 0);
	CHECK(access(path, F_OK) == 0);
	unlink(path);
	char missing[700];
	snprintf(missing, sizeof missing, "%s/not-there", dir);
	child = fork();
	if (child == 0) {
		setenv("ROCSHARE_ACCOUNT_DIR", missing, 1);
		execl(self_g_path, self_g_path, "alloc", "8", (char *)NULL);
		_exit(3);
	}
	CHECK(exit_status(child) == 1); /* refused: no fallback to /tmp */
	rmdir(dir);
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

/* HOOK_TEST_ONLY=<name>: that test alone (to show one door on an older hook without the others). */
#define RUN(test) do { const char *only = getenv("HOOK_TEST_ONLY"); if (!only || !strcmp(only, #test)) test(); } while (0)

int main(int argc, char **argv)
{
	char dir[] = "/tmp/rocshare-hook-test-XXXXXX";
	ssize_t n = readlink("/proc/self/exe", self_g_path, sizeof self_g_path - 1);
	self_g_path[n > 0 ? n : 0] = 0;
	if (argc == 1) { /* the test itself; else a mode of it, in the parent's environment */
		if (!mkdtemp(dir))
			return 2;
		setenv("ROCSHARE_HOOK_DIR", dir, 1);
		setenv("HIP_DEVICE_MEMORY_LIMIT_0", "64m", 1);
		setenv("HSA_CU_MASK", "0:16-35;1:40-47", 1);
		setenv("ROCM_STUB_DEVICES", "2", 1);
	}
	la_version(LAV_CURRENT);
	hip_g = map_of("libamdhip64.so.5");
	hsa_g = map_of("libhsa-runtime64.so.1");
	self_g = map_of(NULL);
	uintptr_t cookie = 0;
	la_objopen(hip_g, LM_ID_BASE, &cookie);
	la_objopen(hsa_g, LM_ID_BASE, &cookie);
	if (argc == 3)
		return run_mode(argv[1], argv[2]);
	void *none = NULL;
	CHECK(BIND(hip_g, hipMalloc)(&none, 0) == hipSuccess); /* this process's slot: account_used() reads it */
	RUN(test_parse);
	RUN(test_binding);
	RUN(test_boundary);
	RUN(test_unlimited_device);
	RUN(test_pitched_and_vmm);
	RUN(test_threads);
	RUN(test_fork);
	RUN(test_cu_mask);
	RUN(test_refusal_is_noted);
	RUN(test_array_destroy_gives_back);
	RUN(test_stream_and_pool_devices);
	RUN(test_release_waits_for_unmap);
	RUN(test_exec_releases_the_old_image);
	RUN(test_zombie_is_dead);
	RUN(test_full_account_refuses);
	RUN(test_reclaim_matches_start_time);
	RUN(test_uids_share_one_account);
	RUN(test_disabling_is_said);
	RUN(test_limits_parse);
	RUN(test_limits_file_resize);
	RUN(test_resize_race);
	RUN(test_cu_mask_resize);
	RUN(test_cu_mask_bad_file_never_widens);
	RUN(test_cu_mask_race);
	RUN(test_agent_folder);
	printf("%s: %d failures\n", failures_g ? "FAIL" : "ok", failures_g);
	return failures_g != 0;
}
