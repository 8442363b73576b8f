/* The slice's current memory limits, from the file the node agent writes into the container's
 * read-only slice folder ($ROCSHARE_SLICE_DIR/limits; docs/container-account.md), so a resize
 * applies to the next allocation of every running process.
 *
 * Invariants:
 * - Which GPUs are limited is fixed by the environment (read once); the file gives their value.
 * - The file is checked on every call by one statx (no symlink followed): a changed inode, size,
 *   modification or change time makes it read again (one open, one read of at most 4096 bytes).
 *   A read made while the file's mtime is under STABLE_AFTER_S old is redone on the next call, so
 *   two writes within one timestamp tick that reuse an inode and a size are never mistaken for one.
 * - Fail closed: a configured file that is missing, not a regular file, too large, of another
 *   version, malformed, or without a line for a limited GPU makes limits_current() return 0 and
 *   say why; the caller refuses. Never a wider limit than the file's.
 * - One reader at a time (a flag holding the reader's pid: a fork()ed child that inherited it set
 *   by another thread of its parent takes it over); the others use the values as they are. No locks, no
 *   allocation, no libc stat (fstat/stat are GLIBC_2.33 symbols: statx through syscall()).
 */
#define _GNU_SOURCE
#include "hook.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LIMITS_MAX_BYTES 4096
#define STABLE_AFTER_S 2
static const char HEADER[] = "rocshare-limits 1\n";

struct limits_key {
	uint64_t ino, size;
	int64_t mtime_s, ctime_s;
	uint32_t mtime_ns, ctime_ns;
};

static struct {
	char path[512];
	int configured;
	int32_t busy;            /* the pid of the process whose thread reads the file, 0 none */
	int state;               /* 0 never read, 1 good, 2 unusable */
	int stable;              /* the last read saw an mtime old enough to trust the key */
	const char *why;         /* state 2: why */
	uint64_t bytes[HOOK_MAX_DEVICES];
	uint32_t present;        /* bit d: the file has a memory line for d */
	struct limits_key key;
	uint32_t masks_seq;      /* odd while masks/mask_present are written */
	uint32_t masks_changes;  /* good reads with other masks than the last good read: 0 none yet */
	uint32_t mask_present;   /* bit d: the file has a cu-mask line for d */
	uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS];
} limits_g;

void limits_configure(const char *slice_dir)
{
	limits_g.configured = slice_dir && *slice_dir;
	if (limits_g.configured)
		snprintf(limits_g.path, sizeof limits_g.path, "%s/limits", slice_dir);
}

int limits_configured(void)
{
	return limits_g.configured;
}

/* The end of the line starting at s (at its '\n'), or NULL when the text ends first. */
static const char *line_end(const char *s, const char *end)
{
	const char *nl = memchr(s, '\n', (size_t)(end - s));
	return nl;
}

static int starts_with(const char *s, const char *end, const char *word)
{
	size_t n = strlen(word);
	return (size_t)(end - s) >= n && !memcmp(s, word, n);
}

/* Decimal digits from s, before stop: s itself when none, or NULL when the value does not fit. */
static const char *digits(const char *s, const char *stop, uint64_t *v)
{
	*v = 0;
	for (; s < stop && *s >= '0' && *s <= '9'; s++) {
		unsigned digit = (unsigned)(*s - '0');
		if (*v > (UINT64_MAX - digit) / 10)
			return NULL;
		*v = *v * 10 + digit;
	}
	return s;
}

/* " <i> <bytes>" up to nl (after the word "memory"): 1 when well formed, with position and bytes. */
static int parse_memory_line(const char *s, const char *nl, int *position, uint64_t *bytes)
{
	uint64_t i = 0;
	if (s >= nl || *s != ' ')
		return 0;
	const char *end = digits(s + 1, nl, &i);
	if (!end || end == s + 1 || end >= nl || *end != ' ' || i >= HOOK_MAX_DEVICES)
		return 0;
	const char *after = digits(end + 1, nl, bytes);
	if (!after || after == end + 1 || after != nl)
		return 0;
	*position = (int)i;
	return 1;
}

/* " <i> <ranges>" up to nl (after the word "cu-mask"), ranges as HSA_CU_MASK's decimal form
 * ("0-15,32,40-47": each CU below 32 * CU_MASK_WORDS, each range low <= high, at least one): 1 when
 * well formed, with the position and its bits or'ed into mask. */
static int parse_cu_mask_line(const char *s, const char *nl, int *position, uint32_t mask[CU_MASK_WORDS])
{
	uint64_t i = 0, low = 0, high = 0;
	if (s >= nl || *s != ' ')
		return 0;
	const char *at = digits(s + 1, nl, &i);
	if (!at || at == s + 1 || at >= nl || *at != ' ' || i >= HOOK_MAX_DEVICES)
		return 0;
	do {
		const char *from = at + 1, *to = digits(from, nl, &low);
		if (!to || to == from)
			return 0;
		high = low;
		if (to < nl && *to == '-') {
			from = to + 1;
			to = digits(from, nl, &high);
			if (!to || to == from)
				return 0;
		}
		if (low > high || high >= 32 * CU_MASK_WORDS)
			return 0;
		for (uint64_t cu = low; cu <= high; cu++)
			mask[cu / 32] |= 1u << (cu % 32);
		at = to;
	} while (at < nl && *at == ',');
	if (at != nl)
		return 0;
	*position = (int)i;
	return 1;
}

/* The whole file: memory lines into bytes/present, cu-mask lines into masks/mask_present. */
static const char *parse_all(const char *text, size_t n, uint64_t bytes[HOOK_MAX_DEVICES], uint32_t *present,
			     uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS], uint32_t *mask_present)
{
	const char *end = text + n;
	*present = *mask_present = 0;
	if (n > LIMITS_MAX_BYTES)
		return "the slice's limits file is larger than 4096 bytes";
	if (n < sizeof HEADER - 1 || memcmp(text, HEADER, sizeof HEADER - 1))
		return "the slice's limits file is not version 1 (rocshare-limits 1)";
	if (memchr(text, 0, n))
		return "the slice's limits file holds a NUL byte";
	for (const char *s = text + sizeof HEADER - 1; s < end;) {
		const char *nl = line_end(s, end);
		if (!nl)
			return "the slice's limits file ends inside a line";
		if (starts_with(s, nl, "memory ")) {
			int i;
			uint64_t v;
			if (!parse_memory_line(s + 6, nl, &i, &v))
				return "the slice's limits file has a malformed memory line";
			if (*present & (1u << i))
				return "the slice's limits file has two memory lines for one GPU";
			*present |= 1u << i;
			bytes[i] = v;
		} else if (starts_with(s, nl, "cu-mask ")) {
			int i;
			uint32_t mask[CU_MASK_WORDS] = {0};
			if (!parse_cu_mask_line(s + 7, nl, &i, mask))
				return "the slice's limits file has a malformed cu-mask line";
			if (*mask_present & (1u << i))
				return "the slice's limits file has two cu-mask lines for one GPU";
			*mask_present |= 1u << i;
			memcpy(masks[i], mask, sizeof mask);
		}
		s = nl + 1;
	}
	return NULL;
}

const char *limits_parse(const char *text, size_t n, uint64_t bytes[HOOK_MAX_DEVICES], uint32_t *present)
{
	uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS], mask_present;
	return parse_all(text, n, bytes, present, masks, &mask_present);
}

const char *limits_parse_cu_masks(const char *text, size_t n, uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS],
				  uint32_t *mask_present)
{
	uint64_t bytes[HOOK_MAX_DEVICES];
	uint32_t present;
	memset(masks, 0, sizeof(uint32_t) * HOOK_MAX_DEVICES * CU_MASK_WORDS);
	return parse_all(text, n, bytes, &present, masks, mask_present);
}

static long statx_call(const char *path, struct statx *stx)
{
#ifdef SYS_statx
	return syscall(SYS_statx, AT_FDCWD, path, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT,
		       STATX_TYPE | STATX_INO | STATX_SIZE | STATX_MTIME | STATX_CTIME, stx);
#else
	(void)path;
	(void)stx;
	errno = ENOSYS;
	return -1;
#endif
}

/* 1 and key filled when the file could be looked at; 0 and *why when it is not a usable file;
 * -1 when the kernel has no statx (read every time). */
static int look(struct limits_key *key, const char **why)
{
	struct statx stx;
	memset(&stx, 0, sizeof stx);
	if (statx_call(limits_g.path, &stx) != 0) {
		if (errno == ENOSYS || errno == EPERM)
			return -1; /* no statx (old kernel, a seccomp filter): no key, read each time */
		*why = errno == ENOENT ? "the slice's limits file is missing" : "the slice's limits file cannot be looked at";
		return 0;
	}
	if ((stx.stx_mode & S_IFMT) != S_IFREG) {
		*why = "the slice's limits file is not a regular file";
		return 0;
	}
	key->ino = stx.stx_ino;
	key->size = stx.stx_size;
	key->mtime_s = stx.stx_mtime.tv_sec;
	key->mtime_ns = stx.stx_mtime.tv_nsec;
	key->ctime_s = stx.stx_ctime.tv_sec;
	key->ctime_ns = stx.stx_ctime.tv_nsec;
	return 1;
}

static int same_key(const struct limits_key *a)
{
	const struct limits_key *b = &limits_g.key;
	return a->ino == __atomic_load_n(&b->ino, __ATOMIC_ACQUIRE) && a->size == __atomic_load_n(&b->size, __ATOMIC_ACQUIRE) &&
	       a->mtime_s == __atomic_load_n(&b->mtime_s, __ATOMIC_ACQUIRE) &&
	       a->mtime_ns == __atomic_load_n(&b->mtime_ns, __ATOMIC_ACQUIRE) &&
	       a->ctime_s == __atomic_load_n(&b->ctime_s, __ATOMIC_ACQUIRE) &&
	       a->ctime_ns == __atomic_load_n(&b->ctime_ns, __ATOMIC_ACQUIRE);
}

static void store_key(const struct limits_key *k)
{
	struct limits_key *b = &limits_g.key;
	__atomic_store_n(&b->ino, k->ino, __ATOMIC_RELEASE);
	__atomic_store_n(&b->size, k->size, __ATOMIC_RELEASE);
	__atomic_store_n(&b->mtime_s, k->mtime_s, __ATOMIC_RELEASE);
	__atomic_store_n(&b->mtime_ns, k->mtime_ns, __ATOMIC_RELEASE);
	__atomic_store_n(&b->ctime_s, k->ctime_s, __ATOMIC_RELEASE);
	__atomic_store_n(&b->ctime_ns, k->ctime_ns, __ATOMIC_RELEASE);
}

static void set_state(int state, const char *why)
{
	__atomic_store_n(&limits_g.why, why, __ATOMIC_RELEASE);
	__atomic_store_n(&limits_g.state, state, __ATOMIC_RELEASE);
}

/* The reader's masks, when they differ from the last good read's (or are the first). */
static void publish_masks(uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS], uint32_t mask_present)
{
	if (__atomic_load_n(&limits_g.masks_changes, __ATOMIC_ACQUIRE) &&
	    __atomic_load_n(&limits_g.mask_present, __ATOMIC_ACQUIRE) == mask_present &&
	    !memcmp(limits_g.masks, masks, sizeof limits_g.masks)) /* the one writer: no torn read here */
		return;
	__atomic_add_fetch(&limits_g.masks_seq, 1, __ATOMIC_ACQ_REL);
	for (int d = 0; d < HOOK_MAX_DEVICES; d++)
		for (int w = 0; w < CU_MASK_WORDS; w++)
			__atomic_store_n(&limits_g.masks[d][w], masks[d][w], __ATOMIC_RELEASE);
	__atomic_store_n(&limits_g.mask_present, mask_present, __ATOMIC_RELEASE);
	__atomic_add_fetch(&limits_g.masks_changes, 1, __ATOMIC_ACQ_REL);
	__atomic_add_fetch(&limits_g.masks_seq, 1, __ATOMIC_ACQ_REL);
}

/* Read and parse the file; the new state. */
static void read_file(const struct limits_key *key, int have_key)
{
	char text[LIMITS_MAX_BYTES + 1];
	int fd = open(limits_g.path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		set_state(2, errno == ENOENT ? "the slice's limits file is missing"
					     : "the slice's limits file cannot be opened");
		return;
	}
	ssize_t n = read(fd, text, sizeof text);
	close(fd);
	if (n < 0) {
		set_state(2, "the slice's limits file cannot be read");
		return;
	}
	uint64_t bytes[HOOK_MAX_DEVICES] = {0};
	uint32_t present = 0, mask_present = 0, masks[HOOK_MAX_DEVICES][CU_MASK_WORDS];
	memset(masks, 0, sizeof masks);
	const char *why = parse_all(text, (size_t)n, bytes, &present, masks, &mask_present);
	if (why) {
		set_state(2, why);
		return;
	}
	for (int d = 0; d < HOOK_MAX_DEVICES; d++)
		__atomic_store_n(&limits_g.bytes[d], bytes[d], __ATOMIC_RELEASE);
	__atomic_store_n(&limits_g.present, present, __ATOMIC_RELEASE);
	publish_masks(masks, mask_present);
	struct timespec now = {0, 0};
	clock_gettime(CLOCK_REALTIME, &now);
	int stable = have_key && now.tv_sec - key->mtime_s >= STABLE_AFTER_S;
	__atomic_store_n(&limits_g.stable, stable, __ATOMIC_RELEASE);
	set_state(1, NULL);
}

/* 1 when this thread may read the file (and must call let_go()); 0 when another thread reads it. */
static int take_busy(void)
{
	int32_t me = (int32_t)getpid(), cur = 0;
	if (__atomic_compare_exchange_n(&limits_g.busy, &cur, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return 1;
	/* held by another process: a parent's thread at our fork(), which will never let go here */
	return cur != me && __atomic_compare_exchange_n(&limits_g.busy, &cur, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static void let_go(void)
{
	__atomic_store_n(&limits_g.busy, 0, __ATOMIC_RELEASE);
}

static void refresh(void)
{
	struct limits_key key;
	const char *why = NULL;
	memset(&key, 0, sizeof key);
	int looked = look(&key, &why);
	if (looked == 0) {
		if (take_busy()) {
			memset(&key, 0, sizeof key);
			store_key(&key);
			set_state(2, why);
			let_go();
		}
		return;
	}
	int state = __atomic_load_n(&limits_g.state, __ATOMIC_ACQUIRE);
	if (looked == 1 && state != 0 && __atomic_load_n(&limits_g.stable, __ATOMIC_ACQUIRE) && same_key(&key))
		return;
	if (!take_busy()) {
		while (__atomic_load_n(&limits_g.state, __ATOMIC_ACQUIRE) == 0) /* the first read: wait for it */
			sched_yield();
		return; /* another thread reads it now: the values as they are */
	}
	read_file(&key, looked == 1);
	store_key(&key);
	let_go();
}

void limits_check(void)
{
	if (limits_g.configured)
		refresh();
}

const char *limits_problem(void)
{
	if (!limits_g.configured || __atomic_load_n(&limits_g.state, __ATOMIC_ACQUIRE) == 1)
		return NULL;
	const char *why = __atomic_load_n(&limits_g.why, __ATOMIC_ACQUIRE);
	return why ? why : "the slice's limits file has not been read";
}

uint32_t limits_masks_changes(void)
{
	return __atomic_load_n(&limits_g.masks_changes, __ATOMIC_ACQUIRE);
}

uint32_t limits_cu_masks(uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS], uint32_t *mask_present)
{
	for (;;) {
		uint32_t seq = __atomic_load_n(&limits_g.masks_seq, __ATOMIC_ACQUIRE);
		if (seq & 1 && take_busy()) {
			/* the writer was a thread of the process we were fork()ed from, its set half written:
			 * no lines (every GPU keeps the mask in force) until the next look reads the file again */
			__atomic_store_n(&limits_g.mask_present, 0, __ATOMIC_RELEASE);
			__atomic_store_n(&limits_g.stable, 0, __ATOMIC_RELEASE);
			__atomic_add_fetch(&limits_g.masks_seq, 1, __ATOMIC_ACQ_REL);
			let_go();
			continue;
		}
		if (seq & 1) {
			sched_yield();
			continue;
		}
		uint32_t changes = __atomic_load_n(&limits_g.masks_changes, __ATOMIC_ACQUIRE);
		for (int d = 0; d < HOOK_MAX_DEVICES; d++)
			for (int w = 0; w < CU_MASK_WORDS; w++)
				masks[d][w] = __atomic_load_n(&limits_g.masks[d][w], __ATOMIC_ACQUIRE);
		*mask_present = __atomic_load_n(&limits_g.mask_present, __ATOMIC_ACQUIRE);
		if (__atomic_load_n(&limits_g.masks_seq, __ATOMIC_ACQUIRE) == seq)
			return changes;
	}
}

uint64_t limits_current(int dev, uint64_t env_bytes, const char **why)
{
	*why = NULL;
	if (!limits_g.configured || !env_bytes || dev < 0 || dev >= HOOK_MAX_DEVICES)
		return env_bytes;
	refresh();
	if (__atomic_load_n(&limits_g.state, __ATOMIC_ACQUIRE) != 1) {
		*why = __atomic_load_n(&limits_g.why, __ATOMIC_ACQUIRE);
		return 0;
	}
	if (!(__atomic_load_n(&limits_g.present, __ATOMIC_ACQUIRE) & (1u << dev))) {
		*why = "the slice's limits file has no memory line for a GPU the container has a slice of";
		return 0;
	}
	return __atomic_load_n(&limits_g.bytes[dev], __ATOMIC_ACQUIRE);
}
