/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every BPF congestion control here needs from the kernel: the few members of its TCP
 * structures that congestion control reads and writes, the struct_ops table it fills, and
 * the TCP functions the kernel lends to BPF (kfuncs).
 *
 * Declared by hand instead of a generated vmlinux.h (2.8 MB on 6.18): only the members used,
 * each relocated by CO-RE (preserve_access_index) against the running kernel's BTF when the
 * object is loaded. So the object does not depend on the build machine's kernel (it can be
 * built where there is no BTF), and a kernel that moves, adds or changes members (6.10
 * changed cong_control's arguments) loads it unchanged: libbpf fills the kernel's
 * tcp_congestion_ops by member name, and members not declared here stay unset.
 */
#ifndef TRIALBED_BPF_CC_H
#define TRIALBED_BPF_CC_H

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
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define CORE __attribute__((preserve_access_index))

/* A parameter: a global in its own section, which libbpf makes a one-element array map that
 * trialbed-bpf-cc sets by name before the program is loaded, and at any time after (like a
 * module parameter, it is read at each use). Integers only. */
#define BPF_CC_PARAM __attribute__((section(".data.params"))) volatile

/* The congestion control's name and its struct_ops table's: the folder's, or the one build.sh
 * CC:NAME gives (-DBPF_CC_RENAME=NAME), so that one source can be registered beside a kernel's
 * own congestion control of the folder's name (a kernel refuses a second one of one name):
 *   SEC(".struct_ops") struct tcp_congestion_ops BPF_CC_OPS(htcp) = { .name = BPF_CC_NAME(htcp) }
 */
#define BPF_CC_TEXT_(x) #x
#define BPF_CC_TEXT(x) BPF_CC_TEXT_(x)
#ifdef BPF_CC_RENAME
#define BPF_CC_OPS(folder) BPF_CC_RENAME
#define BPF_CC_NAME(folder) BPF_CC_TEXT(BPF_CC_RENAME)
#else
#define BPF_CC_OPS(folder) folder
#define BPF_CC_NAME(folder) #folder
#endif

/* include/net/inet_connection_sock.h: the congestion control's own per-socket area. */
#define ICSK_CA_PRIV_BYTES 104 /* 13 u64 since 6.0 (88 before); a state must fit in 88 */

enum tcp_ca_state {
	TCP_CA_Open = 0,
	TCP_CA_Disorder = 1,
	TCP_CA_CWR = 2,
	TCP_CA_Recovery = 3,
	TCP_CA_Loss = 4,
};

struct sock;

struct inet_connection_sock {
	__u64 icsk_ca_priv[13];
} CORE;

struct tcp_sock {
	__u32 snd_cwnd;
	__u32 snd_cwnd_clamp;
	__u32 snd_ssthresh;
	__u32 prior_cwnd;
	__u32 max_packets_out;
	__u8 is_cwnd_limited : 1;
} CORE;

struct ack_sample {
	__u32 pkts_acked;
	__s32 rtt_us;
	__u32 in_flight;
} CORE;

/* The members a congestion control here may fill (the kernel's has more). */
struct tcp_congestion_ops {
	__u32 (*ssthresh)(struct sock *sk);
	void (*cong_avoid)(struct sock *sk, __u32 ack, __u32 acked);
	void (*set_state)(struct sock *sk, __u8 new_state);
	void (*pkts_acked)(struct sock *sk, const struct ack_sample *sample);
	__u32 (*undo_cwnd)(struct sock *sk);
	void (*init)(struct sock *sk);
	void (*release)(struct sock *sk);
	char name[16];
};

/* kfuncs of bpf_tcp_ca (net/ipv4/bpf_tcp_ca.c). */
extern __u32 tcp_slow_start(struct tcp_sock *tp, __u32 acked) __ksym;

static __always_inline struct tcp_sock *tcp_sk(const struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

/* The congestion control's per-socket area. */
static __always_inline void *ca_state_of(const struct sock *sk)
{
	return (void *)((struct inet_connection_sock *)sk)->icsk_ca_priv;
}

static __always_inline int in_slow_start(const struct tcp_sock *tp)
{
	return tp->snd_cwnd < tp->snd_ssthresh;
}

/* Whether cwnd limits the sender (include/net/tcp.h tcp_is_cwnd_limited): growing it while
 * the application sends less would let it grow without bound. */
static __always_inline int cwnd_limited(const struct tcp_sock *tp)
{
	if (in_slow_start(tp))
		return tp->snd_cwnd < 2 * tp->max_packets_out;
	return BPF_CORE_READ_BITFIELD(tp, is_cwnd_limited);
}

static __always_inline __u32 now_us(void)
{
	return (__u32)(bpf_ktime_get_ns() / 1000);
}

#endif
