/* SPDX-License-Identifier: GPL-2.0 */
/*
 * trialbed-bpf-tc's parts (trialbed_bpf_tc.c: the commands; loader_params.c: the
 * parameters, constants of the object's .rodata found by name in its BTF).
 */
#ifndef TRIALBED_BPF_TC_LOADER_H
#define TRIALBED_BPF_TC_LOADER_H

#include <bpf/btf.h>
#include <bpf/libbpf.h>

#define MAX_PARAMS 32

enum param_kind { P_INT, P_ENUM, P_DOUBLE };

struct param {
	const char *name;
	__u32 offset;
	__u32 size;
	enum param_kind kind;
	const struct btf_type *type;	/* the enum, for P_ENUM */
};

struct object {
	struct bpf_object *obj;
	const struct btf *btf;
	struct bpf_map *rodata;
	struct bpf_program *prog;
	struct param list[MAX_PARAMS];
	int count;
	void *data;	/* the .rodata image, parameters as set */
};

/* Print "trialbed-bpf-tc: <message>" on stderr; returns `status`. */
int fail(int status, const char *fmt, ...);
/* A variable's type, typedefs and qualifiers (const volatile) taken off. */
const struct btf_type *bare_type(const struct btf *btf, __u32 id);
/* The section `name`'s variables (BTF datasec) in `o->list`. */
int read_vars(struct object *o, const char *name);
/* {"NAME": value, ...} of o->data on stdout. */
void print_params(const struct object *o);
/* Apply NAME=VALUE arguments; a name the object lacks is named with those it has. */
int assign(struct object *o, int argc, char **argv);

#endif
