/* A small, bounded JSON reader for rocshare-loadcheck: the OCI state and config.json are
 * untrusted input (the image and the pod spec write parts of them).
 *
 * Invariants:
 * - The whole document is tokenised up front into at most LC_JSON_MAX_TOKENS tokens, nesting at
 *   most LC_JSON_MAX_DEPTH deep; anything malformed, deeper or bigger is an error, never a guess.
 * - A token knows the index just past its subtree (`next`), so lookups skip values in O(1).
 * - Strings are decoded on demand into fresh NUL-terminated buffers; a string holding NUL
 *   (\u0000) is refused, since every consumer is a C string (a path, an env entry).
 */
#include "loadcheck.h"

#include <stdlib.h>
#include <string.h>

struct parser {
	const char *s;
	size_t len, pos;
	struct lc_json *doc;
};

static void skip_space(struct parser *p)
{
	while (p->pos < p->len && strchr(" \t\r\n", p->s[p->pos]) && p->s[p->pos])
		p->pos++;
}

static int new_token(struct parser *p, enum lc_json_type type)
{
	if (p->doc->count >= LC_JSON_MAX_TOKENS)
		return -1;
	int i = p->doc->count++;
	p->doc->tok[i] = (struct lc_json_token){.type = type, .start = p->pos};
	return i;
}

static int parse_value(struct parser *p, int depth);

static int scan_string(struct parser *p)
{
	p->pos++; /* the opening quote */
	while (p->pos < p->len) {
		unsigned char c = (unsigned char)p->s[p->pos];
		if (c == '"')
			return p->pos++, 0;
		if (c < 0x20)
			return -1;
		if (c == '\\') {
			if (++p->pos >= p->len || !strchr("\"\\/bfnrtu", p->s[p->pos]) || !p->s[p->pos])
				return -1;
		}
		p->pos++;
	}
	return -1;
}

static int parse_string(struct parser *p)
{
	int i = new_token(p, LC_JSON_STRING);
	if (i < 0 || scan_string(p) < 0)
		return -1;
	p->doc->tok[i].end = p->pos;
	p->doc->tok[i].next = p->doc->count;
	return 0;
}

static int parse_scalar(struct parser *p)
{
	int i = new_token(p, LC_JSON_SCALAR);
	if (i < 0)
		return -1;
	while (p->pos < p->len && (strchr("+-.0123456789eEtrufalsn", p->s[p->pos]) && p->s[p->pos]))
		p->pos++;
	if (p->pos == p->doc->tok[i].start)
		return -1;
	p->doc->tok[i].end = p->pos;
	p->doc->tok[i].next = p->doc->count;
	return 0;
}

/* Members of an object or elements of an array, up to the closing bracket. */
static int parse_container(struct parser *p, int depth, int object)
{
	int i = new_token(p, object ? LC_JSON_OBJECT : LC_JSON_ARRAY);
	if (i < 0)
		return -1;
	char close = object ? '}' : ']';
	p->pos++;
	skip_space(p);
	if (p->pos < p->len && p->s[p->pos] == close) {
		p->pos++;
	} else {
		for (;;) {
			skip_space(p);
			if (object) {
				if (p->pos >= p->len || p->s[p->pos] != '"' || parse_string(p) < 0)
					return -1;
				skip_space(p);
				if (p->pos >= p->len || p->s[p->pos++] != ':')
					return -1;
			}
			if (parse_value(p, depth + 1) < 0)
				return -1;
			skip_space(p);
			if (p->pos >= p->len)
				return -1;
			char c = p->s[p->pos++];
			if (c == close)
				break;
			if (c != ',')
				return -1;
		}
	}
	p->doc->tok[i].end = p->pos;
	p->doc->tok[i].next = p->doc->count;
	return 0;
}

static int parse_value(struct parser *p, int depth)
{
	if (depth > LC_JSON_MAX_DEPTH)
		return -1;
	skip_space(p);
	if (p->pos >= p->len)
		return -1;
	switch (p->s[p->pos]) {
	case '{':
		return parse_container(p, depth, 1);
	case '[':
		return parse_container(p, depth, 0);
	case '"':
		return parse_string(p);
	default:
		return parse_scalar(p);
	}
}

int lc_json_parse(struct lc_json *doc, const char *text, size_t len)
{
	struct parser p = {.s = text, .len = len, .doc = doc};
	doc->text = text;
	doc->count = 0;
	if (parse_value(&p, 0) < 0)
		return -1;
	skip_space(&p);
	return p.pos == len ? 0 : -1;
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static long read_hex4(const char *s, size_t left)
{
	long v = 0;
	if (left < 4)
		return -1;
	for (int k = 0; k < 4; k++) {
		int d = hex_digit(s[k]);
		if (d < 0)
			return -1;
		v = v * 16 + d;
	}
	return v;
}

static size_t put_utf8(char *out, unsigned long cp)
{
	if (cp < 0x80)
		return out[0] = (char)cp, 1;
	if (cp < 0x800)
		return out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
	if (cp < 0x10000) {
		out[0] = (char)(0xE0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (char)(0xF0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* One escape at s[*i] (just past the backslash); appends its bytes to out. */
static int decode_escape(const char *s, size_t end, size_t *i, char *out, size_t *o)
{
	static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
	char c = s[(*i)++];
	if (c != 'u') {
		out[(*o)++] = to[strchr(from, c) - from];
		return 0;
	}
	long cp = read_hex4(s + *i, end - *i);
	if (cp <= 0) /* malformed, or \u0000 */
		return -1;
	*i += 4;
	if (cp >= 0xD800 && cp <= 0xDBFF) {
		if (end - *i < 6 || s[*i] != '\\' || s[*i + 1] != 'u')
			return -1;
		long low = read_hex4(s + *i + 2, end - *i - 2);
		if (low < 0xDC00 || low > 0xDFFF)
			return -1;
		*i += 6;
		cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
	} else if (cp >= 0xDC00 && cp <= 0xDFFF) {
		return -1;
	}
	*o += put_utf8(out + *o, (unsigned long)cp);
	return 0;
}

char *lc_json_string(const struct lc_json *doc, int index)
{
	if (index < 0 || index >= doc->count || doc->tok[index].type != LC_JSON_STRING)
		return NULL;
	const char *s = doc->text;
	size_t i = doc->tok[index].start + 1, end = doc->tok[index].end - 1, o = 0;
	char *out = malloc(end - i + 1); /* decoding never grows a string */
	if (!out)
		return NULL;
	while (i < end) {
		if (s[i] == '\\') {
			i++;
			if (decode_escape(s, end, &i, out, &o) < 0)
				return free(out), NULL;
		} else if (s[i] == '\0') {
			return free(out), NULL;
		} else {
			out[o++] = s[i++];
		}
	}
	out[o] = '\0';
	return out;
}

int lc_json_get(const struct lc_json *doc, int object, const char *key)
{
	if (object < 0 || object >= doc->count || doc->tok[object].type != LC_JSON_OBJECT)
		return -1;
	int found = -1; /* the last of duplicate keys: what Go's encoding/json (runc) reads */
	for (int k = object + 1; k < doc->tok[object].next; k = doc->tok[k + 1].next) {
		char *name = lc_json_string(doc, k);
		if (name && strcmp(name, key) == 0)
			found = k + 1;
		free(name);
	}
	return found;
}

int lc_json_first(const struct lc_json *doc, int array)
{
	if (array < 0 || array >= doc->count || doc->tok[array].type != LC_JSON_ARRAY)
		return -1;
	return array + 1 < doc->tok[array].next ? array + 1 : -1;
}

int lc_json_next(const struct lc_json *doc, int array, int element)
{
	int n = doc->tok[element].next;
	return n < doc->tok[array].next ? n : -1;
}
