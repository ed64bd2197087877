/*
 * trialbed-transact: request/response transactions for the EFT family (seed 003, Lipovac et
 * al. 2009), over TCP and over UDP with the paper's simple reliable window scheme.
 *
 *   EFT-SHORT        connect, send the request, receive a 1-byte reply, close; repeated
 *   EFT-LONG         one connection; request / 1-byte reply repeated; close at the end
 *   FILETRANSF-LONG  one connection; send the file, receive a 1-byte acknowledgement; repeated
 *
 * The client times every transaction on CLOCK_REALTIME (the captures' clock) and writes one
 * CSV row per transaction when it ends; nothing is written while it measures.
 *
 * UDP: the reliable scheme of udp.c.
 *
 *   trialbed-transact server --proto tcp|udp --bind ADDR --port P [--pairs K]
 *                            [--request BYTES] [--sockbuf BYTES] [--close-first]
 *   trialbed-transact client --proto tcp|udp --workload short|long|file --connect ADDR
 *                            --port P [--bind ADDR] [--request BYTES] [--send-size BYTES]
 *                            [--sockbuf BYTES] [--window BYTES] [--rto-ms MS] [--pairs K]
 *                            [--count N] [--duration S] [--out FILE]
 *
 * TCP: one port, K accepting threads. UDP: pair i uses port P + i. The server prints one
 * line "served ..." with its counters when it gets SIGTERM or SIGINT.
 */
#include "transact.h"

struct opts o = {.pairs = 1, .request = 100, .window = 17726, .rto_ms = 200, .count = -1,
		 .duration = -1};
volatile sig_atomic_t stopping;
atomic_long served_requests, served_bytes, served_conns, served_naks, served_dups,
	served_mismatched;
char PATTERN[MAX_DGRAM + PERIOD];

static char pattern(uint32_t x)
{
	return (char)(x % PERIOD);
}

void die(const char *what)
{
	fprintf(stderr, "trialbed-transact: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void usage(const char *msg)
{
	fprintf(stderr, "trialbed-transact: %s (see the head of transact.c)\n", msg);
	exit(2);
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct sockaddr_in addr_of(const char *ip, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1)
		usage("not an IPv4 address");
	return a;
}

static void set_bufs(int fd)
{
	int v = (int)o.sockbuf;
	if (o.sockbuf > 0 && (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v) ||
			      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v)))
		die("setsockopt SO_SNDBUF/SO_RCVBUF");
}

static int new_socket(void)
{
	int fd = socket(AF_INET, o.udp ? SOCK_DGRAM : SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	set_bufs(fd); /* before connect/listen: the window scale is chosen from it */
	return fd;
}

static int write_all(int fd, const char *buf, long n, long chunk)
{
	for (long done = 0; done < n;) {
		long part = n - done < chunk ? n - done : chunk;
		ssize_t w = send(fd, buf, part, MSG_NOSIGNAL); /* one send call per chunk */
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		done += w;
	}
	return 0;
}

static long read_some(int fd, char *buf, long n)
{
	for (;;) {
		ssize_t r = recv(fd, buf, n, 0);
		if (r < 0 && (errno == EINTR || errno == EAGAIN) && !stopping)
			continue;
		return r;
	}
}

/* ---------------------------------------------------------------- server */

static void *tcp_serve(void *arg)
{
	struct srv *s = arg;
	long cap = o.request < 65536 ? o.request : 65536;
	char *buf = malloc(cap), one = 'R';
	for (;;) {
		int c = accept(s->fd, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			die("accept");
		}
		served_conns++;
		for (;;) {
			long got = 0, r = 0;
			while (got < o.request && (r = read_some(c, buf, cap)) > 0)
				got += r;
			served_bytes += got;
			if (got < o.request)
				break; /* the client closed (or failed) */
			/* counted before the reply: the client may exit and the run print the
			   counters as soon as the reply reaches it */
			served_requests++;
			if (write_all(c, &one, 1, 1)) {
				served_requests--; /* not answered after all */
				break;
			}
			if (o.close_first)
				break; /* EFT-SHORT: the server closes; TIME-WAIT stays here */
		}
		close(c);
	}
	return NULL;
}

static int server(void)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL); /* only the main thread takes them, by sigwait */
	int tcp_fd = -1;
	static struct srv s[MAX_PAIRS];
	pthread_t t;
	for (int i = 0; i < o.pairs; i++) {
		if (o.udp || tcp_fd < 0) {
			int fd = new_socket(), on = 1;
			setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
			struct sockaddr_in a = addr_of(o.bind, o.port + (o.udp ? i : 0));
			if (bind(fd, (struct sockaddr *)&a, sizeof a))
				die("bind");
			if (!o.udp && listen(fd, 128))
				die("listen");
			tcp_fd = fd;
		}
		s[i] = (struct srv){.fd = tcp_fd, .index = i};
		if (pthread_create(&t, NULL, o.udp ? udp_serve : tcp_serve, &s[i]))
			die("pthread_create");
	}
	printf("listening on %s port %ld (%s, %ld pair%s)\n", o.bind, o.port, o.udp ? "udp" : "tcp",
	       o.pairs, o.pairs > 1 ? "s" : "");
	fflush(stdout);
	int sig;
	sigwait(&set, &sig);
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("served requests=%ld bytes=%ld connections=%ld naks=%ld duplicates=%ld "
	       "mismatched_datagrams=%ld user_s=%.6f sys_s=%.6f\n",
	       (long)served_requests, (long)served_bytes, (long)served_conns, (long)served_naks,
	       (long)served_dups, (long)served_mismatched, ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
	       ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
	fflush(stdout);
	_exit(0);
}

/* ---------------------------------------------------------------- client */

struct row {
	int64_t start, end;
	long bytes, retrans;
	int ok, port;
};

struct pair {
	int index, sndbuf, rcvbuf, mss;
	pthread_t thread;
	struct row *rows;
	long n, cap;
	const char *error;
	int64_t deadline;
};

static int local_port(int fd)
{
	struct sockaddr_in a;
	socklen_t l = sizeof a;
	return getsockname(fd, (struct sockaddr *)&a, &l) ? 0 : ntohs(a.sin_port);
}

static int open_conn(struct pair *p)
{
	int fd = new_socket();
	if (o.bind) {
		int on = 1; /* the port is chosen at connect (no bind-time port reservation) */
		setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &on, sizeof on);
		struct sockaddr_in a = addr_of(o.bind, 0);
		if (bind(fd, (struct sockaddr *)&a, sizeof a))
			die("bind");
	}
	struct sockaddr_in to = addr_of(o.connect, o.port + (o.udp ? p->index : 0));
	if (connect(fd, (struct sockaddr *)&to, sizeof to)) {
		close(fd);
		return -1;
	}
	if (!o.udp) { /* a 1 s receive timeout lets a stop request end a blocked receive */
		struct timeval tv = {.tv_sec = 1};
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	}
	return fd;
}

static void note_socket(struct pair *p, int fd)
{
	socklen_t l = sizeof(int);
	getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &p->sndbuf, &l);
	l = sizeof(int);
	getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &p->rcvbuf, &l);
	l = sizeof(int);
	if (!o.udp)
		getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &p->mss, &l);
}

static long tcp_retrans(int fd)
{
	struct tcp_info ti;
	socklen_t l = sizeof ti;
	return getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) ? 0 : (long)ti.tcpi_total_retrans;
}

/* One TCP request and its 1-byte reply on an open connection: 0, or -1 on failure. */
static int tcp_exchange(int fd, const char *req)
{
	char reply;
	if (write_all(fd, req, o.request, o.send_size))
		return -1;
	return read_some(fd, &reply, 1) == 1 ? 0 : -1;
}

static void add_row(struct pair *p, struct row r)
{
	if (p->n == p->cap) {
		p->cap = p->cap ? 2 * p->cap : 4096;
		p->rows = realloc(p->rows, p->cap * sizeof *p->rows);
		if (!p->rows)
			die("realloc");
	}
	p->rows[p->n++] = r;
}

static void *client_pair(void *arg)
{
	struct pair *p = arg;
	char *req = calloc(1, o.request > 1 ? o.request : 1);
	char *dg = calloc(1, HDR + o.send_size);
	int fd = -1, is_long = o.workload != 's';
	uint32_t txn = (uint32_t)p->index << 24;
	for (long x = 0; x < o.request; x++)
		req[x] = pattern((uint32_t)x);
	if (is_long) { /* one connection for every transaction, set up before the first */
		if ((fd = open_conn(p)) < 0) {
			p->error = strerror(errno);
			return NULL;
		}
		note_socket(p, fd);
	}
	while ((o.count < 0 || p->n < o.count) && !stopping && now_ns() < p->deadline) {
		struct row r = {.bytes = o.request};
		long before = 0, result;
		r.start = now_ns();
		if (!is_long) {
			fd = open_conn(p);
			if (fd < 0) {
				r.end = now_ns();
				add_row(p, r);
				usleep(1000);
				continue;
			}
		}
		if (o.udp) {
			result = udp_exchange(fd, ++txn, dg, req);
		} else {
			before = is_long ? tcp_retrans(fd) : 0;
			result = tcp_exchange(fd, req);
			if (result == 0 && !is_long) { /* the server closes first: wait for its FIN */
				char c;
				result = read_some(fd, &c, 1) == 0 ? 0 : -1;
			}
			if (result == 0)
				result = tcp_retrans(fd) - before;
		}
		if (!is_long) {
			r.port = local_port(fd);
			if (p->n == 0)
				note_socket(p, fd);
			close(fd);
		} else {
			r.port = local_port(fd);
		}
		r.end = now_ns();
		if (stopping && result < 0)
			break; /* cut short by a stop request: not a transaction */
		r.ok = result >= 0;
		r.retrans = result > 0 ? result : 0;
		add_row(p, r);
		if (result < 0 && is_long)
			break; /* the connection is gone */
	}
	if (is_long)
		close(fd);
	return NULL;
}

static void on_stop(int sig)
{
	(void)sig;
	stopping = 1;
}

static int client(void)
{
	static struct pair p[MAX_PAIRS];
	struct sigaction sa = {.sa_handler = on_stop}; /* no SA_RESTART: blocked calls return */
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	int64_t start = now_ns();
	int64_t deadline = o.duration < 0 ? INT64_MAX : start + (int64_t)(o.duration * 1e9);
	for (int i = 0; i < o.pairs; i++) {
		p[i] = (struct pair){.index = i, .deadline = deadline};
		if (pthread_create(&p[i].thread, NULL, client_pair, &p[i]))
			die("pthread_create");
	}
	for (int i = 0; i < o.pairs; i++)
		pthread_join(p[i].thread, NULL);
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	FILE *f = o.out ? fopen(o.out, "w") : stdout;
	if (!f)
		die(o.out);
	fprintf(f, "# %s proto=%s workload=%c request=%ld send_size=%ld sockbuf=%ld window=%ld "
		   "rto_ms=%ld pairs=%ld\n",
		VERSION, o.udp ? "udp" : "tcp", o.workload, o.request, o.send_size, o.sockbuf,
		o.window, o.rto_ms, o.pairs);
	fprintf(f, "# kernel sndbuf=%d rcvbuf=%d mss=%d user_s=%.6f sys_s=%.6f\n", p[0].sndbuf,
		p[0].rcvbuf, p[0].mss, ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
		ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
	fprintf(f, "pair,seq,start_ns,end_ns,bytes,ok,retrans,local_port\n");
	long total = 0, failed = 0;
	for (int i = 0; i < o.pairs; i++) {
		if (p[i].error)
			fprintf(stderr, "pair %d: could not connect: %s\n", i, p[i].error), failed++;
		for (long k = 0; k < p[i].n; k++) {
			struct row *r = &p[i].rows[k];
			fprintf(f, "%d,%ld,%lld,%lld,%ld,%d,%ld,%d\n", i, k, (long long)r->start,
				(long long)r->end, r->bytes, r->ok, r->retrans, r->port);
			failed += !r->ok;
		}
		total += p[i].n;
	}
	if (o.out)
		fclose(f);
	fprintf(stderr, "done transactions=%ld failed=%ld\n", total, failed);
	return failed && total == failed ? 1 : 0;
}

/* ---------------------------------------------------------------- options */

/* The integer options, each with its range. */
static const struct {
	const char *name;
	long *value, lo, hi;
} NUMBERS[] = {
	{"--port", &o.port, 1, 65535},	       {"--pairs", &o.pairs, 1, MAX_PAIRS},
	{"--request", &o.request, 1, 1L << 31}, {"--send-size", &o.send_size, 1, 1L << 30},
	{"--sockbuf", &o.sockbuf, 1, 1L << 30}, {"--window", &o.window, 1, 1L << 30},
	{"--rto-ms", &o.rto_ms, 1, 60000},      {"--count", &o.count, 1, 1L << 40},
};

/* One option and its value; exits with the reason when either is wrong. */
static void set_option(const char *k, const char *v)
{
	for (size_t i = 0; i < sizeof NUMBERS / sizeof NUMBERS[0]; i++) {
		if (strcmp(k, NUMBERS[i].name))
			continue;
		char *end;
		long n = strtol(v, &end, 10);
		if (*end || n < NUMBERS[i].lo || n > NUMBERS[i].hi) {
			fprintf(stderr, "trialbed-transact: %s %s: give an integer in %ld..%ld\n", k,
				v, NUMBERS[i].lo, NUMBERS[i].hi);
			exit(2);
		}
		*NUMBERS[i].value = n;
		return;
	}
	if (!strcmp(k, "--proto")) {
		if (strcmp(v, "tcp") && strcmp(v, "udp"))
			usage("--proto is tcp or udp");
		o.udp = !strcmp(v, "udp");
	} else if (!strcmp(k, "--workload")) {
		if (strcmp(v, "short") && strcmp(v, "long") && strcmp(v, "file"))
			usage("--workload is short, long or file");
		o.workload = v[0];
	} else if (!strcmp(k, "--bind"))
		o.bind = v;
	else if (!strcmp(k, "--connect"))
		o.connect = v;
	else if (!strcmp(k, "--out"))
		o.out = v;
	else if (!strcmp(k, "--duration"))
		o.duration = atof(v);
	else
		usage("unknown option");
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage("give server or client");
	if (!strcmp(argv[1], "--version"))
		return puts(VERSION), 0;
	for (uint32_t x = 0; x < sizeof PATTERN; x++)
		PATTERN[x] = pattern(x);
	o.server = !strcmp(argv[1], "server");
	if (!o.server && strcmp(argv[1], "client"))
		usage("the first word is server or client");
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--close-first"))
			o.close_first = 1;
		else if (i + 1 < argc)
			set_option(argv[i], argv[i + 1]), i++;
		else
			usage("an option without its value");
	}
	if (!o.port || (o.server ? !o.bind : !o.connect))
		usage("--port and --bind (server) or --connect (client) are required");
	if (o.pairs > 1 && o.udp && o.port + o.pairs - 1 > 65535)
		usage("--port + --pairs goes beyond 65535");
	if (o.server)
		return server();
	if (!o.workload)
		usage("--workload is required");
	if (!o.send_size)
		o.send_size = o.udp ? 8863 : 32767;
	if (o.udp && (o.send_size > MAX_DGRAM - HDR || o.window < o.send_size))
		usage("UDP: --send-size at most 65487 and --window at least one send");
	return client();
}
