/* The container's VRAM account: one shared file, one slot per live process, one counter per GPU.
 *
 * Invariants:
 * - A GPU's use is the sum of its counter over all slots; a slot belongs to one process image (pid
 *   and its start time, so a reused pid is not mistaken for the owner) or is free (pid 0).
 * - A reservation adds to the caller's own slot first and then sums: two racing reservations can
 *   both be refused, never both granted past the limit (each sum sees the other's addition).
 * - A dead owner's slot is reclaimed by whoever finds it: pid is swapped for -(reclaimer's pid),
 *   the counters zeroed, then pid set to 0; a reclaimer that dies midway is itself reclaimed. The
 *   slot must still hold the owner found dead, by pid AND start time: a slot freed and claimed by a
 *   new process under the same pid since the look is given back, not zeroed.
 *   Dead means: no such pid, another process under that pid (start time differs), or a zombie.
 * - A process image opens the account once. A slot already holding its own pid is a previous image
 *   of the same process (exec without fork): the driver freed that image's memory, so the slot is
 *   zeroed and taken over, never added to.
 * - No slot, no memory: when every slot is held by a live process, or the account file exists but
 *   cannot be opened, account_open returns NULL and the caller refuses limited allocations. A
 *   private (per-process) account is used only when no account file exists and none can be made.
 * - One account per container: an existing file is opened without O_CREAT (fs.protected_regular
 *   refuses O_CREAT on another uid's file in a sticky folder); a new file is made whole (mode 0666,
 *   full size) under a temporary name and published with link(), so nobody sees it half made.
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

struct slot {
	int32_t pid; /* owner, 0 free, negative: being reclaimed by -pid */
	uint32_t pid_ns; /* inode of the owner's PID namespace, 0 unknown (for readers: pids are judged in
			  * the reader's own namespace, see docs/container-account.md) */
	uint64_t start_ticks; /* owner's start time (/proc/<pid>/stat field 22), 0 unknown */
	uint64_t used_bytes[HOOK_MAX_DEVICES];
};

#define NOTE_BYTES 240

struct account_file {
	uint32_t high_water_slots; /* slots [0, high_water) may be in use */
	uint32_t pad;
	struct slot slots[ACCOUNT_SLOTS];
	/* the last time a process of the container was refused or ran unlimited, and why (text) */
	uint32_t note_busy;  /* 1 while one writer fills note */
	uint32_t note_count; /* notes written so far */
	char note[NOTE_BYTES];
	uint64_t peak_bytes[HOOK_MAX_DEVICES]; /* the most the container held per GPU since the file was made */
};
/* docs/container-account.md gives this layout to the node agent, which reads it */
_Static_assert(sizeof(struct slot) == 144, "usage.v3 slot layout");
_Static_assert(sizeof(struct account_file) == 37248, "usage.v3 file layout");

static struct account_file *account_g;
static const char *agent_dir_g; /* $ROCSHARE_ACCOUNT_DIR: the agent's folder, the only place */
static struct account_file private_account_g; /* no file exists and none can be made */

struct proc_stat {
	char state;          /* field 3: R, S, D, Z (zombie), X (dead), ... */
	uint32_t threads;    /* field 20 */
	uint64_t start_ticks; /* field 22 */
};

/* The inode of this process's PID namespace ("pid:[4026531836]"), 0 when unknown. Per process
 * (a child of an unshare(CLONE_NEWPID) caller lives in another), cached for the pid asking. */
static uint32_t my_pid_ns(void)
{
	static int cached_pid;
	static uint32_t cached_ns;
	int pid = (int)getpid();
	if (__atomic_load_n(&cached_pid, __ATOMIC_ACQUIRE) == pid)
		return __atomic_load_n(&cached_ns, __ATOMIC_RELAXED);
	char link_text[64];
	ssize_t n = readlink("/proc/self/ns/pid", link_text, sizeof link_text - 1);
	uint32_t ns = 0;
	if (n > 0) {
		link_text[n] = 0;
		const char *open_bracket = strchr(link_text, '[');
		uint64_t v = open_bracket ? parse_u64(open_bracket + 1, NULL) : 0;
		ns = v <= UINT32_MAX ? (uint32_t)v : 0;
	}
	__atomic_store_n(&cached_ns, ns, __ATOMIC_RELAXED);
	__atomic_store_n(&cached_pid, pid, __ATOMIC_RELEASE);
	return ns;
}

/* 1 and st filled when /proc/<pid>/stat was read. */
static int read_proc_stat(int pid, struct proc_stat *st)
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
	/* after ")" come fields 3..: state is field 3, num_threads 20, starttime field 22 */
	int field = 2;
	for (; *p && field < 22; p++) {
		if (*p != ' ')
			continue;
		field++;
		if (field == 3)
			st->state = p[1];
		else if (field == 20)
			st->threads = (uint32_t)parse_u64(p + 1, NULL);
	}
	st->start_ticks = parse_u64(p, NULL);
	return 1;
}

static uint64_t process_start_ticks(int pid)
{
	struct proc_stat st = {0, 0, 0};
	return read_proc_stat(pid, &st) ? st.start_ticks : 0;
}

/* A zombie answers kill(pid, 0) but holds no GPU memory. A thread-group leader that exited before
 * its other threads also shows Z, with num_threads > 1: that process is alive. */
static int pid_alive(int pid, uint64_t start_ticks)
{
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return 0;
	struct proc_stat st = {0, 0, 0};
	if (!read_proc_stat(pid, &st))
		return 1; /* unreadable /proc: trust kill() */
	if (st.state == 'X' || (st.state == 'Z' && st.threads <= 1))
		return 0;
	return start_ticks == 0 || st.start_ticks == 0 || st.start_ticks == start_ticks;
}

/* ---- opening: one file per container, never split ---- */

enum open_result { OPENED, ABSENT, UNUSABLE };

/* The existing file, opened without O_CREAT. */
static enum open_result open_existing(const char *path, int *fd)
{
	*fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (*fd >= 0)
		return OPENED;
	return errno == ENOENT ? ABSENT : UNUSABLE;
}

/* Make the file whole under a temporary name, then publish it with link(): EEXIST means another
 * process published first, and its file is opened instead. ABSENT: this folder cannot hold it. */
static enum open_result create_published(const char *path, int *fd)
{
	char tmp[600];
	snprintf(tmp, sizeof tmp, "%s.%d.new", path, (int)getpid());
	(void)unlink(tmp); /* a stale one of a crashed process with our pid */
	*fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
	if (*fd < 0)
		return ABSENT;
	int made = fchmod(*fd, 0666) == 0 && ftruncate(*fd, sizeof(struct account_file)) == 0;
	int linked = made && link(tmp, path) == 0;
	int lost_race = made && !linked && errno == EEXIST;
	(void)unlink(tmp);
	if (linked)
		return OPENED;
	close(*fd);
	*fd = -1;
	return lost_race ? open_existing(path, fd) : ABSENT;
}

/* The file at `path`, made and published when there is none yet. */
static enum open_result open_or_create(const char *path, int *fd)
{
	enum open_result r = open_existing(path, fd);
	return r == ABSENT ? create_published(path, fd) : r;
}

static struct account_file *map_fd(int fd, const char **why)
{
	/* lseek, not fstat: fstat is a GLIBC_2.33 symbol and we keep the glibc floor low */
	off_t size_bytes = lseek(fd, 0, SEEK_END);
	void *m = MAP_FAILED;
	if (size_bytes == (off_t)sizeof(struct account_file))
		m = mmap(NULL, sizeof(struct account_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m != MAP_FAILED)
		return m;
	*why = size_bytes == (off_t)sizeof(struct account_file) ? "the account file cannot be mapped"
								: "the account file has the wrong size";
	return NULL;
}

void account_use_agent_folder(const char *dir)
{
	agent_dir_g = dir && *dir ? dir : NULL;
}

static void account_path(char *path, size_t path_bytes, const char *dir)
{
	char ns[64] = "0";
	ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
	if (n > 0) {
		ns[n] = 0;
		for (char *c = ns; *c; c++)
			if (*c < '0' || *c > '9')
				*c = '_';
	}
	snprintf(path, path_bytes, "%s/rocshare-hook-v3-%s.acct", dir, ns);
}

/* The file: $ROCSHARE_HOOK_DIR, else /tmp (the container's own writable layer), else /dev/shm
 * (read-only root filesystem; shared by the pod's containers, hence the pid namespace in the
 * name, which separates containers). The first folder holding the file (or able to) wins; an
 * existing file that cannot be used is a refusal (NULL, why), never a reason to look further.
 * No folder at all: the private account. */
/* The agent's folder: the file there, made when absent; anything else is a refusal. */
static struct account_file *map_agent_account(const char **why)
{
	char path[512];
	snprintf(path, sizeof path, "%s/usage.v3.acct", agent_dir_g);
	int fd = -1;
	enum open_result r = open_or_create(path, &fd);
	if (r == OPENED)
		return map_fd(fd, why);
	*why = r == UNUSABLE ? "the account file exists but cannot be opened"
			     : "the account folder the node agent mounted cannot hold the account file";
	return NULL;
}

static struct account_file *map_account(const char *dir_override, const char **why)
{
	if (agent_dir_g)
		return map_agent_account(why);
	const char *dirs[] = {dir_override, "/tmp", "/dev/shm"};
	for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
		if (!dirs[i] || !*dirs[i])
			continue;
		char path[512];
		account_path(path, sizeof path, dirs[i]);
		int fd = -1;
		enum open_result r = open_or_create(path, &fd);
		if (r == OPENED)
			return map_fd(fd, why);
		if (r == UNUSABLE) {
			*why = "the account file exists but cannot be opened";
			return NULL;
		}
	}
	*why = "no folder can hold the account file: this process has a private account";
	return &private_account_g;
}

/* ---- slots ---- */

static void free_slot(struct slot *s)
{
	for (int d = 0; d < HOOK_MAX_DEVICES; d++)
		__atomic_store_n(&s->used_bytes[d], 0, __ATOMIC_RELEASE);
	__atomic_store_n(&s->start_ticks, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&s->pid_ns, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
}

/* Undo a reclaim's pid swap: the slot is a live process's again. */
static void give_back(struct slot *s, int my_pid, int32_t owner_pid)
{
	int32_t parked = -my_pid;
	__atomic_compare_exchange_n(&s->pid, &parked, owner_pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

/* A slot is reclaimed only if it still holds the very owner found dead: same pid (the swap) AND
 * same start time (checked after the swap, as a new owner under a reused pid writes its own). */
static void reclaim_dead_slots(int my_pid)
{
	uint32_t hw = __atomic_load_n(&account_g->high_water_slots, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < hw && i < ACCOUNT_SLOTS; i++) {
		struct slot *s = &account_g->slots[i];
		int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
		if (pid == 0 || pid == my_pid || pid == -my_pid)
			continue;
		uint64_t ticks = pid > 0 ? __atomic_load_n(&s->start_ticks, __ATOMIC_RELAXED) : 0;
		if (pid_alive(pid > 0 ? pid : -pid, ticks))
			continue;
		if (!__atomic_compare_exchange_n(&s->pid, &pid, -my_pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			continue;
		if (pid > 0 && __atomic_load_n(&s->start_ticks, __ATOMIC_ACQUIRE) != ticks)
			give_back(s, my_pid, pid); /* freed and claimed again under a reused pid since we looked */
		else
			free_slot(s);
	}
}

/* A slot holding my pid when this image opens the account is a previous image's (exec): its
 * memory went with that image, so it is zeroed (pid parked at -pid meanwhile, as a reclaim does). */
static void release_previous_images(int my_pid)
{
	uint32_t hw = __atomic_load_n(&account_g->high_water_slots, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < hw && i < ACCOUNT_SLOTS; i++) {
		int32_t pid = my_pid;
		if (__atomic_compare_exchange_n(&account_g->slots[i].pid, &pid, -my_pid, 0, __ATOMIC_ACQ_REL,
						__ATOMIC_RELAXED))
			free_slot(&account_g->slots[i]);
	}
}

static void raise_high_water(uint32_t slots)
{
	uint32_t hw = __atomic_load_n(&account_g->high_water_slots, __ATOMIC_RELAXED);
	while (hw < slots && !__atomic_compare_exchange_n(&account_g->high_water_slots, &hw, slots, 0, __ATOMIC_ACQ_REL,
							  __ATOMIC_RELAXED))
		;
}

static struct slot *claim_slot(int my_pid)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		for (uint32_t i = 0; i < ACCOUNT_SLOTS; i++) {
			struct slot *s = &account_g->slots[i];
			int32_t free_pid = 0;
			if (!__atomic_compare_exchange_n(&s->pid, &free_pid, my_pid, 0, __ATOMIC_ACQ_REL,
							 __ATOMIC_RELAXED))
				continue;
			__atomic_store_n(&s->start_ticks, process_start_ticks(my_pid), __ATOMIC_RELEASE);
			__atomic_store_n(&s->pid_ns, my_pid_ns(), __ATOMIC_RELEASE);
			raise_high_water(i + 1);
			return s;
		}
		reclaim_dead_slots(my_pid);
	}
	return NULL;
}

/* Map the account once per image (the first caller's mapping wins); NULL and why when refused. */
static struct account_file *account_map_once(const char *dir_override, int my_pid, const char **why)
{
	struct account_file *cur = __atomic_load_n(&account_g, __ATOMIC_ACQUIRE);
	if (cur)
		return cur;
	struct account_file *m = map_account(dir_override, why);
	if (!m)
		return NULL;
	if (__atomic_compare_exchange_n(&account_g, &cur, m, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		release_previous_images(my_pid);
		return m;
	}
	if (m != &private_account_g)
		munmap(m, sizeof *m);
	return cur;
}

int account_attach(const char *dir_override, int my_pid)
{
	const char *why = NULL;
	return account_map_once(dir_override, my_pid, &why) != NULL;
}

struct slot *account_open(const char *dir_override, int my_pid, const char **why)
{
	if (!account_map_once(dir_override, my_pid, why))
		return NULL;
	reclaim_dead_slots(my_pid);
	struct slot *s = claim_slot(my_pid);
	if (!s)
		*why = "every slot of the account is held by a live process";
	return s;
}

void account_close(struct slot *s)
{
	int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
	if (pid > 0 && __atomic_compare_exchange_n(&s->pid, &pid, -pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		free_slot(s);
}

uint64_t account_used(int device)
{
	uint64_t sum = 0;
	if (!account_g)
		return 0;
	uint32_t hw = __atomic_load_n(&account_g->high_water_slots, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < hw && i < ACCOUNT_SLOTS; i++)
		if (__atomic_load_n(&account_g->slots[i].pid, __ATOMIC_ACQUIRE) != 0)
			sum += __atomic_load_n(&account_g->slots[i].used_bytes[device], __ATOMIC_SEQ_CST);
	return sum;
}

static void raise_peak(int device, uint64_t used)
{
	uint64_t peak = __atomic_load_n(&account_g->peak_bytes[device], __ATOMIC_RELAXED);
	while (peak < used && !__atomic_compare_exchange_n(&account_g->peak_bytes[device], &peak, used, 0,
							  __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		;
}

static int try_reserve(struct slot *s, int device, uint64_t bytes, uint64_t limit_bytes)
{
	__atomic_add_fetch(&s->used_bytes[device], bytes, __ATOMIC_SEQ_CST);
	uint64_t used = account_used(device);
	if (used <= limit_bytes) {
		raise_peak(device, used);
		return 1;
	}
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

uint64_t account_peak(int device)
{
	struct account_file *a = __atomic_load_n(&account_g, __ATOMIC_ACQUIRE);
	return a && device >= 0 && device < HOOK_MAX_DEVICES ? __atomic_load_n(&a->peak_bytes[device], __ATOMIC_RELAXED) : 0;
}

void account_release(struct slot *s, int device, uint64_t bytes)
{
	__atomic_sub_fetch(&s->used_bytes[device], bytes, __ATOMIC_SEQ_CST);
}

void account_refresh(int my_pid)
{
	if (account_g)
		reclaim_dead_slots(my_pid);
}

/* Write text to the account's note (skipped when another writer holds it: the line on stderr
 * is the record that always appears). Byte by byte, atomically, as readers may be mid-copy. */
void account_note(const char *text)
{
	struct account_file *a = __atomic_load_n(&account_g, __ATOMIC_ACQUIRE);
	uint32_t idle = 0;
	if (!a || a == &private_account_g ||
	    !__atomic_compare_exchange_n(&a->note_busy, &idle, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		return;
	size_t i = 0;
	for (; text[i] && i < NOTE_BYTES - 1; i++)
		__atomic_store_n(&a->note[i], text[i], __ATOMIC_RELAXED);
	for (; i < NOTE_BYTES; i++)
		__atomic_store_n(&a->note[i], 0, __ATOMIC_RELAXED);
	__atomic_add_fetch(&a->note_count, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&a->note_busy, 0, __ATOMIC_RELEASE);
}

/* The note as last written, for tests and for whoever reads the account; 0 when none. */
uint32_t account_read_note(char *out, size_t out_bytes)
{
	struct account_file *a = __atomic_load_n(&account_g, __ATOMIC_ACQUIRE);
	if (!a || !out_bytes)
		return 0;
	size_t i = 0;
	for (; i + 1 < out_bytes && i < NOTE_BYTES; i++)
		out[i] = __atomic_load_n(&a->note[i], __ATOMIC_RELAXED);
	out[i] = 0;
	return __atomic_load_n(&a->note_count, __ATOMIC_RELAXED);
}
