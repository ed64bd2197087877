// SPDX-License-Identifier: GPL-2.0
/*
 * trialbed-bpf-tc: loads a tc BPF program of hostside/bpf_tc/ with its parameters, onto an
 * interface's ingress or onto packets from a file, and reads its counters. Output is JSON on
 * stdout; errors go to stderr with exit status 1 (2: bad usage or an unknown parameter).
 *
 *   trialbed-bpf-tc params OBJECT          the object's parameters and their defaults
 *   trialbed-bpf-tc attach OBJECT IFACE... [NAME=VALUE]...
 *       load OBJECT once with those parameters and attach its program to each IFACE's
 *       ingress (clsact, direct action; the clsact qdisc is added where there is none),
 *       replacing the one this command attached there before: one program, one set of maps
 *       for all. It stays attached after this program exits. Prints {"prog_id", "handle",
 *       "priority", "interfaces": {IFACE: {"ifindex", "clsact_added"}}, "maps", "params"}.
 *   trialbed-bpf-tc detach IFACE...
 *       remove what attach put on each IFACE's ingress (the clsact qdisc stays: other
 *       filters may use it). Prints {IFACE: whether there was one}.
 *   trialbed-bpf-tc stats PROG_ID
 *       the program's counters (its map "stats": a per-CPU array of one struct of __u64,
 *       summed over the CPUs) and how many entries each of its hash maps holds.
 *   trialbed-bpf-tc run OBJECT IN OUT [NAME=VALUE]...
 *       load OBJECT and run its program on each packet of IN with BPF_PROG_TEST_RUN (no
 *       interface): IN holds records <u64 now_ns><u32 length><frame>, OUT gets
 *       <u32 verdict><u32 length><frame as the program left it>, little-endian. now_ns is
 *       written to the program's .bss variable test_now_ns before each packet. Prints
 *       {"packets", "params", "stats", "maps"}.
 *
 * A parameter is a constant of the object's .rodata (BPF_TC_PARAM in bpf_tc.h), found by its
 * name in the object's BTF: an integer, an enum (VALUE is an enumerator's name) or a double
 * (VALUE is decimal text, read as C reads it: strtod rounds as Python's float() does). The
 * loader knows no program.
 */
#include <errno.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include "loader.h"

#define MAX_FRAME 65536
#define MAX_IFACES 64
#define HANDLE 0x7b	/* this tool's filter on an ingress: handle and priority */
#define PRIORITY 0x7b

static struct bpf_map *section_map(struct bpf_object *obj, const char *section)
{
	struct bpf_map *map;
	size_t len = strlen(section);

	bpf_object__for_each_map(map, obj) {
		const char *name = bpf_map__name(map);

		if (strlen(name) >= len && !strcmp(name + strlen(name) - len, section))
			return map;
	}
	return NULL;
}

/* Open OBJECT, find its one program and its parameters, apply NAME=VALUE arguments. */
static int open_object(const char *path, struct object *o, int argc, char **argv)
{
	size_t size;
	int err;

	memset(o, 0, sizeof(*o));
	o->obj = bpf_object__open_file(path, NULL);
	if (!o->obj)
		return fail(1, "cannot open %s: %s", path, strerror(errno));
	o->btf = bpf_object__btf(o->obj);
	o->prog = bpf_object__next_program(o->obj, NULL);
	if (!o->btf || !o->prog || bpf_object__next_program(o->obj, o->prog))
		return fail(1, "%s: not one program with BTF (build it with clang -g)", path);
	bpf_program__set_type(o->prog, BPF_PROG_TYPE_SCHED_CLS);
	err = read_vars(o, ".rodata");
	if (err)
		return err;
	o->rodata = section_map(o->obj, ".rodata");
	if (!o->rodata)
		return argc ? fail(2, "%s has no parameters", path) : 0;
	o->data = malloc(bpf_map__value_size(o->rodata));
	if (!o->data)
		return fail(1, "out of memory");
	memcpy(o->data, bpf_map__initial_value(o->rodata, &size),
	       bpf_map__value_size(o->rodata));
	err = assign(o, argc, argv);
	if (err)
		return err;
	if (bpf_map__set_initial_value(o->rodata, o->data, bpf_map__value_size(o->rodata)))
		return fail(1, "cannot set the parameters of %s", path);
	return 0;
}

static int load(const char *path, struct object *o)
{
	if (bpf_object__load(o->obj))
		return fail(1, "cannot load %s (the verifier's log is above): %s", path,
			    strerror(errno));
	return 0;
}

static void print_map_ids(struct bpf_object *obj)
{
	struct bpf_map_info info;
	struct bpf_map *map;
	__u32 len;
	int n = 0;

	printf("{");
	bpf_object__for_each_map(map, obj) {
		memset(&info, 0, sizeof(info));
		len = sizeof(info);
		if (!bpf_obj_get_info_by_fd(bpf_map__fd(map), &info, &len))
			printf("%s\"%s\": %u", n++ ? ", " : "", bpf_map__name(map), info.id);
	}
	printf("}");
}

/* The counters of map fd `fd` (per-CPU array, one struct of __u64 members) and `btf`. */
static int print_stats(int fd, const struct bpf_map_info *info, const struct btf *btf)
{
	const struct btf_type *t = bare_type(btf, info->btf_value_type_id);
	const struct btf_member *m;
	int cpus = libbpf_num_possible_cpus(), i, c;
	__u32 zero = 0;
	__u64 *values;

	if (cpus < 0 || !t || !btf_is_struct(t) || info->value_size % 8)
		return fail(1, "map %s is not a per-CPU array of counters", info->name);
	values = calloc(cpus, info->value_size);
	if (!values || bpf_map_lookup_elem(fd, &zero, values))
		return fail(1, "cannot read map %s: %s", info->name, strerror(errno));
	printf("{");
	for (i = 0, m = btf_members(t); i < btf_vlen(t); i++, m++) {
		__u64 sum = 0;

		for (c = 0; c < cpus; c++)
			sum += values[c * info->value_size / 8 + m->offset / 64];
		printf("%s\"%s\": %llu", i ? ", " : "", btf__name_by_offset(btf, m->name_off),
		       (unsigned long long)sum);
	}
	printf("}");
	free(values);
	return 0;
}

/* {"stats": {...}, "maps": {"NAME": {"id", "entries"}}} of the maps of program `prog_fd`. */
static int print_counters(int prog_fd)
{
	struct bpf_prog_info info = {};
	__u32 len = sizeof(info), ids[16], i, n;
	int err = 0, listed = 0;

	info.nr_map_ids = 16;
	info.map_ids = (__u64)(unsigned long)ids;
	if (bpf_obj_get_info_by_fd(prog_fd, &info, &len))
		return fail(1, "cannot read the program's maps: %s", strerror(errno));
	n = info.nr_map_ids < 16 ? info.nr_map_ids : 16;
	printf("\"stats\": ");
	for (i = 0; i < n && !err; i++) {
		struct bpf_map_info mi = {};
		__u32 mlen = sizeof(mi);
		int fd = bpf_map_get_fd_by_id(ids[i]);
		struct btf *btf;

		if (fd < 0 || bpf_obj_get_info_by_fd(fd, &mi, &mlen))
			return fail(1, "cannot read map %u: %s", ids[i], strerror(errno));
		if (!strcmp(mi.name, "stats")) {
			btf = btf__load_from_kernel_by_id(mi.btf_id);
			err = btf ? print_stats(fd, &mi, btf) : fail(1, "map stats has no BTF");
			btf__free(btf);
			listed = 1;
		}
		close(fd);
	}
	if (!listed && !err)
		printf("null");
	printf(", \"maps\": {");
	for (i = 0, listed = 0; i < n && !err; i++) {
		struct bpf_map_info mi = {};
		__u32 mlen = sizeof(mi);
		int fd = bpf_map_get_fd_by_id(ids[i]);
		char key[256], next[256];
		void *prev = NULL;
		__u64 entries = 0;

		if (fd < 0 || bpf_obj_get_info_by_fd(fd, &mi, &mlen))
			return fail(1, "cannot read map %u: %s", ids[i], strerror(errno));
		if (mi.type == BPF_MAP_TYPE_HASH && mi.key_size <= sizeof(key)) {
			while (!bpf_map_get_next_key(fd, prev, next)) {
				entries++;
				memcpy(key, next, mi.key_size);
				prev = key;
			}
			printf("%s\"%s\": {\"id\": %u, \"entries\": %llu}", listed++ ? ", " : "",
			       mi.name, mi.id, (unsigned long long)entries);
		}
		close(fd);
	}
	printf("}");
	return err;
}

static int ifindex_of(const char *iface, unsigned int *ifindex)
{
	char path[64 + IF_NAMESIZE];
	FILE *f;
	int type = -1;

	*ifindex = if_nametoindex(iface);
	if (!*ifindex)
		return fail(1, "no interface %s", iface);
	snprintf(path, sizeof(path), "/sys/class/net/%s/type", iface);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%d", &type) != 1)
			type = -1;
		fclose(f);
	}
	if (type != 1)	/* ARPHRD_ETHER: the programs read the IP header after 14 bytes */
		return fail(1, "%s is not an Ethernet interface (type %d)", iface, type);
	return 0;
}

/* IFACE... [NAME=VALUE]...: the interfaces (words without '=') come first. */
static int count_ifaces(int argc, char **argv)
{
	int n = 0;

	while (n < argc && !strchr(argv[n], '='))
		n++;
	return n;
}

static int cmd_attach(const char *path, int argc, char **argv)
{
	int n = count_ifaces(argc, argv), i, err;
	unsigned int ifindex[MAX_IFACES];
	struct bpf_prog_info info = {};
	__u32 len = sizeof(info);
	struct object o;

	if (n == 0 || n > MAX_IFACES)
		return fail(2, "attach OBJECT IFACE... [NAME=VALUE]...: 1 to %d interfaces",
			    MAX_IFACES);
	for (i = 0; i < n; i++) {
		err = ifindex_of(argv[i], &ifindex[i]);
		if (err)
			return err;
	}
	err = open_object(path, &o, argc - n, argv + n) ?: load(path, &o);
	if (err)
		return err;
	if (bpf_obj_get_info_by_fd(bpf_program__fd(o.prog), &info, &len))
		return fail(1, "cannot read the program: %s", strerror(errno));
	printf("{\"prog_id\": %u, \"handle\": %u, \"priority\": %u, \"interfaces\": {",
	       info.id, HANDLE, PRIORITY);
	for (i = 0; i < n; i++) {
		LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex[i],
			    .attach_point = BPF_TC_INGRESS);
		LIBBPF_OPTS(bpf_tc_opts, opts, .handle = HANDLE, .priority = PRIORITY,
			    .flags = BPF_TC_F_REPLACE, .prog_fd = bpf_program__fd(o.prog));
		int added;

		err = bpf_tc_hook_create(&hook);
		if (err && err != -EEXIST)
			return fail(1, "cannot add clsact to %s: %s", argv[i], strerror(-err));
		added = !err;
		err = bpf_tc_attach(&hook, &opts);
		if (err)
			return fail(1, "cannot attach to %s's ingress: %s", argv[i],
				    strerror(-err));
		printf("%s\"%s\": {\"ifindex\": %u, \"clsact_added\": %s}", i ? ", " : "",
		       argv[i], ifindex[i], added ? "true" : "false");
	}
	printf("}, \"maps\": ");
	print_map_ids(o.obj);
	printf(", \"params\": ");
	print_params(&o);
	printf("}\n");
	bpf_object__close(o.obj);	/* the filters hold the program, and it its maps */
	return 0;
}

static int cmd_detach(int argc, char **argv)
{
	int i, err;

	printf("{");
	for (i = 0; i < argc; i++) {
		unsigned int ifindex = if_nametoindex(argv[i]);
		LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = BPF_TC_INGRESS);
		LIBBPF_OPTS(bpf_tc_opts, opts, .handle = HANDLE, .priority = PRIORITY);

		if (!ifindex)
			return fail(1, "no interface %s", argv[i]);
		err = bpf_tc_detach(&hook, &opts);
		if (err && err != -ENOENT && err != -EINVAL)
			return fail(1, "cannot detach from %s: %s", argv[i], strerror(-err));
		printf("%s\"%s\": %s", i ? ", " : "", argv[i], err ? "false" : "true");
	}
	printf("}\n");
	return 0;
}

static int cmd_stats(const char *id_text)
{
	char *end;
	unsigned long id = strtoul(id_text, &end, 10);
	int fd, err;

	if (!*id_text || *end)
		return fail(2, "'%s' is not a program id", id_text);
	fd = bpf_prog_get_fd_by_id(id);
	if (fd < 0)
		return fail(1, "no program with id %s: %s", id_text, strerror(errno));
	printf("{");
	err = print_counters(fd);
	printf("}\n");
	close(fd);
	return err;
}

/* The loaded object's .bss map and the offset in it of its __u64 variable `name`. */
static struct bpf_map *bss_u64(struct object *o, const char *name, __u32 *offset)
{
	struct bpf_map *bss = section_map(o->obj, ".bss");
	int id = btf__find_by_name_kind(o->btf, ".bss", BTF_KIND_DATASEC), i;
	const struct btf_var_secinfo *vsi;
	const struct btf_type *sec;

	if (!bss || id < 0)
		return NULL;
	sec = btf__type_by_id(o->btf, id);
	for (i = 0, vsi = btf_var_secinfos(sec); i < btf_vlen(sec); i++, vsi++) {
		const struct btf_type *var = btf__type_by_id(o->btf, vsi->type);

		if (!strcmp(btf__name_by_offset(o->btf, var->name_off), name) && vsi->size == 8) {
			*offset = vsi->offset;
			return bss;
		}
	}
	return NULL;
}

/* Write `now` into the .bss map's variable at `offset` (read, change, write: libbpf 1.1 maps
 * the section's memory to the kernel's map only for skeletons). */
static int set_clock(struct bpf_map *bss, __u32 offset, __u64 now, void *buf)
{
	__u32 zero = 0;
	int fd = bpf_map__fd(bss);

	if (bpf_map_lookup_elem(fd, &zero, buf))
		return -errno;
	memcpy((char *)buf + offset, &now, sizeof(now));
	return bpf_map_update_elem(fd, &zero, buf, BPF_ANY) ? -errno : 0;
}

static int cmd_run(const char *path, const char *in_path, const char *out_path, int argc,
		   char **argv)
{
	static unsigned char frame[MAX_FRAME], result[MAX_FRAME];
	struct object o;
	FILE *in, *out;
	struct bpf_map *bss;
	__u64 now, packets = 0;
	__u32 len, clock;
	void *buf;
	int err = open_object(path, &o, argc, argv) ?: load(path, &o);

	if (err)
		return err;
	bss = bss_u64(&o, "test_now_ns", &clock);
	if (!bss)
		return fail(1, "%s has no .bss __u64 test_now_ns", path);
	buf = malloc(bpf_map__value_size(bss));
	if (!buf)
		return fail(1, "out of memory");
	in = fopen(in_path, "rb");
	out = fopen(out_path, "wb");
	if (!in || !out)
		return fail(1, "cannot open %s or %s: %s", in_path, out_path, strerror(errno));
	while (fread(&now, sizeof(now), 1, in) == 1) {
		LIBBPF_OPTS(bpf_test_run_opts, run, .data_in = frame, .data_out = result,
			    .data_size_out = sizeof(result), .repeat = 1);

		if (fread(&len, sizeof(len), 1, in) != 1 || len > MAX_FRAME ||
		    fread(frame, 1, len, in) != len)
			return fail(1, "%s: record %llu is cut short", in_path,
				    (unsigned long long)packets);
		err = set_clock(bss, clock, now, buf);
		if (err)
			return fail(1, "cannot set test_now_ns: %s", strerror(-err));
		run.data_size_in = len;
		err = bpf_prog_test_run_opts(bpf_program__fd(o.prog), &run);
		if (err)
			return fail(1, "%s: record %llu: BPF_PROG_TEST_RUN: %s", in_path,
				    (unsigned long long)packets, strerror(-err));
		if (fwrite(&run.retval, sizeof(run.retval), 1, out) != 1 ||
		    fwrite(&run.data_size_out, sizeof(run.data_size_out), 1, out) != 1 ||
		    fwrite(result, 1, run.data_size_out, out) != run.data_size_out)
			return fail(1, "cannot write %s: %s", out_path, strerror(errno));
		packets++;
	}
	if (fclose(out))
		return fail(1, "cannot write %s: %s", out_path, strerror(errno));
	fclose(in);
	free(buf);
	printf("{\"packets\": %llu, \"params\": ", (unsigned long long)packets);
	print_params(&o);
	printf(", ");
	err = print_counters(bpf_program__fd(o.prog));
	printf("}\n");
	bpf_object__close(o.obj);
	return err;
}

static int cmd_params(const char *path)
{
	struct object o;
	int err = open_object(path, &o, 0, NULL);

	if (err)
		return err;
	print_params(&o);
	printf("\n");
	bpf_object__close(o.obj);
	return 0;
}

static int quiet(enum libbpf_print_level level, const char *fmt, va_list args)
{
	return level == LIBBPF_DEBUG ? 0 : vfprintf(stderr, fmt, args);
}

int main(int argc, char **argv)
{
	libbpf_set_print(quiet);
	if (argc == 3 && !strcmp(argv[1], "params"))
		return cmd_params(argv[2]);
	if (argc >= 4 && !strcmp(argv[1], "attach"))
		return cmd_attach(argv[2], argc - 3, argv + 3);
	if (argc >= 3 && !strcmp(argv[1], "detach"))
		return cmd_detach(argc - 2, argv + 2);
	if (argc == 3 && !strcmp(argv[1], "stats"))
		return cmd_stats(argv[2]);
	if (argc >= 5 && !strcmp(argv[1], "run"))
		return cmd_run(argv[2], argv[3], argv[4], argc - 5, argv + 5);
	fprintf(stderr, "usage: trialbed-bpf-tc params OBJECT\n"
			"       trialbed-bpf-tc attach OBJECT IFACE... [NAME=VALUE]...\n"
			"       trialbed-bpf-tc detach IFACE...\n"
			"       trialbed-bpf-tc stats PROG_ID\n"
			"       trialbed-bpf-tc run OBJECT IN OUT [NAME=VALUE]...\n");
	return 2;
}
