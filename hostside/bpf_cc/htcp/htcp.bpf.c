// SPDX-License-Identifier: GPL-2.0
/*
 * H-TCP (D. Leith, R. Shorten: "H-TCP: TCP for high-speed and long-distance networks",
 * PFLDnet 2004; draft-leith-tcp-htcp-06) as a BPF congestion control named "htcp", for
 * kernels without the tcp_htcp module.
 *
 * AIMD whose additive increase grows with the time D since the last congestion event. For
 * D up to D_L = 1 s it is NewReno's, one segment per RTT; after that
 *     alpha(D) = 1 + 10 (D - D_L) + ((D - D_L) / 2)^2   segments per RTT (D in seconds),
 * so that a flow that has seen no loss for a while probes quickly, while on a small
 * bandwidth-delay product (frequent losses) it stays NewReno-like. Options (parameters below):
 *  - RTT scaling: alpha times RTTmin / 100 ms (the ratio kept within [0.1, 2]), so that flows
 *    of different RTTs take a link more evenly;
 *  - adaptive backoff: at a congestion event cwnd is multiplied by beta = RTTmin / RTTmax
 *    (kept within [0.5, 0.8]) instead of 0.5, just enough to empty the queue; alpha is then
 *    multiplied by 2 (1 - beta) so that the flow is on average as aggressive as with 0.5;
 *  - adaptive reset: beta goes back to 0.5 whenever the throughput measured between
 *    congestion events changed by more than 20 % (the path changed).
 * alpha is a whole number of segments per RTT, at least 1 (as in the Linux and FreeBSD
 * implementations), and D counts from the end of the event's recovery (the Linux module's
 * last_cong fix, which the collateral-damage paper ran with).
 *
 * Where the algorithm leaves the arithmetic open, this does what the Linux module does, since
 * the module is what it is validated against (make validate-htcp): RTT scaling divides by a
 * scale in eighths, floored; congestion avoidance counts acked segments from ACK to ACK and
 * adds one segment when the count times alpha reaches cwnd, without counting that ACK's
 * segments (a delayed ACK's two segments per increment), at most one segment per ACK; slow
 * start's leftover segments are not carried into congestion avoidance; alpha is computed
 * again only when cwnd grows and at a congestion event, there from the epoch that ends, so
 * that an epoch's first segment of growth comes at the last epoch's alpha. Counting every segment
 * exactly instead made epochs 7 % shorter than the module's on the VM rack (3.78 s against
 * 4.07 s, 1 Mbit/s, RTT 50 ms).
 */
#include "../bpf_cc.h"

/* Defaults as the Linux module's: use_rtt_scaling=1, use_bandwidth_switch=1 (adaptive
 * reset), and adaptive backoff, which the module always does. The collateral-damage paper
 * turned adaptive backoff and adaptive reset off and left RTT scaling on. */
BPF_CC_PARAM __u32 use_rtt_scaling = 1;
BPF_CC_PARAM __u32 use_bandwidth_switch = 1;
BPF_CC_PARAM __u32 use_adaptive_backoff = 1;

#define SCALE 128U			/* alpha and beta are multiples of 1/SCALE */
#define BETA_LOW (SCALE / 2)		/* 0.5 */
#define BETA_HIGH (SCALE * 4 / 5)	/* 0.8 */
#define US_PER_S 1000000ULL
#define LOW_SPEED_US 1000000U		/* D_L */
#define HIGH_SPEED_MAX_US 500000000ULL	/* D - D_L counts up to this: alpha < 2^16 */
#define RTT_REF_US 100000U		/* RTT scaling's reference */
#define RTT_MAX_STEP_US 20000U		/* one sample may raise RTTmax by this much at most */
#define ADAPTIVE_MIN_RTT_US 10000U	/* below, RTTmin/RTTmax says nothing about the queue */
#define FRESH_EPOCH_RTTS 3		/* the throughput of the first RTTs after an event restarts */

struct htcp {
	__u32 alpha;		/* increase: segments per RTT, times SCALE */
	__u32 beta;		/* decrease factor, times SCALE */
	__u32 acked_count;	/* segments acked since cwnd last grew (the module's snd_cwnd_cnt) */
	__u32 epoch_start;	/* us: the last congestion event's end */
	__u32 rtt_min;		/* us, 0 before the first sample */
	__u32 rtt_max;		/* us, as seen in the Open state */
	/* Achieved throughput (adaptive reset only), in packets per second. */
	__u32 window_start;	/* us: this measurement window's start */
	__u32 window_acked;	/* packets acked in it */
	__u32 rate;		/* smoothed */
	__u32 rate_max;		/* highest smoothed rate of this epoch */
	__u32 rate_max_before;	/* the epoch before's */
	/* Before the congestion event in progress: back if the event is undone. */
	__u32 undo_epoch_start;
	__u32 undo_rtt_max;
	__u32 undo_rate_max_before;
	__u32 undo_beta;
	__u8 undo_beta_adaptive;
	__u8 undo_pending;	/* a congestion event is in progress */
	__u8 beta_adaptive;	/* RTTmin/RTTmax may choose beta (not right after a reset) */
	__u8 ca_state;		/* the socket's congestion state, as set_state last said */
};

_Static_assert(sizeof(struct htcp) <= 88, "the state must fit in icsk_ca_priv on every kernel");

static __always_inline __u32 clamp_u32(__u32 v, __u32 lo, __u32 hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* alpha(D), RTT-scaled, in whole segments per RTT. */
static __always_inline __u64 segments_per_rtt(const struct htcp *ca, __u32 now)
{
	__u64 since = (__u32)(now - ca->epoch_start);
	__u64 segments = 1;

	if (since > LOW_SPEED_US) {
		__u64 t = since - LOW_SPEED_US;

		if (t > HIGH_SPEED_MAX_US)
			t = HIGH_SPEED_MAX_US;
		segments = 1 + (10 * t + t * t / 4 / US_PER_S) / US_PER_S;
	}
	if (use_rtt_scaling && ca->rtt_min) {
		/* times RTTmin / RTT_REF, as the module: divided by RTT_REF / RTTmin in eighths,
		 * floored, kept within [0.5, 10] */
		__u32 scale = clamp_u32(8 * RTT_REF_US / ca->rtt_min, 4, 80);

		segments = (segments << 3) / scale;
		if (!segments)
			segments = 1;
	}
	return segments;
}

static __always_inline void update_alpha(struct htcp *ca, __u32 now)
{
	ca->alpha = 2 * segments_per_rtt(ca, now) * (SCALE - ca->beta);
}

/* At a congestion event, from what the epoch that ends measured. */
static __always_inline void update_beta(struct htcp *ca)
{
	if (use_bandwidth_switch) {
		__u64 was = ca->rate_max_before, now = ca->rate_max;

		ca->rate_max_before = ca->rate_max;
		if (5 * now < 4 * was || 5 * now > 6 * was) {
			ca->beta = BETA_LOW;
			ca->beta_adaptive = 0;
			return;
		}
	}
	if (use_adaptive_backoff && ca->beta_adaptive && ca->rtt_min > ADAPTIVE_MIN_RTT_US &&
	    ca->rtt_max) {
		ca->beta = clamp_u32((__u64)ca->rtt_min * SCALE / ca->rtt_max, BETA_LOW, BETA_HIGH);
	} else {
		ca->beta = BETA_LOW;
		ca->beta_adaptive = 1;
	}
}

static __always_inline void note_rtt(struct htcp *ca, __u32 rtt)
{
	if (!ca->rtt_min || rtt < ca->rtt_min)
		ca->rtt_min = rtt;
	if (ca->ca_state != TCP_CA_Open)
		return; /* retransmissions and their queue are not the path's */
	if (ca->rtt_max < ca->rtt_min)
		ca->rtt_max = ca->rtt_min;
	if (rtt > ca->rtt_max && rtt <= ca->rtt_max + RTT_MAX_STEP_US)
		ca->rtt_max = rtt;
}

static __always_inline void note_throughput(struct htcp *ca, const struct tcp_sock *tp,
					    __u32 acked, __u32 now)
{
	__u32 elapsed, whole_alpha, rate;

	if (ca->ca_state != TCP_CA_Open && ca->ca_state != TCP_CA_Disorder) {
		ca->window_acked = 0;
		ca->window_start = now;
		return;
	}
	ca->window_acked += acked;
	elapsed = now - ca->window_start;
	whole_alpha = ca->alpha / SCALE ?: 1;
	/* One window's worth, over at least one RTT. */
	if (!ca->rtt_min || elapsed < ca->rtt_min || !elapsed ||
	    ca->window_acked + whole_alpha < tp->snd_cwnd)
		return;
	rate = (__u64)ca->window_acked * US_PER_S / elapsed;
	if ((__u32)(now - ca->epoch_start) / ca->rtt_min <= FRESH_EPOCH_RTTS) {
		ca->rate = rate;
		ca->rate_max = rate;
	} else {
		ca->rate = (3 * (__u64)ca->rate + rate) / 4;
		if (ca->rate > ca->rate_max)
			ca->rate_max = ca->rate;
	}
	ca->window_acked = 0;
	ca->window_start = now;
}

SEC("struct_ops/htcp_init")
void BPF_PROG(htcp_init, struct sock *sk)
{
	struct htcp *ca = ca_state_of(sk);

	__builtin_memset(ca, 0, sizeof(*ca));
	ca->beta = BETA_LOW;
	ca->alpha = 2 * (SCALE - BETA_LOW);
	ca->epoch_start = now_us();
	ca->window_start = ca->epoch_start;
	ca->ca_state = TCP_CA_Open;
}

/* The first call of a congestion event (loss, ECN, RTO): the new ssthresh. */
SEC("struct_ops/htcp_ssthresh")
__u32 BPF_PROG(htcp_ssthresh, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct htcp *ca = ca_state_of(sk);
	__u32 now = now_us(), cwnd = tp->snd_cwnd, target;

	if (!ca->undo_pending) {
		ca->undo_pending = 1;
		ca->undo_epoch_start = ca->epoch_start;
		ca->undo_rtt_max = ca->rtt_max;
		ca->undo_rate_max_before = ca->rate_max_before;
		ca->undo_beta = ca->beta;
		ca->undo_beta_adaptive = ca->beta_adaptive;
	}
	update_beta(ca);
	/* RTTmax forgets slowly (5 % of its excess per event), for a path that changes. */
	if (ca->rtt_min && ca->rtt_max > ca->rtt_min)
		ca->rtt_max = ca->rtt_min + (__u64)(ca->rtt_max - ca->rtt_min) * 95 / 100;
	/* alpha from the epoch that ends, as the module: until cwnd next grows it stays that */
	update_alpha(ca, now);
	ca->epoch_start = now; /* again at the end of recovery (set_state) */
	ca->acked_count = 0;
	target = (__u64)cwnd * ca->beta / SCALE;
	return target > 2 ? target : 2;
}

SEC("struct_ops/htcp_cong_avoid")
void BPF_PROG(htcp_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct htcp *ca = ca_state_of(sk);

	if (!cwnd_limited(tp))
		return;
	if (in_slow_start(tp)) {
		tcp_slow_start(tp, acked);
		return;
	}
	/* cwnd += alpha / cwnd per acked segment: one segment once the count times alpha reaches
	 * cwnd (the module's arithmetic, see the top of the file) */
	if ((__u64)ca->acked_count * ca->alpha / SCALE >= tp->snd_cwnd) {
		if (tp->snd_cwnd < tp->snd_cwnd_clamp)
			tp->snd_cwnd = tp->snd_cwnd + 1;
		ca->acked_count = 0;
		update_alpha(ca, now_us());
	} else {
		ca->acked_count += acked;
	}
}

SEC("struct_ops/htcp_set_state")
void BPF_PROG(htcp_set_state, struct sock *sk, __u8 new_state)
{
	struct htcp *ca = ca_state_of(sk);

	if (new_state == TCP_CA_Open && ca->undo_pending) {
		/* Recovered: the new epoch starts now, NewReno-like for D_L (from cwnd's next
		 * growth, which recomputes alpha). */
		ca->undo_pending = 0;
		ca->epoch_start = now_us();
	}
	ca->ca_state = new_state;
}

SEC("struct_ops/htcp_pkts_acked")
void BPF_PROG(htcp_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	struct htcp *ca = ca_state_of(sk);
	__s32 rtt = sample->rtt_us;

	if (rtt > 0)
		note_rtt(ca, rtt);
	if (use_bandwidth_switch)
		note_throughput(ca, tcp_sk(sk), sample->pkts_acked, now_us());
}

/* The congestion event was spurious (the kernel undoes its cwnd reduction). */
SEC("struct_ops/htcp_undo_cwnd")
__u32 BPF_PROG(htcp_undo_cwnd, struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct htcp *ca = ca_state_of(sk);

	if (ca->undo_pending) {
		ca->undo_pending = 0;
		ca->epoch_start = ca->undo_epoch_start;
		ca->rtt_max = ca->undo_rtt_max;
		ca->rate_max_before = ca->undo_rate_max_before;
		ca->beta = ca->undo_beta;
		ca->beta_adaptive = ca->undo_beta_adaptive;
		update_alpha(ca, now_us());
	}
	return tp->snd_cwnd > tp->prior_cwnd ? tp->snd_cwnd : tp->prior_cwnd;
}

SEC(".struct_ops")
struct tcp_congestion_ops BPF_CC_OPS(htcp) = {
	.init = (void *)htcp_init,
	.ssthresh = (void *)htcp_ssthresh,
	.cong_avoid = (void *)htcp_cong_avoid,
	.set_state = (void *)htcp_set_state,
	.pkts_acked = (void *)htcp_pkts_acked,
	.undo_cwnd = (void *)htcp_undo_cwnd,
	.name = BPF_CC_NAME(htcp),
};

char _license[] SEC("license") = "GPL";
