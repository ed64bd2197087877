// SPDX-License-Identifier: GPL-2.0
/*
 * rio: RIO's early drop (RED with In and Out, Clark and Fang 1998) as a tc program on an
 * interface's clsact egress, in front of the interface's real FIFO (HTB at `rate_bps` with a
 * bfifo of `limit_bytes`), for kernels without GRED. The FIFO is not read: the link is
 * work-conserving at a known rate, so the program keeps a virtual copy of it from the packets
 * it lets through (their arrival times and sizes) and computes RED's averages from that.
 *
 * The reference is analysis/rio_model.py (the same integer arithmetic, step for step); the
 * tests run both on the same packets with BPF_PROG_TEST_RUN and compare every decision and
 * every average (tests/unit/test_rio_bpf.py). hostside/bpf_tc/rio/README.md says what each
 * choice below is and where it departs from GRED and from ns-2.
 *
 * Units, all integers (BPF has no floating point):
 *   work: a byte is BYTE_WORK units (bits x 10^9), so that work / rate_bps is nanoseconds and
 *         the drain in dt ns is rate_bps x dt, exactly;
 *   avg:  bytes << AVG_SHIFT;  w_q: << W_SHIFT;  max_p: << P_SHIFT.
 *
 * The UAPI structures and constants it reads, and BPF_TC_PARAM (a .rodata constant, set by
 * name before loading), are those of every program here (../bpf_tc.h).
 */
#include "../bpf_tc.h"

#define LEVELS 3		/* IN, OUT, and high (RFC 2597's AFx3) when `levels` is 3 */
#define RING_BITS 16
#define RING (1u << RING_BITS)	/* packets the virtual FIFO can hold */
#define BYTE_WORK 8000000000ULL
#define AVG_SHIFT 16
#define W_SHIFT 20
#define P_SHIFT 32
#define RATIO_SHIFT 20
#define D_SHIFT 31		/* the idle decay's fractions: each product below 2^63 */
#define MAX_LIMIT (1u << 26)	/* bytes: keeps every product below 2^63 */
#define SIZE_MASK 0xffffffu

/* How the averages are built (README.md). */
enum rio_mode {
	/* Linux GRED in RIO mode (grio): each level averages its own packets' backlog; a
	 * level's drop decision takes its average plus those of the better levels that are
	 * not idle. */
	RIO_GRED = 0,
	/* Clark and Fang: level L averages the backlog of levels 0..L, updated at their
	 * arrivals (IN's over IN packets, OUT's over all); a level decides on its own. */
	RIO_COUPLED = 1,
};

/* What the averages count as the queue. */
enum rio_backlog {
	/* the packets waiting in the qdisc (what GRED and ns-2 average: HTB has taken the
	 * packet being sent) */
	BACKLOG_QUEUED = 0,
	/* the FIFO's remaining work, the packet on the wire included (fluid) */
	BACKLOG_FLUID = 1,
};

BPF_TC_PARAM __u64 rate_bps = 0;		/* the link (HTB's rate), bits/s */
BPF_TC_PARAM __u32 limit_bytes = 0;	/* the FIFO's size (the bfifo's limit) */
BPF_TC_PARAM __u32 mean_packet = 1500;	/* bytes: the idle decay's packet time */
BPF_TC_PARAM __u32 levels = 2;
BPF_TC_PARAM __u64 in_dscp = 0;		/* bit d set: DSCP d is level 0 (IN) */
BPF_TC_PARAM __u64 high_dscp = 0;		/* bit d set: level 2 (with levels 3); others: 1 */
BPF_TC_PARAM enum rio_mode mode = RIO_GRED;
BPF_TC_PARAM enum rio_backlog backlog = BACKLOG_QUEUED;
/* 1: as ns-2's RED (the seed-004 paper's simulator), no RED drop of a packet that arrives
 * while at most one packet waits (`qlen > 1`); GRED has no such guard (0), and an average
 * left above max then drops every packet into the empty queue (analysis/gred_lockout.py). */
BPF_TC_PARAM __u32 ns2_guard = 0;
/* Per level: thresholds in bytes, max_p << P_SHIFT, w_q << W_SHIFT. */
BPF_TC_PARAM __u32 in_min = 0, in_max = 0, in_wq = 0;
BPF_TC_PARAM __u64 in_maxp = 0;
BPF_TC_PARAM __u32 out_min = 0, out_max = 0, out_wq = 0;
BPF_TC_PARAM __u64 out_maxp = 0;
BPF_TC_PARAM __u32 high_min = 0, high_max = 0, high_wq = 0;
BPF_TC_PARAM __u64 high_maxp = 0;

/* Tests only (0 in a trial): the clock, and the random value of each packet. */
__u64 test_now_ns = 0;
__u32 test_rand = 0;
__u32 test_rand_on = 0;

/* One packet in the virtual FIFO. */
struct slot {
	__u32 start;	/* bytes accepted before it (mod 2^32) */
	__u32 size;	/* bytes | level << 24 */
	__u32 cum[2];	/* bytes of levels 0 and 1 accepted before it (mod 2^32) */
};

struct ring {
	struct slot slot[RING];
};

/* A sub-queue: one level's packets (RIO_GRED) or levels 0..L's (RIO_COUPLED). */
struct sub_queue {
	__u64 avg;		/* bytes << AVG_SHIFT */
	__u64 count;		/* packets since the last drop (or since the average left min..max) */
	__u64 arrival_ns;	/* its last arrival, accepted or not */
	__u64 accept_ns;	/* its last accepted packet's arrival (0: none yet) */
	__u64 accept_work;	/* work ahead of that packet (queued) or up to its end (fluid) */
};

/* What the last packet saw and what became of it (for the tests and a sampler). */
enum reason { PASS = 0, EARLY = 1, FORCED = 2, LIMIT = 3, RING_FULL = 4 };

struct last {
	__u32 level;
	__u32 reason;
	__u64 queue[LEVELS];	/* each sub-queue's backlog, bytes */
	__u64 queued;		/* the FIFO's waiting bytes (the bfifo's backlog) */
	__u64 avg;		/* the average the decision compared */
	__u64 pb;		/* RED's p_b << P_SHIFT (between the thresholds) */
};

struct state {
	struct bpf_spin_lock lock;
	__u32 head;		/* the oldest slot still in the FIFO (per `backlog`) */
	__u32 tail;		/* the next free slot */
	__u64 now_ns;		/* the latest arrival */
	__u64 work;		/* the FIFO's remaining work (fluid) */
	__u32 accepted;		/* bytes let through (mod 2^32) */
	__u32 level_accepted[LEVELS];	/* per level (mod 2^32) */
	struct sub_queue sub[LEVELS];
	struct last last;
};

/* Counters per CPU (summed by the reader), per level. */
struct stats {
	__u64 packets[LEVELS];
	__u64 bytes[LEVELS];
	__u64 early[LEVELS];
	__u64 forced[LEVELS];
	__u64 limit[LEVELS];
	__u64 ring_full[LEVELS];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct state);
} rio_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ring);
} rio_ring SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stats);
} stats SEC(".maps");

struct level_params {
	__u64 min;	/* bytes << AVG_SHIFT */
	__u64 max;
	__u64 maxp;
	__u64 wq;
};

static __always_inline struct level_params params_of(__u32 level)
{
	struct level_params p;

	if (level == 0) {
		p.min = in_min; p.max = in_max; p.maxp = in_maxp; p.wq = in_wq;
	} else if (level == 1) {
		p.min = out_min; p.max = out_max; p.maxp = out_maxp; p.wq = out_wq;
	} else {
		p.min = high_min; p.max = high_max; p.maxp = high_maxp; p.wq = high_wq;
	}
	p.min <<= AVG_SHIFT;
	p.max <<= AVG_SHIFT;
	return p;
}

/* The packet's level from its DSCP (IPv4 or IPv6 behind Ethernet); any other packet is OUT,
 * as GRED's catch-all filter makes it. */
static __always_inline __u32 level_of(struct __sk_buff *skb)
{
	__u8 head[2];
	__be16 proto;
	__u32 dscp;

	if (bpf_skb_load_bytes(skb, 12, &proto, 2) || bpf_skb_load_bytes(skb, 14, head, 2))
		return 1;
	if (proto == __builtin_bswap16(ETH_P_IP) && (head[0] >> 4) == 4)
		dscp = head[1] >> 2;
	else if (proto == __builtin_bswap16(ETH_P_IPV6) && (head[0] >> 4) == 6)
		dscp = ((head[0] & 0x0f) << 2) | (head[1] >> 6);
	else
		return 1;
	if ((in_dscp >> dscp) & 1)
		return 0;
	if (levels > 2 && ((high_dscp >> dscp) & 1))
		return 2;
	return 1;
}

/* Whether sub-queue j holds packets of level `level`. */
static __always_inline int holds(__u32 j, __u32 level)
{
	return mode == RIO_COUPLED ? level <= j : level == j;
}

/* 1 when a slot has left the FIFO (started service: BACKLOG_QUEUED; finished: FLUID), else
 * 0, without a branch: `unsent` is the bytes still to send, ceil(work / BYTE_WORK), and a slot
 * has left when the bytes from its start (or its end) to the FIFO's end are at least those.
 * A branch here would make the verifier walk every path of the search below (2^17). */
static __always_inline __u64 departed(const struct state *s, const struct slot *e, __u64 unsent)
{
	__u64 behind = (__u32)(s->accepted - e->start);

	if (backlog == BACKLOG_FLUID)
		behind -= e->size & SIZE_MASK;
	behind -= unsent;
	barrier_var(behind);	/* or clang turns the sign bit back into a branch */
	return 1 - (behind >> 63);
}

/* Whether sub-queue j idles: empty (work_j 0) since its last accepted packet left, and no
 * arrival since (GRED and ns-2 end an idle period at the next arrival, dropped or not). */
static __always_inline int idling(const struct sub_queue *q, __u64 work_j)
{
	__u64 since = q->arrival_ns - q->accept_ns;

	if (work_j || !q->accept_ns)
		return 0;
	return since <= q->accept_work / rate_bps;
}

/* avg x (1 - w)^m: RED's decay over an idle period of m mean packets, by squaring in 31-bit
 * fractions (the reference does the same truncations). */
static __always_inline __u64 decay(__u64 avg, __u64 wq, __u64 m)
{
	__u64 one = 1ULL << D_SHIFT, base = one - (wq << (D_SHIFT - W_SHIFT)), f = one;
	int i;

	if (m >> 32)
		return 0;
	for (i = 0; i < 32; i++) {
		/* f x base when bit i of m is set, else f (no branch: see departed) */
		__u64 bit = (m >> i) & 1;

		barrier_var(bit);
		f = (f * (one + bit * (base - one))) >> D_SHIFT;
		base = (base * base) >> D_SHIFT;
	}
	/* avg x f >> D_SHIFT in two halves: avg has up to 44 bits */
	return (avg >> D_SHIFT) * f + (((avg & (one - 1)) * f) >> D_SHIFT);
}

/* Mean packets the link could have sent since sub-queue q emptied. */
static __always_inline __u64 idle_packets(const struct sub_queue *q, __u64 now)
{
	__u64 since = now - q->accept_ns, unit = (__u64)mean_packet * BYTE_WORK;

	if (since > (~0ULL >> 1) / rate_bps)
		return ~0ULL;
	return (since * rate_bps - q->accept_work) / unit;
}

/* The FIFO's size: limit_bytes, or MAX_LIMIT when none is given or it is larger. */
static __always_inline __u64 fifo_limit(void)
{
	return limit_bytes && limit_bytes < MAX_LIMIT ? limit_bytes : MAX_LIMIT;
}

static __always_inline void count_drop(struct stats *st, __u32 level, __u32 reason)
{
	if (!st)
		return;
	if (reason == EARLY)
		st->early[level]++;
	else if (reason == FORCED)
		st->forced[level]++;
	else if (reason == LIMIT)
		st->limit[level]++;
	else
		st->ring_full[level]++;
}

SEC("tc")
int rio(struct __sk_buff *skb)
{
	__u32 zero = 0, len = skb->len, level = level_of(skb), reason = PASS, lo, hi, j, i;
	__u64 now = test_now_ns ? test_now_ns : bpf_ktime_get_ns();
	__u32 rnd = test_rand_on ? test_rand : bpf_get_prandom_u32();
	__u64 work_l[LEVELS] = {}, work_j[LEVELS] = {}, queued = 0, avg = 0, pb = 0, unsent;
	__u32 waiting;
	struct level_params p = params_of(level);
	struct state *s = bpf_map_lookup_elem(&rio_state, &zero);
	struct ring *r = bpf_map_lookup_elem(&rio_ring, &zero);
	struct stats *st = bpf_map_lookup_elem(&stats, &zero);
	struct slot *e;

	if (!s || !r || !rate_bps)
		return TC_ACT_OK;
	if (st) {
		st->packets[level]++;
		st->bytes[level] += len;
	}
	bpf_spin_lock(&s->lock);

	/* The FIFO drained at rate_bps since the last arrival (times may cross between CPUs:
	 * a packet stamped before the last one drains nothing). */
	if (now > s->now_ns) {
		__u64 dt = now - s->now_ns;

		s->work = dt > s->work / rate_bps ? 0 : s->work - dt * rate_bps;
		s->now_ns = now;
	}
	now = s->now_ns;

	/* The first slot still in the FIFO: departures are a prefix of the ring, found by a
	 * binary search with no branch but the loop's (an empty range changes nothing). */
	lo = s->head;
	hi = s->tail;
	unsent = (s->work + BYTE_WORK - 1) / BYTE_WORK;
	for (i = 0; i <= RING_BITS; i++) {
		__u64 open = ((__u64)(hi - lo) + 0xffffffffULL) >> 32;	/* lo < hi */
		__u32 mid = lo + (hi - lo) / 2;
		__u64 gone = departed(s, &r->slot[mid & (RING - 1)], unsent) & open;

		lo = lo + (__u32)gone * (mid + 1 - lo);
		hi = hi + (__u32)(open - gone) * (mid - hi);
	}
	s->head = lo;
	/* packets in the qdisc: the head is on the wire when the backlog is fluid */
	waiting = s->tail - s->head;
	if (backlog == BACKLOG_FLUID && waiting)
		waiting--;

	/* Each level's backlog (work units) and the FIFO's waiting bytes. */
	if (s->head != s->tail) {
		__u32 size, lvl, ahead;

		e = &r->slot[s->head & (RING - 1)];
		size = e->size & SIZE_MASK;
		lvl = e->size >> 24;
		work_l[0] = (__u64)(__u32)(s->level_accepted[0] - e->cum[0]) * BYTE_WORK;
		work_l[1] = (__u64)(__u32)(s->level_accepted[1] - e->cum[1]) * BYTE_WORK;
		work_l[2] = (__u64)(__u32)((s->accepted - e->start) - (s->level_accepted[0] - e->cum[0]) -
					   (s->level_accepted[1] - e->cum[1])) * BYTE_WORK;
		ahead = s->accepted - e->start;	/* the head and everything behind it */
		queued = ahead;
		if (backlog == BACKLOG_FLUID) {
			/* The head is on the wire (the first unfinished packet of a work-conserving
			 * FIFO is being sent): only its unsent part is backlog, and the qdisc no
			 * longer holds it. */
			__u64 rest = s->work - (__u64)(ahead - size) * BYTE_WORK;

			if (lvl < LEVELS)
				work_l[lvl] -= (__u64)size * BYTE_WORK - rest;
			queued = ahead - size;
		}
	}
	for (j = 0; j < LEVELS; j++) {
		for (i = 0; i < LEVELS; i++)
			if (holds(j, i))
				work_j[j] += work_l[i];
		s->last.queue[j] = work_j[j] / BYTE_WORK;
	}

	/* RED's average of every sub-queue the packet arrives to. */
	for (j = 0; j < LEVELS; j++) {
		struct sub_queue *q = &s->sub[j];
		struct level_params pj;

		if (j >= levels || !holds(j, level))
			continue;
		pj = params_of(j);
		if (idling(q, work_j[j])) {
			q->avg = decay(q->avg, pj.wq, idle_packets(q, now));
		} else {
			__s64 d = (__s64)((work_j[j] / BYTE_WORK) << AVG_SHIFT) - (__s64)q->avg;

			q->avg = (__u64)((__s64)q->avg + ((d * (__s64)pj.wq) >> W_SHIFT));
		}
		q->arrival_ns = now;
	}

	/* The average this packet's level decides on. */
	if (level < LEVELS) {
		avg = s->sub[level].avg;
		if (mode == RIO_GRED)
			for (j = 0; j < LEVELS; j++)
				if (j < level && !idling(&s->sub[j], work_j[j]))
					avg += s->sub[j].avg;
	}

	/* RED (Floyd and Jacobson 1993): count-based spacing of the early drops. The n-th packet
	 * after a drop goes with p_b / (1 - (n - 1) p_b), so that the gaps between drops are
	 * uniform on 1..1/p_b (as Linux RED spaces them; Floyd's pseudocode counts one more). */
	if (level < LEVELS) {
		struct sub_queue *q = &s->sub[level];

		if (avg < p.min || (ns2_guard && waiting <= 1)) {
			q->count = 0;
		} else if (avg >= p.max) {
			q->count = 0;
			reason = FORCED;
		} else {
			__u64 ratio = ((avg - p.min) << RATIO_SHIFT) / (p.max - p.min), cp;

			pb = (p.maxp * ratio) >> RATIO_SHIFT;
			cp = q->count * pb;
			if (cp >= (1ULL << P_SHIFT) ||
			    (__u64)rnd * ((1ULL << P_SHIFT) - cp) < pb << P_SHIFT) {
				q->count = 0;
				reason = EARLY;
			} else {
				q->count++;
			}
		}
	}

	/* The bfifo's tail drop, done here so that the virtual FIFO holds what the real one
	 * holds; then the packet joins the FIFO. */
	if (reason == PASS && queued + len > fifo_limit())
		reason = LIMIT;
	if (reason == PASS && s->tail - s->head >= RING)
		reason = RING_FULL;
	if (reason == PASS) {
		__u64 before = s->work;

		e = &r->slot[s->tail & (RING - 1)];
		e->start = s->accepted;
		e->size = (len & SIZE_MASK) | (level << 24);
		e->cum[0] = s->level_accepted[0];
		e->cum[1] = s->level_accepted[1];
		s->tail++;
		s->accepted += len;
		if (level < LEVELS)
			s->level_accepted[level] += len;
		s->work += (__u64)len * BYTE_WORK;
		for (j = 0; j < LEVELS; j++) {
			if (!holds(j, level))
				continue;
			s->sub[j].accept_ns = now;
			s->sub[j].accept_work = backlog == BACKLOG_FLUID ? s->work : before;
		}
	}
	s->last.level = level;
	s->last.reason = reason;
	s->last.queued = queued;
	s->last.avg = avg;
	s->last.pb = pb;
	bpf_spin_unlock(&s->lock);

	if (reason == PASS)
		return TC_ACT_OK;
	count_drop(st, level < LEVELS ? level : 1, reason);
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "GPL";
