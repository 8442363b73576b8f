/* Shared declarations of the hook's two parts: the account (account.c) and the audit library with
 * its wrappers (hook.c). Nothing here is exported from the library. */
#ifndef ROCSHARE_HOOK_H
#define ROCSHARE_HOOK_H

#include <stddef.h>
#include <stdint.h>

#define HOOK_MAX_DEVICES 16
#define ACCOUNT_SLOTS 256 /* live processes one container's account holds */
#define CU_MASK_WORDS 8   /* 256 CUs, more than any AMD GPU has */

struct slot;

/* Map (or create) the container's account file once and claim a slot for my_pid. NULL, with the
 * reason in *why, when there is no slot to be had (every slot held by a live process, or the
 * account file exists but cannot be used): the caller then refuses limited allocations. */
struct slot *account_open(const char *dir_override, int my_pid, const char **why);
/* Map the account without claiming a slot (to leave a note); 1 when mapped. */
int account_attach(const char *dir_override, int my_pid);
/* Give a slot back (it must hold nothing: a spare one a racing thread also claimed). */
void account_close(struct slot *s);
/* Add bytes to device's use if the container's total stays within limit_bytes; 1 if added. */
int account_reserve(struct slot *s, int device, uint64_t bytes, uint64_t limit_bytes, int my_pid);
void account_release(struct slot *s, int device, uint64_t bytes);
/* Bytes in use on device by every live process of the container. */
uint64_t account_used(int device);
/* Give back what dead processes held. */
void account_refresh(int my_pid);
/* Leave text in the container's account (why a process was refused or runs unlimited). */
void account_note(const char *text);
/* Copy the last note to out; how many notes were written so far (0: none, or no account). */
uint32_t account_read_note(char *out, size_t out_bytes);

/* The node agent's account folder ($ROCSHARE_ACCOUNT_DIR, docs/container-account.md): when set, the
 * account is <dir>/usage.v3.acct there and nowhere else (no fallback folder, no private account). */
void account_use_agent_folder(const char *dir);
/* The most the container held on device since its account was made (0 without an account). */
uint64_t account_peak(int device);

/* The slice's limits file (limits.c): $ROCSHARE_SLICE_DIR/limits, re-read when it changes. */
void limits_configure(const char *slice_dir);
int limits_configured(void);
/* The limit now enforced on dev: env_bytes (the environment's) when no file is configured or dev
 * has no limit there, else the file's; 0 with *why when the file is configured and unusable. */
uint64_t limits_current(int dev, uint64_t env_bytes, const char **why);
/* Parse a limits file's text (version 1): NULL and bytes/present filled, or why it is refused. */
const char *limits_parse(const char *text, size_t n, uint64_t bytes[HOOK_MAX_DEVICES], uint32_t *present);
/* The same file's cu-mask lines (bit d of *mask_present: a line for GPU d), or why it is refused. */
const char *limits_parse_cu_masks(const char *text, size_t n, uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS],
				  uint32_t *mask_present);
/* Look at the file now (one statx; a read when it changed); nothing without a configured file. */
void limits_check(void);
/* Why the configured file is unusable now (NULL: it is good, or none is configured). */
const char *limits_problem(void);
/* How many good reads brought other CU masks than the last good one (0: no good read yet). */
uint32_t limits_masks_changes(void);
/* The CU masks of the last good read, copied whole; returns limits_masks_changes() of that copy. */
uint32_t limits_cu_masks(uint32_t masks[HOOK_MAX_DEVICES][CU_MASK_WORDS], uint32_t *mask_present);

/* Decimal numbers, without libc's strto* (parse.c says why). Like strtoull/strtol in base 10:
 * leading blanks skipped, *end (if not NULL) after the last digit or s when none was read,
 * saturating when out of range. parse_u64 takes no sign but '+'. */
uint64_t parse_u64(const char *s, const char **end);
long parse_long(const char *s, const char **end);

#endif
