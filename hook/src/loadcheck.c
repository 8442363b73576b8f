/* rocshare-loadcheck: an OCI createContainer hook that refuses to start a slice container in which
 * the memory hook (an LD_AUDIT library) cannot load, so no slice runs unlimited unseen.
 *
 *   rocshare-loadcheck --library <host path of the hook> --audit-path <its path in the container>
 *   stdin: the OCI state (JSON; its "bundle" names the folder holding config.json)
 *   exit 0: the loader will load the hook; exit 1 with one line on stderr: why it will not
 *
 * The container's runtime (runc, crun) runs createContainer hooks after the container's mounts
 * and before pivot_root, so the root filesystem it reads holds the image and the pod's volumes.
 * What it refuses (the loader's own rules, glibc's rtld):
 * - LD_AUDIT in the final environment (config.json's process.env: the device plugin's, then the
 *   pod's env/envFrom, last wins) that does not name the hook, or no LD_AUDIT at all;
 * - a program the image does not have (nothing to check: fail closed), or one that is not an ELF
 *   file of the hook's class and machine (after following "#!" interpreters);
 * - a static program (no PT_INTERP: no loader runs), or a loader that is not glibc's (musl's);
 * - a library the hook needs (its DT_NEEDED) missing from the image, or one that does not define
 *   every version the hook needs from it (its verneed, read from the hook file itself: no floor
 *   is written here).
 * With --witness-dir, it first leaves an empty file <pod uid>_<container name> there (names from
 * the CRI's annotations), so the agent can tell a runtime that ignored the CDI device (the check
 * never ran) from one that ran it.
 * Every path inside the container is opened with openat2(RESOLVE_IN_ROOT): symlinks and ".." stay
 * inside the container's root, as they will for the program once it runs there.
 * What it cannot see is in docs/memory-hook.md (a program that execs a static binary later, a
 * process that drops LD_AUDIT for its children, direct KFD ioctls).
 */
#define _GNU_SOURCE
#include "loadcheck.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#define STATE_MAX_BYTES (1u << 20)
#define CONFIG_MAX_BYTES (16u << 20)
#define PROGRAM_PREFIX_BYTES (4u << 20) /* headers and PT_INTERP sit in the first page in practice */
#define LIBRARY_MAX_BYTES (256u << 20)
#define MAX_INTERPRETERS 4              /* "#!" chains the kernel follows (BINPRM_MAX_RECURSION) */
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define SYS_OPENAT2_NR 437               /* the same on every architecture */
#define LC_RESOLVE_NO_MAGICLINKS 0x02
#define LC_RESOLVE_IN_ROOT 0x10

struct open_how_v0 {
	uint64_t flags, mode, resolve;
};

struct container {
	char *witness; /* "<pod uid>_<container name>", or NULL when the annotations lack them */
	char *root;    /* host path of the root filesystem */
	char *program; /* process.args[0] as the pod/image wrote it */
	char *cwd;
	char **env;
	int env_count;
	unsigned long uid, gid; /* process.user */
	int no_new_privs;       /* process.noNewPrivileges: setuid bits and file capabilities do nothing */
};

struct options {
	const char *library;    /* the hook on the host */
	const char *audit_path; /* the hook's path inside the container */
	const char *witness_dir;
};

static const char *program_g = "?";

static void refuse(const char *format, ...) __attribute__((format(printf, 1, 2), noreturn));
static void refuse(const char *format, ...)
{
	char cause[1024];
	va_list args;
	va_start(args, format);
	vsnprintf(cause, sizeof cause, format, args);
	va_end(args);
	for (char *c = cause; *c; c++) /* one line, whatever the image's names hold */
		if (*c == '\n' || *c == '\r')
			*c = ' ';
	fprintf(stderr, "rocshare: refusing to start %s: %s; the GPU memory hook cannot load there, "
	        "so its slice would run without a memory limit\n", program_g, cause);
	exit(1);
}

/* ---- input: the OCI state and config.json ---- */

static struct lc_json *parse_json_fd(int fd, size_t max_bytes, const char *what, struct lc_file *text)
{
	static struct lc_json doc; /* 1.5 MiB of tokens: static, one document at a time */
	if (lc_read_fd(fd, max_bytes, text) < 0)
		refuse("cannot read %s: %s", what, strerror(errno));
	if (text->size >= max_bytes)
		refuse("%s is larger than %u bytes", what, (unsigned)max_bytes);
	if (lc_json_parse(&doc, (const char *)text->data, text->size) < 0)
		refuse("%s is not JSON this check can read (malformed, or too deep or large)", what);
	return &doc;
}

static char *bundle_of_state(void)
{
	struct lc_file text;
	struct lc_json *doc = parse_json_fd(0, STATE_MAX_BYTES, "the OCI state on stdin", &text);
	char *bundle = lc_json_string(doc, lc_json_get(doc, 0, "bundle"));
	if (!bundle || bundle[0] != '/')
		refuse("the OCI state on stdin names no absolute bundle");
	free(text.data);
	return bundle;
}

static char *join(const char *a, const char *b)
{
	char *out;
	if (asprintf(&out, "%s/%s", a, b) < 0)
		refuse("out of memory");
	return out;
}

static void read_env(const struct lc_json *doc, int process, struct container *c)
{
	int env = lc_json_get(doc, process, "env");
	c->env = calloc((size_t)doc->count + 1, sizeof *c->env);
	if (!c->env)
		refuse("out of memory");
	for (int e = lc_json_first(doc, env); e >= 0; e = lc_json_next(doc, env, e)) {
		char *entry = lc_json_string(doc, e);
		if (!entry)
			refuse("config.json's process.env holds an entry that is not a string");
		c->env[c->env_count++] = entry;
	}
}

/* An annotation's value if it is a short name of [a-z0-9-] (a pod uid, a container name), else NULL. */
static char *name_annotation(const struct lc_json *doc, const char *key)
{
	char *value = lc_json_string(doc, lc_json_get(doc, lc_json_get(doc, 0, "annotations"), key));
	if (value && (!value[0] || strlen(value) > 64 || value[strspn(value, "abcdefghijklmnopqrstuvwxyz0123456789-")])) {
		free(value);
		return NULL;
	}
	return value;
}

/* containerd names the pod's uid and the container in these annotations; CRI-O in the second pair. */
static char *witness_name(const struct lc_json *doc)
{
	char *uid = name_annotation(doc, "io.kubernetes.cri.sandbox-uid");
	char *container = name_annotation(doc, "io.kubernetes.cri.container-name");
	if (!uid)
		uid = name_annotation(doc, "io.kubernetes.pod.uid");
	if (!container)
		container = name_annotation(doc, "io.kubernetes.container.name");
	char *name = NULL;
	if (uid && container && asprintf(&name, "%s_%s", uid, container) < 0)
		name = NULL;
	free(uid), free(container);
	return name;
}

/* Best effort: a witness that cannot be written only makes the agent report the check as not run. */
static void leave_witness(const char *dir, const char *name)
{
	if (!dir || !name)
		return;
	int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dir_fd < 0)
		return;
	int fd = openat(dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd >= 0)
		close(fd);
	close(dir_fd);
}

/* A JSON number token's value (a uid, a gid); 0 when absent, and refused when it is not one. */
static unsigned long json_id(const struct lc_json *doc, int index)
{
	if (index < 0)
		return 0;
	const struct lc_json_token *t = &doc->tok[index];
	unsigned long v = 0;
	if (t->type != LC_JSON_SCALAR || t->end - t->start > 10)
		refuse("config.json's process.user is not a pair of numbers");
	for (size_t i = t->start; i < t->end; i++) {
		if (doc->text[i] < '0' || doc->text[i] > '9')
			refuse("config.json's process.user is not a pair of numbers");
		v = v * 10 + (unsigned long)(doc->text[i] - '0');
	}
	return v;
}

static int json_true(const struct lc_json *doc, int index)
{
	return index >= 0 && doc->tok[index].type == LC_JSON_SCALAR && doc->tok[index].end - doc->tok[index].start == 4 &&
	       strncmp(doc->text + doc->tok[index].start, "true", 4) == 0;
}

static void read_config(const char *bundle, struct container *c)
{
	char *path = join(bundle, "config.json");
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		refuse("cannot open %s: %s", path, strerror(errno));
	struct lc_file text;
	struct lc_json *doc = parse_json_fd(fd, CONFIG_MAX_BYTES, "config.json", &text);
	close(fd);
	char *root = lc_json_string(doc, lc_json_get(doc, lc_json_get(doc, 0, "root"), "path"));
	int process = lc_json_get(doc, 0, "process");
	c->program = lc_json_string(doc, lc_json_first(doc, lc_json_get(doc, process, "args")));
	c->cwd = lc_json_string(doc, lc_json_get(doc, process, "cwd"));
	if (!root || !c->program || !c->program[0])
		refuse("config.json names no root path or no program (process.args[0])");
	program_g = c->program;
	c->root = root[0] == '/' ? root : join(bundle, root);
	read_env(doc, process, c);
	int user = lc_json_get(doc, process, "user");
	c->uid = json_id(doc, lc_json_get(doc, user, "uid"));
	c->gid = json_id(doc, lc_json_get(doc, user, "gid"));
	c->no_new_privs = json_true(doc, lc_json_get(doc, process, "noNewPrivileges"));
	c->witness = witness_name(doc);
	free(text.data);
	free(path);
}

/* The value of the last `name=` entry (what getenv-by-replacement in the runtime keeps), or NULL. */
static const char *env_value(const struct container *c, const char *name)
{
	size_t n = strlen(name);
	const char *value = NULL;
	for (int i = 0; i < c->env_count; i++)
		if (strncmp(c->env[i], name, n) == 0 && c->env[i][n] == '=')
			value = c->env[i] + n + 1;
	return value;
}

/* ---- the checks ---- */

static int list_names(const char *list, const char *wanted)
{
	size_t n = strlen(wanted);
	for (const char *s = list; s && *s;) {
		size_t len = strcspn(s, ":");
		if (len == n && strncmp(s, wanted, n) == 0)
			return 1;
		s += len + (s[len] == ':');
	}
	return 0;
}

/* glibc's rtld adds every LD_AUDIT entry of the environment it is handed, so each must name the
 * hook (else a second entry could carry a different list; harmless, but nothing we vouch for). */
static void check_audit_env(const struct container *c, const char *audit_path)
{
	int seen = 0;
	for (int i = 0; i < c->env_count; i++) {
		if (strncmp(c->env[i], "LD_AUDIT=", 9) != 0)
			continue;
		if (!list_names(c->env[i] + 9, audit_path))
			refuse("its environment sets LD_AUDIT=%.200s, which does not name the hook %s "
			       "(a pod's env or envFrom replaces the device's)", c->env[i] + 9, audit_path);
		seen = 1;
	}
	if (!seen)
		refuse("its environment has no LD_AUDIT naming the hook %s", audit_path);
}

static int open_in_root(int root_fd, const char *path)
{
	struct open_how_v0 how = {.flags = O_RDONLY | O_CLOEXEC,
	                          .resolve = LC_RESOLVE_IN_ROOT | LC_RESOLVE_NO_MAGICLINKS};
	long fd;
	do {
		fd = syscall(SYS_OPENAT2_NR, root_fd, path, &how, sizeof how);
	} while (fd < 0 && (errno == EAGAIN || errno == EINTR));
	if (fd < 0 && errno == ENOSYS)
		refuse("this kernel has no openat2 (Linux 5.6+), so paths in the image cannot be resolved safely");
	return (int)fd;
}

static int open_executable(int root_fd, const char *path)
{
	int fd = open_in_root(root_fd, path);
	struct stat st;
	if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || !(st.st_mode & 0111))) {
		close(fd);
		return -1;
	}
	return fd;
}

/* args[0] as runc's exec finds it: with a slash, relative to cwd; else the first PATH entry. */
static int find_program(int root_fd, const struct container *c, char **found)
{
	if (strchr(c->program, '/')) {
		*found = c->program[0] == '/' ? strdup(c->program) : join(c->cwd ? c->cwd : "/", c->program);
		return open_executable(root_fd, *found);
	}
	const char *path = env_value(c, "PATH");
	path = path ? path : DEFAULT_PATH;
	while (*path) {
		size_t len = strcspn(path, ":");
		char *dir = strndup(path, len);
		*found = join(len ? dir : ".", c->program);
		free(dir);
		int fd = open_executable(root_fd, *found);
		if (fd >= 0)
			return fd;
		free(*found);
		path += len + (path[len] == ':');
	}
	*found = strdup(c->program);
	return -1;
}

static struct lc_file read_in_root(int root_fd, const char *path, size_t max_bytes)
{
	struct lc_file f = {0};
	int fd = open_in_root(root_fd, path);
	if (fd < 0)
		return f;
	if (lc_read_fd(fd, max_bytes, &f) < 0)
		f.data = NULL, f.size = 0;
	close(fd);
	return f;
}

/* "#!/bin/sh -e" -> "/bin/sh"; NULL when the file is no script. */
static char *script_interpreter(const struct lc_file *f)
{
	if (f->size < 2 || f->data[0] != '#' || f->data[1] != '!')
		return NULL;
	size_t i = 2, end;
	while (i < f->size && (f->data[i] == ' ' || f->data[i] == '\t'))
		i++;
	for (end = i; end < f->size && end < 256 && !strchr(" \t\n", f->data[end]) && f->data[end]; end++)
		;
	if (end == i)
		refuse("its script has an empty #! line");
	return strndup((const char *)f->data + i, end - i);
}

/* The ELF file that will run: the program, or the interpreter its "#!" names (recursively). */
/* glibc's loader runs a program that changes its credentials (setuid, setgid, file capabilities)
 * in secure mode, where LD_AUDIT names with a slash are dropped: the hook would not load. With
 * noNewPrivileges (allowPrivilegeEscalation: false) the kernel grants none of that. */
static void check_secure_exec(int fd, const struct container *c, const char *path)
{
	struct stat st;
	if (c->no_new_privs)
		return;
	if (fstat(fd, &st) < 0)
		refuse("cannot stat %s: %s", path, strerror(errno));
	if ((st.st_mode & S_ISUID) && st.st_uid != c->uid)
		refuse("%s is set-user-ID, so the loader runs it in secure mode and drops LD_AUDIT", path);
	if ((st.st_mode & S_ISGID) && (st.st_mode & S_IXGRP) && st.st_gid != c->gid)
		refuse("%s is set-group-ID, so the loader runs it in secure mode and drops LD_AUDIT", path);
	if (c->uid != 0 && fgetxattr(fd, "security.capability", NULL, 0) > 0)
		refuse("%s has file capabilities, so the loader runs it in secure mode and drops LD_AUDIT", path);
}

static struct lc_file program_elf(int root_fd, const struct container *c, char **path)
{
	int fd = find_program(root_fd, c, path);
	if (fd < 0)
		refuse("%s is not an executable file in the image (so its loader cannot be checked)", *path);
	struct lc_file f;
	for (int depth = 0; depth <= MAX_INTERPRETERS; depth++) {
		if (lc_read_fd(fd, PROGRAM_PREFIX_BYTES, &f) < 0)
			refuse("cannot read %s: %s", *path, strerror(errno));
		char *interpreter = script_interpreter(&f);
		if (!interpreter) { /* the ELF file the kernel runs: its credentials bits apply */
			check_secure_exec(fd, c, *path);
			close(fd);
			return f;
		}
		close(fd);
		free(f.data);
		free(*path);
		*path = interpreter;
		fd = open_executable(root_fd, interpreter);
		if (fd < 0)
			refuse("its script's interpreter %s is not an executable file in the image", interpreter);
	}
	refuse("its #! interpreters nest deeper than %d", MAX_INTERPRETERS);
}

static int defines_glibc(const struct lc_names *defs)
{
	for (int i = 0; i < defs->count; i++)
		if (strncmp(defs->name[i], "GLIBC_", 6) == 0)
			return 1;
	return 0;
}

/* The loader's search for a library the hook needs, in the container: LD_LIBRARY_PATH, then the
 * default and multiarch folders (ld.so.cache is not read: it lists files from these folders in
 * the images we know; an image that puts its libc elsewhere is refused as "missing"). */
static struct lc_file find_library(int root_fd, const struct container *c, const char *name,
                                   unsigned kind, char **path)
{
	static const char *const defaults[] = {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
	                                       "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
	                                       "/lib64", "/usr/lib64", "/lib", "/usr/lib", NULL};
	const char *ld_path = env_value(c, "LD_LIBRARY_PATH");
	char *dirs = strdup(ld_path ? ld_path : ""), *save = NULL;
	struct lc_file f = {0};
	for (char *dir = strtok_r(dirs, ":;", &save); dir; dir = strtok_r(NULL, ":;", &save)) {
		*path = join(dir, name);
		f = read_in_root(root_fd, *path, LIBRARY_MAX_BYTES);
		if (f.data && lc_elf_kind(&f) == kind)
			return free(dirs), f;
		free(f.data), free(*path);
	}
	free(dirs);
	for (int i = 0; defaults[i]; i++) {
		*path = join(defaults[i], name);
		f = read_in_root(root_fd, *path, LIBRARY_MAX_BYTES);
		if (f.data && lc_elf_kind(&f) == kind)
			return f;
		free(f.data), free(*path);
	}
	*path = NULL;
	return (struct lc_file){0};
}

static void check_versions(const char *file, const char *path, const struct lc_file *lib,
                           const struct lc_names *needs)
{
	struct lc_names defs;
	if (lc_elf_verdef(lib, &defs) < 0)
		refuse("%s in the image is malformed (its version definitions cannot be read)", path);
	for (int i = 0; i < needs->count; i++) {
		if (strcmp(needs->file[i], file) != 0)
			continue;
		int defined = 0;
		for (int k = 0; k < defs.count && !defined; k++)
			defined = strcmp(defs.name[k], needs->name[i]) == 0;
		if (!defined)
			refuse("the image's %s lacks version %s, which the hook needs (its C library is too old)",
			       path, needs->name[i]);
	}
}

static int add_once(struct lc_names *queue, const char *name)
{
	for (int k = 0; k < queue->count; k++)
		if (strcmp(queue->name[k], name) == 0)
			return 0;
	if (queue->count >= LC_MAX_NAMES)
		refuse("the hook's libraries need more than %d others", LC_MAX_NAMES);
	queue->name[queue->count++] = name;
	return 1;
}

/* Every library the hook needs, and what those need in turn, is in the image and defines every
 * version the hook needs of it. The loader opens the hook in a namespace of its own, where each
 * name (ld-linux-*.so.2, which libc.so.6 needs, included) is searched for as any library is. */
static void check_hook_needs(int root_fd, const struct container *c, const struct lc_file *hook)
{
	struct lc_names queue, needs, more;
	struct lc_file held[LC_MAX_NAMES];
	int held_count = 0;
	if (lc_elf_needed(hook, &queue) < 0 || lc_elf_verneed(hook, &needs) < 0)
		refuse("the hook library is malformed (internal error: check the node's hook install)");
	for (int i = 0; i < needs.count; i++) /* a version's file is needed even if not DT_NEEDED */
		add_once(&queue, needs.file[i]);
	for (int i = 0; i < queue.count; i++) {
		char *path;
		struct lc_file lib = find_library(root_fd, c, queue.name[i], lc_elf_kind(hook), &path);
		if (!lib.data)
			refuse("the image has no %s where the loader looks, which the hook needs", queue.name[i]);
		check_versions(queue.name[i], path, &lib, &needs);
		if (lc_elf_needed(&lib, &more) < 0)
			refuse("the image's %s is malformed", path);
		for (int k = 0; k < more.count; k++)
			add_once(&queue, more.name[k]); /* names point into lib, kept until the end */
		held[held_count++] = lib;
		free(path);
	}
	while (held_count > 0)
		free(held[--held_count].data);
}

static struct lc_file read_hook(const char *library)
{
	int fd = open(library, O_RDONLY | O_CLOEXEC);
	struct lc_file hook;
	if (fd < 0 || lc_read_fd(fd, LIBRARY_MAX_BYTES, &hook) < 0)
		refuse("the node's hook library %s cannot be read: %s", library, strerror(errno));
	close(fd);
	if (lc_elf_kind(&hook) == 0)
		refuse("the node's hook library %s is not an ELF file", library);
	return hook;
}

static void check_loader(int root_fd, const struct container *c, const struct lc_file *hook)
{
	char *path;
	struct lc_file program = program_elf(root_fd, c, &path);
	const char *interp;
	if (lc_elf_kind(&program) != lc_elf_kind(hook))
		refuse("%s is not an ELF program of the hook's class and machine", path);
	if (lc_elf_interp(&program, &interp) < 0)
		refuse("%s is a malformed ELF file", path);
	if (!interp)
		refuse("%s is a static executable (no program interpreter, so no loader runs the hook)", path);
	struct lc_file loader = read_in_root(root_fd, interp, LIBRARY_MAX_BYTES);
	struct lc_names defs;
	if (!loader.data)
		refuse("%s's loader %s is not in the image", path, interp);
	if (lc_elf_kind(&loader) != lc_elf_kind(hook) || lc_elf_verdef(&loader, &defs) < 0 || !defines_glibc(&defs))
		refuse("%s's loader %s is not glibc's%s (only glibc honours LD_AUDIT)", path, interp,
		       strstr(interp, "musl") ? " but musl's" : "");
	check_hook_needs(root_fd, c, hook);
	free(loader.data), free(program.data), free(path);
}

static void parse_options(int argc, char **argv, struct options *o)
{
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--library") == 0)
			o->library = argv[i + 1];
		else if (strcmp(argv[i], "--audit-path") == 0)
			o->audit_path = argv[i + 1];
		else if (strcmp(argv[i], "--witness-dir") == 0)
			o->witness_dir = argv[i + 1];
	}
	if (!o->library || !o->audit_path || argc % 2 == 0)
		refuse("usage: rocshare-loadcheck --library <host path> --audit-path <container path> [--witness-dir <dir>]");
}

int main(int argc, char **argv)
{
	struct options options = {0};
	struct container c = {0};
	parse_options(argc, argv, &options);
	char *bundle = bundle_of_state();
	read_config(bundle, &c);
	leave_witness(options.witness_dir, c.witness);
	check_audit_env(&c, options.audit_path);
	struct lc_file hook = read_hook(options.library);
	int root_fd = open(c.root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0)
		refuse("cannot open the container's root %s: %s", c.root, strerror(errno));
	check_loader(root_fd, &c, &hook);
	close(root_fd);
	free(hook.data);
	return 0;
}
