// SPDX-License-Identifier: GPL-2.0
/*
 * trialbed-bpf-cc: registers a BPF congestion control with its parameters, and reads or sets
 * the parameters of one that is registered. Output is JSON on stdout; errors go to stderr
 * with exit status 1 (2: bad usage or an unknown parameter).
 *
 *   trialbed-bpf-cc params OBJECT                  the object's parameters and their defaults
 *   trialbed-bpf-cc register OBJECT [NAME=VALUE]...
 *       load OBJECT with those parameters and register its tcp_congestion_ops; it stays
 *       registered after this program exits, until `bpftool struct_ops unregister id ID`.
 *       Prints {"id": ID, "params_map_id": MAP, "params": {...}}.
 *   trialbed-bpf-cc set MAP [NAME=VALUE]...
 *       write the parameters of a registered one (its params_map_id), in force from each
 *       connection's next ACK, as a module parameter is; without NAME=VALUE, only read them.
 *       Prints {"params": {...}}.
 *
 * A parameter is a global of the object's ".data.params" section (BPF_CC_PARAM in bpf_cc.h),
 * found by its name in the object's BTF: the loader knows no congestion control.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#define PARAMS_SECTION ".data.params"
#define MAX_PARAMS 32

struct param {
	const char *name;
	__u32 offset;
	__u32 size;
};

struct params {
	struct param list[MAX_PARAMS];
	int count;
};

static int fail(int status, const char *fmt, ...)
{
	va_list args;

	va_start(args, fmt);
	fprintf(stderr, "trialbed-bpf-cc: ");
	vfprintf(stderr, fmt, args);
	fputc('\n', stderr);
	va_end(args);
	return status;
}

/* The parameters: the variables of BTF's datasec PARAMS_SECTION (type id `sec_id`). */
static int read_params(const struct btf *btf, __u32 sec_id, struct params *out)
{
	const struct btf_type *sec = btf__type_by_id(btf, sec_id);
	const struct btf_var_secinfo *vsi;
	int i;

	if (!sec || !btf_is_datasec(sec))
		return fail(1, "no %s section in the BTF", PARAMS_SECTION);
	out->count = 0;
	for (i = 0, vsi = btf_var_secinfos(sec); i < btf_vlen(sec); i++, vsi++) {
		const struct btf_type *var = btf__type_by_id(btf, vsi->type);

		if (out->count == MAX_PARAMS)
			return fail(1, "more than %d parameters", MAX_PARAMS);
		if (vsi->size != 1 && vsi->size != 2 && vsi->size != 4 && vsi->size != 8)
			return fail(1, "parameter %s is not an integer",
				    btf__name_by_offset(btf, var->name_off));
		out->list[out->count].name = btf__name_by_offset(btf, var->name_off);
		out->list[out->count].offset = vsi->offset;
		out->list[out->count].size = vsi->size;
		out->count++;
	}
	return 0;
}

static unsigned long long get_value(const void *data, const struct param *p)
{
	const char *at = (const char *)data + p->offset;

	switch (p->size) {
	case 1: return *(const __u8 *)at;
	case 2: return *(const __u16 *)at;
	case 4: return *(const __u32 *)at;
	default: return *(const __u64 *)at;
	}
}

static void set_value(void *data, const struct param *p, unsigned long long v)
{
	char *at = (char *)data + p->offset;

	switch (p->size) {
	case 1: *(__u8 *)at = v; break;
	case 2: *(__u16 *)at = v; break;
	case 4: *(__u32 *)at = v; break;
	default: *(__u64 *)at = v;
	}
}

static void print_params(const struct params *ps, const void *data)
{
	int i;

	printf("{");
	for (i = 0; i < ps->count; i++)
		printf("%s\"%s\": %llu", i ? ", " : "", ps->list[i].name,
		       get_value(data, &ps->list[i]));
	printf("}");
}

/* Apply NAME=VALUE arguments to `data`; a name the object lacks is named with those it has. */
static int assign(const struct params *ps, void *data, int argc, char **argv)
{
	int i, j;

	for (i = 0; i < argc; i++) {
		char *eq = strchr(argv[i], '='), *end;
		unsigned long long v;
		const struct param *p = NULL;
		char have[512] = "";

		if (!eq || eq == argv[i])
			return fail(2, "'%s': a parameter is NAME=VALUE", argv[i]);
		*eq = '\0';
		for (j = 0; j < ps->count; j++) {
			if (!strcmp(ps->list[j].name, argv[i]))
				p = &ps->list[j];
			snprintf(have + strlen(have), sizeof(have) - strlen(have), "%s%s",
				 j ? ", " : "", ps->list[j].name);
		}
		if (!p)
			return fail(2, "no parameter '%s'; this one has: %s", argv[i], have);
		errno = 0;
		v = strtoull(eq + 1, &end, 0);
		if (errno || end == eq + 1 || *end || eq[1] == '-' ||
		    (p->size < 8 && v >> (8 * p->size)))
			return fail(2, "parameter '%s': '%s' is not an unsigned integer that fits",
				    argv[i], eq + 1);
		set_value(data, p, v);
	}
	return 0;
}

static struct bpf_map *params_map(struct bpf_object *obj)
{
	struct bpf_map *map;
	size_t len = strlen(PARAMS_SECTION);

	bpf_object__for_each_map(map, obj) {
		const char *name = bpf_map__name(map);

		if (strlen(name) >= len && !strcmp(name + strlen(name) - len, PARAMS_SECTION))
			return map;
	}
	return NULL;
}

static int open_object(const char *path, struct bpf_object **obj, struct bpf_map **map,
		       struct params *ps)
{
	const struct btf *btf;
	int sec_id;

	*obj = bpf_object__open_file(path, NULL);
	if (!*obj)
		return fail(1, "cannot open %s: %s", path, strerror(errno));
	*map = params_map(*obj);
	btf = bpf_object__btf(*obj);
	if (!*map || !btf)
		return fail(1, "%s has no %s section (BPF_CC_PARAM)", path, PARAMS_SECTION);
	sec_id = btf__find_by_name_kind(btf, PARAMS_SECTION, BTF_KIND_DATASEC);
	if (sec_id < 0)
		return fail(1, "%s has no BTF for %s", path, PARAMS_SECTION);
	return read_params(btf, sec_id, ps);
}

static int cmd_params(const char *path)
{
	struct bpf_object *obj;
	struct bpf_map *map;
	struct params ps;
	size_t size;
	int err = open_object(path, &obj, &map, &ps);

	if (err)
		return err;
	print_params(&ps, bpf_map__initial_value(map, &size));
	printf("\n");
	bpf_object__close(obj);
	return 0;
}

static __u32 map_id(int fd)
{
	struct bpf_map_info info = {};
	__u32 len = sizeof(info);

	return bpf_obj_get_info_by_fd(fd, &info, &len) ? 0 : info.id;
}

static int cmd_register(const char *path, int argc, char **argv)
{
	struct bpf_object *obj;
	struct bpf_map *map, *ops = NULL, *m;
	struct bpf_link *link;
	struct params ps;
	size_t size;
	void *data;
	int err = open_object(path, &obj, &map, &ps);

	if (err)
		return err;
	data = malloc(bpf_map__value_size(map));
	if (!data)
		return fail(1, "out of memory");
	memcpy(data, bpf_map__initial_value(map, &size), bpf_map__value_size(map));
	err = assign(&ps, data, argc, argv);
	if (err)
		return err;
	if (bpf_map__set_initial_value(map, data, bpf_map__value_size(map)))
		return fail(1, "cannot set the parameters of %s", path);
	bpf_object__for_each_map(m, obj) {
		if (bpf_map__type(m) == BPF_MAP_TYPE_STRUCT_OPS)
			ops = m;
	}
	if (!ops)
		return fail(1, "%s has no SEC(\".struct_ops\") table", path);
	if (bpf_object__load(obj))
		return fail(1, "cannot load %s (the verifier's log is above): %s", path,
			    strerror(errno));
	link = bpf_map__attach_struct_ops(ops);
	if (!link)
		return fail(1, "cannot register %s: %s (EEXIST: that name is taken)", path,
			    strerror(errno));
	/* Registered until unregistered by id: the kernel holds the map, not this process. */
	bpf_link__disconnect(link);
	bpf_link__destroy(link);
	printf("{\"id\": %u, \"params_map_id\": %u, \"params\": ", map_id(bpf_map__fd(ops)),
	       map_id(bpf_map__fd(map)));
	print_params(&ps, data);
	printf("}\n");
	free(data);
	bpf_object__close(obj);
	return 0;
}

static int cmd_set(const char *id_text, int argc, char **argv)
{
	struct bpf_map_info info = {};
	__u32 len = sizeof(info), zero = 0;
	struct params ps;
	struct btf *btf;
	char *end;
	void *data;
	unsigned long id = strtoul(id_text, &end, 10);
	int fd, err;

	if (!*id_text || *end)
		return fail(2, "'%s' is not a map id", id_text);
	fd = bpf_map_get_fd_by_id(id);
	if (fd < 0 || bpf_obj_get_info_by_fd(fd, &info, &len))
		return fail(1, "no map with id %s: %s", id_text, strerror(errno));
	btf = btf__load_from_kernel_by_id(info.btf_id);
	if (!btf || !strstr(info.name, PARAMS_SECTION))
		return fail(1, "map %s is not the %s of a BPF congestion control", id_text,
			    PARAMS_SECTION);
	err = read_params(btf, info.btf_value_type_id, &ps);
	if (err)
		return err;
	data = calloc(1, info.value_size);
	if (!data || bpf_map_lookup_elem(fd, &zero, data))
		return fail(1, "cannot read map %s: %s", id_text, strerror(errno));
	err = assign(&ps, data, argc, argv);
	if (err)
		return err;
	if (argc && bpf_map_update_elem(fd, &zero, data, BPF_ANY))
		return fail(1, "cannot write map %s: %s", id_text, strerror(errno));
	printf("{\"params\": ");
	print_params(&ps, data);
	printf("}\n");
	free(data);
	btf__free(btf);
	close(fd);
	return 0;
}

static int quiet(enum libbpf_print_level level, const char *fmt, va_list args)
{
	return level == LIBBPF_DEBUG ? 0 : vfprintf(stderr, fmt, args);
}

int main(int argc, char **argv)
{
	libbpf_set_print(quiet);
	if (argc >= 3 && !strcmp(argv[1], "params") && argc == 3)
		return cmd_params(argv[2]);
	if (argc >= 3 && !strcmp(argv[1], "register"))
		return cmd_register(argv[2], argc - 3, argv + 3);
	if (argc >= 3 && !strcmp(argv[1], "set"))
		return cmd_set(argv[2], argc - 3, argv + 3);
	fprintf(stderr, "usage: trialbed-bpf-cc params OBJECT\n"
			"       trialbed-bpf-cc register OBJECT [NAME=VALUE]...\n"
			"       trialbed-bpf-cc set PARAMS_MAP_ID [NAME=VALUE]...\n");
	return 2;
}
