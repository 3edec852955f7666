#!/usr/bin/python3
"""Captures as other tools write them, made with scapy (Debian's
python3-scapy): each the smallest traffic that shows one case of issue 55.
Run from this directory to write them again: `/usr/bin/python3 make.py`;
the same captures come out. tests/tests/captures.rs says what
`dnstrace replay NAME.pcap` must read in each."""
from scapy.all import DNS, DNSQR, DNSRR, GRE, IP, UDP, VXLAN, Ether, Raw, wrpcap
from scapy.contrib.geneve import GENEVE

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


def slow_answers():
    """One cold lookup of 372 ms among ten quick ones, then, 70 s later,
    three slow answers within a few seconds: 310, 1312 and 450 ms."""
    quick = [
        lookup(0x100 + i, f"q{i}.example.com.", T0 + i, T0 + i + 0.002, 41000 + i)
        for i in range(10)
    ]
    cold = lookup(0x200, "cold.example.com.", T0 + 5.5, T0 + 5.5 + 0.372, 42000)
    later = [
        lookup(0x300 + i, f"s{i}.example.com.", T0 + 80 + 2 * i, T0 + 80 + 2 * i + d, 43000 + i)
        for i, d in enumerate([0.310, 1.312, 0.450])
    ]
    return sorted(sum(quick + later, cold), key=lambda p: p.time)


def capture_end():
    """The capture stops 50 ms after an answer, and 1 s after a query
    that got none."""
    answered = lookup(0x400, "answered.example.com.", T0, T0 + 0.004, 44000)
    unanswered = lookup(0x401, "open.example.com.", T0 + 0.054, T0 + 9, 44001)[:1]
    last = Ether() / IP(src=CLIENT, dst="10.244.1.1") / UDP(sport=9, dport=9)
    last.time = T0 + 1.054
    return answered + unanswered + [last]


def broken(qid, name, t, sport, tail):
    """A lookup whose answer carries `tail`, one more answer record that
    does not read, after a good one."""
    q, a = lookup(qid, name, t, t + 0.003, sport)
    raw = bytearray(bytes(a[DNS]))
    raw[6:8] = (2).to_bytes(2, "big")  # ANCOUNT: the good one and `tail`
    a[UDP].remove_payload()
    a = a / Raw(bytes(raw) + tail)
    a[IP].len = a[UDP].len = a[UDP].chksum = None
    a = Ether(bytes(a))
    a.time = t + 0.003
    return [q, a]


def malformed_answers():
    """Two answers that arrive and do not read whole: an SVCB record whose
    parameter claims more bytes than its RDATA holds, and an A record whose
    RDATA runs past the message's end."""
    # SVCB (64): priority 1, root target, alpn (key 1) of length 10, 2 there.
    svcb = b"\xc0\x0c\x00\x40\x00\x01\x00\x00\x00\x1e\x00\x09" + b"\x00\x01\x00\x00\x01\x00\x0a\x02h2"
    past = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x1e\x00\x04\x0a\x00"
    return (
        broken(0x500, "svcb.example.com.", T0, 45000, svcb)
        + broken(0x501, "past.example.com.", T0 + 0.5, 45001, past)
        + lookup(0x502, "fine.example.com.", T0 + 1, T0 + 1.002, 45002)
    )


def answers_before_queries():
    """A capture merged from two points whose clocks differ: each answer is
    stamped 1 to 3 ms before its query; a last answer has no query at all."""
    out = []
    for i, early in enumerate([0.001, 0.003]):
        t = T0 + i
        out += lookup(0x600 + i, f"e{i}.example.com.", t, t - early, 46000 + i)
    out += lookup(0x610, "lone.example.com.", T0 + 5, T0 + 5, 46010)[1:]
    return sorted(out, key=lambda p: p.time)


def odd_names():
    """Names with bytes outside hostname rules, as clients do send them:
    `=`, `/` and `+` (base64 in a label), a space, a byte above 127."""
    names = [b"a=b/c+d.example.com.", b"sp ace.example.com.", b"\xff.example.com."]
    out = []
    for i, name in enumerate(names):
        out += lookup(0x700 + i, name, T0 + i, T0 + i + 0.002, 47000 + i)
    return out


def zone_operations():
    """A NOTIFY from a primary, answered; an UPDATE, refused, whose answer
    echoes its prerequisite (a CNAME record) where a query's answers are."""
    primary, secondary = "10.244.1.20", "10.244.1.53"
    notify = Ether() / IP(src=primary, dst=secondary) / UDP(sport=48000, dport=53) / DNS(
        id=0x800, opcode=4, aa=1, qd=DNSQR(qname="example.com.", qtype="SOA")
    )
    notified = Ether() / IP(src=secondary, dst=primary) / UDP(sport=53, dport=48000) / DNS(
        id=0x800, qr=1, opcode=4, aa=1, qd=DNSQR(qname="example.com.", qtype="SOA")
    )
    prerequisite = DNSRR(rrname="www.example.com.", type="CNAME", rclass=255, ttl=0, rdata="x.example.com.")
    update = Ether() / IP(src=CLIENT, dst=secondary) / UDP(sport=48001, dport=53) / DNS(
        id=0x801, opcode=5, qd=DNSQR(qname="example.com.", qtype="SOA"), an=prerequisite
    )
    refused = Ether() / IP(src=secondary, dst=CLIENT) / UDP(sport=53, dport=48001) / DNS(
        id=0x801, qr=1, opcode=5, rcode=5, qd=DNSQR(qname="example.com.", qtype="SOA"),
        an=prerequisite,
    )
    for i, p in enumerate([notify, notified, update, refused]):
        p.time = T0 + (i // 2) * 0.5 + (i % 2) * 0.002
    return [notify, notified, update, refused]


def odd_edns():
    """A query whose EDNS cookie option claims 40 bytes where 8 are, and
    its answer: the lookup is a journey all the same."""
    q, a = lookup(0x900, "cookie.example.com.", T0, T0 + 0.002, 49000)
    raw = bytearray(bytes(q[DNS]))
    raw[10:12] = (1).to_bytes(2, "big")  # ARCOUNT: the OPT record
    opt = b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x0c" + b"\x00\x0a\x00\x28" + b"\x01" * 8
    q[UDP].remove_payload()
    q = q / Raw(bytes(raw) + opt)
    q[IP].len = q[UDP].len = q[UDP].chksum = None
    q = Ether(bytes(q))
    q.time = T0
    return [q, a]


def mixed_case():
    """Names in the case their clients sent them: a resolver's DNS 0x20
    (random case, echoed), and a server that answers in lowercase."""
    echoed = lookup(0xb00, "wWw.ExAmPlE.cOm.", T0, T0 + 0.002, 51000)
    lowered = lookup(0xb01, "API.Example.COM.", T0 + 1, T0 + 1.002, 51001)
    lowered[1][DNS].qd.qname = b"api.example.com."
    lowered[1][DNS].an.rrname = b"api.example.com."
    return echoed + lowered


def no_question():
    """A query with no question, asking only for a server cookie (RFC 7873
    5.4), and its answer with none either."""
    cookie = b"\x00\x0a\x00\x08" + b"\x01" * 8
    both = b"\x00\x0a\x00\x18" + b"\x01" * 8 + b"\x02" * 16

    def message(flags, option):
        head = (0xc00).to_bytes(2, "big") + flags + b"\x00\x00\x00\x00\x00\x00\x00\x01"
        opt = b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00" + len(option).to_bytes(2, "big")
        return head + opt + option

    q = Ether() / IP(src=CLIENT, dst=SERVER) / UDP(sport=52000, dport=53) / Raw(message(b"\x00\x00", cookie))
    a = Ether() / IP(src=SERVER, dst=CLIENT) / UDP(sport=53, dport=52000) / Raw(message(b"\x80\x00", both))
    q.time, a.time = T0, T0 + 0.001
    return [q, a]


NODE_A, NODE_B, NODE_C = "192.168.0.1", "192.168.0.2", "192.168.0.3"


def tunneled(outer, qid, name, client, server, t, sport):
    """A lookup from a pod on node A to a CoreDNS pod on another node, as
    node A's underlay sees it: `outer(there, back)` wraps the query going
    there and the answer coming back."""
    q, a = lookup(qid, name, t, t + 0.004, sport)
    q[IP].src, q[IP].dst, a[IP].src, a[IP].dst = client, server, server, client
    there, back = outer(True), outer(False)
    q, a = there / q[IP], back / a[IP]
    q.time, a.time = t, t + 0.004
    return [q, a]


def between(node, vni, port=4789):
    """VXLAN between node A and `node`, on `port`."""
    def outer(there):
        src, dst = (NODE_A, node) if there else (node, NODE_A)
        return (Ether() / IP(src=src, dst=dst) / UDP(sport=50000 + vni, dport=port)
                / VXLAN(vni=vni) / Ether())
    return outer


def tunnels():
    """A node's underlay (node A's eth0): cross-node lookups inside VXLAN
    (IANA's port and flannel's), Geneve, IP-in-IP and GRE, and the node's
    own lookup upstream, not in any tunnel."""
    def geneve(there):
        src, dst = (NODE_A, NODE_B) if there else (NODE_B, NODE_A)
        return Ether() / IP(src=src, dst=dst) / UDP(sport=50100, dport=6081) / GENEVE(vni=5, proto=0x6558) / Ether()

    def ipip(there):
        src, dst = (NODE_A, NODE_C) if there else (NODE_C, NODE_A)
        return Ether() / IP(src=src, dst=dst, proto=4)

    def gre(there):
        src, dst = (NODE_A, NODE_B) if there else (NODE_B, NODE_A)
        return Ether() / IP(src=src, dst=dst) / GRE(key_present=1, key=77, proto=0x0800)

    upstream = lookup(0xa05, "example.org.", T0 + 0.5, T0 + 0.52, 50005)
    for p in upstream:
        p[IP].src, p[IP].dst = (NODE_A, "192.0.2.53") if p[IP].dst == SERVER else ("192.0.2.53", NODE_A)
        del p[IP].chksum, p[UDP].chksum
    return sorted(
        tunneled(between(NODE_B, 1), 0xa00, "vxlan.example.com.", "10.244.1.10", "10.244.2.5", T0, 50000)
        + tunneled(between(NODE_C, 1, 8472), 0xa01, "flannel.example.com.", "10.244.1.11", "10.244.3.5", T0 + 0.1, 50001)
        + tunneled(geneve, 0xa02, "geneve.example.com.", "10.244.1.12", "10.244.2.5", T0 + 0.2, 50002)
        + tunneled(ipip, 0xa03, "ipip.example.com.", "10.244.1.13", "10.244.3.5", T0 + 0.3, 50003)
        + tunneled(gre, 0xa04, "gre.example.com.", "10.244.1.14", "10.244.2.5", T0 + 0.4, 50004)
        + upstream,
        key=lambda p: p.time,
    )


CASES = {
    "same-timestamp": same_timestamp,
    "slow-answers": slow_answers,
    "capture-end": capture_end,
    "malformed-answers": malformed_answers,
    "answers-before-queries": answers_before_queries,
    "odd-names": odd_names,
    "zone-operations": zone_operations,
    "odd-edns": odd_edns,
    "tunnels": tunnels,
    "mixed-case": mixed_case,
    "no-question": no_question,
}

if __name__ == "__main__":
    for name, make in CASES.items():
        wrpcap(f"{name}.pcap", make())
