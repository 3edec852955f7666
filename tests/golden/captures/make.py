#!/usr/bin/python3
"""Captures as other tools write them, made with scapy (Debian's
python3-scapy): each the smallest traffic that shows one case of issue 55.
Run from this directory to write them again: `/usr/bin/python3 make.py`.
Each NAME.pcap sits beside NAME.jsonl, `dnstrace replay NAME.pcap -o json`
as it should read; tests/tests/captures.rs checks both."""
from scapy.all import DNS, DNSQR, DNSRR, IP, UDP, Ether, wrpcap

CLIENT, SERVER = "10.244.1.10", "10.96.0.10"
T0 = 1_700_000_000


def lookup(qid, name, t_query, t_answer, sport=40000, answer="10.0.0.1"):
    """A query from the client and the server's answer, at the times given."""
    q = Ether() / IP(src=CLIENT, dst=SERVER) / UDP(sport=sport, dport=53) / DNS(
        id=qid, rd=1, qd=DNSQR(qname=name)
    )
    a = Ether() / IP(src=SERVER, dst=CLIENT) / UDP(sport=53, dport=sport) / DNS(
        id=qid, qr=1, aa=1, rd=1, ra=1, qd=DNSQR(qname=name),
        an=DNSRR(rrname=name, ttl=30, rdata=answer),
    )
    q.time, a.time = t_query, t_answer
    return [q, a]


def same_timestamp():
    """A capture with a coarse clock: each answer carries its query's
    timestamp (whole milliseconds, as appliances write them)."""
    return (
        lookup(0x1111, "a.example.com.", T0 + 0.001, T0 + 0.001, 40001)
        + lookup(0x2222, "b.example.com.", T0 + 0.002, T0 + 0.002, 40002)
        + lookup(0x3333, "c.example.com.", T0 + 0.010, T0 + 0.013, 40003)
    )


CASES = {"same-timestamp": same_timestamp}

if __name__ == "__main__":
    for name, make in CASES.items():
        wrpcap(f"{name}.pcap", make())
