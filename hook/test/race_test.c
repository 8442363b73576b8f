/* The account under a race at the limit: N processes (two threads each) released together through a
 * barrier (a pipe all of them block on until the parent closes it), each repeatedly asking for half
 * the limit and freeing it. The test keeps its own count of granted bytes in shared memory (added
 * after a grant, taken off before the release), so at every moment it is at most what the account
 * holds: it must never pass the limit. It must reach the limit (two halves held at once), or the
 * run proved nothing. account.c is linked straight in (test/run.sh runs it in every build). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/hook.h"

#define PROCESSES 8
#define THREADS 2
#define ROUNDS 1500
#define LIMIT_BYTES (64ull << 20)
#define HALF_BYTES (LIMIT_BYTES / 2)

struct shared {
	uint64_t granted_bytes;    /* the test's own count of what is held right now */
	uint64_t high_water_bytes; /* the most it ever was */
	uint64_t over_limit;       /* times it was seen past the limit */
	uint64_t grants, refusals;
};

static struct shared *shared_g;
static struct slot *slot_g;

static void note_grant(void)
{
	uint64_t now = __atomic_add_fetch(&shared_g->granted_bytes, HALF_BYTES, __ATOMIC_SEQ_CST);
	uint64_t high = __atomic_load_n(&shared_g->high_water_bytes, __ATOMIC_RELAXED);
	while (now > high && !__atomic_compare_exchange_n(&shared_g->high_water_bytes, &high, now, 0, __ATOMIC_RELAXED,
							  __ATOMIC_RELAXED))
		;
	if (now > LIMIT_BYTES)
		__atomic_add_fetch(&shared_g->over_limit, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&shared_g->grants, 1, __ATOMIC_RELAXED);
}

static void *ask_and_free(void *unused)
{
	(void)unused;
	int pid = getpid();
	for (int i = 0; i < ROUNDS; i++) {
		if (!account_reserve(slot_g, 0, HALF_BYTES, LIMIT_BYTES, pid)) {
			__atomic_add_fetch(&shared_g->refusals, 1, __ATOMIC_RELAXED);
			continue;
		}
		note_grant();
		sched_yield(); /* hold it a moment, so others ask while it is held */
		__atomic_sub_fetch(&shared_g->granted_bytes, HALF_BYTES, __ATOMIC_SEQ_CST);
		account_release(slot_g, 0, HALF_BYTES);
	}
	return NULL;
}

static int child(const char *dir, int barrier_fd)
{
	const char *why = NULL;
	slot_g = account_open(dir, getpid(), &why);
	if (!slot_g) {
		fprintf(stderr, "no slot: %s\n", why);
		return 2;
	}
	char byte;
	if (read(barrier_fd, &byte, 1) != 0) /* EOF: the parent let everyone go at once */
		return 2;
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, ask_and_free, NULL);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	return 0;
}

int main(void)
{
	char dir[] = "/tmp/rocshare-race-test-XXXXXX";
	int barrier[2];
	shared_g = mmap(NULL, sizeof *shared_g, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (!mkdtemp(dir) || shared_g == MAP_FAILED || pipe(barrier) != 0)
		return 2;
	pid_t pids[PROCESSES];
	for (int i = 0; i < PROCESSES; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			close(barrier[1]);
			_exit(child(dir, barrier[0]));
		}
	}
	close(barrier[0]);
	close(barrier[1]);
	int failures = 0;
	for (int i = 0; i < PROCESSES; i++) {
		int status = 0;
		waitpid(pids[i], &status, 0);
		failures += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
	}
	printf("race: %d processes x %d threads x %d rounds of %llu MiB under %llu MiB: %llu granted, %llu refused, "
	       "high water %llu MiB, %llu times past the limit\n",
	       PROCESSES, THREADS, ROUNDS, HALF_BYTES >> 20, LIMIT_BYTES >> 20, (unsigned long long)shared_g->grants,
	       (unsigned long long)shared_g->refusals, (unsigned long long)(shared_g->high_water_bytes >> 20),
	       (unsigned long long)shared_g->over_limit);
	failures += shared_g->over_limit != 0 || shared_g->high_water_bytes > LIMIT_BYTES;
	failures += shared_g->high_water_bytes != LIMIT_BYTES || shared_g->refusals == 0; /* it did race */
	printf("%s: %d failures\n", failures ? "FAIL" : "ok", failures);
	return failures != 0;
}
