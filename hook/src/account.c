/* The container's VRAM account: one shared file, one slot per live process, one counter per GPU.
 *
 * Invariants:
 * - A GPU's use is the sum of its counter over all slots; a slot belongs to one process (pid and
 *   its start time, so a reused pid is not mistaken for the owner) or is free (pid 0).
 * - A reservation adds to the caller's own slot first and then sums: two racing reservations can
 *   both be refused, never both granted past the limit (each sum sees the other's addition).
 * - A dead owner's slot is reclaimed by whoever finds it: pid is swapped for -(reclaimer's pid),
 *   the counters zeroed, then pid set to 0; a reclaimer that dies midway is itself reclaimed.
 * - An all-zero file is a valid empty account, so creating it needs no lock and no init step.
 * No locks, only atomics: the audit namespace's libc has no pthread we could share safely.
 */
#include "hook.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SLOT_COUNT 256

struct slot {
	int32_t pid; /* owner, 0 free, negative: being reclaimed by -pid */
	int32_t pad;
	uint64_t start_ticks; /* owner's start time (/proc/<pid>/stat field 22), 0 unknown */
	uint64_t used_bytes[HOOK_MAX_DEVICES];
};

struct account_file {
	uint32_t high_water_slots; /* slots [0, high_water) may be in use */
	uint32_t pad;
	struct slot slots[SLOT_COUNT];
};

static struct account_file *account_g;

static uint64_t process_start_ticks(int pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
	if (!p)
		return 0;
	/* after ")" come fields 3..: state is field 3, starttime field 22 */
	int field = 2;
	for (; *p && field < 22; p++)
		if (*p == ' ')
			field++;
	return parse_u64(p, NULL);
}

static int pid_alive(int pid, uint64_t start_ticks)
{
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return 0;
	if (start_ticks == 0)
		return 1;
	uint64_t now = process_start_ticks(pid);
	return now == 0 || now == start_ticks; /* unreadable /proc: trust kill() */
}

/* The file: $ROCSHARE_HOOK_DIR, else /tmp (the container's own writable layer), else /dev/shm
 * (read-only root filesystem; shared by the pod's containers, hence the pid namespace in the
 * name, which separates containers). NULL: no file could be made; the caller keeps a private
 * account. */
static struct account_file *map_account(const char *dir_override)
{
	char ns[64] = "0";
	ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
	if (n > 0) {
		ns[n] = 0;
		for (char *c = ns; *c; c++)
			if (*c < '0' || *c > '9')
				*c = '_';
	}
	const char *dirs[] = {dir_override, "/tmp", "/dev/shm"};
	for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
		if (!dirs[i] || !*dirs[i])
			continue;
		char path[512];
		snprintf(path, sizeof path, "%s/rocshare-hook-v1-%s.acct", dirs[i], ns);
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
		if (fd < 0)
			continue;
		(void)fchmod(fd, 0666); /* processes of other users in the container share it */
		/* lseek, not fstat: fstat is a GLIBC_2.33 symbol and we keep the glibc floor low */
		off_t size_bytes = lseek(fd, 0, SEEK_END);
		if (size_bytes >= 0 && (size_t)size_bytes < sizeof(struct account_file) &&
		    ftruncate(fd, sizeof(struct account_file)) != 0) {
			close(fd);
			continue;
		}
		void *m = mmap(NULL, sizeof(struct account_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (m != MAP_FAILED)
			return m;
	}
	return NULL;
}

static void reclaim_dead_slots(int my_pid)
{
	uint32_t hw = __atomic_load_n(&account_g->high_water_slots, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < hw && i < SLOT_COUNT; i++) {
		struct slot *s = &account_g->slots[i];
		int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
		if (pid == 0 || pid == my_pid || pid == -my_pid)
			continue;
		uint64_t ticks = pid > 0 ? __atomic_load_n(&s->start_ticks, __ATOMIC_RELAXED) : 0;
		if (pid_alive(pid > 0 ? pid : -pid, ticks))
			continue;
		if (!__atomic_compare_exchange_n(&s->pid, &pid, -my_pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			continue;
		for (int d = 0; d < HOOK_MAX_DEVICES; d++)
			__atomic_store_n(&s->used_bytes[d], 0, __ATOMIC_RELEASE);
		__atomic_store_n(&s->start_ticks, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
	}
}

static struct slot *claim_slot(int my_pid)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		for (uint32_t i = 0; i < SLOT_COUNT; i++) {
			struct slot *s = &account_g->slots[i];
			int32_t free_pid = 0;
			if (!__atomic_compare_exchange_n(&s->pid, &free_pid, my_pid, 0, __ATOMIC_ACQ_REL,
							 __ATOMIC_RELAXED))
				continue;
			__atomic_store_n(&s->start_ticks, process_start_ticks(my_pid), __ATOMIC_RELEASE);
			uint32_t hw = __atomic_load_n(&account_g->high_water_slots, __ATOMIC_RELAXED);
			while (hw < i + 1 && !__atomic_compare_exchange_n(&account_g->high_water_slots, &hw, i + 1, 0,
									   __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
				;
			return s;
		}
		reclaim_dead_slots(my_pid);
	}
	return NULL;
}

static struct account_file private_account_g; /* no file and no free slot: this process alone */

struct slot *account_open(const char *dir_override, int my_pid)
{
	if (!account_g) {
		struct account_file *m = map_account(dir_override);
		struct account_file *none = NULL;
		if (!m)
			m = &private_account_g;
		if (!__atomic_compare_exchange_n(&account_g, &none, m, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
		    m != &private_account_g)
			munmap(m, sizeof *m);
	}
	reclaim_dead_slots(my_pid);
	struct slot *s = claim_slot(my_pid);
	if (!s) {
		account_g = &private_account_g;
		s = claim_slot(my_pid);
	}
	return s;
}

uint64_t account_used(int device)
{
	uint64_t sum = 0;
	uint32_t hw = __atomic_load_n(&account_g->high_water_slots, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < hw && i < SLOT_COUNT; i++)
		if (__atomic_load_n(&account_g->slots[i].pid, __ATOMIC_ACQUIRE) != 0)
			sum += __atomic_load_n(&account_g->slots[i].used_bytes[device], __ATOMIC_SEQ_CST);
	return sum;
}

static int try_reserve(struct slot *s, int device, uint64_t bytes, uint64_t limit_bytes)
{
	__atomic_add_fetch(&s->used_bytes[device], bytes, __ATOMIC_SEQ_CST);
	if (account_used(device) <= limit_bytes)
		return 1;
	__atomic_sub_fetch(&s->used_bytes[device], bytes, __ATOMIC_SEQ_CST);
	return 0;
}

int account_reserve(struct slot *s, int device, uint64_t bytes, uint64_t limit_bytes, int my_pid)
{
	if (bytes > limit_bytes)
		return 0;
	if (try_reserve(s, device, bytes, limit_bytes))
		return 1;
	reclaim_dead_slots(my_pid); /* a crashed process may still hold what we need */
	return try_reserve(s, device, bytes, limit_bytes);
}

void account_release(struct slot *s, int device, uint64_t bytes)
{
	__atomic_sub_fetch(&s->used_bytes[device], bytes, __ATOMIC_SEQ_CST);
}

void account_refresh(int my_pid)
{
	reclaim_dead_slots(my_pid);
}
