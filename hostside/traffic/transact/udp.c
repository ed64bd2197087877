/*
 * trialbed-transact's reliable UDP scheme, both ends.
 *
 * UDP scheme (every datagram starts with a 20-byte header, then up to --send-size bytes of
 * data): the sender sends a window of --window bytes and waits for the receiver's ACK, sent
 * once the complete window is in; on a timeout (--rto-ms) it sends the window again; the
 * receiver answers a gap (a datagram beyond the next expected offset) with a NAK naming the
 * offset it expects, and the sender goes back to it. The receiver's 1-byte REPLY, sent when
 * the whole request is in, acknowledges the last window; a duplicate of a completed
 * request's last datagram makes it send the REPLY again.
 */
#include "transact.h"

/* txn and off first: a capture's first 8 payload bytes name each datagram */
struct hdr {
	uint32_t txn, off, total, wend;
	uint8_t type, pad[3];
};

static void put_hdr(char *b, int type, uint32_t txn, uint32_t off, uint32_t total, uint32_t wend)
{
	struct hdr h = {.type = (uint8_t)type, .txn = htonl(txn), .off = htonl(off),
			.total = htonl(total), .wend = htonl(wend)};
	memcpy(b, &h, HDR);
}

static int get_hdr(const char *b, ssize_t n, struct hdr *h)
{
	if (n < HDR)
		return -1;
	memcpy(h, b, HDR);
	h->txn = ntohl(h->txn), h->off = ntohl(h->off), h->total = ntohl(h->total),
	h->wend = ntohl(h->wend);
	return 0;
}

void *udp_serve(void *arg)
{
	struct srv *s = arg;
	char *buf = malloc(MAX_DGRAM), out[HDR + 1];
	struct sockaddr_in peer = {0}, from;
	uint32_t txn = 0, expected = 0, total = 0;
	int have = 0, done = 0;
	long last_nak = -1;
	for (;;) {
		socklen_t fl = sizeof from;
		ssize_t n = recvfrom(s->fd, buf, MAX_DGRAM, 0, (struct sockaddr *)&from, &fl);
		struct hdr h;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("recvfrom");
		if (get_hdr(buf, n, &h) || h.type != DATA)
			continue;
		uint32_t len = (uint32_t)(n - HDR);
		if (!have || h.txn != txn || from.sin_port != peer.sin_port ||
		    from.sin_addr.s_addr != peer.sin_addr.s_addr) {
			have = 1, peer = from, txn = h.txn, expected = 0, total = h.total, done = 0;
			last_nak = -1;
		}
		int reply = -1;
		uint32_t ack = expected;
		if (h.off == expected && !done) {
			served_mismatched += memcmp(buf + HDR, PATTERN + h.off % PERIOD, len) != 0;
			expected += len, last_nak = -1;
			served_bytes += len;
			if (expected >= total)
				reply = REPLY, done = 1, served_requests++;
			else if (expected >= h.wend)
				reply = ACK;
			ack = expected;
		} else if (h.off > expected && !done) {
			if (last_nak != (long)expected)
				reply = NAK, last_nak = expected, served_naks++;
		} else if (h.off + len >= h.wend) {
			/* a window sent again whose ACK (or REPLY) was lost: answer once more */
			served_dups++;
			reply = done ? REPLY : ACK;
		}
		if (reply < 0)
			continue;
		put_hdr(out, reply, txn, ack, total, h.wend);
		out[HDR] = 'R';
		sendto(s->fd, out, reply == REPLY ? HDR + 1 : HDR, 0, (struct sockaddr *)&peer,
		       sizeof peer);
	}
	return NULL;
}

/* One reliable UDP request (windows of o.window bytes) and its REPLY: retransmissions
 * (datagrams sent again), or -1 when MAX_RETRIES timeouts in a row passed. */
long udp_exchange(int fd, uint32_t txn, char *dg, const char *req)
{
	uint32_t total = (uint32_t)o.request, base = 0, pos = 0, wend = 0;
	long resent = 0, timeouts = 0;
	char in[HDR + 1];
	wend = base + o.window < total ? base + o.window : total;
	for (;;) {
		while (pos < wend) { /* (re)send from pos to the window's end */
			uint32_t len = wend - pos < o.send_size ? wend - pos : (uint32_t)o.send_size;
			put_hdr(dg, DATA, txn, pos, total, wend);
			memcpy(dg + HDR, req + pos, len);
			if (send(fd, dg, HDR + len, 0) < 0 && errno != ECONNREFUSED)
				return -1;
			pos += len;
		}
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int r = poll(&pf, 1, (int)o.rto_ms);
		if (stopping)
			return -1;
		if (r == 0) { /* timeout: the whole window again */
			if (++timeouts > MAX_RETRIES)
				return -1;
			resent += (wend - base + o.send_size - 1) / o.send_size;
			pos = base;
			continue;
		}
		ssize_t n = recv(fd, in, sizeof in, 0);
		struct hdr h;
		if (n < 0 || get_hdr(in, n, &h) || h.txn != txn)
			continue; /* an ICMP error or a late answer of an earlier transaction */
		timeouts = 0;
		if (h.type == REPLY)
			return resent;
		if (h.type == ACK && h.off > base && h.off == wend) {
			base = pos = h.off;
			wend = base + o.window < total ? base + o.window : total;
		} else if (h.type == NAK && h.off >= base && h.off < wend && h.off < pos) {
			resent += (wend - h.off + o.send_size - 1) / o.send_size;
			base = pos = h.off; /* go back to what the receiver expects */
		}
	}
}

