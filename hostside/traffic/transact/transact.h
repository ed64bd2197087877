/*
 * What the two halves of trialbed-transact share (transact.c: options, TCP, client and
 * server; udp.c: the reliable UDP scheme): the options, the server's counters, the request's
 * byte pattern and the datagram layout. Every .c file of this folder is one build.
 */
#ifndef TRIALBED_TRANSACT_H
#define TRIALBED_TRANSACT_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define VERSION "trialbed-transact 1"
#define HDR 20
#define MAX_DGRAM 65507
#define MAX_PAIRS 256
#define MAX_RETRIES 100

enum { DATA = 1, ACK = 2, NAK = 3, REPLY = 4 };

struct opts {
	int server, udp, close_first;
	char workload; /* 's', 'l', 'f' */
	const char *bind, *connect, *out;
	long port, pairs, request, send_size, sockbuf, window, rto_ms, count;
	double duration;
};

/* one serving thread: its socket and its pair's index */
struct srv {
	int fd, index;
};

extern struct opts o;
extern volatile sig_atomic_t stopping;
extern atomic_long served_requests, served_bytes, served_conns, served_naks, served_dups,
	served_mismatched;

/* The request's byte at offset x is x % 251: the UDP receiver compares every datagram it
 * accepts with PATTERN from offset % 251 (one memcmp, not a loop over bytes). */
#define PERIOD 251
extern char PATTERN[MAX_DGRAM + PERIOD];

void die(const char *what);
void *udp_serve(void *arg);
long udp_exchange(int fd, uint32_t txn, char *dg, const char *req);

#endif
