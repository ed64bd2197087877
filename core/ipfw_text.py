"""The lines ipfw(8) prints about dummynet objects and rules, as regular expressions: one
reading for the analysis of `ipfw pipe|queue show` samples (analysis/ipfw_samples.py) and for
`trials status` on a FreeBSD router (hostside/probes/status_probe.py, which carries this module
to the host inside its source: standard library only, no project import).

The text of `ipfw pipe|sched|queue show` is what sbin/ipfw/dummynet.c's list_pipes() prints
(FreeBSD 8.2 onwards):

    10001:   1.000 Mbit/s   25 ms burst 0              link: "%05d: %s %4d ms burst %s"
    q141073  58 KB 0 flows (1 buckets) sched 75537 weight 0 lmax 0 pri 0 droptail
                                                       flowset: queue size (KB, B or "sl."
                                                       slots), then its AQM: droptail,
                                                       "AQM CoDel ...", "AQM type PIE ..." or,
                                                       on the next line,
    \\t  RED w_q 0.002000 min_th 5 max_th 15 max_p 0.100000    (GRED with a G)
     sched 75537 type FIFO flags 0x0 0 buckets 1 active
     FQ_CODEL target 5ms interval 100ms quantum 1514 limit 40 flows 1024 NoECN
    BKT Prot ___Source IP/port____ ____Dest. IP/port____ Tot_pkt/bytes Pkt/Byte Drp
      0 ip           0.0.0.0/0             0.0.0.0/0     7489  10803048 21 31500  0

A flow line (list_flow) ends with five counters: total packets and bytes through the flow,
packets and bytes queued now, and packets dropped. `ipfw queue show N M` prints flowsets
alone, without link lines.
"""

import re

# A link line starts a pipe's (or a scheduler's) block: its number (%05d, modulo 65536), then
# its rate (link_rate) and its delay in ms.
LINK = r"^(?P<number>\d{5,}):\s+(?:unlimited|[\d.]+ [KMG]?bit/s)\s+(?P<delay>\d+) ms burst "
LINK_LINE = re.compile(LINK)
# The head of a flowset line (print_flowset_parms without a pending link line): its number,
# then its size; the whole line: number, queue size, scheduler, then the AQM words.
FLOWSET = r"^q(?P<number>\d+)\s+(?:\d+ KB|\d+ B|\d+ sl\.)"
FLOWSET_HEAD = re.compile(FLOWSET)
FLOWSET_LINE = re.compile(
    r"^q(\d+)\s+(\d+ KB|\d+ B|\d+ sl\.)\S*.*?\bsched (\d+) weight \d+ lmax \d+ pri \d+\s*(.*)$"
)
# print_flowset_parms()'s RED line, "\n\t %cRED w_q %f min_th %d max_th %d max_p %f".
_NUMBER = r"(\d+(?:\.\d+)?)"
RED_LINE = re.compile(rf"^\s+(G?)RED w_q (?:{_NUMBER} min_th (\d+) max_th (\d+) max_p {_NUMBER})?")
SCHED_LINE = re.compile(r"^\s*sched (\d+) type (\S+) ")
SCHED_LIMIT_LINE = re.compile(r"^\s*(?:FQ_CODEL|FQ_PIE)\b.*\blimit (\d+)")
# A flow line: bucket number (with '*' when the mask has the queue bit), then fields, then the
# five counters; IPv6 lines have more fields in between, the same counters at the end.
FLOW = (
    r"^\s*\d+\*?\s+\S+.*?\s(?P<packets>\d+)\s+(?P<bytes>\d+)\s+(?P<qlen>\d+)\s+"
    r"(?P<backlog>\d+)\s+(?P<drops>\d+)\s*$"
)
FLOW_LINE = re.compile(FLOW)
# `ipfw list`: "NNNNN ACTION ...", a rule sending to a pipe or queue on an interface.
RULE_LINE = re.compile(r"^(\d+)\s+(pipe|queue)\s+(\d+)\s.*?\b(?:xmit|via)\s+(\S+)")
# A rule's DSCP match (ipfw2.c print_dscp: " dscp" then the codes, comma-separated, by name
# where they have one), "not" before it when negated.
DSCP_MATCH = re.compile(r"(?:^|\s)((?:not\s+)?dscp\s+\S+)")


def link_rate(found: re.Match) -> str:
    """The rate of a matched link line as ipfw printed it ("1.000 Mbit/s", "unlimited")."""
    return found.string[found.end(1) + 1 : found.start(2)].strip()
