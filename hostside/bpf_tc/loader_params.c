// SPDX-License-Identifier: GPL-2.0
/*
 * trialbed-bpf-tc's parameters: the constants of an object's .rodata (BPF_TC_PARAM in
 * bpf_tc.h), found by their names in its BTF, read and set as integers, enums (by an
 * enumerator's name) or doubles (decimal text, read by strtod: rounded as Python's float()).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"

int fail(int status, const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	fprintf(stderr, "trialbed-bpf-tc: ");
	vfprintf(stderr, fmt, args);
	fputc('\n', stderr);
	va_end(args);
	return status;
}

/* A variable's type, typedefs and qualifiers (const volatile) taken off. */
const struct btf_type *bare_type(const struct btf *btf, __u32 id)
{
	const struct btf_type *t = btf__type_by_id(btf, id);

	while (t && (btf_is_typedef(t) || btf_is_const(t) || btf_is_volatile(t)))
		t = btf__type_by_id(btf, t->type);
	return t;
}

/* The section `name`'s variables (BTF datasec) in `o->list`. */
int read_vars(struct object *o, const char *name)
{
	int id = btf__find_by_name_kind(o->btf, name, BTF_KIND_DATASEC), i;
	const struct btf_type *sec;
	const struct btf_var_secinfo *vsi;

	o->count = 0;
	if (id < 0)
		return 0;	/* no parameters */
	sec = btf__type_by_id(o->btf, id);
	for (i = 0, vsi = btf_var_secinfos(sec); i < btf_vlen(sec); i++, vsi++) {
		const struct btf_type *var = btf__type_by_id(o->btf, vsi->type);
		const struct btf_type *t = bare_type(o->btf, var->type);
		struct param *p = &o->list[o->count];

		if (o->count == MAX_PARAMS)
			return fail(1, "more than %d parameters", MAX_PARAMS);
		p->name = btf__name_by_offset(o->btf, var->name_off);
		p->offset = vsi->offset;
		p->size = vsi->size;
		p->type = t;
		if (t && btf_is_int(t) && (p->size == 1 || p->size == 2 || p->size == 4 ||
					   p->size == 8))
			p->kind = P_INT;
		else if (t && btf_is_enum(t) && p->size == 4)
			p->kind = P_ENUM;
		else if (t && btf_kind(t) == BTF_KIND_FLOAT && p->size == 8)
			p->kind = P_DOUBLE;
		else
			return fail(1, "parameter %s is not an integer, an enum or a double",
				    p->name);
		o->count++;
	}
	return 0;
}

static unsigned long long get_int(const void *data, const struct param *p)
{
	const char *at = (const char *)data + p->offset;

	switch (p->size) {
	case 1: return *(const __u8 *)at;
	case 2: return *(const __u16 *)at;
	case 4: return *(const __u32 *)at;
	default: return *(const __u64 *)at;
	}
}

static void set_int(void *data, const struct param *p, unsigned long long v)
{
	char *at = (char *)data + p->offset;

	switch (p->size) {
	case 1: *(__u8 *)at = v; break;
	case 2: *(__u16 *)at = v; break;
	case 4: *(__u32 *)at = v; break;
	default: *(__u64 *)at = v;
	}
}

void print_params(const struct object *o)
{
	int i, j;

	printf("{");
	for (i = 0; i < o->count; i++) {
		const struct param *p = &o->list[i];
		const char *at = (const char *)o->data + p->offset;

		printf("%s\"%s\": ", i ? ", " : "", p->name);
		if (p->kind == P_DOUBLE) {
			double d;

			memcpy(&d, at, sizeof(d));
			printf("%.17g", d);
		} else if (p->kind == P_ENUM) {
			const struct btf_enum *e = btf_enum(p->type);
			__s32 v = *(const __s32 *)at;
			const char *name = NULL;

			for (j = 0; j < btf_vlen(p->type); j++, e++)
				if (e->val == v)
					name = btf__name_by_offset(o->btf, e->name_off);
			if (name)
				printf("\"%s\"", name);
			else
				printf("%d", v);
		} else {
			printf("%llu", get_int(o->data, p));
		}
	}
	printf("}");
}

/* VALUE for parameter p: 0, or 2 with the reason said. */
static int set_param(struct object *o, const struct param *p, const char *value)
{
	char *at = (char *)o->data + p->offset, *end, have[512] = "";
	unsigned long long v;
	double d;
	int j;

	errno = 0;
	if (p->kind == P_DOUBLE) {
		d = strtod(value, &end);
		if (errno || end == value || *end || !(d >= 0) || d > 1e300)
			return fail(2, "parameter '%s': '%s' is not a finite number >= 0", p->name,
				    value);
		memcpy(at, &d, sizeof(d));
		return 0;
	}
	if (p->kind == P_ENUM) {
		const struct btf_enum *e = btf_enum(p->type);

		for (j = 0; j < btf_vlen(p->type); j++, e++) {
			const char *name = btf__name_by_offset(o->btf, e->name_off);

			if (!strcmp(name, value)) {
				*(__s32 *)at = e->val;
				return 0;
			}
			snprintf(have + strlen(have), sizeof(have) - strlen(have), "%s%s",
				 j ? ", " : "", name);
		}
		return fail(2, "parameter '%s': '%s' is not one of %s", p->name, value, have);
	}
	v = strtoull(value, &end, 0);
	if (errno || end == value || *end || value[0] == '-' ||
	    (p->size < 8 && v >> (8 * p->size)))
		return fail(2, "parameter '%s': '%s' is not an unsigned integer that fits in %u bytes",
			    p->name, value, p->size);
	set_int(o->data, p, v);
	return 0;
}

/* Apply NAME=VALUE arguments; a name the object lacks is named with those it has. */
int assign(struct object *o, int argc, char **argv)
{
	int i, j, err;

	for (i = 0; i < argc; i++) {
		char *eq = strchr(argv[i], '='), have[512] = "";
		const struct param *p = NULL;

		if (!eq || eq == argv[i])
			return fail(2, "'%s': a parameter is NAME=VALUE", argv[i]);
		*eq = '\0';
		for (j = 0; j < o->count; j++) {
			if (!strcmp(o->list[j].name, argv[i]))
				p = &o->list[j];
			snprintf(have + strlen(have), sizeof(have) - strlen(have), "%s%s",
				 j ? ", " : "", o->list[j].name);
		}
		if (!p)
			return fail(2, "no parameter '%s'; this one has: %s", argv[i], have);
		err = set_param(o, p, eq + 1);
		if (err)
			return err;
	}
	return 0;
}
