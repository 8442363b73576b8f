/* The hook's own decimal number parsers, in place of strtol/strtoull/sscanf/atoi.
 *
 * Why: glibc >= 2.38 headers with _GNU_SOURCE (or C2x) redirect strtol, strtoull and the scanf
 * family to __isoc23_* symbols that only GLIBC_2.38 defines. A library built on such a system
 * is then refused by every older loader ("cannot be loaded as audit interface"), and the
 * container runs with no limit. These parsers need nothing from libc, so the hook's glibc floor
 * (hook/GLIBC_FLOOR) does not depend on where it is built.
 *
 * Both read base 10 only and, like strtol, skip leading blanks and set *end to the first
 * character not read (to s itself when no digit was read). Out of range values saturate.
 */
#include "hook.h"

#include <limits.h>

static const char *skip_blanks(const char *s)
{
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == '\f' || *s == '\v')
		s++;
	return s;
}

/* Digits from s on, saturating at UINT64_MAX; *end after the last digit, s when there is none. */
static uint64_t read_digits(const char *s, const char **end)
{
	uint64_t v = 0;
	const char *p = s;
	for (; *p >= '0' && *p <= '9'; p++) {
		unsigned digit = (unsigned)(*p - '0');
		v = v > (UINT64_MAX - digit) / 10 ? UINT64_MAX : v * 10 + digit;
	}
	*end = p;
	return v;
}

uint64_t parse_u64(const char *s, const char **end)
{
	const char *first = skip_blanks(s), *after;
	if (*first == '+')
		first++;
	uint64_t v = read_digits(first, &after);
	if (end)
		*end = after == first ? s : after;
	return v;
}

long parse_long(const char *s, const char **end)
{
	const char *first = skip_blanks(s), *after;
	int negative = *first == '-';
	if (*first == '-' || *first == '+')
		first++;
	uint64_t magnitude = read_digits(first, &after);
	if (end)
		*end = after == first ? s : after;
	if (after == first)
		return 0;
	if (negative)
		return magnitude > (uint64_t)LONG_MAX + 1 ? LONG_MIN : (long)(0 - magnitude);
	return magnitude > (uint64_t)LONG_MAX ? LONG_MAX : (long)magnitude;
}
