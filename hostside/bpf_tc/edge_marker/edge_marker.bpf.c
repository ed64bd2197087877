// SPDX-License-Identifier: GPL-2.0
/*
 * Seed 004's per-flow DiffServ markers (Neglia, Bianchi, Sottile: NM, APM, WPM, MPM) as a tc
 * program on an edge router's ingress (clsact, direct action): each IPv4 TCP packet gets the
 * DSCP of its drop precedence, the ECN bits kept and the header checksum fixed; no packet is
 * ever dropped.
 *
 * The algorithms are hostside/markers/markers.py's, which is the reference (its docstring
 * says what each marker does and why); this program gives the same packet sequence the same
 * marks, which tests/unit/test_edge_marker_bpf.py checks with BPF_PROG_TEST_RUN. Step for step:
 * the per-flow state is markers.py's Flow (a flow is the 4-tuple of a TCP packet; its value
 * says whether the flow exists, since an entry may outlive it), A_IN is a double computed as
 * Python computes it (../double.h), and a flow idle for longer than `idle_ns` is forgotten
 * when its next packet comes, as if Marker.expire ran before every packet.
 *
 * Where the NFQUEUE marker and this program see different packets, neither is the other's
 * reference: this program runs before IP's checks (a packet the kernel then drops as
 * malformed still counts), sees fragments as they come (not reassembled by conntrack;
 * fragments after the first are not marked) and sees a GRO or GSO packet once (counted in
 * `gso`: the rack turns those offloads off). The link must be Ethernet.
 */
#include "../bpf_tc.h"
#include "../double.h"

enum marker_kind { NM, APM, WPM, MPM };

/* Parameters, as edge_marker.py's options; the DSCP written for drop precedence 1, 2, 3
 * (core/dscp.py's af_code_points of the marker's class; AF11, AF12, AF13 here). */
BPF_TC_PARAM enum marker_kind marker = NM;
BPF_TC_PARAM double a0 = 7.0;
BPF_TC_PARAM double alpha = 0.5;
BPF_TC_PARAM __u32 n_s = 5;
BPF_TC_PARAM __u32 n_a = 5;
BPF_TC_PARAM __u64 idle_ns = 120000000000ULL;
BPF_TC_PARAM __u8 dscp1 = 10;
BPF_TC_PARAM __u8 dscp2 = 12;
BPF_TC_PARAM __u8 dscp3 = 14;

/* The clock: 0 reads CLOCK_MONOTONIC (bpf_ktime_get_ns). Only trialbed-bpf-tc's `run` (the
 * tests) sets it, before each packet: BPF_PROG_TEST_RUN feeds packets back to back, and idle
 * expiry must be checked at chosen times, the same as the Python reference's. */
volatile __u64 test_now_ns;

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define IN 1
#define OUT 2
#define PROTECTED 1
#define NORMAL 2
#define PROBE 3
#define FLOWS_MAX (1 << 18)

struct flow_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};

struct flow {
	struct bpf_spin_lock lock;
	__u32 exists;		/* 0: as if there were no entry (never made, or forgotten) */
	__u64 last_ns;
	__u64 a_in;		/* APM's A_IN: the bits of a double */
	__u32 snd_max;		/* the end of the highest data sent (markers.py's snd_max) */
	__u32 l_in;		/* APM's L_IN */
	__u32 protect_left;	/* WPM: data packets still to protect */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, FLOWS_MAX);
	__type(key, struct flow_key);
	__type(value, struct flow);
} flows SEC(".maps");

/* Per CPU, summed by the reader. precedenceN counts every TCP packet given N (control
 * packets included, as markers.py's Marker.counts). */
struct stats {
	__u64 precedence1;
	__u64 precedence2;
	__u64 precedence3;
	__u64 control;		/* TCP packets without payload (not for NM) */
	__u64 retransmissions;	/* data packets taken for retransmissions */
	__u64 rewritten;	/* packets whose DSCP changed */
	__u64 not_marked;	/* not IPv4 TCP, malformed, or a fragment after the first */
	__u64 gso;		/* packets holding several segments, marked as one */
	__u64 flows_lost;	/* data or SYN packets of a flow with no room left for it */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stats);
} stats SEC(".maps");

/* a comes after b in sequence space (modulo 2^32), as markers.py's seq_after. */
static __always_inline int seq_after(__u32 a, __u32 b)
{
	return (__s32)(a - b) > 0;
}

static __always_inline __u64 bits(const volatile double *d)
{
	return *(const volatile __u64 *)d;
}

static __always_inline void flow_start(struct flow *f, __u32 snd_max, __u64 now)
{
	f->exists = 1;
	f->snd_max = snd_max;
	f->last_ns = now;
	f->a_in = bits(&a0);
	f->l_in = 0;
	f->protect_left = n_s;
}

/* APM's step for a data packet: markers.py's ApmState.data. */
static __always_inline int apm_data(struct flow *f, int retransmission)
{
	__u64 one_minus_alpha;

	if (retransmission) {
		one_minus_alpha = dbl_sub(DBL_ONE, bits(&alpha));
		f->a_in = dbl_add(dbl_mul(bits(&alpha), f->a_in),
				  dbl_mul(one_minus_alpha, dbl_from_u32(f->l_in)));
		f->l_in = 0;
		return IN;
	}
	f->l_in++;
	/* l_in < a_in: for non-negative doubles the bits order as the values do. */
	if (dbl_from_u32(f->l_in) < f->a_in)
		return IN;
	f->l_in = 0;
	f->a_in = dbl_add(dbl_mul(DBL_TWO, f->a_in), DBL_ONE);
	return OUT;
}

/* WPM's step for a data packet: markers.py's WpmState.data. */
static __always_inline int wpm_data(struct flow *f, int retransmission)
{
	if (retransmission)
		f->protect_left = n_a;
	if (f->protect_left > 0) {
		f->protect_left--;
		return IN;
	}
	return OUT;
}

/* markers.py's Marker._mark for APM, WPM and MPM, on the flow's state `f` (locked). Sets
 * *control or *retransmission to say what the packet was. */
static __always_inline int flow_mark(struct flow *f, __u64 now, __u32 seq, __s32 payload,
				     int syn, int *control, int *retransmission)
{
	__u32 end;
	int apm = 0, wpm = 0;

	if (f->exists && (__s64)(now - f->last_ns) > (__s64)idle_ns)
		f->exists = 0;
	if (syn)
		flow_start(f, seq + 1, now);
	if (payload <= 0) {
		*control = 1;
		if (f->exists)
			f->last_ns = now;
		return IN;
	}
	if (!f->exists)
		flow_start(f, seq, now);
	f->last_ns = now;
	*retransmission = seq_after(f->snd_max, seq);
	end = seq + (__u32)payload;
	if (seq_after(end, f->snd_max))
		f->snd_max = end;
	if (marker == APM || marker == MPM)
		apm = apm_data(f, *retransmission);
	if (marker == WPM || marker == MPM)
		wpm = wpm_data(f, *retransmission);
	if (marker == APM)
		return apm;
	if (marker == WPM)
		return wpm;
	if (wpm == IN)
		return PROTECTED;
	return apm == OUT ? PROBE : NORMAL;
}

/* The drop precedence of a TCP packet of flow `key`. */
static __always_inline int mark(struct flow_key *key, __u32 seq, __s32 payload, __u8 flags,
				struct stats *st)
{
	struct flow *f, lost = {};
	int p, syn = flags & TCP_SYN, control = 0, retransmission = 0;
	__u64 now = test_now_ns;

	if (marker == NM)
		return IN;
	if (!now)
		now = bpf_ktime_get_ns();
	f = bpf_map_lookup_elem(&flows, key);
	if (!f && (syn || payload > 0)) {
		/* An entry that does not exist yet; another CPU may make it first. */
		bpf_map_update_elem(&flows, key, &lost, BPF_NOEXIST);
		f = bpf_map_lookup_elem(&flows, key);
	}
	if (f) {
		bpf_spin_lock(&f->lock);
		p = flow_mark(f, now, seq, payload, syn, &control, &retransmission);
		bpf_spin_unlock(&f->lock);
	} else {
		/* No room: the packet is marked as its flow's first, and the flow is not kept. */
		p = flow_mark(&lost, now, seq, payload, syn, &control, &retransmission);
		if (st && (syn || payload > 0))
			st->flows_lost++;
	}
	if (st) {
		st->control += control;
		st->retransmissions += retransmission;
	}
	return p;
}

SEC("tc")
int edge_marker(struct __sk_buff *skb)
{
	__u32 zero = 0, ip_len, tcp_off;
	struct stats *st = bpf_map_lookup_elem(&stats, &zero);
	struct flow_key key;
	struct tcp_head tcp;
	struct iphdr ip;
	__u8 dscp, tos, word_old[2], word_new[2];
	__u16 old, new;
	__s32 payload;
	int p;

	if (skb->protocol != bpf_htons(ETH_P_IP) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		goto not_marked;
	ip_len = (ip.ver_ihl & 0x0F) * 4;
	tcp_off = ETH_HLEN + ip_len;
	if (ip.ver_ihl >> 4 != 4 || ip_len < sizeof(ip) || ip.protocol != IPPROTO_TCP ||
	    bpf_ntohs(ip.tot_len) < ip_len || bpf_ntohs(ip.tot_len) > skb->len - ETH_HLEN ||
	    (bpf_ntohs(ip.frag_off) & IP_OFFSET) ||
	    bpf_skb_load_bytes(skb, tcp_off, &tcp, sizeof(tcp)) < 0)
		goto not_marked;
	payload = (__s32)bpf_ntohs(ip.tot_len) - (__s32)ip_len - (__s32)(tcp.doff_res >> 4) * 4;
	key.saddr = ip.saddr;
	key.daddr = ip.daddr;
	key.sport = tcp.source;
	key.dport = tcp.dest;
	p = mark(&key, bpf_ntohl(tcp.seq), payload, tcp.flags, st);
	dscp = p == 1 ? dscp1 : p == 2 ? dscp2 : dscp3;
	tos = (dscp << 2) | (ip.tos & 0x03);
	if (st) {
		if (p == 1)
			st->precedence1++;
		else if (p == 2)
			st->precedence2++;
		else
			st->precedence3++;
		if (skb->gso_segs > 1)
			st->gso++;
	}
	if (tos == ip.tos)
		return TC_ACT_OK;
	/* The checksum's 16-bit word holding the TOS, as it is in memory (RFC 1624's m, m'). */
	word_old[0] = word_new[0] = ip.ver_ihl;
	word_old[1] = ip.tos;
	word_new[1] = tos;
	__builtin_memcpy(&old, word_old, 2);
	__builtin_memcpy(&new, word_new, 2);
	if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, old, new, 2) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + 1, &tos, 1, 0) < 0)
		return TC_ACT_OK;
	if (st)
		st->rewritten++;
	return TC_ACT_OK;
not_marked:
	if (st)
		st->not_marked++;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
