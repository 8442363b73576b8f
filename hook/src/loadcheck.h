/* rocshare-loadcheck: the OCI createContainer hook that refuses a slice container whose loader
 * cannot load the memory hook (loadcheck.c). Shared between its three files. */
#ifndef ROCSHARE_LOADCHECK_H
#define ROCSHARE_LOADCHECK_H

#include <stddef.h>

/* ---- JSON (loadcheck_json.c) ---- */
#define LC_JSON_MAX_TOKENS 65536
#define LC_JSON_MAX_DEPTH 64

enum lc_json_type { LC_JSON_OBJECT, LC_JSON_ARRAY, LC_JSON_STRING, LC_JSON_SCALAR };

struct lc_json_token {
	enum lc_json_type type;
	size_t start, end; /* byte range in the text, quotes and brackets included */
	int next;          /* index of the token just past this one's subtree */
};

struct lc_json {
	const char *text;
	int count;
	struct lc_json_token tok[LC_JSON_MAX_TOKENS];
};

int lc_json_parse(struct lc_json *doc, const char *text, size_t len);
int lc_json_get(const struct lc_json *doc, int object, const char *key); /* -1: absent */
char *lc_json_string(const struct lc_json *doc, int index);              /* malloc'ed; NULL: not a string */
int lc_json_first(const struct lc_json *doc, int array);                 /* -1: empty or not an array */
int lc_json_next(const struct lc_json *doc, int array, int element);     /* -1: past the end */

/* ---- ELF (loadcheck_elf.c): 64-bit little-endian files, every offset checked ---- */
#define LC_MAX_NAMES 256

struct lc_file {
	unsigned char *data;
	size_t size;
};

struct lc_names {
	int count;
	const char *name[LC_MAX_NAMES]; /* point into an lc_file's data */
	const char *file[LC_MAX_NAMES]; /* verneed only: the file each version is needed from */
};

int lc_read_fd(int fd, size_t max_bytes, struct lc_file *out); /* 0, or -1 with errno */
/* The ELF kind of a file: 0 not ELF, else e_machine | class<<16 | data<<24. */
unsigned lc_elf_kind(const struct lc_file *f);
/* PT_INTERP's path (NUL-terminated inside the file) or NULL; -1 on a malformed file. */
int lc_elf_interp(const struct lc_file *f, const char **interp);
int lc_elf_needed(const struct lc_file *f, struct lc_names *out);   /* DT_NEEDED names */
int lc_elf_verneed(const struct lc_file *f, struct lc_names *out);  /* versions needed, per file */
int lc_elf_verdef(const struct lc_file *f, struct lc_names *out);   /* versions defined */

#endif
