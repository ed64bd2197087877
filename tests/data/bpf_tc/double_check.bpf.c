// SPDX-License-Identifier: GPL-2.0
/*
 * hostside/bpf_tc/double.h on operands from a packet, for tests/unit/test_bpf_double.py: the
 * frame after its 14-byte Ethernet header holds <u64 op><u64 x><u64 y>, and the program writes
 * the result's bits after them. op: 0 x + y, 1 x - y, 2 x * y, 3 x as a double (x < 2^32).
 */
#include "bpf_tc.h"
#include "double.h"

volatile __u64 test_now_ns;	/* trialbed-bpf-tc run sets it; unused here */

SEC("tc")
int double_check(struct __sk_buff *skb)
{
	__u64 c[3], r;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, c, sizeof(c)) < 0)
		return TC_ACT_OK;
	if (c[0] == 0)
		r = dbl_add(c[1], c[2]);
	else if (c[0] == 1)
		r = dbl_sub(c[1], c[2]);
	else if (c[0] == 2)
		r = dbl_mul(c[1], c[2]);
	else
		r = dbl_from_u32((__u32)c[1]);
	bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(c), &r, sizeof(r), 0);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
