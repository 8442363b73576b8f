/* ELF facts rocshare-loadcheck needs, read from untrusted files (the image's program and libraries).
 *
 * Invariants:
 * - Only 64-bit little-endian ELF is read (the hook is built for x86_64 or aarch64); anything else
 *   is reported as "not ELF" or malformed, and the caller refuses.
 * - Every offset, size and count is checked against the bytes read before it is used; structures
 *   are copied out with memcpy (a file owes us no alignment); strings must end inside their table.
 * - Versions (verdef/verneed) and DT_NEEDED come from the section headers (SHT_GNU_verdef,
 *   SHT_GNU_verneed, SHT_DYNAMIC and their sh_link string tables), which is where binutils and
 *   the glibc build put them; a library without them cannot be checked and is treated as such.
 */
#include "loadcheck.h"

#include <elf.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int lc_read_fd(int fd, size_t max_bytes, struct lc_file *out)
{
	size_t cap = 65536, n = 0;
	unsigned char *buf = malloc(cap);
	if (!buf)
		return -1;
	for (;;) {
		if (n == cap) {
			if (cap >= max_bytes)
				break; /* a prefix: enough for headers, the caller bounds-checks the rest */
			size_t grown = cap * 2 > max_bytes ? max_bytes : cap * 2;
			unsigned char *bigger = realloc(buf, grown);
			if (!bigger)
				return free(buf), -1;
			buf = bigger, cap = grown;
		}
		ssize_t got = read(fd, buf + n, cap - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return free(buf), -1;
		if (got == 0)
			break;
		n += (size_t)got;
	}
	out->data = buf, out->size = n;
	return 0;
}

static int in_file(const struct lc_file *f, uint64_t offset, uint64_t length)
{
	return offset <= f->size && length <= f->size - offset;
}

static int header(const struct lc_file *f, Elf64_Ehdr *eh)
{
	if (!in_file(f, 0, sizeof *eh))
		return -1;
	memcpy(eh, f->data, sizeof *eh);
	if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
	    eh->e_ident[EI_DATA] != ELFDATA2LSB)
		return -1;
	return 0;
}

unsigned lc_elf_kind(const struct lc_file *f)
{
	if (!in_file(f, 0, 20) || memcmp(f->data, ELFMAG, SELFMAG) != 0)
		return 0;
	uint16_t machine;
	memcpy(&machine, f->data + 18, sizeof machine); /* e_machine: same offset in both classes */
	return machine | (unsigned)f->data[EI_CLASS] << 16 | (unsigned)f->data[EI_DATA] << 24;
}

int lc_elf_interp(const struct lc_file *f, const char **interp)
{
	Elf64_Ehdr eh;
	*interp = NULL;
	if (header(f, &eh) < 0 || eh.e_phentsize != sizeof(Elf64_Phdr) ||
	    !in_file(f, eh.e_phoff, (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr)))
		return -1;
	for (unsigned i = 0; i < eh.e_phnum; i++) {
		Elf64_Phdr ph;
		memcpy(&ph, f->data + eh.e_phoff + i * sizeof ph, sizeof ph);
		if (ph.p_type != PT_INTERP)
			continue;
		if (ph.p_filesz < 2 || !in_file(f, ph.p_offset, ph.p_filesz) ||
		    f->data[ph.p_offset + ph.p_filesz - 1] != '\0')
			return -1;
		*interp = (const char *)f->data + ph.p_offset;
		return strlen(*interp) == ph.p_filesz - 1 ? 0 : -1;
	}
	return 0;
}

/* The section of `type`, and the string table its sh_link names. */
static int section(const struct lc_file *f, uint32_t type, Elf64_Shdr *sec, Elf64_Shdr *strtab)
{
	Elf64_Ehdr eh;
	if (header(f, &eh) < 0 || eh.e_shentsize != sizeof(Elf64_Shdr) ||
	    !in_file(f, eh.e_shoff, (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr)))
		return -1;
	for (unsigned i = 0; i < eh.e_shnum; i++) {
		memcpy(sec, f->data + eh.e_shoff + i * sizeof *sec, sizeof *sec);
		if (sec->sh_type != type)
			continue;
		if (sec->sh_link >= eh.e_shnum || !in_file(f, sec->sh_offset, sec->sh_size))
			return -1;
		memcpy(strtab, f->data + eh.e_shoff + sec->sh_link * sizeof *strtab, sizeof *strtab);
		if (!in_file(f, strtab->sh_offset, strtab->sh_size))
			return -1;
		return 1;
	}
	return 0;
}

static const char *string_at(const struct lc_file *f, const Elf64_Shdr *strtab, uint64_t offset)
{
	if (offset >= strtab->sh_size)
		return NULL;
	const char *s = (const char *)f->data + strtab->sh_offset + offset;
	return memchr(s, '\0', strtab->sh_size - offset) ? s : NULL;
}

static int add_name(struct lc_names *out, const char *name, const char *file)
{
	if (!name || out->count >= LC_MAX_NAMES)
		return -1;
	out->name[out->count] = name;
	out->file[out->count++] = file;
	return 0;
}

int lc_elf_needed(const struct lc_file *f, struct lc_names *out)
{
	Elf64_Shdr dyn, strtab;
	out->count = 0;
	int found = section(f, SHT_DYNAMIC, &dyn, &strtab);
	if (found <= 0)
		return found;
	for (uint64_t off = 0; off + sizeof(Elf64_Dyn) <= dyn.sh_size; off += sizeof(Elf64_Dyn)) {
		Elf64_Dyn d;
		memcpy(&d, f->data + dyn.sh_offset + off, sizeof d);
		if (d.d_tag == DT_NULL)
			break;
		if (d.d_tag == DT_NEEDED && add_name(out, string_at(f, &strtab, d.d_un.d_val), NULL) < 0)
			return -1;
	}
	return 0;
}

/* Walks a chain of records linked by relative offsets, at most `limit` of them, inside `sec`. */
static int chain_ok(const Elf64_Shdr *sec, uint64_t at, uint64_t record_bytes)
{
	return at <= sec->sh_size && record_bytes <= sec->sh_size - at;
}

int lc_elf_verneed(const struct lc_file *f, struct lc_names *out)
{
	Elf64_Shdr sec, strtab;
	out->count = 0;
	int found = section(f, SHT_GNU_verneed, &sec, &strtab);
	if (found <= 0)
		return found;
	uint64_t at = 0;
	for (int files = 0; files < LC_MAX_NAMES; files++) {
		Elf64_Verneed vn;
		if (!chain_ok(&sec, at, sizeof vn))
			return -1;
		memcpy(&vn, f->data + sec.sh_offset + at, sizeof vn);
		const char *file = string_at(f, &strtab, vn.vn_file);
		uint64_t aux = at + vn.vn_aux;
		for (unsigned k = 0; k < vn.vn_cnt; k++) {
			Elf64_Vernaux va;
			if (!chain_ok(&sec, aux, sizeof va))
				return -1;
			memcpy(&va, f->data + sec.sh_offset + aux, sizeof va);
			if (!file || add_name(out, string_at(f, &strtab, va.vna_name), file) < 0)
				return -1;
			aux += va.vna_next;
		}
		if (vn.vn_next == 0)
			return 0;
		at += vn.vn_next;
	}
	return -1;
}

int lc_elf_verdef(const struct lc_file *f, struct lc_names *out)
{
	Elf64_Shdr sec, strtab;
	out->count = 0;
	int found = section(f, SHT_GNU_verdef, &sec, &strtab);
	if (found <= 0)
		return found;
	uint64_t at = 0;
	for (int defs = 0; defs < LC_MAX_NAMES; defs++) {
		Elf64_Verdef vd;
		Elf64_Verdaux va;
		if (!chain_ok(&sec, at, sizeof vd))
			return -1;
		memcpy(&vd, f->data + sec.sh_offset + at, sizeof vd);
		if (vd.vd_cnt > 0) { /* the first aux names the version itself; the rest are parents */
			if (!chain_ok(&sec, at + vd.vd_aux, sizeof va))
				return -1;
			memcpy(&va, f->data + sec.sh_offset + at + vd.vd_aux, sizeof va);
			if (add_name(out, string_at(f, &strtab, va.vda_name), NULL) < 0)
				return -1;
		}
		if (vd.vd_next == 0)
			return 0;
		at += vd.vd_next;
	}
	return -1;
}
