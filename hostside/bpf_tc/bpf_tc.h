/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every tc BPF program here needs: the integer types, the socket buffer's context as the
 * UAPI declares it (a stable ABI: the members up to the last one used, at their offsets), the
 * header layouts and constants read, and a parameter's declaration.
 *
 * Declared by hand, as ../bpf_cc/bpf_cc.h is, instead of <linux/bpf.h>: that header includes
 * <asm/types.h>, which clang -target bpf finds only with the build machine's multiarch
 * directory on its path.
 */
#ifndef TRIALBED_BPF_TC_H
#define TRIALBED_BPF_TC_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* A parameter: a constant of the object's .rodata, set by trialbed-bpf-tc by its name before
 * the program is loaded; the verifier then knows its value and drops the branches it rules
 * out. Integers, enums (set by an enumerator's name) and doubles (set from decimal text, the
 * bits then used by integer code: BPF has no floating point). */
#define BPF_TC_PARAM const volatile

/* include/uapi/linux/bpf.h: struct __sk_buff, up to gso_segs. */
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
	__u32 tc_index;
	__u32 cb[5];
	__u32 hash;
	__u32 tc_classid;
	__u32 data;
	__u32 data_end;
	__u32 napi_id;
	__u32 family;
	__u32 remote_ip4;
	__u32 local_ip4;
	__u32 remote_ip6[4];
	__u32 local_ip6[4];
	__u32 remote_port;
	__u32 local_port;
	__u32 data_meta;
	__u64 flow_keys;	/* __bpf_md_ptr(struct bpf_flow_keys *, flow_keys) */
	__u64 tstamp;
	__u32 wire_len;
	__u32 gso_segs;
};

struct bpf_spin_lock {
	__u32 val;
};

/* include/uapi/linux/bpf.h */
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_F_NO_PREALLOC (1U << 0)
/* include/uapi/linux/pkt_cls.h */
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
/* include/uapi/linux/if_ether.h */
#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
/* include/uapi/linux/in.h */
#define IPPROTO_TCP 6

/* RFC 791: the IPv4 header's first 20 bytes. */
struct iphdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__u16 check;
	__be32 saddr;
	__be32 daddr;
};

#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

/* RFC 793: the TCP header's first 14 bytes (ports, sequence number, offset, flags). */
struct tcp_head {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff_res;
	__u8 flags;
};

#endif
