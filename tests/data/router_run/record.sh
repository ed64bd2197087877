#!/usr/bin/env bash
# Records this directory's data (run from the repository root, as root):
#   RATE=4mbit BUF=15000 CC=reno T=1 tests/data/router_run/record.sh [OUTDIR]
# Three namespaces C -- R -- S (198.18.250.0/24, 198.18.251.0/24), R shapes its egress to S
# with HTB + bfifo (no delay: this kernel has no sch_netem). iperf3 C -> S; tcpdump on both
# of R's interfaces, tc -s of R's egress every 10 ms, tcp:tcp_probe of C and S.
set -euo pipefail
OUT=$(realpath "${1:-tests/data/router_run}")
S=tbs-$$; C=tbc-$$; R=tbr-$$
trap 'ip netns del $S 2>/dev/null; ip netns del $C 2>/dev/null; ip netns del $R 2>/dev/null' EXIT
RATE=${RATE:-4mbit}; BUF=${BUF:-15000}; CC=${CC:-reno}; T=${T:-1}
ip netns add $S; ip netns add $C; ip netns add $R
ip link add tbv0 netns $C type veth peer name tbr0 netns $R
ip link add tbv1 netns $S type veth peer name tbr1 netns $R
ip -n $C addr add 198.18.250.1/24 dev tbv0; ip -n $R addr add 198.18.250.254/24 dev tbr0
ip -n $S addr add 198.18.251.2/24 dev tbv1; ip -n $R addr add 198.18.251.254/24 dev tbr1
for n in $C $S $R; do ip -n $n link set lo up; done
ip -n $C link set tbv0 up; ip -n $S link set tbv1 up; ip -n $R link set tbr0 up; ip -n $R link set tbr1 up
ip -n $C route add default via 198.18.250.254; ip -n $S route add default via 198.18.251.254
ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
for n in $C $S $R; do for i in $(ip -n $n -o link | awk -F': ' '/tb/{print $2}' | cut -d@ -f1); do ip netns exec $n ethtool -K $i tso off gso off gro off 2>/dev/null || true; done; done
ip netns exec $R tc qdisc add dev tbr1 root handle 1: htb default 10
ip netns exec $R tc class add dev tbr1 parent 1: classid 1:10 htb rate $RATE ceil $RATE
ip netns exec $R tc qdisc add dev tbr1 parent 1:10 handle 10: bfifo limit $BUF
ip netns exec $S iperf3 -s -1 -D -B 198.18.251.2 --logfile "$OUT"/iperf3_server.log
sleep 0.5
ip netns exec $C python3 -c "$(cat collect/remote/tcp_probe.py)" --out "$OUT"/tcp_probe.txt --tag test 198.18.250.1 198.18.251.2 & RP=$!
ip netns exec $R python3 -c "$(cat collect/remote/tc_sampler.py)" --out "$OUT"/tc_samples.jsonl tbr1 & TP=$!
ip netns exec $R tcpdump --immediate-mode -i tbr0 -n -s 96 --time-stamp-precision=nano -w "$OUT"/router_in.pcap ip 2>/dev/null & D1=$!
ip netns exec $R tcpdump --immediate-mode -i tbr1 -n -s 96 --time-stamp-precision=nano -w "$OUT"/router_out.pcap ip 2>/dev/null & D2=$!
sleep 1
ip netns exec $C iperf3 -c 198.18.251.2 -t $T -C $CC -J > "$OUT"/iperf3_client.json
sleep 1.5  # the queue drains; the sender's socket still holds data when iperf3 ends
kill -TERM $RP $TP; kill -INT $D1 $D2; wait $RP $TP $D1 $D2 || true
gzip -9f "$OUT"/tc_samples.jsonl "$OUT"/tcp_probe.txt
