/* SPDX-License-Identifier: GPL-2.0 */
/*
 * IEEE 754 binary64 ("double") arithmetic on the bits, with integer instructions only (BPF
 * has no floating point): addition, subtraction, multiplication of non-negative finite
 * doubles, rounded to nearest, ties to even, subnormals included, as a C or Python double
 * computes them. So a BPF program reproduces, bit for bit, a reference that computes in
 * doubles (hostside/markers/markers.py's A_IN): a fixed-point stand-in would part from it
 * after a few dozen consecutive halvings, and its marks with it.
 *
 * A double is its bits in a __u64. Values that would overflow become +infinity (far out of
 * these programs' reach: 2^1024). Not handled: negative operands, infinities or NaNs as
 * operands. All inline: no function calls may be made under a bpf_spin_lock.
 */
#ifndef TRIALBED_DOUBLE_H
#define TRIALBED_DOUBLE_H

#define DBL_FRAC_BITS 52
#define DBL_HIDDEN (1ULL << DBL_FRAC_BITS)
#define DBL_FRAC_MASK (DBL_HIDDEN - 1)
#define DBL_EXP_MAX 2047
#define DBL_BIAS 1075		/* value = significand * 2^(exponent field - DBL_BIAS) */
#define DBL_E_MIN (-1074)	/* the exponent of the smallest subnormal's unit */
#define DBL_GUARD 9		/* spare low bits while adding: 53 + 9 + 1 carry < 64 */
#define DBL_ONE 0x3FF0000000000000ULL
#define DBL_TWO 0x4000000000000000ULL
#define DBL_INF 0x7FF0000000000000ULL

/* Significand and exponent of `x` (value m * 2^e); zero and subnormals have e = DBL_E_MIN. */
static __always_inline void dbl_unpack(__u64 x, __u64 *m, __s32 *e)
{
	__u32 field = (x >> DBL_FRAC_BITS) & DBL_EXP_MAX;

	if (field == 0) {
		*m = x & DBL_FRAC_MASK;
		*e = DBL_E_MIN;
	} else {
		*m = (x & DBL_FRAC_MASK) | DBL_HIDDEN;
		*e = (__s32)field - DBL_BIAS;
	}
}

/* The number of significant bits of `v` (0 for 0), by halving: BPF has no count of zeros. */
static __always_inline __u32 dbl_bit_length(__u64 v)
{
	__u32 n = 0;

	if (v >> 32) { n += 32; v >>= 32; }
	if (v >> 16) { n += 16; v >>= 16; }
	if (v >> 8) { n += 8; v >>= 8; }
	if (v >> 4) { n += 4; v >>= 4; }
	if (v >> 2) { n += 2; v >>= 2; }
	if (v >> 1) { n += 1; v >>= 1; }
	return n + (__u32)v;
}

/* The double nearest to (m + s) * 2^e, ties to even, where m < 2^63 and s, the `sticky` flag,
 * says that a non-zero fraction below m's last bit was dropped (0 < s < 1). */
static __always_inline __u64 dbl_round(__u64 m, __s32 e, int sticky)
{
	__s32 shift;
	__u64 rest, half;

	if (m == 0)
		return 0;	/* sticky alone: below any subnormal's half */
	shift = (__s32)dbl_bit_length(m) - (DBL_FRAC_BITS + 1);
	if (e + shift < DBL_E_MIN)
		shift = DBL_E_MIN - e;	/* subnormal: the unit is 2^DBL_E_MIN */
	if (shift >= 64)
		return 0;	/* m < 2^63 <= half the unit: rounds down to zero */
	if (shift > 0) {
		rest = m & ((1ULL << shift) - 1);
		half = 1ULL << (shift - 1);
		m >>= shift;
		e += shift;
		if (rest > half || (rest == half && (sticky || (m & 1))))
			m++;
		if (m == DBL_HIDDEN << 1) {
			m >>= 1;
			e++;
		}
	} else if (shift < 0) {
		m <<= -shift;	/* exact: sticky is only ever set with bits to drop */
		e += shift;
	}
	if (m < DBL_HIDDEN)
		return m;	/* subnormal (e == DBL_E_MIN) */
	if (e + DBL_BIAS >= DBL_EXP_MAX)
		return DBL_INF;
	return ((__u64)(e + DBL_BIAS) << DBL_FRAC_BITS) | (m & DBL_FRAC_MASK);
}

/* The double equal to `v` (exact: v < 2^53). */
static __always_inline __u64 dbl_from_u32(__u32 v)
{
	return dbl_round(v, 0, 0);
}

/* m >> d for 0 <= d, with `sticky` set when a non-zero bit is dropped. */
static __always_inline __u64 dbl_shift_out(__u64 m, __s32 d, int *sticky)
{
	if (d <= 0)
		return m;
	if (d >= 64) {
		*sticky = m != 0;
		return 0;
	}
	*sticky = (m & ((1ULL << d) - 1)) != 0;
	return m >> d;
}

/* x + y, for x, y >= 0. */
static __always_inline __u64 dbl_add(__u64 x, __u64 y)
{
	__u64 mx, my, t;
	__s32 ex, ey, te;
	int sticky = 0;

	dbl_unpack(x, &mx, &ex);
	dbl_unpack(y, &my, &ey);
	if (ey > ex) {
		t = mx; mx = my; my = t;
		te = ex; ex = ey; ey = te;
	}
	mx <<= DBL_GUARD;
	my = dbl_shift_out(my << DBL_GUARD, ex - ey, &sticky);
	return dbl_round(mx + my, ex - DBL_GUARD, sticky);
}

/* x - y, for x >= y >= 0. */
static __always_inline __u64 dbl_sub(__u64 x, __u64 y)
{
	__u64 mx, my;
	__s32 ex, ey;
	int sticky = 0;

	dbl_unpack(x, &mx, &ex);
	dbl_unpack(y, &my, &ey);
	mx <<= DBL_GUARD;
	my = dbl_shift_out(my << DBL_GUARD, ex - ey, &sticky);
	/* Dropped bits of y make the difference a fraction smaller than mx - my: one unit less,
	 * plus that fraction's complement, which is again non-zero and below one unit. */
	return dbl_round(mx - my - (sticky ? 1 : 0), ex - DBL_GUARD, sticky);
}

/* x * y, for x, y >= 0. */
static __always_inline __u64 dbl_mul(__u64 x, __u64 y)
{
	__u64 mx, my, p00, p01, p10, p11, mid, lo, hi, m;
	__s32 ex, ey, e, s;
	int sticky;

	dbl_unpack(x, &mx, &ex);
	dbl_unpack(y, &my, &ey);
	if (mx == 0 || my == 0)
		return 0;
	/* The 106-bit product hi:lo from 32-bit halves (BPF multiplies 64 x 64 -> 64). */
	p00 = (mx & 0xFFFFFFFF) * (my & 0xFFFFFFFF);
	p01 = (mx & 0xFFFFFFFF) * (my >> 32);
	p10 = (mx >> 32) * (my & 0xFFFFFFFF);
	p11 = (mx >> 32) * (my >> 32);
	mid = p01 + p10;			/* < 2^54 */
	lo = p00 + (mid << 32);
	hi = p11 + (mid >> 32) + (lo < p00);
	e = ex + ey;
	if (hi == 0) {
		sticky = lo & 1;
		m = lo >> 1;			/* < 2^63 */
		e += 1;
		if (!(lo >> 63)) {		/* fits as it is */
			sticky = 0;
			m = lo;
			e -= 1;
		}
	} else {
		/* Keep the top 62 bits: 64 + bits(hi) - 62 = s dropped, 3 <= s <= 44. */
		s = 64 + (__s32)dbl_bit_length(hi) - 62;
		m = (hi << (64 - s)) | (lo >> s);
		sticky = (lo & ((1ULL << s) - 1)) != 0;
		e += s;
	}
	return dbl_round(m, e, sticky);
}

#endif
